"""Leases: create-if-absent, compare-and-swap renewal, fencing tokens, takeover, heartbeat."""

import subprocess
import sys
import time

import pytest

from executor.storage.lease import Heartbeat, Leases, Owner
from executor.storage.store import Status, Store

D = "step-0123456789"


# A ttl that a loaded machine (CI runs three workers on its cores) does not let lapse between two
# lines of a test by accident; the tests that need it to lapse sleep past it.
TTL = 1.0


def owners(n):
    return [Owner(f"host{i}", 1000 + i, f"run{i}") for i in range(n)]


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    if request.param == "local":
        return Store(str(tmp_path / "prefix"))
    return Store(f"memory://lease-{time.time_ns()}")


def test_acquire_conflict_takeover_and_fencing(store):
    a, b = (Leases(store, ttl=TTL, owner=o) for o in owners(2))
    lease_a, holder = a.try_acquire(D)
    assert lease_a is not None and holder is None and lease_a.token == 1
    lease_b, holder = b.try_acquire(D)
    assert lease_b is None and holder.host == "host0" and holder.live()
    assert a.still_ours(D, lease_a.token)
    time.sleep(TTL + 0.05)  # a stops renewing: the lease expires and b takes it over
    lease_b, _ = b.try_acquire(D)
    assert lease_b is not None and lease_b.token == 2
    assert not a.still_ours(D, lease_a.token)  # fencing: a's token is stale
    assert a.renew(D, lease_a) is None  # and a cannot renew what it lost
    assert b.renew(D, lease_b).expires > lease_b.expires
    b.release(D, lease_b)
    assert not b.still_ours(D, lease_b.token)
    lease_a2, _ = a.try_acquire(D)
    assert lease_a2.token == 3  # released, not deleted: tokens only grow


def test_heartbeat_keeps_a_lease_alive_and_stops_before_release(store):
    a, b = (Leases(store, ttl=TTL, owner=o) for o in owners(2))
    lease, _ = a.try_acquire(D)
    with Heartbeat(a, interval=0.05) as hb:
        hb.hold(D, lease)
        time.sleep(TTL * 1.5)  # well past the ttl
        assert b.try_acquire(D)[0] is None
        assert a.still_ours(D, lease.token)
    assert not hb._thread.is_alive()
    current = a.holder(D)
    assert current.released and current.token == lease.token
    time.sleep(0.2)  # nothing renews it after release
    assert a.holder(D) == current
    assert b.try_acquire(D)[0].token == lease.token + 1


def test_heartbeat_notices_a_lost_lease(store):
    a, b = (Leases(store, ttl=0.1, owner=o) for o in owners(2))
    lease, _ = a.try_acquire(D)
    with Heartbeat(a, interval=0.3) as hb:  # slower than the ttl on purpose: the lease expires
        hb.hold(D, lease)
        time.sleep(0.15)
        taken, _ = b.try_acquire(D)
        assert taken is not None
        deadline = time.time() + 10  # its next beat (0.3 s; later on a loaded machine) finds it lost
        while not hb.lost(D) and time.time() < deadline:
            time.sleep(0.05)
        assert hb.lost(D)
    current = b.holder(D)  # a's exit released nothing of b's
    assert current.token == taken.token and current.run_id == "run1" and not current.released


RACE = """
import sys, time
from executor.storage.lease import Leases, Owner
from executor.storage.store import Status, Store
prefix, i, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
leases = Leases(Store(prefix), ttl=30, owner=Owner("h", i, f"run{i}"))
while time.time() < start:
    pass
lease, _ = leases.try_acquire("step-0123456789")
print(lease.token if lease else "-")
"""


def test_processes_racing_on_local_files_one_wins(tmp_path):
    start = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path), str(i), str(start)],
                              stdout=subprocess.PIPE, text=True) for i in range(8)]
    results = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert sorted(results) == ["-"] * 7 + ["1"], results


def _spoil(store, content):
    """Overwrite the lease file in place, as a torn write or a stray editor would."""
    if store.is_local:
        with open(store.path(D, ".lease"), "r+b") as f:
            f.truncate(0)
            f.write(content)
    else:
        store.fs.pipe_file(store.path(D, ".lease"), content)


@pytest.mark.parametrize("content", [b"", b"{garbage", b'{"token": 3}'])
def test_an_unreadable_lease_is_held_until_its_ttl_passes_then_taken_with_a_larger_token(store, content):
    """Item 7: an empty or corrupt lease is neither released nor a reason to start tokens at 1."""
    a, b = (Leases(store, ttl=TTL, owner=o) for o in owners(2))
    lease_a, _ = a.try_acquire(D)
    store.write_status(D, Status(state="RUNNING", digest="d" * 64, attempt=1, token=lease_a.token))
    _spoil(store, content)
    taken, holder = b.try_acquire(D)
    assert taken is None and holder is not None and holder.live()
    assert "unreadable" in holder.describe()
    assert not a.still_ours(D, lease_a.token) and a.renew(D, lease_a) is None
    with a.fence(D, lease_a.token) as ours:
        assert not ours
    time.sleep(TTL + 0.1)  # one ttl after the lease file was last written
    taken, _ = b.try_acquire(D)
    assert taken is not None and taken.token > lease_a.token
    with a.fence(D, lease_a.token) as ours:
        assert not ours  # the old holder's writes do not pass


def test_a_holder_that_wrote_nothing_yet_is_fenced_after_its_unreadable_lease_is_taken(store):
    """The token of a holder whose worker has not started (so no status names it) is known only
    to the lease; once that is unreadable the next token must still be larger than any before."""
    a, b = (Leases(store, ttl=0.3, owner=o) for o in owners(2))
    for _ in range(5):  # tokens 1..5, each released at once (a step found done meanwhile)
        lease_a, _ = a.try_acquire(D)
        a.release(D, lease_a)
    lease_a, _ = a.try_acquire(D)
    assert lease_a.token == 6
    _spoil(store, b"")
    time.sleep(0.35)
    taken, _ = b.try_acquire(D)
    assert taken is not None and taken.token > lease_a.token
    with a.fence(D, lease_a.token) as ours:
        assert not ours
    b.release(D, taken)
    again, _ = a.try_acquire(D)
    assert again.token == taken.token + 1  # and from there on, one at a time


def test_tokens_grow_past_the_status_token(store):
    """A lease older than the status (restored from an earlier copy of the folder) cannot hand
    out a token the status has already seen."""
    a = Leases(store, ttl=5, owner=owners(1)[0])
    store.write_status(D, Status(state="FAILED", digest="d" * 64, attempt=3, token=7))
    lease, _ = a.try_acquire(D)
    assert lease.token == 8


def test_gcs_lease_io_on_the_emulator(gcs_emulator):
    # The emulator ignores ifGenerationMatch, so this shows the I/O path, not mutual exclusion.
    store = Store("gs://marin-test/lease-test")
    a, b = (Leases(store, ttl=0.5, owner=o) for o in owners(2))
    lease, _ = a.try_acquire(D)
    assert lease.token == 1
    assert b.try_acquire(D)[0] is None
    assert a.renew(D, lease) is not None
    a.release(D, lease)
    taken = b.try_acquire(D)[0]
    assert taken.token == 2
    # An unreadable lease object is held from its `updated` time as GCS reports it (a ttl of 30 s
    # here: with 0.5 s a loaded machine could let it expire before the next line asks).
    store.fs.pipe_file(store.path(D, ".lease"), b"")
    written = store.fs.info(store.path(D, ".lease"))["mtime"].timestamp()
    holder = Leases(store, ttl=30, owner=owners(1)[0]).try_acquire(D)[1]
    assert holder.unreadable and abs(holder.acquired - written) < 1 and holder.expires == holder.acquired + 30

"""Leases: create-if-absent, compare-and-swap renewal, fencing tokens, takeover, heartbeat."""

import subprocess
import sys
import time

import pytest

from executor.lease import Heartbeat, Leases, Owner
from executor.store import Store

D = "step-0123456789"


def owners(n):
    return [Owner(f"host{i}", 1000 + i, f"run{i}") for i in range(n)]


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    if request.param == "local":
        return Store(str(tmp_path / "prefix"))
    return Store(f"memory://lease-{time.time_ns()}")


def test_acquire_conflict_takeover_and_fencing(store):
    a, b = (Leases(store, ttl=0.3, owner=o) for o in owners(2))
    lease_a, holder = a.try_acquire(D)
    assert lease_a is not None and holder is None and lease_a.token == 1
    lease_b, holder = b.try_acquire(D)
    assert lease_b is None and holder.host == "host0" and holder.live()
    assert a.still_ours(D, lease_a.token)
    time.sleep(0.35)  # a stops renewing: the lease expires and b takes it over
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
    a, b = (Leases(store, ttl=0.3, owner=o) for o in owners(2))
    lease, _ = a.try_acquire(D)
    with Heartbeat(a, interval=0.05) as hb:
        hb.hold(D, lease)
        time.sleep(0.8)  # well past the ttl
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
        time.sleep(0.3)
        assert hb.lost(D)
    current = b.holder(D)  # a's exit released nothing of b's
    assert current.token == taken.token and current.run_id == "run1" and not current.released


RACE = """
import sys, time
from executor.lease import Leases, Owner
from executor.store import Store
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


def test_corrupt_lease_is_treated_as_expired(tmp_path):
    store = Store(str(tmp_path))
    store.fs.makedirs(store.path(D), exist_ok=True)
    store.fs.pipe_file(store.path(D, ".lease"), b"{garbage")
    lease, _ = Leases(store, ttl=5).try_acquire(D)
    assert lease is not None


def test_gcs_lease_io_on_the_emulator(gcs_emulator):
    # The emulator ignores ifGenerationMatch, so this shows the I/O path, not mutual exclusion.
    store = Store("gs://marin-test/lease-test")
    a, b = (Leases(store, ttl=0.5, owner=o) for o in owners(2))
    lease, _ = a.try_acquire(D)
    assert lease.token == 1
    assert b.try_acquire(D)[0] is None
    assert a.renew(D, lease) is not None
    a.release(D, lease)
    assert b.try_acquire(D)[0].token == 2

"""A step's files are its own. `ctx.open`/`ctx.path` refuse a path that would
leave the step's output folder or name one of the executor's files, with one clear error."""

import pytest

from executor import VoyageError
from executor.context import StepContext


@pytest.fixture
def ctx(tmp_path):
    return StepContext(name="s", output=str(tmp_path / "s-0123456789" / ".attempts" / "0001-abcdef12"), digest="0" * 64)


@pytest.mark.parametrize("path, why", [
    ("../x", "'..' segment"),
    ("sub/../../x", "'..' segment"),
    ("..", "'..' segment"),
    ("/etc/passwd", "is absolute"),
    ("gs://bucket/x", "is absolute"),
    (".status", "executor's files"),
    ("./.lease", "executor's files"),
    (".step.json", "executor's files"),
    ("deep/.attempts/x", "executor's files"),
])
def test_paths_that_leave_the_folder_or_name_executor_files_are_refused(ctx, tmp_path, path, why):
    for call in (lambda: ctx.open(path, "w"), lambda: ctx.open(path, "rb"), lambda: ctx.path(path),
                 lambda: ctx.fs_path(path), lambda: ctx.exists(path)):
        with pytest.raises(VoyageError, match=why) as e:
            call()
        assert "step s: ctx path" in str(e.value) and "\n" not in str(e.value)
    assert not list(tmp_path.rglob("x")) and not list(tmp_path.rglob(".status"))


def test_paths_inside_the_folder_still_work(ctx):
    with ctx.open("a/b/./c.txt", "w") as f:
        f.write("ok")
    assert ctx.exists("a/b/c.txt") and ctx.path("a", "b/c.txt").endswith("/0001-abcdef12/a/b/c.txt")
    with ctx.open(".tmp-123-c.txt", "w") as f:  # the atomic-write convention stays allowed
        f.write("tmp")


def test_fenced_waits_for_a_late_renewal_and_gives_up_on_a_lease_never_renewed(tmp_path):
    """`ctx.fenced`: a lease that still carries the attempt's token but has lapsed (its executor
    slow or paused) is waited for, never written past: the block runs once the executor renews
    it, and a lease nobody renews ends in LeaseLost ("not renewed") after `patience`. Another
    executor's token ends it at once."""
    import threading
    import time

    from executor import LeaseLost, StepContext
    from executor.context import LeaseRef
    from executor.storage.lease import Leases, Owner
    from executor.storage.store import Store

    store = Store(str(tmp_path))
    leases = Leases(store, ttl=0.3, owner=Owner("a", 1, "run-a"))
    lease, _ = leases.try_acquire("s")
    ctx = StepContext(name="s", output=str(tmp_path / "s"), digest="0" * 64, resumable=True,
                      lease=LeaseRef(str(tmp_path), "s", lease.token, 0.3))
    time.sleep(0.4)  # lapsed, still our token
    renewed = threading.Timer(0.3, lambda: leases.renew("s", lease))
    renewed.start()
    t0 = time.monotonic()
    with ctx.fenced("a late write", patience=10):
        waited = time.monotonic() - t0  # (the lease's lock is held here on a local prefix: no reading it)
    renewed.join()
    assert waited >= 0.2 and leases.still_ours("s", lease.token)  # it waited for the renewal

    time.sleep(0.4)  # lapsed again; nobody renews it now
    with pytest.raises(LeaseLost, match=r"step s, attempt 1 \(token \d+\): the lease was not renewed for too long"):
        with ctx.fenced("a write nobody renews", patience=0.5):
            raise AssertionError("the block ran on a lapsed lease")

    Leases(store, ttl=30, owner=Owner("b", 2, "run-b")).try_acquire("s")  # taken over
    t0 = time.monotonic()
    with pytest.raises(LeaseLost, match="was taken over by another executor"):
        with ctx.fenced("a write after a takeover", patience=10):
            raise AssertionError("the block ran under another executor's lease")
    assert time.monotonic() - t0 < 5  # no waiting for a lease that is someone else's


def test_a_fenced_write_inside_a_fenced_block_runs_at_once(tmp_path):
    """On a local prefix a fenced block holds the lease's lock: a resumable step's `ctx.open`
    (fenced too) inside it must not take the lock again, which would wait forever."""
    from executor.context import LeaseRef
    from executor.storage.lease import Leases, Owner
    from executor.storage.store import Store

    lease, _ = Leases(Store(str(tmp_path)), ttl=30, owner=Owner("a", 1, "run-a")).try_acquire("s")
    ctx = StepContext(name="s", output=str(tmp_path / "s"), digest="0" * 64, resumable=True,
                      lease=LeaseRef(str(tmp_path), "s", lease.token, 30.0, {"auto_mkdir": True}))
    with ctx.fenced("an outer write"):
        with ctx.open("inner.txt", "w") as f:
            f.write("x")
        with ctx.fenced("an inner write"):
            pass
    assert (tmp_path / "s" / "inner.txt").read_text() == "x"

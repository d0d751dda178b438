"""Many executors, one prefix: real `marin-run` processes started together run every step exactly
once, and the lease of one SIGKILLed is taken over within twice the lease timeout.

The executors join the session's local Ray (`--ray-address`), as people sharing a cluster do;
bench/faults.py runs the same with an embedded Ray each."""

import glob
import json
import os
import sys
import time

from kits import faultkit  # noqa: E402


def wait_until(check, timeout, what):
    value = faultkit.wait_for(check, timeout)
    if not value:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")
    return value


def test_executors_started_together_run_every_step_exactly_once(tmp_path, ray_local):
    address = ray_local.get_runtime_context().gcs_address
    prefix = str(tmp_path / "p")
    args = ["--prefix", prefix, "--ray-address", address, "--lease-ttl", "3",
            "--shards", "3", "--files", "3", "--delay", "0.4"]
    runs = [faultkit.Executor(faultkit.SLOW, args, str(tmp_path / "logs"), name=f"x{i}") for i in range(4)]
    codes = [run.wait(180) for run in runs]
    assert codes == [0] * 4, "\n\n".join(run.tail() for run in runs)
    got = faultkit.audit(prefix)
    assert got.corrupt == []
    assert len(got.attempts) == 7 and all(states == ["SUCCESS"] for states in got.attempts.values()), got.attempts
    # the others waited for the holder, then took its result instead of running the step again
    waited = [run for run in runs if ": WAITING, leased by" in run.stderr]
    assert waited and all("done meanwhile by another executor" in run.stderr for run in waited)


def test_a_killed_lease_holder_is_taken_over_within_twice_the_ttl(tmp_path, ray_local):
    address = ray_local.get_runtime_context().gcs_address
    prefix, ttl = str(tmp_path / "p"), 3.0
    common = ["--prefix", prefix, "--ray-address", address, "--lease-ttl", str(ttl), "--shards", "1", "--files", "6"]
    holder = faultkit.Executor(faultkit.SLOW, [*common, "--delay", "2"], str(tmp_path), name="holder")
    dirname = wait_until(lambda: faultkit.holds_a_lease(prefix, holder.pid), 90, "the holder to take a lease")
    wait_until(lambda: glob.glob(os.path.join(prefix, dirname, ".attempts/*/part-000.bin")), 60, "the step to start")
    # delay is run-only: the waiter runs the same steps, only faster
    waiter = faultkit.Executor(faultkit.SLOW, [*common, "--delay", "0.05"], str(tmp_path), name="waiter")
    wait_until(lambda: ": WAITING, leased by" in waiter.stderr or not waiter.running(), 90, "the waiter to wait")
    lease_path = os.path.join(prefix, dirname, ".lease")
    before = json.load(open(lease_path))
    assert before["pid"] == holder.pid and holder.running(), holder.tail()
    holder.kill()

    def taken_over():
        try:
            lease = json.load(open(lease_path))
        except (OSError, ValueError):
            return None
        return time.time() if lease["token"] > before["token"] else None

    took = wait_until(taken_over, 4 * ttl, "the takeover") - holder.killed_at
    assert took <= 2 * ttl, f"taken over {took:.2f}s after the kill; the ttl is {ttl}s"
    assert waiter.wait(120) == 0, waiter.tail()
    got = faultkit.audit(prefix)
    assert got.corrupt == []
    name = "slow/shard/0"
    assert got.attempts[name] == ["INTERRUPTED", "SUCCESS"], got.attempts
    assert all(got.successes(n) == 1 for n in got.attempts)
    assert "took over the lease" in waiter.stderr


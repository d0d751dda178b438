"""Crash safety: `marin-run` SIGKILLed (with the Ray it embeds) at random moments of a run.

After every kill: no folder is SUCCESS unless its record says SUCCESS and lists exactly the files
it holds. Then a run completes the voyage, no step that had succeeded runs again (its record
gains no attempt) and the outputs equal those of an uninterrupted run. Every process of the
killed executors is gone afterwards, without `ray stop`. Set MARIN_FAULT_SEED to replay.
"""

import os
import random
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultkit  # noqa: E402

from executor.api import run_steps  # noqa: E402

SLOW_SIZE = dict(shards=3, files=4)


@pytest.fixture(scope="module")
def ray_tmp():
    tmp = faultkit.RayTmp()
    yield tmp.path
    tmp.close()


def reference(prefix, voyage, **config):
    _, summary = run_steps(faultkit.load_voyage(voyage, **config), prefix)
    assert summary.exit_code == 0
    return faultkit.audit(prefix)


def kill_and_finish(voyage, args, prefix, logs, ray_tmp, ray_local, moments, seed):
    """SIGKILL one run per entry of `moments` (seconds after it first holds a lease), checking the
    prefix after each, then finish on the session's Ray; returns the final audit."""
    done_at: dict[str, int] = {}  # a step seen SUCCESS -> how many attempts its record had then
    tags = []
    for k, moment in enumerate(moments):
        run = faultkit.Executor(voyage, args, logs, ray_tmp, name=f"killed{k}")
        tags.append(run.tag)
        deadline = time.time() + 90
        while run.running() and not faultkit.holds_a_lease(prefix, run.pid, live=False) and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(moment)
        run.kill()
        got = faultkit.audit(prefix)
        assert got.corrupt == [], (seed, k, got.corrupt)
        for name, state in got.states.items():
            if state == "SUCCESS":
                done_at.setdefault(name, len(got.attempts[name]))
    address = ray_local.get_runtime_context().gcs_address
    final = faultkit.Executor(voyage, [*args, "--ray-address", address], logs, name="final")
    assert final.wait(180) == 0, final.tail()
    assert faultkit.reap(tags) == [], "processes of a killed executor outlived it"
    got = faultkit.audit(prefix)
    assert got.corrupt == [], (seed, got.corrupt)
    assert set(got.states.values()) == {"SUCCESS"}, (seed, got.states)
    assert all(got.successes(name) == 1 for name in got.attempts), (seed, got.attempts)
    for name, attempts in done_at.items():
        assert len(got.attempts[name]) == attempts, (seed, name, "ran again after it had succeeded", got.attempts)
    return got


def test_sigkill_of_marin_run_at_random_moments(tmp_path, ray_local, ray_tmp):
    seed = int(os.environ.get("MARIN_FAULT_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    expected = reference(str(tmp_path / "ref"), faultkit.SLOW, delay=0.0, **SLOW_SIZE)
    prefix = str(tmp_path / "p")
    args = ["--prefix", prefix, "--lease-ttl", "2", "--delay", "0.3",
            *(f"--{k}={v}" for k, v in SLOW_SIZE.items())]
    got = kill_and_finish(faultkit.SLOW, args, prefix, str(tmp_path / "logs"), ray_tmp, ray_local,
                          [rng.uniform(0, 2.5) for _ in range(2)], seed)
    assert got.outputs == expected.outputs and len(got.outputs) == 7


def test_sigkill_during_hello(tmp_path, ray_local, ray_tmp):
    seed = int(os.environ.get("MARIN_FAULT_SEED", random.randrange(1 << 30)))
    expected = reference(str(tmp_path / "ref"), faultkit.HELLO, n_files=3)
    prefix = str(tmp_path / "p")
    args = ["--prefix", prefix, "--lease-ttl", "2", "--n_files", "3"]
    got = kill_and_finish(faultkit.HELLO, args, prefix, str(tmp_path / "logs"), ray_tmp, ray_local,
                          [random.Random(seed).uniform(0, 0.5)], seed)
    assert got.outputs == expected.outputs and len(got.outputs) == 8

"""Crash safety: `marin-run` SIGKILLed (with the Ray it embeds) at chosen moments of a run.

The moments are the ones that matter, reached by watching what the steps write (no sleeping for
a random time): inside a step between two of its writes, and just after a step succeeded while
others are still writing. After every kill: no folder is SUCCESS unless its record says SUCCESS
and lists exactly the files it holds. Then a run completes the voyage, no step that had succeeded
runs again (its record gains no attempt) and the outputs equal those of an uninterrupted run.
Every process of the killed executors is gone afterwards, without `ray stop`. (Random moments,
many of them: bench/faults.py.)
"""

import os
import shutil
import sys
import time

import pytest

from kits import faultkit  # noqa: E402

from executor.api import run_steps  # noqa: E402
from executor.storage.store import SUCCESS  # noqa: E402

# the slower tier (`--tier slow`: fault injection on real processes), which .ci/run runs after the
# README's command (tests/conftest.py)
pytestmark = pytest.mark.slow_tier

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


def writing(prefix):
    """Step names whose RUNNING attempt has written some of its files but is not done: a kill now
    lands between two writes of a step."""
    store = faultkit.Store(prefix)
    found = []
    for dirpath, _, files in os.walk(prefix):
        if ".step.json" not in files or not any(not f.startswith(".") for _, _, fs in os.walk(dirpath) for f in fs):
            continue
        folder = os.path.relpath(dirpath, prefix)  # an attempt's folder: `{output}/.attempts/{id}`
        dirname = folder.split("/.attempts/")[0]
        record, status = store.read_record_in(folder), store.read_status(dirname)
        if record and record.attempts and record.attempts[-1].state == "RUNNING" and \
                (status is None or status.state != SUCCESS):
            found.append(record.name)
    return found


def mid_step(prefix):
    """Inside a step: one has written part of its files."""
    return writing(prefix)


SLOW_STEPS = 7  # the slow voyage's outputs at SLOW_SIZE


def after_a_success(prefix):
    """Just after a step succeeded (in this run or an earlier one) while another is writing, and
    with at least two steps still to succeed: on a loaded machine the writing step may end
    between this check and the kill, and the voyage must not end with it."""
    done = sum(state == SUCCESS for state in faultkit.audit(prefix, verify=False).states.values())
    return 1 <= done <= SLOW_STEPS - 2 and writing(prefix)


def kill_and_finish(voyage, args, prefix, logs, ray_tmp, ray_local, moments, final_args=(), quick=False):
    """SIGKILL one run per entry of `moments` (a check of the prefix, polled: the run is killed as
    soon as it holds), checking the prefix after each, then finish on the session's Ray; returns
    the final audit. `quick`: the voyage may have ended between the check and the kill; and a
    quick voyage may pass its first moment between two polls (a loaded machine), so the first
    moment gets up to three runs, each on an emptied prefix."""
    done_at: dict[str, int] = {}  # a step seen SUCCESS -> how many attempts its record had then
    tags = []
    for k, moment in enumerate(moments):
        tries = 3 if quick and k == 0 else 1
        for t in range(tries):
            run = faultkit.Executor(voyage, args, logs, ray_tmp, name=f"killed{k}-{t}")
            tags.append(run.tag)
            hit = faultkit.wait_for(lambda: not run.running() or moment(prefix), 120)
            if (run.running() and hit) or t == tries - 1 or run.wait(60) != 0:
                break
            shutil.rmtree(prefix, ignore_errors=True)  # it ran to the end unseen: again, from nothing
        assert run.running() and hit, (k, moment.__name__, run.tail())
        run.kill()
        got = faultkit.audit(prefix)
        assert got.corrupt == [], (k, moment.__name__, got.corrupt)
        assert quick or any(state != SUCCESS for state in got.states.values()), (k, "killed after the voyage ended")
        for name, state in got.states.items():
            if state == "SUCCESS":
                done_at.setdefault(name, len(got.attempts[name]))
    address = ray_local.get_runtime_context().gcs_address
    final = faultkit.Executor(voyage, [*args, *final_args, "--ray-address", address], logs, name="final")
    assert final.wait(180) == 0, final.tail()
    assert faultkit.reap(tags) == [], "processes of a killed executor outlived it"
    got = faultkit.audit(prefix)
    assert got.corrupt == [], got.corrupt
    assert set(got.states.values()) == {"SUCCESS"}, got.states
    assert all(got.successes(name) == 1 for name in got.attempts), got.attempts
    for name, attempts in done_at.items():
        assert len(got.attempts[name]) == attempts, (name, "ran again after it had succeeded", got.attempts)
    return got


def test_sigkill_of_marin_run_inside_a_step_and_after_a_success(tmp_path, ray_local, ray_tmp):
    expected = reference(str(tmp_path / "ref"), faultkit.SLOW, delay=0.0, **SLOW_SIZE)
    prefix = str(tmp_path / "p")
    args = ["--prefix", prefix, "--lease-ttl", "2", "--delay", "0.3",
            *(f"--{k}={v}" for k, v in SLOW_SIZE.items())]
    # the final run needs no pauses between writes (`delay` is run-only: the same digests)
    got = kill_and_finish(faultkit.SLOW, args, prefix, str(tmp_path / "logs"), ray_tmp, ray_local,
                          [mid_step, after_a_success], final_args=["--delay", "0"])
    assert got.outputs == expected.outputs and len(got.outputs) == SLOW_STEPS


def test_sigkill_during_hello(tmp_path, ray_local, ray_tmp):
    """hello.py's steps are quick: killed as soon as its first step has begun (its record says
    RUNNING), nothing done yet; the final run takes the dead run's leases over."""
    expected = reference(str(tmp_path / "ref"), faultkit.HELLO, n_files=3)
    prefix = str(tmp_path / "p")
    args = ["--prefix", prefix, "--lease-ttl", "2", "--n_files", "3"]

    def a_step_began(prefix):
        seen = faultkit.audit(prefix, verify=False)
        return any(states and states[-1] == "RUNNING" for states in seen.attempts.values())

    got = kill_and_finish(faultkit.HELLO, args, prefix, str(tmp_path / "logs"), ray_tmp, ray_local,
                          [a_step_began], quick=True)
    assert got.outputs == expected.outputs and len(got.outputs) == 8

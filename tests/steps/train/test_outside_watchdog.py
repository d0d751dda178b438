"""The watchdog outside the worker (executor.heartbeat): a training worker stopped from outside
(SIGSTOP, as the kernel, a GPU driver or a dead NFS server would stop it) cannot fire its own
watchdog; the executor sees its heartbeat stop, dumps its state, kills it through Ray, classes the
attempt `hang`, and the retry resumes from the last checkpoint and ends bitwise equal to a clean
run."""

import dataclasses
import os
import shutil
import signal
import sys
import threading
import time

import pytest
import torch

from kits.trainkit import make_mixture, run_step  # noqa: E402

from executor import Resources, Step  # noqa: E402
from executor.api import run_steps  # noqa: E402
from executor.heartbeat import PAUSED_FACTOR, SLACK_S  # noqa: E402
from executor.runner import WATCH_EVERY  # noqa: E402
from executor.storage.store import Store  # noqa: E402
from steps.train import checkpoint  # noqa: E402
from steps.train.config import (DataConfig, ModelSpec, OptimizerConfig, TrackerConfig, TrainConfig,  # noqa: E402
                                TrainerConfig)
from steps.train.pretrain import pretrain  # noqa: E402
from steps.train.watchdog import WatchdogConfig  # noqa: E402



def _weights(output):
    from steps.moe.model import PRESETS, MoETransformer

    found = checkpoint.list_checkpoints(output)[-1]
    model = MoETransformer(dataclasses.replace(PRESETS["tiny"], vocab_size=512))
    checkpoint.load(found.url, model, None)
    return found.step, model.state_dict()


def _stopped(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "T"
    except OSError:
        return False


@pytest.mark.slow_tier  # a real worker stopped and killed
def test_a_stopped_training_worker_is_killed_from_outside_and_the_run_ends_bitwise_equal(ray_local, tokens,
                                                                                            tmp_path):
    mix = make_mixture(tokens, tmp_path / "mix", sequences=1000)
    bound, grace = 6.0, 1.0
    watchdog = WatchdogConfig(timeout_s=bound, grace_s=grace, first_step_s=300)
    cfg = TrainConfig(data=DataConfig(mixture=mix, batch_size=16), model=ModelSpec("tiny"),
                      optimizer=OptimizerConfig(lr=1e-2, warmup_steps=5),
                      trainer=TrainerConfig(log_every=5, checkpoint_every=7, tracker=TrackerConfig(kind="none"),
                                            watchdog=watchdog))
    prefix = str(tmp_path / "prefix")
    steps = [Step("pretrain", pretrain, cfg, resources=Resources(cpus=1))]
    done = {}
    runner = threading.Thread(target=lambda: done.update(zip(("plan", "summary"), run_steps(steps, prefix))))
    runner.start()
    store, pid = Store(prefix), None
    try:
        # wait for the first attempt to have a checkpoint, then stop its worker from outside
        deadline = time.time() + 300
        while time.time() < deadline and runner.is_alive():
            dirnames = [p for p in os.listdir(prefix) if p.startswith("pretrain-")] if os.path.isdir(prefix) else []
            status = store.read_status(dirnames[0]) if dirnames else None
            if status is not None and status.state == "RUNNING" and status.dir:
                folder = os.path.join(prefix, dirnames[0], status.dir)
                if checkpoint.list_checkpoints(folder):
                    time.sleep(0.5)  # most likely between two saves (a stop inside one takes longer)
                    record = store.read_record(dirnames[0], status, latest=True)
                    pid = record.attempts[-1].pid
                    break
            time.sleep(0.05)
        assert pid, "the first attempt never reached a checkpoint"
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.time()
        while not _stopped(pid) and time.time() < stopped_at + 5:
            time.sleep(0.01)
        assert _stopped(pid)
        runner.join(timeout=600)
        assert not runner.is_alive()
    finally:
        if pid and _stopped(pid):  # the test failed before the executor killed it
            os.kill(pid, signal.SIGKILL)
    plan, summary = done["plan"], done["summary"]
    outcome = summary.outcomes["pretrain"]
    assert summary.exit_code == 0 and outcome.state == "SUCCESS" and outcome.attempts == 2, outcome
    dirname = plan.decisions[0].node.dirname
    record = store.read_record(dirname)
    first, second = record.attempts
    assert (first.state, first.failure) == ("FAILED", "hang") and "killed from outside" in first.error, first
    assert first.pid == pid and second.pid != pid and not os.path.exists(f"/proc/{pid}")
    # the dump: py-spy's stacks (installed with the suite) or the /proc state of a stopped process
    out = os.path.join(prefix, store.served_dir(dirname))
    dump = open(os.path.join(out, "logs", f"hang-outside-attempt{first.number}.txt")).read()
    assert "State:\tT (stopped)" in dump and "no heartbeat for" in dump, dump[:2000]
    if shutil.which("py-spy") or os.path.exists(os.path.join(os.path.dirname(sys.executable), "py-spy")):
        assert "py-spy dump" in dump and "Thread " in dump and "(exit 0)" in dump, dump[:2000]  # the stacks
    # resumed within the outside bound (ten step bounds if stopped inside a checkpoint save), the
    # watch interval, the kill and the new worker's start-up
    saving = ", saving a checkpoint" in first.error
    outside = (PAUSED_FACTOR if saving else 1) * bound + grace + SLACK_S
    assert f"outside bound {outside:.0f}s" in first.error
    assert outside < second.started - stopped_at < outside + WATCH_EVERY + 60, (second.started - stopped_at, outside)
    print(f"stopped at step >= 7; killed {first.ended - stopped_at:.1f}s after the SIGSTOP (outside bound "
          f"{outside:.0f}s); attempt 2 started {second.started - stopped_at:.1f}s after it")
    # bitwise equal to a clean run of the same config
    clean = run_step(pretrain, cfg, tmp_path / "clean", name="clean")
    (s1, w1), (s2, w2) = _weights(clean.output), _weights(out)
    assert s1 == s2 and all(torch.equal(w1[k], w2[k]) for k in w1)


def test_the_watchdog_publishes_its_beats_bound_and_pauses():
    """What the outside watchdog judges on, published by the in-process one (no Ray: a sink)."""
    from executor import heartbeat
    from steps.train.watchdog import Watchdog

    got = []
    cfg = WatchdogConfig(timeout_s=3.0, grace_s=2.0, first_step_s=50.0)
    with heartbeat.sending_to(got.append, output="/x", attempt=4):
        with Watchdog(cfg, "/dev/null") as dog:
            dog.beat()
            dog.beat()  # within a second of the last: not sent
            with dog.paused():
                pass
    assert [(b["count"], b["bound"], b["paused"], b["stopped"]) for b in got] == [
        (0, 50.0, False, False), (1, 3.0, False, False), (2, 3.0, True, False), (2, 3.0, False, False),
        (2, 3.0, False, True)]
    assert got[0]["pid"] == os.getpid() and got[0]["attempt"] == 4 and got[0]["grace"] == 2.0
    beat = heartbeat.Beat.from_dict(got[1], age=9.9)
    assert heartbeat.outside_bound(beat) == 3.0 + 2.0 + SLACK_S and not heartbeat.overdue(beat)
    beat.age = 10.1
    assert heartbeat.overdue(beat)
    paused = heartbeat.Beat.from_dict(got[2], age=11.0)
    assert heartbeat.outside_bound(paused) == PAUSED_FACTOR * 3.0 + 2.0 + SLACK_S and not heartbeat.overdue(paused)
    assert not heartbeat.overdue(heartbeat.Beat.from_dict(got[-1], age=1e9))  # training ended: not watched
    heartbeat.publish(1, 1.0)  # no sink outside `sending_to`: nothing, and no error
    assert len(got) == 5

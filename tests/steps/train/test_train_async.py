"""Async checkpoints (steps/train/saving.py): the same bits as synchronous saves, and a SIGKILL
while an upload is in flight (a store with injected latency) leaves the previous checkpoint in
force; the run resumes from it bitwise equal to an uninterrupted one."""

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from kits.trainkit import make_mixture, renewed, run_step  # noqa: E402

from steps.train import checkpoint  # noqa: E402
from steps.train.config import DataConfig, ModelSpec, OptimizerConfig, TrackerConfig, TrainConfig, TrainerConfig  # noqa: E402
from steps.train.pretrain import pretrain  # noqa: E402

pytestmark = pytest.mark.slow_tier  # processes killed during an async upload, on two spawned ranks: the slow tier (README)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "../../.."))


@pytest.fixture(scope="module")
def mix(tokens, tmp_path_factory):
    return make_mixture(tokens, tmp_path_factory.mktemp("mix") / "mix", sequences=448)  # pretrain 0..21


def _config(mix, **trainer):
    base = dict(log_every=5, checkpoint_every=5, keep_last=2, tracker=TrackerConfig(kind="none"))
    return TrainConfig(data=DataConfig(mixture=mix, batch_size=16), model=ModelSpec("tiny"),
                       optimizer=OptimizerConfig(lr=1e-2, warmup_steps=5),
                       trainer=TrainerConfig(**{**base, **trainer}))


def _weights(output):
    from steps.moe.model import PRESETS, MoETransformer

    found = checkpoint.list_checkpoints(output)[-1]
    model = MoETransformer(dataclasses.replace(PRESETS["tiny"], vocab_size=512))
    checkpoint.load(found.url, model, None)
    return found.step, model.state_dict()


KILLED_RUN = """
import sys, pickle
sys.path[:0] = [{root!r}, {tests!r}]
from kits import slowfs; slowfs.register()
from kits.trainkit import run_step
from steps.train.pretrain import pretrain

run_step(pretrain, pickle.loads(bytes.fromhex({cfg!r})), {out!r}, name="pre")
"""


def test_a_kill_during_an_async_upload_leaves_the_previous_checkpoint_in_force(mix, tmp_path):
    import pickle

    sync = run_step(pretrain, _config(mix), tmp_path / "sync", name="pre")
    cfg = _config(mix, async_checkpoint=True)
    # uploads that take 3 s a file (injected store latency), training ~0.1 s a step: step-5's
    # upload is finished (and marked) when step-10 starts; kill while step-10 uploads
    out = tmp_path / "async"
    code = KILLED_RUN.format(root=ROOT, tests=os.path.join(ROOT, "tests"), cfg=pickle.dumps(cfg).hex(), out=f"slow://{out}")
    env = {**os.environ, "SLOW_WRITE_S": "3", "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not (out / "checkpoints/step-10").exists():
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert [f.step for f in checkpoint.list_checkpoints(str(out))] == [5]  # in force: the previous one
    assert not (out / "checkpoints/step-10/meta.json").exists()
    # resumed (no latency now) with async saves: the same bits as the uninterrupted sync run
    resumed = run_step(pretrain, cfg, out, name="pre")
    assert resumed.results["checkpoint_stall_s"]
    (s1, w1), (s2, w2) = _weights(sync.output), _weights(resumed.output)
    assert s1 == s2 == 21 and all(torch.equal(w1[k], w2[k]) for k in w1)
    assert [f.step for f in checkpoint.list_checkpoints(str(out))] == [20, 21]


def test_async_saves_on_two_ranks_are_marked_while_training_goes_on(mix, tmp_path):
    from steps.train.config import ParallelConfig
    from steps.train.loop import Killed

    # FSDP over two spawned processes, experts split in two: DCP's upload collectives must not
    # interleave with the training's all-reduces (they did on one group: gloo aborted)
    cfg = _config(mix, workers=2, parallel=ParallelConfig(ep=2), async_checkpoint=True, fail_after_steps=12)
    with pytest.raises(Killed):
        run_step(pretrain, cfg, tmp_path / "two", name="pre")
    assert [f.step for f in checkpoint.list_checkpoints(str(tmp_path / "two"))] == [5, 10]  # marked mid-run
    # Another executor has taken the step's lease over: an attempt still holding the old token stops
    # at its first write (the reference curve, before any worker starts) and changes nothing
    from executor import LeaseLost
    from executor.context import LeaseRef
    from executor.storage.lease import Leases, Owner
    from executor.storage.store import Store

    store = Store(str(tmp_path))
    old, _ = Leases(store, ttl=60, owner=Owner("a", 1, "run-a")).try_acquire("two")
    Leases(store, ttl=60, owner=Owner("a", 1, "run-a")).release("two", old)
    leases_b = Leases(store, ttl=60, owner=Owner("b", 2, "run-b"))
    new, _ = leases_b.try_acquire("two")
    before = sorted((p, p.stat().st_mtime_ns) for p in (tmp_path / "two").rglob("*"))
    resumed = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, fail_after_steps=0))
    with pytest.raises(LeaseLost):
        run_step(pretrain, resumed, tmp_path / "two", name="pre", lease=LeaseRef(str(tmp_path), "two", old.token, 60))
    assert sorted((p, p.stat().st_mtime_ns) for p in (tmp_path / "two").rglob("*")) == before
    with renewed(leases_b, "two", new):  # B's driver keeps its lease while the attempt runs
        done = run_step(pretrain, resumed, tmp_path / "two", name="pre", lease=LeaseRef(str(tmp_path), "two", new.token, 60))
    assert done.results["final_step"] == 21
    assert checkpoint.read_run(checkpoint.list_checkpoints(str(tmp_path / "two"))[-1].url)["verified"]["sampled"]


@pytest.mark.parametrize("taken_over", [True, False])
def test_two_ranks_agree_on_a_lost_lease_before_a_write(tmp_path, taken_over):
    """`saving.on_rank0_under_lease`: rank 0 checks the lease around the write; when another executor holds it,
    both ranks raise LeaseLost (the other one by one all-reduce, not waiting in a collective for
    a rank that stopped) and nothing is written; while the lease is ours rank 0 writes."""
    from executor.context import LeaseRef
    from executor.storage.lease import Leases, Owner
    from executor.storage.store import Store
    from steps.train.launch import spawn
    from kits.trainkit import write_if_agreed

    store = Store(str(tmp_path))
    a = Leases(store, ttl=60, owner=Owner("a", 1, "run-a"))
    lease, _ = a.try_acquire("pre")
    if taken_over:
        a.release("pre", lease)
        Leases(store, ttl=60, owner=Owner("b", 2, "run-b")).try_acquire("pre")
    spawn(write_if_agreed, (LeaseRef(str(tmp_path), "pre", lease.token, 60.0), str(tmp_path)), 2)
    said = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    if taken_over:
        assert said[0].startswith("LeaseLost: step pre, attempt 1") and "taken over" in said[0]
        assert said[1] == "LeaseLost: rank 0 found the step's lease taken over before a test write"
        assert not (tmp_path / "written").exists()
    else:
        assert said == ["ok", "ok"] and (tmp_path / "written").exists()

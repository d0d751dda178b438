"""Meshes with real processes over gloo: the same numerics on any mesh
and topology-aware ranks on a real Ray cluster (item 3).

Twenty steps of the tiny preset, 16 sequences a step, on: one process; 4 processes as ep=4
(dp_shard 4, the experts two a rank, the rest FSDP-sharded four ways); 4 processes as
dp_replicate 2 x dp_shard 2 with ep=2 (HSDP, two micro-batches a step, so the cross-replica
all-reduce waits for the last one). Processes: `steps.train.launch.spawn`, the launcher a step
uses when Ray is not running. Every run is the real Trainer, from a model built on `meta`,
sharded there and initialized by parameter name. Then the ep=4 run's step-10 checkpoint is
loaded on the HSDP mesh, on 2 processes as ep=2 (which resume from it and train on), and on one
process (which resumes too). The same HSDP mesh with AdamW sharded over its replicas
(`offload="replicas"`) trains from scratch and is held to one process in loss,
gradient norm and weights; one process resumes from its step-10 checkpoint. In bf16, on 2
processes as dp_replicate 2, it is held to plain bf16 HSDP and its checkpoint to its fp32 masters.

Racks: a `ray.cluster_utils.Cluster` whose two nodes carry the rack labels "r1" and "r0"
(rack_host.py, a process of its own), a pretrain step on 4 Ray Train workers (gloo) as
dp_replicate 2 x dp_shard 2 with ep=2. The step asks Ray for its workers rack by rack in whole
expert-parallel groups, every worker reports its place, and the mesh is built from the ranks
sorted by (rack, node, local index): the racks come in order, and every expert-parallel group and
every replica stays inside one rack. (Sorting and checks on scrambled places are unit tests in
test_train_parallel.py.) The cluster starts first and runs beside the gloo runs: most of its
time is Ray starting processes, which overlaps well.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
import torch

from kits.meshkit import config, losses, metric, run_eval, run_mesh, seed_checkpoint  # noqa: E402
from kits.trainkit import make_mixture  # noqa: E402

from steps.train.config import ParallelConfig  # noqa: E402

pytestmark = pytest.mark.slow_tier  # real gloo processes and a 3-node Ray cluster, about 170 s of the main tier's time: the slow tier (README)

TOLERANCE = 1e-5  # relative difference of a step's loss
# Gradient norms and weights drift further apart than losses between meshes (reduction order):
# plain HSDP against one process after 20 steps, 6.8e-5 on a norm and 5.1e-5 on a weight (norm of
# the difference over the norm), and the replica-sharded optimizer the same to two digits.
NORM_TOLERANCE = 2e-4
WEIGHT_TOLERANCE = 2e-4
# bf16: the distributed optimizer against plain bf16 HSDP on the same 2 processes,
# measured 0 on losses, 5e-7 on norms, 3.5e-8 on weights after 20 steps. Against one fp32 process
# either is 2.7e-3 off in loss by step 20, its norms 16% apart at step 5 and 10x at a step-12
# spike of the bf16 runs only (bf16 compute, not the optimizer): held to bf16 HSDP, the
# fp32 comparison is bench/mesh_equality.py's.
BF16_TOLERANCE = 1e-5
RACK_HOST = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "kits", "rack_host.py")


@pytest.fixture(scope="module")
def racks(tokens, tmp_path_factory):
    """The two-rack cluster's run, started now, read when a test asks (`racks()`)."""
    root = tmp_path_factory.mktemp("racks")
    mix = make_mixture(tokens, root / "mix", sequences=32, stages=((1.0, {"kjv": 1.0}),))  # 2 steps
    # A Ray root of its own: the cluster must neither join nor be found by any other Ray here.
    ray_tmp = tempfile.mkdtemp(prefix="mr", dir="/tmp")
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "RAY_TMPDIR": ray_tmp}
    proc = subprocess.Popen([sys.executable, RACK_HOST, mix, str(root / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)

    def result():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        return json.loads(out.strip().splitlines()[-1])

    yield result
    if proc.poll() is None:  # a test failed first: stop the host and the Ray processes it started
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def runs(tokens, racks, tmp_path_factory):
    root = tmp_path_factory.mktemp("mesh")
    mix = make_mixture(tokens, root / "mix", sequences=320, stages=((1.0, {"kjv": 1.0}),))  # 20 steps of 16
    out = {"one": run_mesh(config(mix, ParallelConfig()), str(root / "one"), 1),
           "ep4": run_mesh(config(mix, ParallelConfig(ep=4)), str(root / "ep4"), 4)}
    ckpt = f"{out['ep4']}/checkpoints/step-10"
    out["hsdp"] = run_mesh(config(mix, ParallelConfig(dp_replicate=2, dp_shard=2, ep=2), microbatch=2),
                           str(root / "hsdp"), 4, load=ckpt)
    # the distributed optimizer across replicas: the HSDP mesh with AdamW's state
    # sharded over dp_replicate, from scratch; it loads the ep=4 checkpoint too
    out["replicas"] = run_mesh(config(mix, ParallelConfig(dp_replicate=2, dp_shard=2, ep=2, offload="replicas"),
                                      microbatch=2), str(root / "replicas"), 4, load=ckpt)
    # bf16 on 2 processes as dp_replicate 2, plain HSDP (fp32 weights whole on each replica) and the
    # distributed optimizer (bf16 working weights, fp32 master slices, gradients accumulated in
    # fp32 over 4 micro-batches); the latter's step-20 checkpoint is loaded back into a fresh model
    # (5 steps each: the suite's time; bench/mesh_equality.py runs the pair for 20)
    short = make_mixture(tokens, root / "mix-5", sequences=80, stages=((1.0, {"kjv": 1.0}),))
    bf16 = dict(microbatch=2, precision="bf16")
    out["hsdp-bf16"] = run_mesh(config(short, ParallelConfig(dp_replicate=2, dp_shard=1), **bf16),
                                str(root / "hsdp-bf16"), 2)
    out["replicas-bf16"] = run_mesh(config(short, ParallelConfig(dp_replicate=2, dp_shard=1, offload="replicas"), **bf16),
                                    str(root / "replicas-bf16"), 2,
                                    load=str(root / "replicas-bf16" / "checkpoints" / "step-5"))
    for name, pc, workers, source in (("ep2-resumed", ParallelConfig(ep=2), 2, "ep4"),
                                      ("one-resumed", ParallelConfig(), 1, "ep4"),
                                      ("ep2-moments", ParallelConfig(ep=2, offload="moments"), 2, "ep4"),
                                      ("one-from-replicas", ParallelConfig(), 1, "replicas")):
        seed_checkpoint(out[source], 10, str(root / name))
        out[name] = run_mesh(config(mix, pc), str(root / name), workers)
    out["eval-one"] = run_eval(out["ep4"], str(root / "eval-one"), 1, ParallelConfig())
    out["eval-ep2"] = run_eval(out["ep4"], str(root / "eval-ep2"), 2, ParallelConfig(ep=2))
    return out


def _state(run, name):
    return torch.load(f"{run}/dumps/{name}.pt")


def _same(a, b):
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, differ


def test_initial_weights_are_the_same_on_1_2_and_4_ranks(runs):
    one = _state(runs["one"], "init")
    assert "blocks.3.moe.w1_EFD" in one and tuple(one["blocks.3.moe.w1_EFD"].shape) == (8, 32, 64)
    for run in ("ep4", "hsdp", "ep2-resumed"):  # 4, 4 and 2 ranks
        _same(one, _state(runs[run], "init"))


def _close(got, want, steps):
    for s in steps:
        assert abs(got[s] - want[s]) <= TOLERANCE * abs(want[s]), (s, got[s], want[s])


def test_the_loss_trajectory_is_the_same_on_any_mesh(runs):
    ref = losses(runs["one"])
    assert sorted(ref) == list(range(1, 21)) and ref[20] < ref[1] - 0.5
    _close(losses(runs["ep4"]), ref, range(1, 21))
    _close(losses(runs["hsdp"]), ref, range(1, 21))


def test_an_ep4_checkpoint_loads_on_ep2_and_one_process_and_training_resumes(runs):
    # the same full state on every mesh it is loaded on
    loaded = _state(runs["hsdp"], "loaded")
    _same(loaded, _state(runs["ep2-resumed"], "resumed"))
    _same(loaded, _state(runs["one-resumed"], "resumed"))
    assert not torch.equal(loaded["blocks.0.moe.w1_EFD"], _state(runs["one"], "init")["blocks.0.moe.w1_EFD"])
    # and training goes on from it as it went on from it on ep=4
    want = losses(runs["ep4"])
    for run in ("ep2-resumed", "one-resumed"):
        got = losses(runs[run])
        assert sorted(got) == list(range(11, 21))
        _close(got, want, range(11, 21))


def _checkpoint(run, step, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = tmp_path / f"{os.path.basename(run)}-{step}.pt"
    dcp_to_torch_save(f"{run}/checkpoints/step-{step}", str(path))
    state = torch.load(path, weights_only=False)
    return {**{f"model.{k}": v for k, v in state["model"].items()},
            **{f"optim.{fqn}.{k}": v for fqn, kv in state["optim"]["state"].items() for k, v in kv.items()}}


def test_adamw_moments_on_the_host_are_bitwise_plain_adamw_with_expert_parallelism(runs, tmp_path):
    # both resumed the ep=4 step-10 checkpoint (written without offload) on 2 processes as ep=2
    assert losses(runs["ep2-moments"]) == losses(runs["ep2-resumed"])
    _same(_state(runs["ep2-moments"], "resumed"), _state(runs["ep2-resumed"], "resumed"))
    # the step-20 checkpoint written with the offload holds the same tensors under the same keys
    with_offload = _checkpoint(runs["ep2-moments"], 20, tmp_path)
    without = _checkpoint(runs["ep2-resumed"], 20, tmp_path)
    assert any(".exp_avg_sq" in k for k in with_offload)
    _same(with_offload, without)


def test_eval_loads_the_checkpoint_sharded_on_its_own_workers(runs):
    one, two = runs["eval-one"], runs["eval-ep2"]
    assert (one["workers"], two["workers"], one["step"]) == (1, 2, 20)
    assert one["datasets"]["kjv"]["sequences"] == two["datasets"]["kjv"]["sequences"] == 24  # 12 a rank
    assert abs(one["loss"] - two["loss"]) <= 1e-6 * one["loss"] and one["loss"] < 6.2  # < ln 512: it learnt


def test_workers_are_ordered_by_rack_and_no_ep_group_crosses_one(runs, racks):
    got = racks()
    mesh, racks_of = got["mesh"], got["nodes"]
    places = mesh["places"]  # in mesh order
    assert (mesh["dp_replicate"], mesh["dp_shard"], mesh["ep"]) == (2, 2, 2)
    assert sorted(mesh["ranks"]) == [0, 1, 2, 3]
    assert [p["rack"] for p in places] == ["r0", "r0", "r1", "r1"]
    assert all(racks_of[p["node"]] == p["rack"] for p in places)  # each worker ran where its label says
    keys = [(p["rack"], p["node"], p["local"]) for p in places]
    assert keys == sorted(keys)
    for group in (places[0:2], places[2:4]):  # the ep groups, and the dp_shard groups of each replica
        assert len({p["rack"] for p in group}) == 1


def test_adamw_sharded_over_replicas_trains_like_one_process(runs):
    """Loss, gradient norm and every weight after 20 steps, not the loss alone: AdamW's scale
    invariance would hide a wrong gradient divisor behind the loss."""
    ref, got = runs["one"], runs["replicas"]
    _close(losses(got), losses(ref), range(1, 21))
    want_norm, got_norm = metric(ref, "grad_norm"), metric(got, "grad_norm")
    assert all(abs(got_norm[s] - want_norm[s]) <= NORM_TOLERANCE * want_norm[s] for s in range(1, 21))
    want, have = _state(ref, "final"), _state(got, "final")
    assert want.keys() == have.keys()
    off = {k: float((have[k] - want[k]).norm() / want[k].norm()) for k in want}
    assert max(off.values()) <= WEIGHT_TOLERANCE, max(off.items(), key=lambda kv: kv[1])
    assert not torch.equal(want["blocks.0.moe.w1_EFD"], _state(ref, "init")["blocks.0.moe.w1_EFD"])  # it trained
    # and plain HSDP on the same mesh, whose all-reduce it replaces, to the same digits
    _close(losses(got), losses(runs["hsdp"]), range(1, 21))


def test_a_replica_sharded_checkpoint_reshards_to_and_from_any_mesh(runs, tmp_path):
    # to it: the ep=4 checkpoint loads on the replica-sharded mesh as on plain HSDP
    _same(_state(runs["replicas"], "loaded"), _state(runs["hsdp"], "loaded"))
    # from it: one process resumes its step-10 state and trains on as it did
    assert sorted(losses(runs["one-from-replicas"])) == list(range(11, 21))
    _close(losses(runs["one-from-replicas"]), losses(runs["replicas"]), range(11, 21))
    # its checkpoint holds the full moments under plain AdamW's keys, as plain HSDP's does
    sharded, plain = _checkpoint(runs["replicas"], 20, tmp_path), _checkpoint(runs["hsdp"], 20, tmp_path)
    assert sharded.keys() == plain.keys() and any(k.endswith(".exp_avg_sq") for k in sharded)
    assert all(sharded[k].shape == plain[k].shape for k in plain if hasattr(plain[k], "shape"))
    moments = [k for k in plain if k.endswith(".exp_avg")]
    assert max(float((sharded[k] - plain[k]).norm() / plain[k].norm()) for k in moments) <= WEIGHT_TOLERANCE


def test_the_distributed_optimizer_in_bf16_keeps_fp32_master_slices(runs, tmp_path):
    """bf16 working weights, fp32 master weights sharded over the replicas: the same run as plain
    bf16 HSDP (whose fp32 weights are whole on each replica) within BF16_TOLERANCE in loss,
    gradient norm and weights over 5 steps. Its checkpoint holds the fp32 masters, which load
    back bitwise."""
    got, plain = runs["replicas-bf16"], runs["hsdp-bf16"]
    assert sorted(losses(got)) == list(range(1, 6))
    _close(losses(got), losses(plain), range(1, 6))
    want_norm, got_norm = metric(plain, "grad_norm"), metric(got, "grad_norm")
    assert all(abs(got_norm[s] - want_norm[s]) <= BF16_TOLERANCE * want_norm[s] for s in range(1, 6))
    want, have = _state(plain, "final"), _state(got, "final")
    assert max(float((have[k] - want[k]).norm() / want[k].norm()) for k in want) <= BF16_TOLERANCE
    # the checkpoint's weights are the fp32 masters, not the bf16 working copy, and load back as they were
    saved = _checkpoint(got, 5, tmp_path)
    w = saved["model.blocks.0.moe.w1_EFD"]
    assert w.dtype == torch.float32 and (w != w.bfloat16().float()).float().mean() > 0.5
    _same(_state(got, "final"), _state(got, "loaded"))
    assert torch.equal(_state(got, "final")["blocks.0.moe.w1_EFD"], w)
    assert not torch.equal(w, _state(got, "init")["blocks.0.moe.w1_EFD"])  # it trained

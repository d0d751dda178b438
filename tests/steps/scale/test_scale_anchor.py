"""The anchor read through our own cost model (the calibrated efficiency while computing), and
what the stacks and the offload choices change in a step's time and memory. Torch-free."""

import dataclasses

import pytest

from executor import VoyageError
from steps.moe.config import PRESETS, flops_per_token
from steps.scale.anchor import anchor_time, calibrate
from steps.scale.comms import OURS, block_flops_per_token, step_time
from steps.scale.hardware import GB200_NVL72, GIB
from steps.scale.memory import Mesh, shards
from steps.scale.mesh_plan import Choice, Setup, estimate, pick

BIG = PRESETS["535b-a23b"]
FULL = Setup(model=BIG, batch=11_264, context=4095, gpus=792)
EP64 = Mesh(11, 64, 64)


def test_the_calibration_reproduces_the_anchors_step():
    cal = FULL.calibration
    assert cal.target_s == 17.0
    again = anchor_time(GB200_NVL72, cal.efficiency, 1.1)
    assert again.total == pytest.approx(17.0, rel=1e-9)
    assert 0.2 < cal.efficiency < 0.6 and cal.time == again
    # the anchor pads its routed experts to capacity 1.15 on every rank, nothing more
    routed = block_flops_per_token(BIG, 4095)[1]
    assert again.routed_extra == pytest.approx(16 * 4095 * 3 * routed * 0.15 / (2.5e15 * cal.efficiency))
    assert again.masked_attention == 0  # its window kernel skips masked blocks (assumed)
    a2a = next(c for c in again.collectives if c.name == "expert all-to-all")
    assert a2a.exposed == a2a.seconds  # no overlap assumed for the anchor
    # the two FLOP counts: 17.0 s is 21.3% MFU by the trainer's formula, 22.9% by the anchor's own
    assert cal.mfu == pytest.approx(11_264 * 4095 * flops_per_token(BIG, 4095) / (704 * 2.5e15 * 17.0))
    assert round(cal.mfu, 3) == 0.213 and cal.count_ratio == pytest.approx(0.229 / cal.mfu)
    assert 1.07 < cal.count_ratio < 1.08


def test_a_what_if_mfu_scales_the_anchors_step_and_the_efficiency_follows():
    faster = calibrate(GB200_NVL72, 0.3)
    assert faster.target_s == pytest.approx(17.0 * 0.229 / 0.3)
    assert faster.efficiency > FULL.calibration.efficiency
    plan = estimate(dataclasses.replace(FULL, mfu=0.3), Choice(EP64, 1, "selective", "moments"))
    assert plan.time.efficiency == faster.efficiency
    with pytest.raises(VoyageError, match="mfu must lie in"):
        calibrate(GB200_NVL72, 0.0)
    with pytest.raises(VoyageError, match="cannot take .* even at the GPU's peak"):
        calibrate(GB200_NVL72, 0.99)


def test_a_given_efficiency_bypasses_the_calibration():
    plan = estimate(dataclasses.replace(FULL, efficiency=0.5), Choice(EP64, 1, "selective", "moments"))
    slower = estimate(dataclasses.replace(FULL, efficiency=0.25), Choice(EP64, 1, "selective", "moments"))
    assert plan.time.efficiency == 0.5 and plan.time.executed == pytest.approx(slower.time.executed / 2)
    assert plan.time.total < slower.time.total


def _time(stack, **kw):
    args = dict(context=4095, share=16, microbatch=1, checkpointing="selective", efficiency=0.35,
                replicas_per_rack=1, racks=11, offload="moments", load=1.1)
    return step_time(BIG, EP64, GB200_NVL72, **{**args, **kw}, stack=stack)


def test_what_each_difference_between_the_stacks_costs():
    ours = _time(OURS)
    a2a = next(c for c in ours.collectives if c.name == "expert all-to-all")
    assert a2a.calls == 48 * 16 * 4 and a2a.exposed == pytest.approx(a2a.seconds * 3 / 4)  # forward combine hidden
    serial = _time(dataclasses.replace(OURS, combine_beside_shared=False))
    assert next(c for c in serial.collectives if c.name == "expert all-to-all").exposed == pytest.approx(a2a.seconds)
    skips = _time(dataclasses.replace(OURS, window_over_all_keys=False))
    assert skips.masked_attention == 0 and ours.masked_attention > 0
    padded = _time(dataclasses.replace(OURS, capacity_factor=1.15))
    assert padded.routed_extra == pytest.approx(ours.routed_extra * 1.5)  # 15% of the rows against 10%
    # capacity caps what the busiest rank receives: the all-to-all moves at most 1.15x
    hot = _time(dataclasses.replace(OURS, capacity_factor=1.15), load=1.4)
    cold = _time(OURS, load=1.4)
    bytes_ = {t: next(c for c in t.collectives if c.name == "expert all-to-all").bytes for t in (hot, cold)}
    assert bytes_[hot] == pytest.approx(bytes_[cold] * 1.15 / 1.4)


def test_offload_moves_the_state_and_charges_its_traffic():
    sh = shards(BIG, EP64)
    params = sh.total(48)
    plans = {off: estimate(dataclasses.replace(FULL, efficiency=0.35), Choice(EP64, 1, "selective", off))
             for off in ("none", "moments", "all")}
    rows = {off: {r.name: r.bytes for r in p.rows} for off, p in plans.items()}
    assert rows["none"]["Adam moments (2 x fp32)"] == 8 * params and plans["none"].host == 0
    assert rows["moments"]["Adam moments (2 x fp32)"] == 0 and plans["moments"].host == 8 * params
    assert rows["moments"]["parameters (fp32 shards)"] == 4 * params
    assert rows["all"]["parameters (fp32 shards)"] == rows["all"]["gradients (fp32 shards)"] == 0
    assert plans["all"].host == 16 * params
    assert rows["all"]["offloaded shards in transit (fp32)"] == 3 * 4 * (sh.dense_per_block + sh.experts_per_block)
    assert plans["none"].peak - plans["moments"].peak == pytest.approx(8 * params)
    # moments: both moments each way over C2C beside the update; exposed only past the update
    c2c = next(c for c in plans["moments"].time.collectives if c.link == "host")
    # the two GPUs of a Grace stream theirs at once: its C2C (each way) and its LPDDR5X (both ways)
    # are shared; the memory is the slower, 4 x 66.7 GB at 410 GB/s (0.65 s, not 0.19 s)
    assert c2c.bytes == 8 * params
    assert c2c.seconds == pytest.approx(max(2 * 8 * params / (450e9 * 0.8), 2 * 16 * params / (512e9 * 0.8)))
    assert c2c.seconds == pytest.approx(0.65, abs=0.01)
    assert c2c.exposed == pytest.approx(c2c.seconds - plans["moments"].time.optimizer)
    # all: the update on a Grace shared by 2 GPUs at torch's CPU AdamW rate, the shards over C2C
    hw = GB200_NVL72
    assert plans["all"].time.optimizer == pytest.approx(params * 40 / (512e9 * 0.8 * 0.28 / 2))
    assert any(c.name.startswith("offloaded shards") for c in plans["all"].time.collectives)
    assert plans["all"].time.total > plans["moments"].time.total  # the CPU update costs seconds
    assert hw.host_update_bytes_per_s() < hw.link_bytes_per_s("host")


def test_host_memory_is_a_limit_too():
    tiny_host = dataclasses.replace(FULL, hardware=dataclasses.replace(GB200_NVL72, host_gb=10.0),
                                    memory_target_gib=170.0)  # the GPU's side fits: the host's is what misses
    with pytest.raises(VoyageError, match="needs 62.1 GiB of host memory a GPU, .* more than 75% of the 10 GB"):
        pick(tiny_host, dp_replicate=11, dp_shard=64, ep=64, microbatch=1, checkpointing="selective",
             offload="moments")
    with pytest.raises(VoyageError, match="offload must be one of"):
        pick(FULL, offload="host")


def test_the_anchors_micro_batch_is_the_one_its_published_peak_picks():
    """ANCHOR_MICROBATCH is not published: under the assumed full recompute with the moments on
    the host, it is the micro-batch whose peak by our memory model comes nearest the anchor's
    measured 137.9 GiB."""
    from steps.scale.anchor import ANCHOR, ANCHOR_CHECKPOINTING, ANCHOR_MICROBATCH

    # through the anchor's stack as assumed: XLA's static allocator (no fragmentation reserve) and
    # the loss over whole logits (ours is fused and chunked)
    whole_loss = dataclasses.replace(FULL.model, loss_chunk=FULL.model.vocab_size)
    setup = dataclasses.replace(FULL, efficiency=0.35, model=whole_loss, fragmentation=0.0)
    peaks = {mb: estimate(setup, Choice(EP64, mb, ANCHOR_CHECKPOINTING, "moments")).peak / GIB
             for mb in (1, 2, 4, 8, 16)}
    assert min(peaks, key=lambda mb: abs(peaks[mb] - ANCHOR.peak_gib)) == ANCHOR_MICROBATCH
    # within 5%: one chunk of our fused head keeps 10 bytes a logit where torch's unchunked
    # cross-entropy (the model before the chunked loss, 2% off) kept 12
    assert abs(peaks[ANCHOR_MICROBATCH] / ANCHOR.peak_gib - 1) < 0.05

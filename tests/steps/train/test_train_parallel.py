"""The mesh as config, in one process: ParallelConfig's checks, the topology order and rack
placement (pure functions), the sharding applied in torch's fake process group (the 535B model at
704 ranks; every layout of the tiny model, whose shards, assembled rank by rank, must be exactly
the one-process initialization), activation checkpointing, and the all-to-all expert path on a
one-rank group. The multi-process runs are in test_train_mesh.py."""

import contextlib
import copy
import dataclasses

import pytest
import torch
import torch.distributed as dist

from executor import VoyageError
from steps.moe.config import PRESETS
from steps.train.config import ParallelConfig
from steps.train.topology import Place, check_ep_groups, mesh_order, rack_capacity, rack_selectors

TINY = dataclasses.replace(PRESETS["tiny"], vocab_size=512)
FOUR = dataclasses.replace(TINY, n_layers=2, n_experts=4)  # few experts: shards finer than an expert
BIG = PRESETS["535b-a23b"]


# --- ParallelConfig ------------------------------------------------------------------------------

def test_the_anchor_mesh_validates_and_resolves():
    pc = ParallelConfig(dp_replicate=11, dp_shard=-1, ep=64).validate(704, BIG, 11_264, 4)
    assert (pc.dp_replicate, pc.dp_shard, pc.ep, pc.efsdp, pc.dp) == (11, 64, 64, 1, 704)
    assert ParallelConfig(dp_replicate=-1, dp_shard=1).resolve(8).dp_replicate == 8


@pytest.mark.parametrize("pc, world, kwargs, message", [
    (ParallelConfig(dp_replicate=11, dp_shard=64), 792, {}, r"trainer\.parallel: dp_replicate 11 x dp_shard 64 = 704 "
                                                            r"ranks, but the step has 792 workers"),
    (ParallelConfig(dp_replicate=5), 792, {}, r"trainer\.parallel: dp_replicate 5 x dp_shard \(rest\) does not divide"),
    (ParallelConfig(ep=48), 72, {}, r"trainer\.parallel\.ep: 48 does not divide dp_shard 72"),
    (ParallelConfig(ep=5), 10, {"model": BIG}, r"trainer\.parallel\.ep: 5 does not divide the model's 384 routed"),
    (ParallelConfig(dp_replicate=11), 792, {"model": BIG, "batch_size": 11_264},
     r"data\.batch_size: 11264 sequences do not divide across the 792 data-parallel ranks of the mesh "
     r"dp_replicate 11 x dp_shard 72"),
    (ParallelConfig(dp_replicate=11), 704, {"batch_size": 11_264, "microbatch": 3}, r"trainer\.microbatch: 3 does not"),
    (ParallelConfig(dp_replicate=11, ep=64), 704, {"ranks_per_rack": 72}, r"ep: 64 does not divide the 72 training "
                                                                          r"ranks of a rack"),
])
def test_a_mesh_that_does_not_divide_names_what(pc, world, kwargs, message):
    with pytest.raises(VoyageError, match=message):
        pc.validate(world, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"dp_replicate": -1, "dp_shard": -1}, "only one of"), ({"dp_shard": 0}, r"dp_shard must be >= 1 or -1"),
    ({"ep": 0}, r"ep must be >= 1"), ({"checkpointing": "some"}, "checkpointing must be one of"),
])
def test_bad_fields_are_refused(kwargs, message):
    with pytest.raises(VoyageError, match=message):
        ParallelConfig(**kwargs)


# --- topology ------------------------------------------------------------------------------------

def test_mesh_order_sorts_by_rack_node_and_local_index_whatever_the_rank_numbering():
    # Ray Train's world ranks interleave two racks and two nodes per rack
    places = [Place("r1", "n3", 1), Place("r0", "n1", 0), Place("r1", "n2", 0), Place("r0", "n0", 1),
              Place("r0", "n1", 1), Place("r1", "n3", 0), Place("r0", "n0", 0), Place("r1", "n2", 1)]
    order = mesh_order(places)
    assert [places[r] for r in order] == sorted(places)
    assert [places[r].rack for r in order] == ["r0"] * 4 + ["r1"] * 4
    check_ep_groups(order, places, 4)  # one rack each
    with pytest.raises(VoyageError, match=r"ep: the expert-parallel group of mesh positions 0\.\.7 spans racks "
                                          r"\{'r0': 4, 'r1': 4\}"):
        check_ep_groups(order, places, 8)
    uneven = places[:6]  # 3 + 3: an ep group of 2 straddles the racks
    with pytest.raises(VoyageError, match="positions 2..3"):
        check_ep_groups(mesh_order(uneven), uneven, 2)


def test_workers_are_placed_rack_by_rack_in_whole_ep_groups():
    nodes = [{"Alive": True, "Labels": {"marin.rack": f"r{r:02d}"}, "Resources": {"CPU": 72, "GPU": 4, "GB200": 4}}
             for r in range(11) for _ in range(18)]
    nodes.append({"Alive": True, "Labels": {}, "Resources": {"CPU": 8}})  # a head without GPUs or rack
    capacity = rack_capacity(nodes, {"CPU": 16, "GPU": 1, "GB200": 1})
    assert capacity == {f"r{r:02d}": 72 for r in range(11)}
    selectors = rack_selectors(704, 64, capacity)
    assert len(selectors) == 704 and selectors[0] == {"marin.rack": "r00"} and selectors[-1] == {"marin.rack": "r10"}
    assert all(sum(s["marin.rack"] == f"r{r:02d}" for s in selectors) == 64 for r in range(11))
    assert rack_selectors(4, 2, {}) is None  # no rack labels: Ray places freely
    with pytest.raises(VoyageError, match=r"768 workers in groups of ep=64 .* r00: 72"):
        rack_selectors(768, 64, capacity)  # 12 groups of 64 on 11 racks


# --- sharding in a fake process group ------------------------------------------------------------

@contextlib.contextmanager
def fake_world(world: int, rank: int = 0):
    """This process as `rank` of a fake process group of `world` ranks. DTensor's sharding cache
    keys meshes without the rank (one process is one rank in real use), so playing several ranks
    in turn clears it first."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch._C._clear_DTensor_sharding_propagator_cache()
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def _sharded(cfg, pc):
    from steps.moe.model import MoETransformer
    from steps.train.parallel import build_meshes, parallelize

    meshes = build_meshes(pc, "cpu")
    with torch.device("meta"):
        model = MoETransformer(cfg)
    return parallelize(model, meshes, pc), meshes


def test_the_535b_model_shards_at_704_ranks_on_meta():
    with fake_world(704):  # two of its 48 layers: the same shapes, a twentieth of the time
        pc = ParallelConfig(dp_replicate=11, dp_shard=64, ep=64, checkpointing="selective")
        model, meshes = _sharded(dataclasses.replace(BIG, n_layers=2), pc)
        shapes = {n: tuple(p.to_local().shape) for n, p in model.named_parameters()}
        assert meshes.ep_groups()[0] == list(range(64)) and len(meshes.ep_groups()) == 11
        assert all(p.device.type == "meta" for p in model.parameters())
    assert shapes["blocks.1.moe.w1_EFD"] == (6, 1536, 6144)  # 6 whole experts a rank
    assert shapes["blocks.1.moe.w2_EDF"] == (6, 6144, 1536)
    assert shapes["embed.weight"] == (2004, 6144)  # ceil(128256 / 64)
    assert shapes["blocks.1.attn.wq.weight"] == (96, 6144)


LAYOUTS = [  # (world, mesh) for 4 experts: every placement an expert weight can get
    (2, ParallelConfig(ep=2)),  # experts Shard(0) over ep
    (8, ParallelConfig(dp_shard=4, dp_replicate=2, ep=2)),  # HSDP, then FSDP over efsdp 2 (_StridedShard)
    (8, ParallelConfig(ep=2)),  # efsdp 4 > 2 experts a rank: experts sharded on dim 1
    (8, ParallelConfig(dp_replicate=4, dp_shard=2)),  # no ep: 4 experts over 2 shards
    (8, ParallelConfig()),  # no ep, 8 shards > 4 experts: dim 1
]


@pytest.mark.parametrize("world, pc", LAYOUTS, ids=lambda v: str(v) if isinstance(v, int) else v.describe())
def test_shards_drawn_rank_by_rank_are_the_one_process_initialization(world, pc):
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from steps.moe.model import MoETransformer

    whole = MoETransformer(FOUR)
    whole.init_weights(seed=7)
    want = dict(whole.named_parameters())
    got = {n: torch.full_like(p, float("nan")) for n, p in want.items()}
    for rank in range(world):
        with fake_world(world, rank):
            model, _ = _sharded(FOUR, pc)
            model.to_empty(device="cpu")
            model.init_weights(seed=7)
            for name, p in model.named_parameters():
                shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
                got[name][tuple(slice(o, o + n) for o, n in zip(offset, shape))] = p.to_local()
    for name in want:
        assert torch.equal(got[name], want[name].detach()), name


# --- activation checkpointing and the expert path, one process -----------------------------------

def _grads(model, tokens):
    model.zero_grad()
    logits, router_loss = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten()) + router_loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_checkpointing_changes_no_number_and_counts_loads_once(mode):
    from steps.moe.model import MoETransformer
    from steps.train.recompute import apply_checkpointing

    tokens = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    plain, again = MoETransformer(FOUR), MoETransformer(FOUR)
    plain.init_weights(1)
    again.init_weights(1)
    apply_checkpointing(again, mode)
    (l1, g1), (l2, g2) = _grads(plain, tokens), _grads(again, tokens)
    assert torch.equal(l1, l2) and all(torch.equal(g1[n], g2[n]) for n in g1)
    for a, b in zip(plain.moe_layers(), again.moe_layers()):
        assert torch.equal(a.expert_load_E, b.expert_load_E) and a.expert_load_E.sum() == 2 * 16 * FOUR.top_k


def test_all_to_all_expert_path_matches_the_local_one_on_a_one_rank_group():
    from steps.moe.expert_parallel import AllToAllExperts
    from steps.moe.model import MoETransformer

    tokens = torch.randint(0, 512, (3, 10), generator=torch.Generator().manual_seed(2))
    local, a2a = MoETransformer(TINY), MoETransformer(TINY)
    local.init_weights(3)
    a2a.init_weights(3)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for moe in a2a.moe_layers():
            moe.experts = AllToAllExperts(dist.group.WORLD, TINY.n_experts)
        (l1, g1), (l2, g2) = _grads(local, tokens), _grads(a2a, tokens)
    finally:
        dist.destroy_process_group()
    assert torch.allclose(l1, l2, rtol=1e-6, atol=0)
    assert all(torch.allclose(g1[n], g2[n], rtol=1e-5, atol=1e-7) for n in g1)


def _train_steps(pc, steps=4, weights=None, built=None):
    """Losses of a few optimizer steps of the FOUR model on one process under `pc` (and, into
    `weights`, the final weights and AdamW state; into `built`, the optimizer)."""
    from steps.train.config import OptimizerConfig
    from steps.train.loop import build_model, build_optimizer
    from steps.train.parallel import build_parallel, clip_grad_norm

    parallel = build_parallel(pc, torch.device("cpu"), "fp32")
    try:
        model = build_model(FOUR, 5, torch.device("cpu"), parallel)
        # the optimizer the trainer builds for this setting (HostMomentsAdamW for "moments")
        offload = pc.offload if pc.offload in ("moments", "replicas") else "none"
        optimizer = build_optimizer(model, OptimizerConfig(lr=1e-2), torch.device("cpu"), offload)
        if built is not None:
            built.append(optimizer)
        tokens = torch.randint(0, 512, (2, 17), generator=torch.Generator().manual_seed(0))
        losses = []
        for _ in range(steps):  # one batch again and again: the loss must fall
            logits, router_loss = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            (loss + router_loss).backward()
            clip_grad_norm(model.parameters(), 1.0, parallel.norm_group)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        if weights is not None:
            weights.update({n: p.detach().clone() for n, p in model.named_parameters()})
            weights.update({f"{n}.{k}": optimizer.state[p][k].clone() for n, p in model.named_parameters()
                            for k in ("exp_avg", "exp_avg_sq", "step")})
        return losses
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_offloaded_state_trains_like_one_process():
    plain = _train_steps(ParallelConfig())
    offloaded = _train_steps(ParallelConfig(offload="all"))  # FSDP2 on a one-rank group, state on the host
    assert all(abs(a - b) <= 1e-5 * a for a, b in zip(plain, offloaded)), (plain, offloaded)
    assert offloaded[-1] < offloaded[0]


def test_host_moments_are_bitwise_plain_adamw_on_the_cpu():
    from steps.train.offload import HostMomentsAdamW

    plain, host, built = {}, {}, []
    moments = _train_steps(ParallelConfig(offload="moments"), weights=host, built=built)
    assert [type(o) for o in built] == [HostMomentsAdamW]  # the moments run really went through the host optimizer
    assert _train_steps(ParallelConfig(), weights=plain) == moments
    assert plain.keys() == host.keys() and all(torch.equal(plain[k], host[k]) for k in plain)


@pytest.mark.parametrize("first, then", [("none", "moments"), ("moments", "none"), ("none", "none")])
def test_an_optimizer_state_loads_with_or_without_host_moments(first, then):
    from steps.moe.model import MoETransformer
    from steps.train.config import OptimizerConfig
    from steps.train.loop import build_optimizer

    tokens = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(1))

    def train(model, opt, steps):
        for _ in range(steps):
            logits, router_loss = model(tokens[:, :-1])
            (torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()) + router_loss).backward()
            opt.step()
            opt.zero_grad()

    a, b = MoETransformer(FOUR), MoETransformer(FOUR)
    a.init_weights(2)
    opt_a = build_optimizer(a, OptimizerConfig(lr=1e-2), torch.device("cpu"), first)
    train(a, opt_a, 2)
    b.load_state_dict(a.state_dict())
    opt_b = build_optimizer(b, OptimizerConfig(lr=1e-2), torch.device("cpu"), then)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # a copy: a state dict holds the live tensors
    train(a, opt_a, 2)
    train(b, opt_b, 2)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))

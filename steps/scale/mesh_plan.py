"""The plan of a training step at full scale: a mesh's per-GPU memory against the GPU's, its
per-step communication against its compute, the checks that refuse a mesh that does not divide
or does not fit, and the search for the fastest meshes that do. Torch-free: the figures come
from the closed forms (steps/scale/memory.py, comms.py) or from a measurement
(steps/scale/measure.py) passed in.

    setup = Setup(model=PRESETS["535b-a23b"], batch=11_264, context=4095, gpus=792)
    plan, alternatives = pick(setup)          # the fastest that fits, and the runners-up
    plan = estimate(setup, Choice(Mesh(11, 64, 64), microbatch=1, checkpointing="selective",
                                  offload="moments"))
    print(steps.scale.table.format_plan(plan, alternatives))

Step times are at the efficiency while computing calibrated on the anchor (steps/scale/anchor.py)
unless `Setup.efficiency` fixes one: the figure to hold against the anchor's 17.0 s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from executor import VoyageError
from steps.scale import memory as mem
from steps.scale.anchor import ANCHOR, Calibration, calibrate
from steps.scale.comms import OFFLOADS, OURS, StepTime, flops_per_token, step_time
from steps.scale.hardware import GB, GB200_NVL72, GIB, Hardware
from steps.scale.memory import BF16, FP32, MODES, Mesh, Tokens

TIE = 0.02  # relative step-time difference the search treats as a tie

# The memory a plan may use a GPU, by default. Why 140 GiB and not the 173 GiB a GB200 has: the
# anchor ran at 137.9 GiB under XLA's static allocator (no fragmentation, buffers sized at compile
# time), so 140 GiB is the figure a plan of ours is held to beside it; the 33 GiB (19%) left are
# for what no closed form sees: kernels' workspaces (flash attention, grouped GEMM, NCCL's
# symmetric memory), memory-snapshot and profiler buffers, a little less usable HBM on a
# degraded GPU, and the traced activations' distance from the fused GPU kernels. What is
# modelled is in the table on lines of its own: the CUDA context, NCCL's buffers, and a
# fragmentation reserve of the caching allocator.
MEMORY_TARGET_GIB = 140.0
# torch's caching allocator holds more than it hands out: blocks of one size cannot serve
# another, and the dropless all-to-all allocates rows of a size the routing decides each
# micro-batch. Reserved over allocated, assumed 5% of the step's transient bytes (activations
# and buffers) with expandable segments on; bench/gpu_all.sh's block check reads
# max_memory_reserved against max_memory_allocated on a GPU to replace it.
FRAGMENTATION = 0.05
# A plan must stay this share of the target under it: what the closed forms and the traces do not
# see (the GPU's fused kernels, NCCL beyond its documented buffers, a skew at the cap in every
# block at once) is not free, and a plan that fits by 2% fits by luck.
MIN_MARGIN = 0.05


@dataclass(frozen=True)
class Setup:
    """What a plan is for: the model, the batch and the cluster, and the assumptions."""

    model: Any  # steps.moe.config.MoEConfig
    batch: int  # sequences per optimizer step
    context: int  # tokens a sequence feeds (the mixture's seq_len - 1)
    gpus: int  # GPUs of the cluster
    mfu: float = ANCHOR.mfu  # the anchor's MFU over its whole step (its count): calibrates the efficiency
    efficiency: float = 0.0  # share of peak while computing; 0: calibrated on the anchor at `mfu`
    hardware: Hardware = GB200_NVL72
    load_mean: float = 1.1  # busiest expert-parallel rank's rows over the mean, on average (time)
    load_peak: float = 1.25  # ... in the worst micro-batch (memory headroom: dropless buffers), unless
    # the model bounds it (MoEConfig.rank_capacity_factor): then the buffers are sized at the bound
    memory_target_gib: float = MEMORY_TARGET_GIB  # a plan above it is refused (MEMORY_TARGET_GIB: why)
    fragmentation: float = FRAGMENTATION  # the allocator's reserve, a share of the transient bytes
    min_margin: float = MIN_MARGIN  # share of the target a plan must leave free (MIN_MARGIN: why)

    def __post_init__(self) -> None:
        hbm = self.hardware.hbm_bytes / GIB
        if not 0 < self.memory_target_gib <= hbm:
            raise VoyageError(f"memory_target_gib must lie in (0, {hbm:.1f}] (the {self.hardware.hbm_gb:g} GB of a "
                              f"{self.hardware.name} GPU), got {self.memory_target_gib:g}")
        if not 0 <= self.fragmentation < 1:
            raise VoyageError(f"fragmentation must lie in [0, 1), got {self.fragmentation:g}")
        if not 0 <= self.min_margin < 1:
            raise VoyageError(f"min_margin must lie in [0, 1), got {self.min_margin:g}")

    @property
    def skew_bound(self) -> float:
        """The busiest rank's rows over the mean that the buffers are sized for: the model's rank
        capacity when it has one (the dispatch drops past it), else `load_peak` (unbounded: a
        worse micro-batch does not fit)."""
        return getattr(self.model, "rank_capacity_factor", 0.0) or self.load_peak

    @property
    def bounded(self) -> bool:
        return bool(getattr(self.model, "rank_capacity_factor", 0.0))

    def skew_words(self) -> str:
        """The skew the plan tolerates, in words."""
        if self.bounded:
            return (f"dropless up to {self.skew_bound:g}x the mean rows a rank (MoEConfig.rank_capacity_factor); "
                    f"past it assignments are dropped and counted (metrics: moe_dropped, moe_dropped_share); the "
                    f"buffers are sized at the bound")
        return (f"unbounded (dropless whatever the skew): the buffers are sized for {self.load_peak:g}x the mean "
                f"rows a rank; a worse micro-batch (up to {self.model.n_experts}x) does not fit")

    @property
    def target_bytes(self) -> float:
        return self.memory_target_gib * GIB

    @property
    def calibration(self) -> Calibration:
        """The anchor's configuration through the same model, at the efficiency that makes it
        take its step (17.0 s at the published 22.9%; `mfu` what-ifs scale it)."""
        return calibrate(self.hardware, self.mfu, self.load_mean, self.context)

    @property
    def compute_efficiency(self) -> float:
        """The share of peak the kernels reach while computing: `efficiency`, or the calibrated one."""
        return self.efficiency or self.calibration.efficiency

    @property
    def racks(self) -> int:
        g = self.hardware.gpus_per_rack
        return max(1, -(-self.gpus // g))

    @property
    def gpus_per_rack(self) -> int:
        """GPUs of one rack this cluster has (fewer than a rack: all of them)."""
        return min(self.gpus, self.hardware.gpus_per_rack)


@dataclass(frozen=True)
class Choice:
    """What the voyage picks: the mesh, the micro-batch, checkpointing, and what lives on the
    host (`offload`, steps.train.config.ParallelConfig: none, moments, all)."""

    mesh: Mesh
    microbatch: int
    checkpointing: str
    offload: str = "none"

    def describe(self) -> str:
        m = self.mesh
        ep = f"EP{m.ep}" + (f" x efsdp {m.efsdp}" if m.efsdp > 1 else "")
        ac = "no" if self.checkpointing == "none" else self.checkpointing
        return (f"dp_replicate {m.dp_replicate} x dp_shard {m.dp_shard} ({ep}), micro-batch {self.microbatch}, "
                f"{ac} checkpointing, {OFFLOAD_WORDS[self.offload]}")


OFFLOAD_WORDS = {"none": "Adam on the GPU", "moments": "Adam moments on the host",
                 "all": "weights, grads and Adam on the host",
                 "replicas": "fp32 masters, grads and Adam sharded over the replicas"}


@dataclass(frozen=True)
class Activations:
    """Activation bytes of a micro-batch on one rank: per layer kind (global, windowed)."""

    kept: dict[bool, int]  # is_global -> bytes one block keeps
    working: dict[bool, int]  # is_global -> peak above that in its backward
    head: int
    source: str  # "formula" or "traced"


@dataclass(frozen=True)
class Row:
    name: str
    bytes: float
    note: str = ""


@dataclass(frozen=True)
class MeshPlan:
    """A choice's memory and time. The peak is computed at once; the memory rows and the step
    time when first read (the search ranks only what fits, and prints only a few)."""

    setup: Setup
    choice: Choice
    racks: int  # racks the mesh spans
    replicas_per_rack: int
    peak: float  # bytes
    sources: dict[str, str] = field(default_factory=dict)
    host: float = 0.0  # bytes of host memory a GPU's offloaded state takes
    make_rows: Callable[[], tuple[Row, ...]] = field(default=tuple, repr=False, compare=False)
    make_time: Callable[[], StepTime] | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def rows(self) -> tuple[Row, ...]:
        return self.make_rows()

    @functools.cached_property
    def time(self) -> StepTime:
        return self.make_time()

    @property
    def ranks(self) -> int:
        return self.choice.mesh.ranks

    @property
    def margin(self) -> float:
        """Bytes between the peak and the memory target (negative: above it)."""
        return self.setup.target_bytes - self.peak

    @property
    def margin_share(self) -> float:
        """The margin as a share of the target."""
        return self.margin / self.setup.target_bytes

    @property
    def fits(self) -> bool:
        """At least `min_margin` of the memory target under it on the GPU, and under the host's limit."""
        return self.margin_share >= self.setup.min_margin and self.fits_host

    def verdict(self) -> str:
        """`fits, X GiB (Y%) under the target`, or what is over: never a bare "fits"."""
        target = f"the {self.setup.memory_target_gib:g} GiB target"
        share = f"{self.margin / GIB:.2f} GiB ({self.margin_share:.1%})"
        if self.margin < 0:
            return f"ABOVE {target} by {-self.margin / GIB:.2f} GiB: refused"
        if self.margin_share < self.setup.min_margin:
            return f"{share} under {target}, less than the {self.setup.min_margin:.0%} margin kept: refused"
        if not self.fits_host:
            return f"under {target}, but its host memory does not fit: refused"
        return f"fits, {share} under {target} (at least {self.setup.min_margin:.0%} kept)"

    @property
    def fits_host(self) -> bool:
        hw = self.setup.hardware
        return self.host <= hw.host_limit * hw.host_gb * GB

    @property
    def predicted_mfu(self) -> float:
        """MFU over the whole step by the trainer's FLOP count, at the plan's efficiency."""
        s = self.setup
        flops = s.batch * s.context * flops_per_token(s.model, s.context)
        return flops / (self.ranks * s.hardware.peak_flops * self.time.total)


# -- checks ------------------------------------------------------------------------------------


def placement(setup: Setup, mesh: Mesh) -> tuple[int, int]:
    """(racks the mesh spans, dp_shard groups a rack holds), or a VoyageError naming what does
    not divide. A dp_shard group (and the ep group inside it) stays inside one rack: its FSDP and
    all-to-all traffic then runs on NVLink."""
    g, hw = setup.gpus_per_rack, setup.hardware
    if setup.gpus < 1:
        raise VoyageError(f"gpus must be positive, got {setup.gpus}")
    if setup.gpus > hw.gpus_per_rack and setup.gpus % hw.gpus_per_rack:
        raise VoyageError(f"gpus: {setup.gpus} GPUs are not whole racks of {hw.gpus_per_rack} ({hw.name})")
    if mesh.dp_shard > g:
        raise VoyageError(f"dp_shard: {mesh.dp_shard} ranks do not fit in one rack of {g} GPUs (a dp_shard "
                          f"group, and the expert-parallel group inside it, must stay on one rack's NVLink)")
    if mesh.dp_shard % mesh.ep:
        raise VoyageError(f"ep: {mesh.ep} does not divide dp_shard {mesh.dp_shard} (expert parallelism borrows its "
                          f"ranks from dp_shard)")
    per_rack = g // mesh.dp_shard
    racks = -(-mesh.dp_replicate // per_rack)
    if racks > setup.racks:
        raise VoyageError(f"gpus: dp_replicate {mesh.dp_replicate} x dp_shard {mesh.dp_shard} needs {racks} racks "
                          f"({per_rack} group{'s' * (per_rack > 1)} of {mesh.dp_shard} a rack); the cluster has "
                          f"{setup.racks} ({setup.gpus} GPUs)")
    return racks, min(per_rack, mesh.dp_replicate)


def check(setup: Setup, choice: Choice) -> tuple[int, int]:
    """Every divisibility the mesh needs (experts, batch, micro-batch, racks), one VoyageError
    naming the first that fails; returns `placement`."""
    m, cfg = choice.mesh, setup.model
    if min(m.dp_replicate, m.dp_shard, m.ep, choice.microbatch) < 1:
        raise VoyageError(f"mesh: dp_replicate, dp_shard, ep and microbatch must be positive ({choice.describe()})")
    if cfg.n_experts % m.ep:
        raise VoyageError(f"ep: {m.ep} does not divide the model's {cfg.n_experts} routed experts")
    if choice.checkpointing not in MODES:
        raise VoyageError(f"checkpointing must be one of {MODES}, got {choice.checkpointing!r}")
    where = placement(setup, m)
    if setup.batch % m.ranks:
        raise VoyageError(f"batch: {setup.batch:,} sequences do not divide over the {m.ranks} data-parallel ranks of "
                          f"dp_replicate {m.dp_replicate} x dp_shard {m.dp_shard}")
    share = setup.batch // m.ranks
    if share % choice.microbatch:
        raise VoyageError(f"microbatch: {choice.microbatch} does not divide the {share} sequences of each rank")
    return where


# -- estimate -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def layer_kinds(cfg: Any) -> dict[bool, int]:
    """A layer of each kind the model has: is_global -> its index."""
    return {cfg.is_global(i): i for i in range(cfg.n_layers)}


@functools.lru_cache(maxsize=64)
def n_global_layers(cfg: Any) -> int:
    return sum(cfg.is_global(i) for i in range(cfg.n_layers))


def formula_activations(setup: Setup, choice: Choice) -> Activations:
    """The closed-form activation figures (steps/scale/memory.py) of a choice."""
    cfg, t = setup.model, Tokens.of(setup.model, choice.microbatch, setup.context, choice.mesh.ep)
    layers = layer_kinds(cfg)
    mode = choice.checkpointing
    return Activations(kept={g: mem.kept_bytes(cfg, i, t, mode) for g, i in layers.items()},
                       working={g: mem.working_bytes(cfg, i, t, mode, choice.mesh) for g, i in layers.items()},
                       head=mem.head_bytes(cfg, choice.microbatch, setup.context), source="formula")


def estimate(setup: Setup, choice: Choice, acts: Activations | None = None, shards: mem.Shards | None = None,
             sources: dict[str, str] | None = None) -> MeshPlan:
    """The plan of `choice`: memory rows, peak and step time. Shards and activations from the
    closed forms unless measured ones are given."""
    racks, per_rack = check(setup, choice)
    cfg, m = setup.model, choice.mesh
    acts = acts or formula_activations(setup, choice)
    sh = shards or mem.shards(cfg, m)
    params = sh.total(cfg.n_layers)
    n_global = n_global_layers(cfg)
    kept = n_global * acts.kept.get(True, 0) + (cfg.n_layers - n_global) * acts.kept.get(False, 0)
    working = max(acts.working.values())
    gathered = mem.gathered_block(sh, m)
    ag = 2 * BF16 * gathered
    rs = FP32 * gathered
    t = Tokens.of(cfg, choice.microbatch, setup.context, m.ep)
    skew = setup.skew_bound
    a2a = BF16 * t.N * cfg.dim * (1 + skew) if m.ep > 1 else 0
    # kept rows at the cap, not the mean load: every block's busiest rank may sit at it at once
    headroom = mem.imbalance_bytes(cfg, t, choice.checkpointing, skew, skew)
    head_unit = BF16 * (sh.head * m.dp_shard)
    off = choice.offload
    moments = {"none": 2, "moments": 0, "all": 0, "replicas": 2 / m.dp_replicate}[off] * FP32 * params
    # the distributed optimizer (steps/train/replicas.py): bf16 working weights, fp32 master slices,
    # an fp32 accumulator of the whole gradient shard, reduce-scattered in place (the reduced slice
    # is the accumulator's own chunk: no buffer of its own)
    replicas = off == "replicas"
    weights = 0 if off == "all" else (BF16 if replicas else FP32) * params
    master = FP32 * params / m.dp_replicate if replicas else 0
    grads = 0 if off == "all" else FP32 * params
    on_gpu = weights + master + grads + moments
    host = {"none": 0, "moments": 2, "all": 4, "replicas": 0}[off] * FP32 * params
    transit = 3 * FP32 * (sh.dense_per_block + sh.experts_per_block) if off == "all" else 0
    at_head = kept + headroom + head_unit + acts.head + BF16 * gathered + transit  # last block prefetched
    at_block = kept + headroom + working + ag + rs + transit
    hw = setup.hardware
    context_bytes = hw.cuda_context_gb * GB
    nccl_p2p, nccl_rings = mem.nccl_bytes(m)
    nccl = nccl_p2p + nccl_rings
    transient = max(at_head, at_block)
    fragmentation = setup.fragmentation * transient
    peak = on_gpu + context_bytes + nccl + fragmentation + transient
    mb = choice.microbatch

    def rows() -> tuple[Row, ...]:
        slices = f"a 1/{m.dp_replicate} slice of each shard on each replica (distributed optimizer)"
        where = f"on the host ({host / GIB:.1f} GiB of the {hw.host_gb:g} GB a GPU has, limit {hw.host_limit:.0%})"
        moments_note = {"none": "on the GPU", "moments": "on the host; two parameters' at a time on the GPU in the "
                        "update, after the backward", "all": "on the host",
                        "replicas": slices}[off]
        return (
            Row("parameters (bf16 working shards)" if replicas else "parameters (fp32 shards)", weights,
                f"{params / 1e9:.2f}B elements on the largest rank" + (", on the host" if off == "all" else "")
                + (", gathered from the master slices once a step" if replicas else "")),
            Row("fp32 master weights", master, slices if replicas else "the parameters are their own master"),
            Row("gradients (fp32 shards)", grads,
                "on the host" if off == "all" else
                "accumulated in fp32 over the micro-batches; the 1/"
                f"{m.dp_replicate} slice reduce-scattered in place into it (was {FP32 * params / m.dp_replicate / GIB:.2f} GiB "
                "more in a buffer of its own)" if replicas else
                "sharded like the parameters (reduce-scatter every micro-batch)"),
            Row("Adam moments (2 x fp32)", moments, moments_note),
            Row(f"activations kept ({cfg.n_layers} blocks x {mb} seq)", kept,
                f"{choice.checkpointing} checkpointing, {acts.source}"),
            Row("block backward working set", working, f"recompute, activation and bf16 weight grads, {acts.source}"),
            Row("  of which all-to-all buffers", a2a,
                f"send + receive at {skew:g}x the mean load" + (" (the bound)" if setup.bounded else "")
                if m.ep > 1 else "no expert parallelism"),
            Row("all-gather buffers (bf16)", ag, "this block's weights and the next one's (prefetch)"),
            Row("reduce-scatter buffer (fp32)", rs, "one block's gradients"),
            Row("offloaded shards in transit (fp32)", transit,
                "two blocks' weight shards up, one block's gradients down" if transit else "no weights on the host"),
            Row("expert-load headroom", headroom, f"busiest rank: {skew:g}x the mean rows kept in every block, "
                f"{skew:g}x in one block's buffers " + ("(the rank capacity)" if setup.bounded else "(dropless, unbounded)")),
            Row("head and loss (own moment)", acts.head + head_unit,
                f"the head fused with the loss, {getattr(cfg, 'loss_chunk', cfg.vocab_size):,} vocabulary rows at a "
                f"time (steps/moe/head.py) + gathered head, {acts.source}"),
            Row("CUDA context and cuBLAS", context_bytes, f"{hw.cuda_context_gb:g} GB (assumed)"),
            Row("NCCL buffers", nccl, f"all-to-all with {m.ep - 1} peers {nccl_p2p / GIB:.2f} GiB + rings of "
                f"{sum(g > 1 for g in (m.dp_shard, m.ep, m.dp_replicate))} communicators {nccl_rings / GIB:.2f} GiB "
                f"(NCCL's documented sizes)"),
            Row("allocator fragmentation reserve", fragmentation,
                f"{setup.fragmentation:.0%} of the {transient / GIB:.1f} GiB transient peak (assumed; reserved over "
                f"allocated)"),
            Row("host memory (pinned, not in the peak)", host, where if host else "nothing offloaded"),
            Row("router weights after w2: saved", weights_saving(), weights_note()),
        )

    def older() -> "MeshPlan | None":
        """This choice with the router weights applied after the combine (the older formulation),
        by the closed forms; None where the model has no such setting or already applies them so."""
        if not getattr(cfg, "router_weights_on_experts", False):
            return None
        import dataclasses

        return estimate(dataclasses.replace(setup, model=dataclasses.replace(cfg, router_weights_on_experts=False)),
                        choice)

    def weights_saving() -> float:
        o = older()
        return 0.0 if o is None else o.peak - estimate(setup, choice).peak  # closed form against closed form

    def weights_note() -> str:
        if older() is None:
            return "the router weights are applied after the combine (MoEConfig.router_weights_on_experts False)"
        t = Tokens.of(cfg, mb, setup.context, m.ep)
        per_block = mem.combine_kept_bytes(cfg, t, choice.checkpointing)
        return (f"not in the peak: what the weights applied after the combine would add (closed form; negative: costs): the combine's output "
                f"kept, {per_block / 2**20:,.1f} MiB a block x {cfg.n_layers}, and its share of the reserve "
                f"(steps/moe/expert_parallel.py)")

    def time() -> StepTime:
        return step_time(cfg, m, hw, context=setup.context, share=setup.batch // m.ranks, microbatch=mb,
                         checkpointing=choice.checkpointing, efficiency=setup.compute_efficiency,
                         replicas_per_rack=per_rack, racks=racks, offload=off, load=setup.load_mean, stack=OURS,
                         sh=sh)

    return MeshPlan(setup=setup, choice=choice, racks=racks, replicas_per_rack=per_rack, peak=peak,
                sources=sources or {"shards": "formula", "activations": acts.source}, host=host, make_rows=rows,
                make_time=time)


# -- search -------------------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def meshes(setup: Setup) -> Iterator[Mesh]:
    """Every mesh whose dp_shard group fits in a rack, whose ep divides the experts and dp_shard,
    and whose ranks divide the batch (the remaining checks are `check`'s)."""
    cfg, g = setup.model, setup.gpus_per_rack
    for shard in range(1, g + 1):
        for ep in _divisors(shard):
            if cfg.n_experts % ep:
                continue
            for rep in range(1, setup.racks * (g // shard) + 1):
                if setup.batch % (rep * shard) == 0:
                    yield Mesh(rep, shard, ep)


def _key(plan: MeshPlan) -> tuple[float, int, float]:
    """Fastest step; then fewer GPUs; then less memory."""
    return (round(plan.time.total, 3), plan.ranks, plan.peak)


def shortfall(plan: MeshPlan, which: str = "its least-memory mesh") -> str:
    """One line naming the memory a plan lacks: the GPU's, or else the host's."""
    hw = plan.setup.hardware
    head = f"the step does not fit on {plan.setup.gpus} GPUs: {which} ({plan.choice.describe()})"
    if plan.margin_share < plan.setup.min_margin:
        need, have, keep = plan.peak / GIB, plan.setup.memory_target_gib, plan.setup.min_margin
        allowed = have * (1 - keep)
        return (f"{head} needs {need:,.1f} GiB a GPU, {need - allowed:,.1f} GiB more than the memory target of "
                f"{have:g} GiB less the {keep:.0%} margin kept ({allowed:,.1f} GiB; memory_target_gib, min_margin; a "
                f"{hw.name} GPU has {hw.hbm_bytes / GIB:.1f} GiB)")
    need, have = plan.host / GIB, hw.host_limit * hw.host_gb * GB / GIB
    return (f"{head} needs {need:,.1f} GiB of host memory a GPU, {need - have:,.1f} GiB more than "
            f"{hw.host_limit:.0%} of the {hw.host_gb:g} GB a GPU has ({have:.1f} GiB)")


def _lighter(plan: MeshPlan, than: MeshPlan | None) -> bool:
    """Whether `plan` is nearer to fitting than `than`: one whose host memory fits first, then
    the smaller GPU peak (the one line then names what a user can most likely change)."""
    return than is None or (not plan.fits_host, plan.peak) < (not than.fits_host, than.peak)


def with_measurement(plan: MeshPlan, acts: Activations, shards: mem.Shards) -> MeshPlan:
    """The same plan recomputed from measured shards and traced activations."""
    return estimate(plan.setup, plan.choice, acts=acts, shards=shards,
                    sources={"shards": "measured", "activations": acts.source})


def check_fields(setup: Setup, dp_replicate: int, dp_shard: int, ep: int, microbatch: int) -> None:
    """The divisibility errors of the fields a user gave (0: not given), by name, before any
    search: the cluster's racks, experts over ep, ep inside dp_shard inside a rack, the batch
    over the ranks, the micro-batch inside a rank's share."""
    cfg, hw = setup.model, setup.hardware
    if setup.gpus < 1:
        raise VoyageError(f"gpus must be positive, got {setup.gpus}")
    if setup.gpus > hw.gpus_per_rack and setup.gpus % hw.gpus_per_rack:
        raise VoyageError(f"gpus: {setup.gpus} GPUs are not whole racks of {hw.gpus_per_rack} ({hw.name})")
    if ep and cfg.n_experts % ep:
        raise VoyageError(f"ep: {ep} does not divide the model's {cfg.n_experts} routed experts")
    if dp_shard:
        placement(setup, Mesh(dp_replicate or 1, dp_shard, ep or 1))
    if dp_replicate and dp_shard:
        check(setup, Choice(Mesh(dp_replicate, dp_shard, ep or 1), microbatch or 1, "full"))
    elif dp_replicate and setup.batch % dp_replicate:
        raise VoyageError(f"batch: {setup.batch:,} sequences do not divide over dp_replicate {dp_replicate}")


def pick(setup: Setup, dp_replicate: int = 0, dp_shard: int = 0, ep: int = 0, microbatch: int = 0,
         checkpointing: str = "auto", offload: str = "auto") -> tuple[MeshPlan, list[MeshPlan]]:
    """The plan for the fields given (0 / "auto": the search's choice among the rest) and the
    feasible alternatives sorted by step time (the choice among them: the fastest, or a lighter
    one within TIE of it). One VoyageError naming what fails: a mesh that does not
    divide, or none that fits (with the memory the least-memory one lacks)."""
    if checkpointing not in (*MODES, "auto"):
        raise VoyageError(f"checkpointing must be one of {MODES} or auto, got {checkpointing!r}")
    if offload not in (*OFFLOADS, "auto"):
        raise VoyageError(f"offload must be one of {OFFLOADS} or auto, got {offload!r}")
    fixed = {"dp_replicate": dp_replicate, "dp_shard": dp_shard, "ep": ep}
    for name, value in (*fixed.items(), ("microbatch", microbatch)):
        if value < 0:
            raise VoyageError(f"{name} must be >= 0 (0: chosen by the plan), got {value}")
    check_fields(setup, dp_replicate, dp_shard, ep, microbatch)

    def wanted(c: Choice) -> bool:
        m = c.mesh
        return ((not dp_replicate or m.dp_replicate == dp_replicate) and (not dp_shard or m.dp_shard == dp_shard)
                and (not ep or m.ep == ep) and (not microbatch or c.microbatch == microbatch)
                and checkpointing in ("auto", c.checkpointing))

    feasible: list[MeshPlan] = []
    smallest: MeshPlan | None = None
    for mesh in meshes(setup):
        if not wanted(Choice(mesh, microbatch or 1, "full" if checkpointing == "auto" else checkpointing)):
            continue
        try:
            placement(setup, mesh)
        except VoyageError:
            continue
        share = setup.batch // mesh.ranks
        for mb in ([microbatch] if microbatch else _divisors(share)):
            if share % mb:
                continue
            for mode in (MODES if checkpointing == "auto" else (checkpointing,)):
                acts = formula_activations(setup, Choice(mesh, mb, mode))  # the same whatever the offload
                for off in (OFFLOADS if offload == "auto" else (offload,)):
                    if off == "replicas" and mesh.dp_replicate == 1 and offload == "auto":
                        continue  # one replica: the same plan as "none"
                    plan = estimate(setup, Choice(mesh, mb, mode, off), acts=acts)
                    if plan.fits:
                        feasible.append(plan)
                    elif _lighter(plan, smallest):
                        smallest = plan
    if not feasible:
        if smallest is None:
            raise VoyageError(f"no mesh of the {setup.gpus} GPUs divides the batch of {setup.batch:,} sequences with "
                              f"the given {', '.join(f'{k} {v}' for k, v in fixed.items() if v) or 'fields'}")
        given = all((dp_replicate, dp_shard, ep, microbatch)) and "auto" not in (checkpointing, offload)
        raise VoyageError(shortfall(smallest, "the mesh asked for" if given else "its least-memory mesh"))
    ranked = _rank(feasible)
    per_mesh: dict[Mesh, MeshPlan] = {}
    for p in ranked[1:]:
        if p.choice.mesh != ranked[0].choice.mesh:
            per_mesh.setdefault(p.choice.mesh, p)
    same_mesh = [p for p in ranked[1:] if p.choice.mesh == ranked[0].choice.mesh][:2]
    shown = [ranked[0], *same_mesh, *list(per_mesh.values())]
    return ranked[0], sorted(shown, key=lambda p: (p.time.total, p.peak))


def _rank(plans: list[MeshPlan]) -> list[MeshPlan]:
    """Fastest first; a plan within TIE of the fastest and lighter on memory goes first."""
    ranked = sorted(plans, key=_key)
    close = [p for p in ranked if p.time.total <= ranked[0].time.total * (1 + TIE)]
    pick_ = min(close, key=lambda p: (p.peak, p.ranks))
    ranked.remove(pick_)
    return [pick_, *ranked]

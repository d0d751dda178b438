"""The 535B-A23B voyage: the whole plan of the real run, and the same DAG at laptop scale.

    marin-run voyages/535b.py --dry-run            # the full-scale plan, its budget and its mesh
    marin-run voyages/535b.py --dry-run --ep 32    # the same with another mesh (see --help)
    marin-run voyages/535b.py --laptop             # the same DAG, tiny, end to end on 2 cores
    marin-run voyages/535b.py --size 1b --dry-run  # the same recipe at about 1B active parameters
    marin-run voyages/535b.py --ladder --dry-run   # with its scaling ladder, the law's fit and the sealed prediction
    marin-run voyages/535b.py --laptop --ladder    # the laptop ladder: 5 rungs of the tiny MoE (docs/ladder.md)

Full scale (public figures, DESIGN.md): declared public sources -> ingest -> dedup -> tokenize
(the 128,256-token Llama 3 vocabulary, pinned into the prefix) -> mixture (15T tokens of
pretraining, then 3.75T of midtraining, the switch at 80%) -> pretrain (535B-A23B, batch
11,264 x 4096, on 11 GB200 NVL72 racks = 792 GPUs) -> midtrain -> eval, and the Hugging Face export.

The training step's mesh, micro-batch, checkpointing and offload come from the plan (steps/scale,
docs/training.md "The plan at full scale"): every mesh that divides the batch, the experts and
the racks is estimated, the fastest that fits is built on `meta` with the trainer's own
sharding in a fake process group of its full size and its blocks traced, and a voyage whose
step does not divide or fit stops here (exit 2, one line). On 792 GPUs the plan picks one
64-GPU expert-parallel mesh a rack, data parallel across the 11 racks: 704 GPUs train, 8 a rack
spare, as Marin's own run does. Any field can be fixed by a flag (`--ep 32 --microbatch 1`).

Laptop (`--laptop`): the same steps and edges over the bundled corpus (data/corpus: the King James
Bible and the Python 3.11 documentation), a byte-level BPE trained on it instead of the pinned
Llama 3 tokenizer, the `tiny` MoE preset and local resources. The bundled corpus is named by
repository-relative paths, read from this checkout whatever the working directory (ingest's
run-only `root`), so the steps' digests do not depend on where the repository was cloned.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from executor import InputRef, License, LicensePolicy, Resources, RetryPolicy, Step, VoyageError, output_of
from steps.data.decontam import DecontamConfig, EvalSet, decontaminate
from steps.dedup.dedup import DedupConfig, dedup
from steps.data.ingest import IngestConfig, ingest
from steps.data.mixture import MixtureConfig, MixtureStage, mixture
from steps.data.budget import CpuNodes, DataPlan, DataSource, format_data_plan, plan_data
from steps.data.tokenize import TokenizeConfig, tokenize
from steps.data.tokenizer import PinTokenizerConfig, TrainTokenizerConfig, pin_tokenizer, train_tokenizer
from steps.export.to_hf import ExportHFConfig, export_hf
from steps.ladder.ladder import Ladder, check_growing, check_rung
from steps.ladder.recipe import FULL_SHAPE, LAPTOP_SHAPE, LR_EXPONENT, SizeRule, Sized, gpu_hours, human, parse_size
from steps.ladder.steps import (CheckConfig, FitConfig, PredictConfig, RungResult, ladder_check, ladder_fit,
                                ladder_predict)
from steps.moe.config import PRESETS, MoEConfig, flops_per_token, param_counts
from steps.provenance.card import CardConfig, model_card
from steps.scale.hardware import GB200_NVL72
from steps.scale.anchor import ANCHOR
from steps.scale.mesh_plan import MEMORY_TARGET_GIB, Setup
from steps.train.config import (DataConfig, ModelSpec, OptimizerConfig, ParallelConfig, TrainConfig,
                                TrainerConfig)
from steps.train.watchdog import WatchdogConfig
from steps.eval.evaluate import EvalConfig, HarnessConfig, evaluate
from steps.train.pretrain import midtrain, pretrain

REPO = Path(__file__).resolve().parents[1]  # the laptop corpus's relative paths start here


@dataclass(frozen=True)
class Source:
    """A declared public source: where its documents are and how many tokens it holds."""

    name: str
    url: str
    tokens: float  # declared size, in tokens of the voyage's tokenizer
    license: License  # an SPDX id, or a short name and the URL of its terms (docs/provenance.md)
    pretrain: float  # weight in the pretraining stage
    midtrain: float  # weight in the midtraining stage
    text_field: str = "text"  # the field of each record that holds its text
    # Sources of one dedup group are deduplicated together, in one id space, by one step
    # `dedup/GROUP` (their overlap is removed; each keeps its own folder, licence and token count);
    # a source without a group is deduplicated alone, by `dedup/NAME`.
    dedup_group: str = ""


# Licences: an SPDX id where one exists, else a short name and the URL of its terms. Sources whose
# documents come under many licences say so, and no open-only policy lets them through.
NVIDIA_DATA = License("NVIDIA data agreement",
                      url="https://data.commoncrawl.org/contrib/Nemotron/Nemotron-CC/index.html")
PER_REPOSITORY = License("per-repository licences", url="https://huggingface.co/datasets/bigcode/the-stack-v2")
PER_SOURCE = License("per-source licences", url="https://huggingface.co/datasets/EleutherAI/proof-pile-2")
PER_PAPER = License("per-paper licences", url="https://info.arxiv.org/help/license/index.html")
LLAMA_31 = License("Llama 3.1 Community License", url="https://www.llama.com/llama3_1/license/")

RAW = "gs://marin-us-central2/raw"
FULL_SOURCES = (
    # both built from Common Crawl: their overlap is removed by one dedup step over the two
    Source("nemotron-cc", f"{RAW}/nemotron-cc/**/*.jsonl.zst", 6.3e12, NVIDIA_DATA, 0.616, 0.682,
           dedup_group="common-crawl"),
    Source("dclm-baseline", f"{RAW}/dclm-baseline-1.0/**/*.jsonl.zst", 3.8e12, License("CC-BY-4.0"), 0.33, 0.15,
           dedup_group="common-crawl"),
    Source("starcoder2-data", f"{RAW}/starcoder2-data/**/*.parquet", 913e9, PER_REPOSITORY, 0.04, 0.10,
           text_field="content"),
    Source("proof-pile-2", f"{RAW}/proof-pile-2/**/*.jsonl.zst", 55e9, PER_SOURCE, 0.005, 0.02),
    Source("finemath-3plus", f"{RAW}/finemath-3plus/**/*.parquet", 34e9, License("ODC-By-1.0"), 0.0, 0.02),
    Source("arxiv", f"{RAW}/redpajama-arxiv/**/*.jsonl.gz", 28e9, PER_PAPER, 0.003, 0.01),
    Source("wikipedia", f"{RAW}/wikipedia-20241201/**/*.jsonl.gz", 24e9, License("CC-BY-SA-4.0"), 0.003, 0.01),
    Source("stackexchange", f"{RAW}/stackexchange-20241201/**/*.jsonl.gz", 20e9, License("CC-BY-SA-4.0"), 0.003,
           0.008),
)

# Held-out documents the eval step reports loss on (EvalConfig.datasets) and decontamination
# removes from training (steps/data/decontam.py). The mixture's never-drawn windows, which eval
# also reports, cannot be a decontamination input: they are cut from the decontaminated data
# (docs/design.md "Decontamination").
FULL_HELDOUT = Source("heldout", f"{RAW}/paloma-1.5/**/*.jsonl.gz", 2e8,
                      License("AI2 ImpACT low-risk licence", url="https://allenai.org/licenses/impact-lr"), 0.0, 0.0)
# lm-eval-harness tasks the full eval runs, so decontamination removes their text from training too
FULL_TASKS = ("arc_challenge", "arc_easy", "hellaswag", "mmlu", "piqa", "winogrande")
LAPTOP_HELDOUT = Source("heldout", "data/evals/heldout_passages.jsonl", 0.0,
                        License("KJV and Python docs excerpts", url="data/evals/SOURCE.md"), 0.0, 0.0)

LAPTOP_SOURCES = (
    # deduplicated together, as the full voyage's Common-Crawl sources are
    Source("kjv", "data/corpus/kjv.jsonl.zst", 1.2e6, License("public domain", url="https://www.gutenberg.org/ebooks/10"),
           0.7, 0.3, dedup_group="corpus"),
    Source("pydocs", "data/corpus/pydocs.jsonl.zst", 1.3e6, License("PSF-2.0"), 0.3, 0.7, dedup_group="corpus"),
)


@dataclass(frozen=True)
class Scale:
    """Everything that differs between the full voyage and its laptop rehearsal."""

    sources: tuple[Source, ...]
    preset: str
    seq_len: int
    batch_size: int  # sequences per optimizer step
    pretrain_tokens: float
    midtrain_tokens: float
    train_resources: Resources
    data_resources: Resources | None  # None: each data step's from the data plan (steps/data/budget.py)
    eval_resources: Resources
    tokenizer_vocab: int
    optimizer: OptimizerConfig
    checkpoint_every: int
    heldout: Source  # held-out documents: evaluated, and decontaminated against
    eval_tasks: tuple[str, ...] = ()  # lm-eval tasks eval runs (and decontamination removes)
    eval_tokens: float = 0.0  # about how many tokens the eval tasks' documents hold (the data plan's eval index)
    eval_parallel: ParallelConfig = ParallelConfig()  # how eval's workers shard the model
    overrides: tuple[tuple[str, int], ...] = ()  # the preset's shape at another size (--size, a ladder's rung)

    @property
    def model(self) -> MoEConfig:
        return dataclasses.replace(PRESETS[self.preset], **dict(self.overrides))


FULL = Scale(
    sources=FULL_SOURCES, preset="535b-a23b", seq_len=4096, batch_size=11_264,
    pretrain_tokens=15e12, midtrain_tokens=3.75e12,
    # a worker a GPU (a compute tray: 4 GPUs, 2 Grace CPUs of 72 cores and 480 GB); workers: the plan's ranks
    train_resources=Resources(cpus=32, gpus=1, accelerator="GB200", memory_gb=200, workers=792),
    data_resources=None,  # planned per step: steps/data/budget.py, printed by --dry-run
    # eval loads the checkpoint sharded, as the trainer does: the fp32 weights are 533.8B x 4 B =
    # 2.14 TB, so one rack's expert mesh (64 GPUs, EP64, 6 experts a GPU) holds 33 GB a GPU of
    # weights, no gradients or optimizer state, and forwards of `EvalConfig.batch_size` windows
    eval_resources=Resources(cpus=32, gpus=1, accelerator="GB200", memory_gb=200, workers=64),
    eval_parallel=ParallelConfig(dp_shard=-1, ep=64),
    tokenizer_vocab=128_256,
    optimizer=OptimizerConfig(lr=2.2e-4, warmup_steps=2000, min_lr_ratio=0.1, weight_decay=0.1),
    checkpoint_every=500,
    heldout=FULL_HELDOUT, eval_tasks=FULL_TASKS, eval_tokens=3e6,
)

# The laptop recipe of docs/training.md ("Laptop settings"): 400 steps of 32 sequences of 64 + 1
# tokens, 80% pretrain then 20% midtrain, one worker on one CPU (at this size one thread is faster
# than two, and two Ray Train workers take longer to start than the whole run).
LAPTOP = Scale(
    sources=LAPTOP_SOURCES, preset="tiny", seq_len=65, batch_size=32,
    pretrain_tokens=320 * 32 * 65, midtrain_tokens=80 * 32 * 65,
    train_resources=Resources(cpus=1),
    data_resources=Resources(cpus=1), eval_resources=Resources(cpus=1), tokenizer_vocab=512,
    optimizer=OptimizerConfig(lr=1e-2, warmup_steps=30, min_lr_ratio=0.1),
    checkpoint_every=100,
    heldout=LAPTOP_HELDOUT,
)


@dataclass(frozen=True)
class VoyageConfig:
    """Knobs of the 535B voyage (`marin-run voyages/535b.py --help`). The mesh fields at 0 (and
    checkpointing "auto") are the plan's choice for the GPUs given."""

    laptop: bool = False  # the same DAG at laptop scale: bundled corpus, tiny model, local resources
    seed: int = 0
    gpus: int = 792  # GPUs of the cluster: whole GB200 NVL72 racks of 72 (11 racks)
    mfu: float = ANCHOR.mfu  # the anchor's MFU over its step (published 0.229): the plan calibrates its
    # efficiency while computing so that the anchor's configuration takes the step this implies (17.0 s)
    efficiency: float = 0.0  # share of peak while computing; 0: calibrated on the anchor at `mfu`
    gpu_peak_tflops: float = 2500.0  # dense bf16 peak of one GB200 GPU
    dp_replicate: int = 0  # data-parallel replicas (HSDP across racks); 0: the plan's choice
    dp_shard: int = 0  # FSDP ranks of one replica, inside a rack; 0: the plan's choice
    ep: int = 0  # expert-parallel ranks (inside dp_shard); 0: the plan's choice
    microbatch: int = 0  # sequences a GPU runs at once; 0: the plan's choice
    checkpointing: str = "auto"  # "none", "selective", "full", or "auto" (the plan's choice)
    offload: str = "auto"  # "none", "moments" (Adam's moments in host memory), "all", "replicas" (sharded over
    # the replicas: a distributed optimizer), or "auto" (the plan's)
    memory_target_gib: float = MEMORY_TARGET_GIB  # a GPU's memory a plan may use; above it: refused (plan.py says why)
    open_only: bool = False  # the exported model is for public release: only open licences may reach it
    laptop_steps: int = 0  # with --laptop: optimizer steps, four fifths pretrain (0: the recipe's 400; the tests run fewer)
    data_nodes: int = 100  # CPU nodes the data steps run on (shared/DATA.md, the data facts the project was given: 100 nodes of 64 cores)
    data_node_cores: int = 64
    data_node_memory_gb: float = 256.0
    # The recipe at another size (docs/ladder.md): active parameters (`1b`, `300m`, `60k`) or a
    # compute (`3e21flops`); width, depth, heads, tokens, batch and lr follow the recipe's rules.
    size: str = ""
    ladder: bool = False  # add the scaling ladder: its rungs, the law's fit, the sealed prediction and its check
    ladder_floor: float = -1.0  # the law's floor E, pinned; < 0: fitted (free)
    ladder_rungs: str = ""  # other rungs than the declared ladder's: sizes, comma-separated (`20k,40k,80k,160k`)
    ladder_seeds: str = ""  # seeds per rung, comma-separated (default: 1 each with ladder_rungs)
    ladder_tokens: float = 1.0  # a rehearsal of the ladder (the tests): its rungs train this share of the rule's tokens
    size_days: float = 14.0  # a sized full-scale run gets the whole racks that train it in about this many days


# The ladders (docs/ladder.md). Full scale: 5 rungs about 4x apart in compute, 0.8% of the 535B
# run's compute together (the anchors' ladders cost 0.4-1%), every rung fitted, the 535B run the
# target. Laptop: 5 rungs of the tiny MoE (depth and heads fixed, the width grown: LAPTOP_SHAPE),
# evenly spaced in log compute from the narrowest width (16) to the laptop recipe's own size, about
# 3x apart, the top one held out and predicted from the other four, each of those at 2 seeds so
# that the band carries the measured seed-to-seed noise (docs/ladder.md "The laptop ladder's design").
FULL_LADDER = Ladder(rungs=("6e19flops", "2.5e20flops", "1e21flops", "4e21flops", "1.6e22flops"),
                     seeds=(2, 2, 1, 1, 1), target="run", metric="datasets.heldout.loss")
LAPTOP_LADDER = Ladder(rungs=("1.2e10flops", "3.7e10flops", "1.1e11flops", "3.2e11flops", "9.5e11flops"),
                       seeds=(2, 2, 2, 2, 1), target="top", metric="loss")


def release_policy(config: VoyageConfig) -> LicensePolicy | None:
    """The licence policy of the exported model: open licences only when it is meant for public
    release (checked when the plan is made: a voyage that would route another licence into it
    stops there, exit 2)."""
    return LicensePolicy.open_only() if config.open_only else None


def scale_of(config: VoyageConfig) -> Scale:
    if config.size:
        if config.laptop_steps:
            raise VoyageError("laptop_steps: not with --size (the size sets the steps)")
        return scale_at(config, rule_of(config).at(parse_size(config.size)))
    if not config.laptop:
        if config.laptop_steps:
            raise VoyageError("laptop_steps: only with --laptop")
        return FULL
    if not config.laptop_steps:
        return LAPTOP
    # A shorter rehearsal (the test suite's session run, tests/conftest.py): the same DAG, batch and
    # 80/20 split, fewer steps; warm-up kept under a tenth of the run.
    steps = config.laptop_steps
    if steps < 10:
        raise VoyageError(f"laptop_steps: at least 10 (pretrain and midtrain both need steps), got {steps}")
    pre, per_step = steps * 4 // 5, LAPTOP.batch_size * LAPTOP.seq_len
    return dataclasses.replace(LAPTOP, pretrain_tokens=pre * per_step, midtrain_tokens=(steps - pre) * per_step,
                               optimizer=dataclasses.replace(LAPTOP.optimizer,
                                                             warmup_steps=min(LAPTOP.optimizer.warmup_steps, steps // 10)))


def rule_of(config: VoyageConfig) -> SizeRule:
    """The recipe's size rule (steps/ladder/recipe.py), through the recipe's own point: the full
    535B run, or the laptop's 400 steps of `tiny`."""
    base = LAPTOP if config.laptop else FULL
    tokens = base.pretrain_tokens + base.midtrain_tokens
    return SizeRule.of_recipe(dataclasses.replace(base.model, vocab_size=base.tokenizer_vocab), tokens=tokens,
                              batch=base.batch_size, seq_len=base.seq_len, lr=base.optimizer.lr,
                              warmup_steps=base.optimizer.warmup_steps,
                              shape=LAPTOP_SHAPE if config.laptop else FULL_SHAPE,
                              pretrain_share=base.pretrain_tokens / tokens, batch_multiple=1 if config.laptop else 64,
                              # the laptop's peak lr is the recipe's at every width: measured on the
                              # ladder's first rung (docs/ladder.md "The laptop ladder's design"),
                              # DeepSeek's lr ~ C^-0.125 (0.0172 there) sat at the edge of divergence
                              lr_exponent=0.0 if config.laptop else LR_EXPONENT)


def scale_at(config: VoyageConfig, sized: Sized) -> Scale:
    """The recipe's Scale at one size: only the shape, the tokens, the batch, lr and warm-up differ."""
    base = LAPTOP if config.laptop else FULL
    return dataclasses.replace(base, overrides=tuple(sorted(sized.overrides.items())),
                               pretrain_tokens=sized.pretrain_tokens, midtrain_tokens=sized.midtrain_tokens,
                               batch_size=sized.batch,
                               optimizer=dataclasses.replace(base.optimizer, lr=sized.lr,
                                                             warmup_steps=sized.warmup_steps))


def run_name(config: VoyageConfig) -> str:
    if config.size:
        return f"{'laptop-' if config.laptop else ''}size-{parse_size(config.size).label}"
    return "laptop" if config.laptop else "535b-a23b"


def data_steps(config: VoyageConfig) -> tuple[Step, dict[str, Step]]:
    """The tokenizer step and, per source, its tokenized dataset."""
    tok, tokenized, _heldout = data_and_heldout(config)
    return tok, tokenized


def data_and_heldout(config: VoyageConfig) -> tuple[Step, dict[str, Step], Step]:
    """The tokenizer step, per source its tokenized dataset, and the tokenized held-out set."""
    scale = scale_of(config)
    sized = _sizer(config)
    heldout_raw = _ingest(scale, scale.heldout, sized)
    raws = {src.name: _ingest(scale, src, sized) for src in scale.sources}
    groups: dict[str, list[Source]] = {}
    for src in scale.sources:
        groups.setdefault(src.dedup_group or src.name, []).append(src)
    deduped: dict[str, InputRef] = {}  # source -> its deduplicated documents
    for group, members in groups.items():
        if len(members) == 1 and not members[0].dedup_group:
            dd = Step(f"dedup/{group}", dedup, DedupConfig(documents=output_of(raws[group]), seed=config.seed,
                                                           **_dedup_tasks(config, sized(f"dedup/{group}"))),
                      resources=sized(f"dedup/{group}"))
            deduped[group] = output_of(dd)
            continue
        dd = Step(f"dedup/{group}", dedup, DedupConfig(documents={s.name: output_of(raws[s.name]) for s in members},
                                                       seed=config.seed, **_dedup_tasks(config, sized(f"dedup/{group}"))),
                  resources=sized(f"dedup/{group}"))
        deduped.update({s.name: output_of(dd, s.name) for s in members})
    # the sources' order; each source decontaminated on its own after dedup
    docs = {src.name: output_of(decontam_step(scale, src.name, deduped[src.name], sized)) for src in scale.sources}
    if config.laptop:
        tok = Step("tokenizer/bpe-512", train_tokenizer,
                   TrainTokenizerConfig(documents=tuple(docs.values()),
                                        vocab_size=scale.tokenizer_vocab))
    else:
        tok = Step("tokenizer/llama3", pin_tokenizer,
                   PinTokenizerConfig(source="meta-llama/Llama-3.1-8B", expect_vocab_size=scale.tokenizer_vocab,
                                      license=LLAMA_31))
    tokenized = {
        name: Step(f"tokenized/{name}", tokenize,
                   TokenizeConfig(documents=d, tokenizer=output_of(tok), bos=None, eos=_eos(config)),
                   resources=sized(f"tokenized/{name}"))
        for name, d in docs.items()}
    heldout = Step(f"tokenized/{scale.heldout.name}", tokenize,
                   TokenizeConfig(documents=output_of(heldout_raw), tokenizer=output_of(tok), bos=None,
                                  eos=_eos(config)), resources=sized(f"tokenized/{scale.heldout.name}"))
    return tok, tokenized, heldout


def data_plan_of(config: VoyageConfig) -> DataPlan:
    """The data plan at full size on the voyage's CPU nodes (a VoyageError when a task of some
    step cannot fit one node: exit 2)."""
    nodes = CpuNodes(config.data_nodes, config.data_node_cores, config.data_node_memory_gb)
    if min(nodes.count, nodes.cores) < 1 or nodes.memory_gb <= 0:
        raise VoyageError(f"data_nodes, data_node_cores and data_node_memory_gb must be positive, got {nodes}")
    sources = [DataSource(s.name, s.tokens, getattr(s, "dedup_group", "")) for s in FULL.sources]
    return plan_data(sources, nodes, heldout_tokens=FULL.heldout.tokens, eval_tokens=FULL.eval_tokens)


def _dedup_tasks(config: VoyageConfig, resources: Resources) -> dict[str, float]:
    """What each pass-1 and pass-4 task of a dedup declares to Ray: at full size the plan's largest
    task (a 100k-document shard's sorted records, steps/data/budget.py), not DedupConfig's 1 GiB
    default, which fits the laptop's shards (run-only: the digest does not change)."""
    return {} if config.laptop else {"task_memory_gb": resources.memory_gb}


def _sizer(config: VoyageConfig):
    """Step name -> its Resources: the laptop's fixed ones, or at full scale the data plan's."""
    if config.laptop:
        return lambda name: LAPTOP.data_resources
    plan = data_plan_of(config)
    return plan.resources


def _ingest(scale: Scale, src: Source, sized) -> Step:
    return Step(f"raw/{src.name}", ingest, IngestConfig(input=src.url, text_field=src.text_field, root=str(REPO),
                                                          license=src.license),
                resources=sized(f"raw/{src.name}"))


def decontam_step(scale: Scale, name: str, documents: InputRef, sized) -> Step:
    """Remove from a source the documents sharing a 13-gram with what eval reports: the held-out
    documents and the lm-eval tasks. The held-out files are read as given, not through their
    ingest step: no held-out text reaches the output, so its licence must not flow into training
    (executor/lineage.py follows every edge)."""
    evals = (EvalSet(scale.heldout.name, documents=scale.heldout.url),
             *(EvalSet(task, task=task) for task in scale.eval_tasks))
    return Step(f"decontam/{name}", decontaminate, DecontamConfig(documents=documents, evals=evals, root=str(REPO)),
                resources=sized(f"decontam/{name}"))


def _eos(config: VoyageConfig) -> str:
    return "<|eos|>" if config.laptop else "<|end_of_text|>"


def mixture_step(config: VoyageConfig, tokenized: dict[str, Step], total_tokens: float, scale: Scale | None = None,
                 name: str = "") -> Step:
    """15T of pretraining at one set of weights, then 3.75T of midtraining at another."""
    scale = scale or scale_of(config)
    pre = scale.pretrain_tokens / total_tokens
    stages = (MixtureStage(pre, {s.name: s.pretrain for s in scale.sources if s.pretrain}),
              MixtureStage(round(1 - pre, 12), {s.name: s.midtrain for s in scale.sources if s.midtrain}))
    if not name:
        name = f"mixture/{run_name(config)}" if config.size else "mixture/535b" if not config.laptop else "mixture/laptop"
    return Step(name, mixture, MixtureConfig(
        datasets={n: output_of(t) for n, t in tokenized.items()}, token_budget=int(total_tokens),
        seq_len=scale.seq_len, stages=stages, seed=config.seed, block_size=256 if config.laptop else 2048))


def setup_of(config: VoyageConfig) -> Setup:
    """What the plan of the full-scale training step is for: the model, the batch, the cluster."""
    scale = FULL
    return Setup(model=dataclasses.replace(scale.model, vocab_size=scale.tokenizer_vocab), batch=scale.batch_size,
                 context=scale.seq_len - 1, gpus=config.gpus, mfu=config.mfu, efficiency=config.efficiency,
                 hardware=dataclasses.replace(GB200_NVL72, peak_tflops=config.gpu_peak_tflops),
                 memory_target_gib=config.memory_target_gib)


def plan_of(config: VoyageConfig):  # -> (steps.scale.measure.Measured, alternatives); imports torch
    """The measured plan of the full-scale step (cached), or the VoyageError that stops the voyage."""
    from steps.scale.measure import plan_for

    if not 0 < config.mfu <= 1:
        raise VoyageError(f"mfu must lie in (0, 1], got {config.mfu}")
    if not 0 <= config.efficiency <= 1:
        raise VoyageError(f"efficiency must lie in [0, 1] (0: calibrated on the anchor), got {config.efficiency}")
    if config.gpu_peak_tflops <= 0:
        raise VoyageError(f"gpu_peak_tflops must be positive, got {config.gpu_peak_tflops}")
    return plan_for(setup_of(config), config.dp_replicate, config.dp_shard, config.ep, config.microbatch,
                    config.checkpointing, config.offload)


def trainer_of(config: VoyageConfig, scale: Scale, seed: int | None = None,
               sized: bool = False) -> tuple[TrainerConfig, Resources]:
    """The trainer's run mechanics and a worker's resources: at full scale, the plan's mesh (at
    another size, `sized_mesh`'s)."""
    common = dict(seed=config.seed if seed is None else seed, checkpoint_every=scale.checkpoint_every, log_every=25,
                  permanent_every=0 if config.laptop else 10_000)
    sized = sized or bool(config.size)
    if config.laptop:  # the live page overlays main's own laptop curve (data/reference/)
        curve = "" if sized else str(REPO / "data/reference/laptop_loss.csv")
        return TrainerConfig(**common, reference_curve=curve), scale.train_resources
    if sized:
        racks = sized_racks(config, scale)
        parallel = ParallelConfig(dp_replicate=racks, dp_shard=64, ep=64, checkpointing="selective")
        return TrainerConfig(workers=64 * racks, parallel=parallel, async_checkpoint=True, **common), \
            dataclasses.replace(scale.train_resources, workers=64 * racks)
    plan = plan_of(config)[0].plan
    choice = plan.choice
    m = choice.mesh
    parallel = ParallelConfig(dp_replicate=m.dp_replicate, dp_shard=m.dp_shard, ep=m.ep,
                              checkpointing=choice.checkpointing, offload=choice.offload)
    # the hang bound from the plan's step time (10x it, at least 5 minutes: steps/train/watchdog.py);
    # checkpoints of 8.5 TB upload in the background
    trainer = TrainerConfig(workers=m.ranks, microbatch=choice.microbatch, parallel=parallel, async_checkpoint=True,
                            watchdog=WatchdogConfig(expected_step_s=round(plan.time.total, 1)), **common)
    return trainer, dataclasses.replace(scale.train_resources, workers=m.ranks)


def sized_racks(config: VoyageConfig, scale: Scale) -> int:
    """Whole racks (64 GPUs that train in each) for a sized full-scale run: enough to train it in
    about `size_days` at the anchor's MFU, at most the cluster's, and dividing the batch."""
    flops = flops_per_token(scale.model, scale.seq_len - 1) * (scale.pretrain_tokens + scale.midtrain_tokens) \
        * (scale.seq_len - 1) / scale.seq_len
    hours = gpu_hours(flops, config.gpu_peak_tflops, config.mfu)
    racks = max(1, min(config.gpus // 72, -(-int(hours) // int(64 * 24 * config.size_days))))
    while racks > 1 and scale.batch_size % (64 * racks):
        racks -= 1
    return racks


def train_config(config: VoyageConfig, scale: Scale, mix: Step, seed: int | None = None, law=None,
                 sized: bool = False) -> tuple[TrainConfig, Resources]:
    """The recipe's training config at a scale (the recipe's own, or at a size)."""
    trainer, resources = trainer_of(config, scale, seed, sized)
    return TrainConfig(
        data=DataConfig(mixture=output_of(mix), batch_size=scale.batch_size),
        model=ModelSpec(scale.preset, vocab_size=scale.tokenizer_vocab, overrides=dict(scale.overrides)),
        optimizer=scale.optimizer,
        trainer=trainer, law=law), resources


def train_eval(config: VoyageConfig, scale: Scale, name: str, train: TrainConfig, resources: Resources,
               heldout: Step, eval_mixture: Step | None = None) -> tuple[Step, Step, Step]:
    """pretrain, midtrain from its checkpoint, and eval (also on the held-out set)."""
    pre = Step(f"pretrain/{name}", pretrain, train, resources=resources,
               retry=RetryPolicy(max_node_failures=10))
    mid = Step(f"midtrain/{name}", midtrain, dataclasses.replace(train, init_from=output_of(pre)),
               resources=resources, retry=RetryPolicy(max_node_failures=10))
    harness = HarnessConfig(tasks=scale.eval_tasks) if scale.eval_tasks else None
    ev = Step(f"eval/{name}", evaluate, EvalConfig(checkpoint=output_of(mid), parallel=scale.eval_parallel,
                                                   mixture=output_of(eval_mixture) if eval_mixture else None,
                                                   datasets={scale.heldout.name: output_of(heldout)}, harness=harness),
              resources=scale.eval_resources)
    return pre, mid, ev


def training_steps(config: VoyageConfig, mix: Step, heldout: Step, law=None, verdict=None) -> list[Step]:
    """pretrain over the first stage, midtrain from its checkpoint over the second, then eval and
    the Hugging Face export of the midtrained model, and the model card of both. `law`: a
    ladder's sealed prediction the run is the target of (its identity includes it); `verdict`:
    a function of the eval step giving the ladder's check step, whose verdict the card carries."""
    scale = scale_of(config)
    train, resources = train_config(config, scale, mix, law=law)
    name = run_name(config)
    pre, mid, ev = train_eval(config, scale, name, train, resources, heldout)
    check = verdict(pre, ev) if verdict is not None else None
    # What the cards describe: the export's README.md (the Hub's page) and the card step's own.
    about = CardConfig(
        evaluation=output_of(ev, data=False), training=(output_of(pre), output_of(mid)), mixture=output_of(mix),
        licenses={s.name: getattr(s.license, "id", s.license) for s in scale.sources},
        title=f"{name} ({scale.preset} preset, seed {config.seed})", language=("en",),
        verdict=output_of(check, data=False) if check is not None else None)
    # The Hugging Face folder (docs/export.md): fp32 on a laptop, bf16 at full scale (the largest
    # tensor, one layer's 384 experts, is 14.5 GB in fp32 while it is read).
    ex = Step(f"export/{name}", export_hf, ExportHFConfig(
        checkpoint=output_of(mid), dtype="float32" if config.laptop else "bfloat16",
        pad_token="<|pad|>" if config.laptop else None, card=about),
        resources=scale.data_resources if config.laptop else Resources(cpus=8, memory_gb=64),
        licenses=release_policy(config))
    # The model card (docs/provenance.md): a cheap step of its own after eval, linking the export.
    card = Step(f"card/{name}", model_card, dataclasses.replace(about, export=output_of(ex)),
                resources=Resources(cpus=1 if config.laptop else 2))
    return [pre, mid, ev, ex, card] + ([check] if check is not None else [])


def voyage(config: VoyageConfig) -> list[Step]:
    """Sources -> ingest -> dedup -> decontaminate -> tokenize -> mixture -> pretrain -> midtrain -> eval
    (also on the held-out set), export. At full
    scale the training step's mesh is planned first: a plan that does not divide or fit stops
    the voyage here (VoyageError: exit 2). With `ladder`, the ladder's rungs, fit, sealed
    prediction and check (docs/ladder.md)."""
    scale = scale_of(config)
    _tok, tokenized, heldout = data_and_heldout(config)
    mix = mixture_step(config, tokenized, scale.pretrain_tokens + scale.midtrain_tokens)
    if not config.ladder:
        return training_steps(config, mix, heldout)
    built = ladder_steps(config, tokenized, heldout)
    if built.ladder.target == "run":  # the voyage's own run is the target: it takes the sealed prediction
        return built.steps + training_steps(config, mix, heldout, law=output_of(built.predict),
                                            verdict=lambda pre, ev: check_step(built.predict, pre, ev))
    return built.steps + training_steps(config, mix, heldout)


# ---------------------------------------------------------------------------------------------
# The scaling ladder (docs/ladder.md): rungs of the recipe at other sizes, sharing the data steps.


def ladder_of(config: VoyageConfig) -> Ladder:
    lad = LAPTOP_LADDER if config.laptop else FULL_LADDER
    if config.ladder_floor >= 0:
        lad = dataclasses.replace(lad, floor=config.ladder_floor)
    if config.ladder_rungs or config.ladder_seeds:
        rungs = tuple(x.strip() for x in config.ladder_rungs.split(",") if x.strip()) if config.ladder_rungs \
            else lad.rungs
        try:
            seeds = tuple(int(x) for x in config.ladder_seeds.split(",")) if config.ladder_seeds else (1,) * len(rungs)
        except ValueError:
            raise VoyageError(f"ladder_seeds: comma-separated whole numbers, got {config.ladder_seeds!r}") from None
        lad = Ladder(rungs=rungs, seeds=seeds, target=lad.target, metric=lad.metric, floor=lad.floor)
    return lad


@dataclass
class Rung:
    name: str  # its size's label: `22k`, `6e19flops`
    sized: Sized
    scale: Scale
    seeds: int
    mixture: Step | None = None
    runs: list = dataclasses.field(default_factory=list)  # (pretrain, midtrain, eval) per seed


@dataclass
class BuiltLadder:
    ladder: Ladder
    rungs: list[Rung]
    fit: Step
    predict: Step
    check: Step | None  # the top rung's check; for target "run", the voyage's run builds it
    steps: list[Step]
    target_name: str
    target_compute: float


def ladder_rule(config: VoyageConfig) -> SizeRule:
    """The recipe's rule, as the ladder's rungs follow it (`ladder_tokens` shortens a rehearsal)."""
    rule = rule_of(config)
    if config.ladder_tokens != 1.0:
        if not 0 < config.ladder_tokens <= 1:
            raise VoyageError(f"ladder_tokens must lie in (0, 1], got {config.ladder_tokens}")
        rule = dataclasses.replace(rule, tokens_per_param=rule.tokens_per_param * config.ladder_tokens)
    return rule


def rungs_of(config: VoyageConfig, lad: Ladder | None = None) -> list[Rung]:
    """The ladder's rungs at their sizes (no steps): the recipe's rule at each declared size,
    compute growing from rung to rung (else exit 2)."""
    lad = lad or ladder_of(config)
    rule = ladder_rule(config)
    rungs = []
    for size, seeds in zip(lad.rungs, lad.seeds):
        sized = rule.at(parse_size(size))
        rungs.append(Rung(parse_size(size).label, sized, scale_at(config, sized), seeds))
    check_growing([r.name for r in rungs], [r.sized.flops for r in rungs])
    return rungs


def ladder_steps(config: VoyageConfig, tokenized: dict[str, Step], heldout: Step,
                 rungs: list[Rung] | None = None) -> BuiltLadder:
    """Per rung, the recipe's mixture, training and eval at that size (one per seed), sharing
    the data steps; the fit over the fitted rungs, the sealed prediction for the target and,
    with target `top`, the top rung's training taking the prediction and its check. Every rung's
    configs are checked against the recipe's at its size (exit 2 naming a field that differs).
    `rungs` may carry steps already built (a voyage of its own); None builds them."""
    lad = ladder_of(config)
    rungs = rungs if rungs is not None else rungs_of(config, lad)
    top = rungs[-1]
    held_out = lad.target == "top"
    fitted = rungs[:-1] if held_out else rungs
    for r in rungs:
        if r.mixture is None:
            r.mixture = mixture_step(config, tokenized, r.scale.pretrain_tokens + r.scale.midtrain_tokens, r.scale,
                                     name=f"ladder/{r.name}/mixture")
    # the laptop's held-out windows: those the top rung's mixture never draws, never drawn by any
    # rung (one seeded order, each rung drawing a prefix of it), so every rung is scored alike
    pin = top.mixture if lad.metric == "loss" else None
    for r in fitted:
        if not r.runs:
            for seed in range(r.seeds):
                train, resources = train_config(config, r.scale, r.mixture, seed=config.seed + seed, sized=True)
                r.runs.append(train_eval(config, r.scale, f"ladder/{r.name}/s{seed}", train, resources, heldout, pin))
    for r in rungs:
        recipe_mix = mixture_step(config, tokenized, r.scale.pretrain_tokens + r.scale.midtrain_tokens, r.scale,
                                  name=r.mixture.name)
        check_rung(r.name, "mixture", recipe_mix.config, r.mixture.config)
        for seed, (pre, _mid, _ev) in enumerate(r.runs):
            recipe, _ = train_config(config, r.scale, r.mixture, seed=pre.config.trainer.seed, sized=True)
            check_rung(r.name, "training", recipe, pre.config, allowed=("law",))
    target_name = f"ladder/{top.name}" if held_out else run_name(config)
    target = scale_of(config) if not held_out else top.scale
    target_tokens = (target.pretrain_tokens + target.midtrain_tokens) * (target.seq_len - 1) / target.seq_len
    fpt = flops_per_token(target.model, target.seq_len - 1)
    fit = Step("ladder/fit", ladder_fit, FitConfig(
        rungs=tuple(RungResult(r.name, r.sized.flops, tuple(output_of(ev, data=False) for _p, _m, ev in r.runs),
                               params=r.sized.active_params, tokens=r.sized.tokens, size=r.name) for r in fitted),
        target=target_name, target_compute=fpt * target_tokens, target_tokens=target_tokens, metric=lad.metric,
        floor=lad.floor, rule=ladder_rule(config).describe(), target_seeds=top.seeds if held_out else 1),
        resources=Resources(cpus=1))
    predict = Step("ladder/predict", ladder_predict, PredictConfig(fit=output_of(fit, data=False), flops_per_token=fpt),
                   resources=Resources(cpus=1))
    steps: list[Step] = [fit, predict]
    check = None
    if held_out:
        if not top.runs:
            train, resources = train_config(config, top.scale, top.mixture, seed=config.seed, sized=True,
                                            law=output_of(predict, data=False))
            top.runs.append(train_eval(config, top.scale, f"ladder/{top.name}/s0", train, resources, heldout, pin))
        pre, _mid, ev = top.runs[0]
        recipe, _ = train_config(config, top.scale, top.mixture, seed=pre.config.trainer.seed, sized=True)
        check_rung(top.name, "training", recipe, pre.config, allowed=("law",))
        check = check_step(predict, pre, ev)
        # the held-out rung's model card carries the verdict, as the run's does when it is the target
        card = Step(f"card/ladder/{top.name}", model_card, CardConfig(
            evaluation=output_of(ev, data=False), training=(output_of(pre), output_of(_mid)),
            mixture=output_of(top.mixture), licenses={s.name: getattr(s.license, "id", s.license)
                                                      for s in top.scale.sources},
            title=f"ladder rung {top.name} (the target; {top.scale.preset} preset at width {top.sized.model.dim})",
            language=("en",), verdict=output_of(check, data=False)), resources=Resources(cpus=1))
        steps += [ev, check, card]
    steps += [ev for r in fitted for _p, _m, ev in r.runs]
    return BuiltLadder(lad, rungs, fit, predict, check, steps, target_name, fpt * target_tokens)


def check_step(predict: Step, pre: Step, ev: Step) -> Step:
    """HIT or MISS: the target's eval against the prediction its training consumed."""
    return Step("ladder/check", ladder_check, CheckConfig(prediction=output_of(predict, data=False),
                                                          training=output_of(pre, data=False),
                                                          evaluation=output_of(ev, data=False)),
                resources=Resources(cpus=1))


# ---------------------------------------------------------------------------------------------
# The budget, printed by `marin-run voyages/535b.py --dry-run`.


def summary(config: VoyageConfig, plan=None) -> str:
    """The budget (parameters, tokens, steps, FLOPs by the trainer's own formula, GPU-hours and
    days at the plan's step time) and the plan of the training step; at another size, its
    budget by the recipe's rules; with the ladder, its rungs and the prediction the cached rungs
    would seal (`plan`: the dry-run's, whose records are read)."""
    text = sized_summary(config) if config.size else run_summary(config)
    if config.ladder:
        text += "\n\n" + ladder_summary(config, plan)
    return text


def sized_summary(config: VoyageConfig) -> str:
    """The recipe at `--size`: its shape, tokens, batch, lr and compute by the rules, and at full
    scale its GPU-hours at the anchor's MFU."""
    rule = rule_of(config)
    sized = rule.at(parse_size(config.size))
    recipe = rule.at_width(rule.base.dim)
    lines = [f"the {'laptop' if config.laptop else '535B-A23B'} recipe at size {sized.label}: {sized.describe()}",
             f"  {sized.flops / recipe.flops:.3g}x the recipe's compute; switch at "
             f"{sized.pretrain_steps / sized.steps:.0%} ({sized.pretrain_steps:,} pretrain steps)",
             f"  rules: {rule.describe()}"]
    if not config.laptop:
        scale = scale_of(config)
        racks = sized_racks(config, scale)
        hours = gpu_hours(sized.flops, config.gpu_peak_tflops, config.mfu)
        lines.append(f"  time: {hours:,.0f} GPU-hours at the anchor's {config.mfu:.1%} MFU of {config.gpu_peak_tflops:g} "
                     f"TFLOP/s; {racks} rack(s) of 64 training GPUs: {hours / (64 * racks) / 24:,.1f} days")
    return "\n".join(lines)


def ladder_summary(config: VoyageConfig, plan=None) -> str:
    """The rungs (size, shape, tokens, FLOPs, GPU-hours at full scale or the wall time measured
    here), their share of the target's compute, and the prediction the cached rungs would seal."""
    lad = ladder_of(config)
    rungs = rungs_of(config, lad)
    held_out = lad.target == "top"
    target = scale_of(config) if not held_out else rungs[-1].scale
    t_tokens = (target.pretrain_tokens + target.midtrain_tokens) * (target.seq_len - 1) / target.seq_len
    t_flops = flops_per_token(target.model, target.seq_len - 1) * t_tokens
    run_flops = rule_of(config).at_width(rule_of(config).base.dim).flops if config.laptop else t_flops
    lines = [f"scaling ladder ({len(rungs)} rungs, target: "
             f"{'the top rung, held out' if held_out else 'this run'}; law L(C) = E + A*C^-alpha on eval "
             f"`{lad.metric}`, floor {'pinned at %g' % lad.floor if lad.floor is not None else 'fitted'}):",
             f"  {'rung':<12} {'width':>6} {'layers':>6} {'active':>8} {'total':>8} {'tokens':>8} {'steps':>8} "
             f"{'batch':>6} {'lr':>9} {'FLOPs':>9} {'seeds':>5} {'GPU-hours' if not config.laptop else 'wall here':>10}"]
    ladder_flops = 0.0
    walls = _rung_walls(plan, rungs) if plan is not None else {}
    for r in rungs:
        s = r.sized
        seeds = 1 if held_out and r is rungs[-1] else r.seeds
        ladder_flops += s.flops * seeds
        cost = (f"{gpu_hours(s.flops, config.gpu_peak_tflops, config.mfu) * seeds:,.0f}" if not config.laptop
                else (f"{walls[r.name]:.0f} s" if r.name in walls else "-"))
        lines.append(f"  {r.name + (' (target)' if held_out and r is rungs[-1] else ''):<12} {s.model.dim:>6} "
                     f"{s.model.n_layers:>6} {human(s.active_params):>8} {human(s.total_params):>8} {human(s.tokens):>8} "
                     f"{s.steps:>8,} {s.batch:>6,} {s.lr:>9.3g} {s.flops:>9.2e} {seeds:>5} {cost:>10}")
    share = ladder_flops / run_flops
    lines.append(f"  the ladder: {ladder_flops:.3g} FLOPs, {share:.2%} of the "
                 f"{'laptop recipe' if config.laptop else '535B run'}'s {run_flops:.3g}"
                 + (f"; {gpu_hours(ladder_flops, config.gpu_peak_tflops, config.mfu):,.0f} GPU-hours at the "
                    f"anchor's MFU" if not config.laptop else ""))
    lines.append(f"  target {'ladder/' + rungs[-1].name if held_out else run_name(config)}: {t_flops:.3g} FLOPs, "
                 f"{t_flops / (rungs[-2] if held_out else rungs[-1]).sized.flops:.3g}x the top fitted rung")
    lines.append("  " + _cached_prediction(lad, rungs[:-1] if held_out else rungs, t_flops, plan))
    return "\n".join(lines)


def _eval_names(r: Rung) -> list[str]:
    return [f"eval/ladder/{r.name}/s{seed}" for seed in range(r.seeds)]


def _rung_walls(plan, rungs: list[Rung]) -> dict[str, float]:
    """Wall seconds of a rung's cached training (pretrain + midtrain of its first seed), from the records."""
    from executor.views.lineage_view import records

    names = [f"{kind}/ladder/{r.name}/s0" for r in rungs for kind in ("pretrain", "midtrain")]
    names = [n for n in names if n in plan.by_name]
    recs = records(plan, names)
    out: dict[str, float] = {}
    for r in rungs:
        walls = [(recs.get(f"{kind}/ladder/{r.name}/s0") or {}).get("results", {}).get("wall_s")
                 for kind in ("pretrain", "midtrain")]
        if all(isinstance(w, (int, float)) for w in walls):
            out[r.name] = sum(walls)
    return out


def _cached_prediction(lad: Ladder, fitted: list[Rung], target_flops: float, plan) -> str:
    """What the predict step would seal from the rungs already cached under the prefix."""
    from executor.state import StepState
    from steps.data.formats import join, read_json
    from steps.ladder.steps import metric_of

    if plan is None:
        return "prediction: (no prefix read)"
    points, missing = [], []
    for r in fitted:
        losses = []
        for name in _eval_names(r):
            d = plan.by_name.get(name)
            if d is None or d.state != StepState.CACHED:
                break
            try:
                results = read_json(join(plan.path(d.node), "results.json"))
                losses.append(metric_of(results, lad.metric, name))
            except (OSError, ValueError, VoyageError):
                break
        if len(losses) == r.seeds:
            points.append((r, losses))
        else:
            missing.append(r.name)
    if len(points) < 3:
        return (f"prediction: {len(points)} of {len(fitted)} fitted rungs cached; the law needs 3: nothing to seal yet"
                + (f" (missing: {', '.join(missing)})" if missing else ""))
    from steps.ladder.law import FitError, LadderPoint, fit_report

    pts = [LadderPoint(r.name, r.sized.flops, sum(ls) / len(ls), tuple(ls) if len(ls) > 1 else ()) for r, ls in points]
    try:
        rep = fit_report(pts, target_compute=target_flops, floor=lad.floor)
    except FitError as e:
        return f"prediction: the cached rungs' fit fails ({e}): nothing would be sealed"
    t = rep["target"]
    law = {k: rep[rep["fit_used"]]["parameters"][k]["value"] for k in ("E", "A", "alpha")}
    return (f"prediction the {len(points)} cached rungs would seal{' (missing: ' + ', '.join(missing) + ')' if missing else ''}: "
            f"{t['predicted']:.4f} [{t['band'][0]:.4f}, {t['band'][1]:.4f}] at {target_flops:.3g} FLOPs; "
            f"L(C) = {law['E']:.4g} + {law['A']:.4g} C^-{law['alpha']:.4g}")


def run_summary(config: VoyageConfig) -> str:
    scale = scale_of(config)
    m = scale.model
    total, active = param_counts(m)
    tokens = scale.pretrain_tokens + scale.midtrain_tokens
    if config.laptop:
        return (f"laptop rehearsal of the 535B voyage: the `{scale.preset}` preset, {total:,} parameters "
                f"({active:,} active), {tokens:,.0f} tokens in {tokens / (scale.batch_size * scale.seq_len):,.0f} steps")
    from steps.scale.table import describe_anchor, format_plan

    measured, alternatives = plan_of(config)
    plan = measured.plan
    steps = tokens / (scale.batch_size * scale.seq_len)
    context = scale.seq_len - 1
    trained = steps * scale.batch_size * context  # each sequence of seq_len tokens gives seq_len - 1 targets
    fpt = flops_per_token(m, context)
    flops = fpt * trained
    matmul = active - m.vocab_size * m.dim
    step_s = plan.time.total
    anchor_s = plan.setup.calibration.target_s
    r = measured.reading
    lines = [
        f"budget of the 535B-A23B voyage ({m.n_layers} layers, {m.n_experts} experts top-{m.top_k}, d={m.dim}):",
        f"  parameters  {total / 1e9:,.1f}B total, {active / 1e9:,.2f}B active per token",
        f"  tokens      {tokens / 1e12:,.2f}T = {scale.pretrain_tokens / 1e12:g}T pretrain + "
        f"{scale.midtrain_tokens / 1e12:g}T midtrain (switch at {scale.pretrain_tokens / tokens:.0%})",
        f"  batch       {scale.batch_size:,} x {scale.seq_len:,} = {scale.batch_size * scale.seq_len / 1e6:,.1f}M tokens "
        f"({context:,} targets a sequence); {steps:,.0f} optimizer steps",
        "  FLOPs       flops_per_token (steps.moe.config, the trainer's MFU formula): 6 x N_active matmul + "
        "12 x heads x head_dim x keys_per_query, per layer",
        f"              = 6 x {matmul / 1e9:.2f}e9 + {fpt - 6 * matmul:.3g} = {fpt / 1e9:.2f} GFLOP a token, "
        f"x {trained:.4g} tokens = {flops:.2e}",
        f"  time        {steps:,.0f} steps x {step_s:.2f} s (the plan below) = {steps * step_s / 86400:,.0f} days on "
        f"{plan.ranks} GB200 that train = {steps * step_s * plan.ranks / 3600:,.0f} GPU-hours "
        f"(at the anchor's {anchor_s:.2f} s a step: {steps * anchor_s / 86400:,.0f} days)",
        "",
        format_plan(plan, list(alternatives), formula=measured.formula,
                    measured_note=(f"measured: the {m.n_layers}-layer model built on meta and sharded by "
                                   f"steps.train.parallel in a fake process group of {r.world} ranks "
                                   f"({r.seconds:.1f} s); one global and one windowed block and the head traced "
                                   f"under FakeTensorMode at the micro-batch ({measured.trace_seconds:.1f} s)"
                                   + "".join(f"\n  passed over, faster but over measured: {p}"
                                             for p in measured.passed_over))),
        "  " + describe_anchor(),
        "",
        format_data_plan(data_plan_of(config)),
    ]
    return "\n".join(lines)


def costs(config: VoyageConfig) -> dict[str, dict[str, object]]:
    """What each step of the voyage costs, from the plans the dry-run prints (`marin-run --diff`
    prices a change with it, docs/logbook.md): core-hours of each data step (the data plan) and
    GPU-hours of pretrain and midtrain (optimizer steps x the training plan's step time x the
    GPUs that train). The laptop's training steps are priced as the full-scale steps they rehearse
    (`at`); its data steps, over the bundled corpus, are not priced."""
    full = dataclasses.replace(config, laptop=False)
    scale = scale_of(full)
    plan = plan_of(full)[0].plan
    per_step = scale.batch_size * scale.seq_len
    name, at = run_name(config), run_name(full)
    out: dict[str, dict[str, object]] = {}
    if not config.laptop:
        out.update({s.name: {"core_hours": s.core_hours} for s in data_plan_of(full).steps})
    for stage, tokens in (("pretrain", scale.pretrain_tokens), ("midtrain", scale.midtrain_tokens)):
        out[f"{stage}/{name}"] = {"gpu_hours": tokens / per_step * plan.time.total * plan.ranks / 3600,
                                  "at": f"{stage}/{at}"}
    return out

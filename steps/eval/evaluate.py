"""`eval`: held-out loss and bits per byte of a checkpoint, per dataset, beside the unigram
baseline; optionally lm-eval-harness tasks through our adapter (steps/eval/harness.py).

Held-out data, per dataset of the mixture the checkpoint trained on: the windows of its first
epoch that the whole mixture (every stage) never draws. The mixture reads dataset d's windows in
the order of a seeded permutation, draws_d of them in all, so windows perm(draws_d),
..., perm(N_d - 1) are never trained on; up to `max_sequences` of them, evenly spaced, are
evaluated. A dataset the mixture draws completely has none (it is reported as such); more
tokenized datasets can be given in `datasets`, evaluated from their start.

Unigram baseline: the cross-entropy, on the same held-out targets, of the unigram distribution
of the tokens the checkpoint was trained on (up to `unigram_sequences` training sequences,
evenly spaced; add-one smoothing over the vocabulary). A model that has learnt anything beyond
token frequencies is below it.

Bits per byte: the summed loss in bits over the UTF-8 bytes the target tokens stand for (special
tokens stand for none).

The model is loaded the way the trainer builds it: on `meta`, sharded over the step's workers by
`parallel` (FSDP2 / HSDP, experts over `ep`), allocated on each worker's device and filled from
the DCP checkpoint (each rank reads only its shards), never whole on one device unless one
worker is asked for. One worker scores in the step's own process; N score as Ray Train workers
(local processes without Ray), each rank a contiguous share of the held-out windows, the sums
all-reduced; rank 0 writes results.json. The data side (held-out windows, unigram baseline,
bytes per token) is computed once, in the step's process.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from executor import InputPath, NonFinite, StepContext, VoyageError, run_only, step_type
from steps.data.formats import MANIFEST, TokenDataset, join, read_json, read_tokens_manifest
from steps.train.config import ParallelConfig


@dataclass(frozen=True)
class HarnessConfig:
    """lm-eval-harness tasks to run against the checkpoint (needs the `lm-eval` package)."""

    tasks: tuple[str, ...]
    include_path: str | None = None  # a folder of task YAMLs; with it only those tasks are indexed
    num_fewshot: int | None = None
    limit: int | None = None  # documents per task
    max_gen_tokens: int = 32
    hf_model: str | None = None  # an export_hf output: also run the tasks through lm-eval's own `hf` model on it


@dataclass(frozen=True)
class EvalConfig:
    """Evaluate `checkpoint`: a training step's output (its newest checkpoint) or a
    `checkpoints/step-N` folder."""

    checkpoint: InputPath
    mixture: InputPath | None = None  # None: the mixture the checkpoint was trained on
    datasets: dict[str, InputPath] = field(default_factory=dict)  # more held-out token datasets: name -> URL
    max_sequences: int = 256  # held-out sequences per dataset
    unigram_sequences: int = 4096  # training sequences counted for the unigram baseline
    harness: HarnessConfig | None = None
    batch_size: int = run_only(default=32)  # sequences per forward, per worker
    device: str = run_only(default="auto")
    workers: int = run_only(default=0)  # 0: the step's Resources.workers
    parallel: ParallelConfig = run_only(default_factory=ParallelConfig)  # how the workers shard the model

    def __post_init__(self) -> None:
        if self.max_sequences < 1 or self.unigram_sequences < 1:
            raise VoyageError("eval: max_sequences and unigram_sequences must be positive")


@step_type(version="1", name="eval")
def evaluate(config: EvalConfig, ctx: StepContext) -> None:
    """Held-out loss and bits per byte per dataset, the unigram baseline, and harness tasks;
    writes results.json."""
    from steps.train.launch import launch

    launch(prepare(config, ctx), score)
    with ctx.open("results.json", "r") as f:
        results = json.load(f)
    ctx.results.update(results)
    ctx.logger.info("%s: held-out loss %.4f (unigram %.4f), %.4f bits/byte", ctx.name, results["loss"],
                    results["unigram_loss"], results["bpb"])


def prepare(config: EvalConfig, ctx: StepContext) -> "EvalJob":
    """Everything but the model: check the inputs, pick the held-out windows, count the unigram
    baseline and the bytes (torch-free). Raises a VoyageError naming the field."""
    from steps.data.mixture import MixtureSampler
    from steps.data.paths import resolve
    from steps.train import checkpoint
    from steps.train.data import check_vocab, read_mixture

    found = checkpoint.resolve(config.checkpoint, "checkpoint")
    meta = checkpoint.read_meta(found.url)
    manifest = read_mixture(config.mixture or resolve(meta["mixture"], found.url))
    vocab = check_vocab(meta["model"]["vocab_size"], manifest, field="checkpoint")
    for name, url in config.datasets.items():
        got = read_json(join(url, MANIFEST))["vocab_size"]
        if got != vocab:
            raise VoyageError(f"datasets[{name!r}]: tokenized with {got} ids, the checkpoint's model has {vocab}")
    sampler = MixtureSampler(manifest)
    tokenizer_url = read_tokens_manifest(next(iter(manifest["datasets"].values()))["url"])["tokenizer"]
    nbytes = token_bytes(tokenizer_url, vocab)

    trained = min(int(meta["step"]) * int(meta["batch_size"]), sampler.size)
    unigram = unigram_logprobs(sampler, trained, config.unigram_sequences, vocab)
    heldout = {name: heldout_windows(sampler, name, config.max_sequences) for name in sampler.names}
    seq_len = sampler.seq_len
    for name, url in sorted(config.datasets.items()):
        data = TokenDataset(url)
        n = min(config.max_sequences, data.num_tokens // seq_len)
        heldout[name] = np.stack([data.tokens(i * seq_len, seq_len) for i in range(n)]) if n else None

    data: dict[str, Any] = {}
    for name, rows in heldout.items():
        if rows is None or not len(rows):
            data[name] = None
            continue
        rows = rows.astype(np.int64)
        targets = rows[:, 1:]
        data[name] = {"rows": rows, "bytes": int(nbytes[targets].sum()), "unigram_nats": float(-unigram[targets].sum())}
    if not any(data.values()):
        raise VoyageError("eval: no held-out data: the mixture draws every window of every dataset; give "
                          "`datasets` to evaluate on, or train on a smaller budget")
    workers = config.workers or ctx.resources.workers
    config.parallel.validate(workers, _model_config(meta))
    return EvalJob(ctx=ctx, config=config, url=found.url, step=found.step, meta=meta, data=data,
                   tokenizer_url=tokenizer_url, trained=min(trained, config.unigram_sequences), workers=workers,
                   cpus_per_worker=ctx.resources.cpus, created=time.time())


@dataclass
class EvalJob:
    """What every eval worker needs; built by the step, scored by `score`."""

    ctx: StepContext
    config: EvalConfig
    url: str  # the checkpoint folder
    step: int
    meta: dict[str, Any]
    data: dict[str, Any]  # dataset -> {"rows": int64 [n, seq_len], "bytes", "unigram_nats"} or None
    tokenizer_url: str
    trained: int  # training sequences the unigram baseline counted
    workers: int
    cpus_per_worker: float
    created: float

    @property
    def parallel(self) -> ParallelConfig:
        return self.config.parallel


def score(job: EvalJob) -> None:
    """One eval worker: load the checkpoint sharded over the workers, score its share of every
    dataset's held-out windows, run the harness tasks (every rank alike: its forwards are
    collectives), and on rank 0 write results.json."""
    import torch
    import torch.distributed as dist

    from steps.data.paths import ref
    from steps.train.parallel import join_mesh, pick_device, pick_precision

    config = job.config
    device = pick_device(config.device)
    if device.type == "cpu":
        torch.set_num_threads(max(1, int(job.cpus_per_worker)))
    had_group = dist.is_initialized()
    parallel, _, _ = join_mesh(config.parallel, device, pick_precision("auto", device))
    try:
        model = load_model(job.url, job.meta, device, parallel)
        dp = parallel.pc.dp
        per: dict[str, Any] = {}
        for name, entry in job.data.items():
            if entry is None:
                per[name] = {"sequences": 0, "note": "no held-out windows: the mixture draws all of this dataset"}
                continue
            rows = entry["rows"]
            nats = model_nats(model, rows, config.batch_size, device, parallel.data_rank, dp)
            targets = rows[:, 1:]
            n_bytes, uni = entry["bytes"], entry["unigram_nats"]
            per[name] = {"sequences": int(len(rows)), "tokens": int(targets.size), "bytes": n_bytes,
                         "loss": nats / targets.size, "unigram_loss": uni / targets.size,
                         "bpb": nats / math.log(2) / max(n_bytes, 1),
                         "unigram_bpb": uni / math.log(2) / max(n_bytes, 1)}
        scored = [v for v in per.values() if v.get("sequences")]
        tokens = sum(v["tokens"] for v in scored)
        n_bytes = sum(v["bytes"] for v in scored)
        results: dict[str, Any] = {
            "checkpoint": ref(job.ctx, job.url), "step": job.step, "datasets": per,
            "loss": sum(v["loss"] * v["tokens"] for v in scored) / tokens,
            "unigram_loss": sum(v["unigram_loss"] * v["tokens"] for v in scored) / tokens,
            "bpb": sum(v["bpb"] * v["bytes"] for v in scored) / max(n_bytes, 1),
            "unigram_bpb": sum(v["unigram_bpb"] * v["bytes"] for v in scored) / max(n_bytes, 1),
            "unigram_trained_sequences": job.trained, "workers": job.workers}
        if config.harness is not None:
            from steps.eval.harness import run_tasks

            results["harness"] = run_tasks(model, job.tokenizer_url, job.meta, config.harness, device,
                                           config.batch_size)
        bad = non_finite_numbers(results)
        if bad:  # a poisoned checkpoint must not publish a number (Marin #9051)
            raise NonFinite(f"eval of {job.url}: non-finite results at {', '.join(bad[:4])}; results.json not written")
        if not dist.is_initialized() or dist.get_rank() == 0:
            if config.harness is not None and config.harness.hf_model is not None:
                from steps.eval.harness_hf import run_hf_tasks  # transformers' own model: whole, on rank 0

                results["harness_hf"] = run_hf_tasks(config.harness.hf_model, config.harness, device,
                                                     config.batch_size)
            with job.ctx.open("results.json", "w") as f:
                json.dump(results, f, indent=1, sort_keys=True, default=float)
    finally:
        if dist.is_initialized() and not had_group:
            dist.destroy_process_group()


def non_finite_numbers(value: Any, path: str = "") -> list[str]:
    """Paths (`datasets.kjv.loss`) of the NaN or infinite floats in a nested result."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path or "."]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in non_finite_numbers(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in non_finite_numbers(v, f"{path}[{i}]")]
    return []


def _model_config(meta: dict[str, Any]):  # -> steps.moe.model.MoEConfig
    import dataclasses

    from steps.moe.config import MoEConfig

    names = {f.name for f in dataclasses.fields(MoEConfig)}
    return MoEConfig(**{k: v for k, v in meta["model"].items() if k in names})


def load_model(url: str, meta: dict[str, Any], device: Any, parallel: Any = None):  # -> MoETransformer, eval
    """The model of a checkpoint (weights only) on `device`: built on `meta`, sharded by
    `parallel` (a steps.train.parallel component; None: whole, one process), allocated, then
    filled from the checkpoint (each rank reads its own shards)."""
    import torch

    from steps.moe.model import MoETransformer
    from steps.train import checkpoint
    from steps.train.config import ParallelConfig
    from steps.train.parallel import OneProcess

    parallel = parallel or OneProcess(ParallelConfig().resolve(1))
    with torch.device("meta"):
        model = MoETransformer(_model_config(meta))
    model = parallel.parallelize(model)
    model.to_empty(device=device)
    for block in model.blocks:
        block.moe.expert_load_E.zero_()  # not in checkpoints: loads only count in training
    checkpoint.load(url, model, None)
    return parallel.wrap(model).eval()


def model_nats(model: Any, rows: np.ndarray, batch_size: int, device: Any, rank: int = 0, ranks: int = 1) -> float:
    """Summed next-token cross-entropy (nats) of the model over windows [n, seq_len]. With
    `ranks` > 1 this rank scores a contiguous share of the windows and the sums are all-reduced;
    every rank runs as many forwards (a short share is padded with windows counted zero), since
    a sharded model's forward is a collective."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    share = -(-len(rows) // ranks)
    mine = rows[rank * share:(rank + 1) * share]
    weight = np.ones(share, dtype=np.float64)
    if len(mine) < share:
        weight[len(mine):] = 0.0
        mine = np.concatenate([mine, np.repeat(rows[:1], share - len(mine), axis=0)])
    total = torch.zeros((), dtype=torch.float64, device=device)
    with torch.no_grad():
        for i in range(0, share, batch_size):
            seq = torch.from_numpy(mine[i:i + batch_size]).to(device)
            logits, _ = model(seq[:, :-1])
            nats = F.cross_entropy(logits.flatten(0, 1).float(), seq[:, 1:].flatten(), reduction="none")
            w = torch.from_numpy(weight[i:i + batch_size]).to(device)
            total += (nats.view(len(seq), -1).double().sum(1) * w).sum()
    if ranks > 1:
        dist.all_reduce(total)
    return float(total)


def heldout_windows(sampler: Any, name: str, limit: int) -> np.ndarray | None:
    """Up to `limit` first-epoch windows of dataset `name` that the mixture never draws."""
    from steps.data.mixture import feistel

    d = sampler.names.index(name)
    windows = int(sampler.windows[d])
    draws = int(sampler.manifest["draws"][name])
    if draws >= windows:
        return None
    picks = np.unique(np.linspace(draws, windows - 1, num=min(limit, windows - draws)).astype(np.int64))
    data = sampler.dataset(name)
    starts = [feistel(int(i), windows, (sampler.seed, d, 0)) * sampler.seq_len for i in picks]
    return np.stack([data.tokens(s, sampler.seq_len) for s in starts])


def unigram_logprobs(sampler: Any, trained: int, limit: int, vocab: int) -> np.ndarray:
    """log p(token) of the add-one-smoothed unigram distribution of the training sequences
    [0, trained) (up to `limit` of them, evenly spaced)."""
    counts = np.ones(vocab, dtype=np.float64)
    if trained:
        for i in np.unique(np.linspace(0, trained - 1, num=min(limit, trained)).astype(np.int64)):
            counts += np.bincount(sampler.sequence(int(i)), minlength=vocab)[:vocab]
    return np.log(counts / counts.sum())


def token_bytes(tokenizer_url: str, vocab: int) -> np.ndarray:
    """UTF-8 bytes each token id stands for; 0 for special tokens."""
    from steps.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_url)
    spec = json.loads(tok.to_str())
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    byte_level = (spec.get("decoder") or {}).get("type") == "ByteLevel"
    chars = byte_level_chars() if byte_level else {}
    out = np.zeros(vocab, dtype=np.int64)
    for i in range(min(vocab, tok.get_vocab_size(with_added_tokens=True))):
        if i in special:
            continue
        piece = tok.id_to_token(i)
        if piece is None:
            continue
        if byte_level and all(c in chars for c in piece):
            out[i] = len(piece)  # one printable stand-in character per byte
        else:
            out[i] = len(tok.decode([i]).encode("utf-8"))
    return out


def byte_level_chars() -> set[str]:
    """The 256 printable characters byte-level BPE uses to stand for the bytes 0..255: printable
    Latin-1 bytes stand for themselves, the other 68 are shifted past 255."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    shifted = [256 + k for k in range(256 - len(keep))]
    return {chr(c) for c in keep} | {chr(c) for c in shifted}

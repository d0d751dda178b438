"""`eval`: held-out loss and bits per byte of a checkpoint, per dataset, beside the unigram
baseline; optionally lm-eval-harness tasks through our adapter (steps/train/harness.py).

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
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from executor import StepContext, VoyageError, run_only, step_type
from steps.data.formats import MANIFEST, TokenDataset, join, read_json


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

    checkpoint: str
    mixture: str | None = None  # None: the mixture the checkpoint was trained on
    datasets: dict[str, str] = field(default_factory=dict)  # more held-out token datasets: name -> URL
    max_sequences: int = 256  # held-out sequences per dataset
    unigram_sequences: int = 4096  # training sequences counted for the unigram baseline
    harness: HarnessConfig | None = None
    batch_size: int = run_only(default=32)
    device: str = run_only(default="auto")

    def __post_init__(self) -> None:
        if self.max_sequences < 1 or self.unigram_sequences < 1:
            raise VoyageError("eval: max_sequences and unigram_sequences must be positive")


@step_type(version="1", name="eval")
def evaluate(config: EvalConfig, ctx: StepContext) -> None:
    """Held-out loss and bits per byte per dataset, the unigram baseline, and harness tasks;
    writes results.json."""
    from steps.data.mixture import MixtureSampler
    from steps.train import checkpoint
    from steps.train.data import check_vocab, read_mixture
    from steps.train.parallel import pick_device

    found = checkpoint.resolve(config.checkpoint, "checkpoint")
    meta = checkpoint.read_meta(found.url)
    manifest = read_mixture(config.mixture or meta["mixture"])
    vocab = check_vocab(meta["model"]["vocab_size"], manifest, field="checkpoint")
    for name, url in config.datasets.items():
        got = read_json(join(url, MANIFEST))["vocab_size"]
        if got != vocab:
            raise VoyageError(f"datasets[{name!r}]: tokenized with {got} ids, the checkpoint's model has {vocab}")
    sampler = MixtureSampler(manifest)
    device = pick_device(config.device)
    model = load_model(found.url, meta, device)
    tokenizer_url = read_json(join(next(iter(manifest["datasets"].values()))["url"], MANIFEST))["tokenizer"]
    nbytes = token_bytes(tokenizer_url, vocab)

    trained = min(int(meta["step"]) * int(meta["batch_size"]), sampler.size)
    unigram = unigram_logprobs(sampler, trained, config.unigram_sequences, vocab)
    heldout = {name: heldout_windows(sampler, name, config.max_sequences) for name in sampler.names}
    seq_len = sampler.seq_len
    for name, url in sorted(config.datasets.items()):
        data = TokenDataset(url)
        n = min(config.max_sequences, data.num_tokens // seq_len)
        heldout[name] = np.stack([data.tokens(i * seq_len, seq_len) for i in range(n)]) if n else None

    per: dict[str, Any] = {}
    for name, rows in heldout.items():
        if rows is None or not len(rows):
            per[name] = {"sequences": 0, "note": "no held-out windows: the mixture draws all of this dataset"}
            continue
        rows = rows.astype(np.int64)
        nats = model_nats(model, rows, config.batch_size, device)
        targets = rows[:, 1:]
        n_bytes = int(nbytes[targets].sum())
        uni = float(-unigram[targets].sum())
        per[name] = {"sequences": int(len(rows)), "tokens": int(targets.size), "bytes": n_bytes,
                     "loss": nats / targets.size, "unigram_loss": uni / targets.size,
                     "bpb": nats / math.log(2) / max(n_bytes, 1), "unigram_bpb": uni / math.log(2) / max(n_bytes, 1)}
    scored = [v for v in per.values() if v.get("sequences")]
    if not scored:
        raise VoyageError("eval: no held-out data: the mixture draws every window of every dataset; give "
                          "`datasets` to evaluate on, or train on a smaller budget")
    tokens = sum(v["tokens"] for v in scored)
    n_bytes = sum(v["bytes"] for v in scored)
    results: dict[str, Any] = {
        "checkpoint": found.url, "step": found.step, "datasets": per,
        "loss": sum(v["loss"] * v["tokens"] for v in scored) / tokens,
        "unigram_loss": sum(v["unigram_loss"] * v["tokens"] for v in scored) / tokens,
        "bpb": sum(v["bpb"] * v["bytes"] for v in scored) / max(n_bytes, 1),
        "unigram_bpb": sum(v["unigram_bpb"] * v["bytes"] for v in scored) / max(n_bytes, 1),
        "unigram_trained_sequences": min(trained, config.unigram_sequences)}
    if config.harness is not None:
        from steps.train.harness import run_tasks

        results["harness"] = run_tasks(model, tokenizer_url, meta, config.harness, device, config.batch_size)
        if config.harness.hf_model is not None:
            from steps.export.harness_hf import run_hf_tasks

            results["harness_hf"] = run_hf_tasks(config.harness.hf_model, config.harness, device, config.batch_size)
    with ctx.open("results.json", "w") as f:
        json.dump(results, f, indent=1, sort_keys=True, default=float)
    ctx.results.update(results)
    ctx.logger.info("%s: held-out loss %.4f (unigram %.4f), %.4f bits/byte", ctx.name, results["loss"],
                    results["unigram_loss"], results["bpb"])


def load_model(url: str, meta: dict[str, Any], device: Any):  # -> MoETransformer, eval mode
    """The model of a checkpoint (weights only), on `device`."""
    import dataclasses

    from steps.moe.model import MoEConfig, MoETransformer
    from steps.train import checkpoint

    names = {f.name for f in dataclasses.fields(MoEConfig)}
    cfg = MoEConfig(**{k: v for k, v in meta["model"].items() if k in names})
    model = MoETransformer(cfg)
    checkpoint.load(url, model, None)
    return model.to(device).eval()


def model_nats(model: Any, rows: np.ndarray, batch_size: int, device: Any) -> float:
    """Summed next-token cross-entropy (nats) of the model over windows [n, seq_len]."""
    import torch
    import torch.nn.functional as F

    total = 0.0
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            seq = torch.from_numpy(rows[i:i + batch_size]).to(device)
            logits, _ = model(seq[:, :-1])
            total += F.cross_entropy(logits.flatten(0, 1).float(), seq[:, 1:].flatten(), reduction="sum").item()
    return total


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

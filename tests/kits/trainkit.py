"""Helpers of the training tests: run a step function in-process, tokenize the bundled corpus,
mix it. The session fixture that uses them is in conftest.py."""

import contextlib
import pathlib
import threading

from executor.testing import build_context
from steps.data.ingest import IngestConfig, ingest
from steps.data.mixture import MixtureConfig, MixtureStage, mixture
from steps.data.tokenize import TokenizeConfig, tokenize
from steps.data.tokenizer import TrainTokenizerConfig, train_tokenizer

CORPUS = pathlib.Path(__file__).resolve().parents[2] / "data/corpus"


def run_step(fn, config, output, name="t", lease=None, voyage=""):
    """`fn(config, ctx)` in this process; `lease` (executor.context.LeaseRef): the attempt's lease,
    as the executor gives it (then the step is resumable, as training is); `voyage`: the voyage's
    name, as a run of `marin-run` gives it."""
    ctx = build_context(str(output), name=name, digest=(name.replace("/", "") * 64)[:64].ljust(64, "0"), lease=lease, resumable=lease is not None, voyage=voyage)
    fn(config, ctx)
    return ctx


@contextlib.contextmanager
def renewed(leases, dirname, lease):
    """Keeps `lease` renewed every quarter ttl while the block runs, as the executor's driver does
    for a running attempt (a test that runs a step under a lease nobody renews lets it expire on a
    slow machine, and the step's fence then rightly stops)."""
    stop = threading.Event()

    def beat():
        while not stop.wait(leases.ttl / 4):
            if leases.renew(dirname, lease) is None:
                return

    thread = threading.Thread(target=beat, name="test-lease-renewer", daemon=True)
    thread.start()
    try:
        yield lease
    finally:
        stop.set()
        thread.join()


def build_tokens(root):
    """{'kjv': url, 'pydocs': url, 'tokenizer': url}: both corpora tokenized with a 512-id BPE."""
    raw = {}
    for name in ("kjv", "pydocs"):
        raw[name] = run_step(ingest, IngestConfig(input=str(CORPUS / f"{name}.jsonl.zst")), root / f"raw-{name}").output
    tok = run_step(train_tokenizer, TrainTokenizerConfig(documents=raw["kjv"], vocab_size=512, max_documents=200),
                   root / "tokenizer").output
    out = {"tokenizer": tok}
    for name in ("kjv", "pydocs"):
        out[name] = run_step(tokenize, TokenizeConfig(documents=raw[name], tokenizer=tok, bos=None, eos="<|eos|>"),
                             root / f"tokens-{name}").output
    return out


def make_mixture(tokens, output, *, sequences, seq_len=33, stages=((0.75, {"kjv": 1.0}), (0.25, {"pydocs": 1.0})),
                 block_size=64):
    """A mixture of the session's tokenized corpora; returns its output URL."""
    config = MixtureConfig(datasets={"kjv": tokens["kjv"], "pydocs": tokens["pydocs"]},
                           token_budget=sequences * seq_len, seq_len=seq_len, block_size=block_size,
                           stages=tuple(MixtureStage(f, w) for f, w in stages))
    return run_step(mixture, config, output).output


def write_if_agreed(lease, folder):
    """On each spawned rank: `saving.on_rank0_under_lease` around rank 0's write of `folder/written`; each rank
    writes what it got to `folder/rankN.txt` (test_train_async)."""
    import torch.distributed as dist

    from executor import LeaseLost
    from steps.train.saving import on_rank0_under_lease

    ctx = build_context(folder, name="pre", digest="0" * 64, lease=lease, resumable=True)
    try:
        on_rank0_under_lease(ctx.fenced, "a test write", lambda: open(f"{folder}/written", "w").close())
        said = "ok"
    except LeaseLost as e:
        said = f"LeaseLost: {e}"
    with open(f"{folder}/rank{dist.get_rank()}.txt", "w") as f:
        f.write(said)


def wandb_runs(path):
    """The `run` records of an offline W&B run file (`run-*.wandb`), read back as W&B's sync reads
    them: a 7-byte header (`:W&B`, magic, version), then LevelDB-log records in 32 KiB blocks (CRC,
    length, type: full, first, middle, last) of `wandb_internal_pb2.Record` protobufs."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data = pathlib.Path(path).read_bytes()
    assert data[:4] == b":W&B", data[:8]
    pos, block, parts, runs = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            if record.WhichOneof("record_type") == "run":
                runs.append(record.run)
    return runs

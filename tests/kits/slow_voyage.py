"""A voyage whose steps take a while and write several files each, for fault injection.

    marin-run tests/kits/slow_voyage.py --shards 3 --files 4 --delay 0.25

`slow/shard/{i}` writes `files` parts one after another, `slow/sum/{i}` writes a checksum per part
of its shard, `slow/total` adds every sum up. Each file is written, then the step sleeps `delay`,
so a SIGKILL at a random moment lands between (or inside) writes. `delay` and `accelerator` are
run-only: an interrupted run, a fast rerun and an uninterrupted run share every digest, and must
end with identical output digests.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from executor import Resources, Step, StepContext, output_of, run_only, step_type


@dataclass(frozen=True)
class SlowConfig:
    """The voyage's knobs."""

    shards: int = 3
    files: int = 4
    kib: int = 64  # per part
    delay: float = 0.25  # seconds after each file written
    accelerator: str = ""  # e.g. GB200: the shards then run only on nodes that have it
    seed: int = 0


@dataclass(frozen=True)
class ShardConfig:
    index: int
    files: int
    kib: int
    seed: int
    delay: float = run_only(default=0.0)


@step_type(version="1")
def write_shard(config: ShardConfig, ctx: StepContext) -> None:
    """Write `files` parts of pseudo-random bytes, slowly."""
    for j in range(config.files):
        block = hashlib.sha256(f"{config.seed}/{config.index}/{j}".encode()).digest()
        with ctx.open(f"part-{j:03d}.bin", "wb") as f:
            f.write(block * (config.kib * 1024 // len(block)))
        time.sleep(config.delay)
    ctx.results["parts"] = config.files


@dataclass(frozen=True)
class SumConfig:
    shard: str
    files: int
    delay: float = run_only(default=0.0)


@step_type(version="1")
def sum_shard(config: SumConfig, ctx: StepContext) -> None:
    """One sha256 file per part of a shard, slowly."""
    import fsspec

    for j in range(config.files):
        with fsspec.open(f"{config.shard}/part-{j:03d}.bin", "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        with ctx.open(f"sums/part-{j:03d}.sha256", "w") as f:
            f.write(digest + "\n")
        time.sleep(config.delay)


@dataclass(frozen=True)
class TotalConfig:
    sums: tuple[str, ...]
    files: int
    delay: float = run_only(default=0.0)


@step_type(version="1")
def total(config: TotalConfig, ctx: StepContext) -> None:
    """Every sum, in order, then one digest over them all."""
    import fsspec

    lines = []
    for url in config.sums:
        for j in range(config.files):
            with fsspec.open(f"{url}/sums/part-{j:03d}.sha256", "r") as f:
                lines.append(f.read().strip())
    with ctx.open("sums.txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    time.sleep(config.delay)
    with ctx.open("total.txt", "w") as f:
        f.write(hashlib.sha256("\n".join(lines).encode()).hexdigest() + "\n")


def voyage(config: SlowConfig) -> list[Step]:
    """`shards` slow shards, a slow sum of each, one total."""
    sums = []
    for i in range(config.shards):
        shard = Step(f"slow/shard/{i}", write_shard,
                     ShardConfig(i, config.files, config.kib, config.seed, delay=config.delay),
                     resources=Resources(cpus=0.5, accelerator=config.accelerator or None))
        sums.append(Step(f"slow/sum/{i}", sum_shard, SumConfig(output_of(shard), config.files, delay=config.delay),
                         resources=Resources(cpus=0.5)))
    return [Step("slow/total", total, TotalConfig(tuple(output_of(s) for s in sums), config.files, delay=config.delay),
                 resources=Resources(cpus=0.5))]

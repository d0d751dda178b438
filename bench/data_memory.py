"""Peak memory of tokenize and dedup on the corpus and on a corpus 10x larger (the same shard
size, ten times the shards; copies are word-shuffled so they are not duplicates).

    .venv/bin/python -m bench.data_memory --scale 10

Each run is a fresh subprocess (steps called directly, no Ray, so the number is the work's own);
its peak RSS is ru_maxrss. "imports" is the same process doing nothing but the imports.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, resource, shutil, sys, os
from bench.data_common import WORK, ctx, shards, tokenizer
from steps.data.tokenize import TokenizeConfig, tokenize
from steps.dedup.dedup import DedupConfig, dedup
job, scale = sys.argv[1], int(sys.argv[2])
src = shards(scale)
out = WORK / f"mem-{job}-{scale}"
shutil.rmtree(out, ignore_errors=True)
if job == "tokenize":
    tokenize(TokenizeConfig(documents=str(src), tokenizer=str(tokenizer()), bos=None, eos="<|eos|>", threads=2), ctx(out))
elif job == "dedup":
    dedup(DedupConfig(documents=str(src)), ctx(out))
elif job == "dedup-verify":
    dedup(DedupConfig(documents=str(src), bands=28, rows=4, verify_threshold=0.7), ctx(out))
print(json.dumps({"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(job: str, scale: int) -> float:
    env = dict(os.environ, RAYON_NUM_THREADS="2", TOKENIZERS_PARALLELISM="true")
    out = subprocess.run([sys.executable, "-c", CHILD, job, str(scale)], capture_output=True, text=True, env=env,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["rss_mb"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    args = ap.parse_args()
    from bench.data_common import shards, tokenizer

    tokenizer()
    for s in (1, args.scale):
        src = shards(s)
        mb = sum(f.stat().st_size for f in src.glob("*.jsonl.zst")) / 1e6
        print(f"corpus x{s}: {len(list(src.glob('*.jsonl.zst')))} shards, {mb:.1f} MB compressed", flush=True)
    base = run("imports", 1)
    print(f"imports only: {base:.0f} MB")
    for job in ("tokenize", "dedup", "dedup-verify"):
        small, large = run(job, 1), run(job, args.scale)
        print(f"{job:13s} x1 {small:6.0f} MB   x{args.scale} {large:6.0f} MB   ratio {large / small:.3f} (target < 1.5)"
              f"   above imports: {small - base:.0f} -> {large - base:.0f} MB", flush=True)


if __name__ == "__main__":
    main()

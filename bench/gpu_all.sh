#!/usr/bin/env bash
# One GPU try that counts: every GPU check of the project in one command, well inside
# the device's 10-minute limit, the most valuable part first, each part's result on $OUT as it
# ends, so a run killed half-way still brings back what it finished.
#
#   part      limit  what                                                       result
#   env          30  the wheels installed, GPU, driver, torch, Triton          env.txt
#   block       150  bench/gpu_block_memory.py: one 535B block against the     block.json, block.txt
#                    plan (PASS/FAIL within 10%), fused router vs eager,
#                    grouped-GEMM offsets, the bf16 matmul peak
#   train       170  bench/train_gpu.py: MFU of the `small` preset under        train.txt
#                    selective and full checkpointing, our MoE layer
#   router       90  bench/router.py: the fused router's sweep-less table      router.txt
#   (every part) one line of summary.jsonl as it ends: name, exit status, seconds
#
# The limits add up to 440 s; with the machine's own start the call fits a 540 s timeout_s and
# leaves the session's 15 minutes room for one rerun. GPU_BUDGET_S (default 480) caps the whole:
# a part never starts with less than 20 s left, and gets at most what is left.
#
# Before the call, here (CPU): `python bench/gpu_wheels.py --download` prepares .whl/ (what the
# device lacks: pydantic, zstandard, dill ...) and checks it. Then the device tool:
#   command "bash bench/gpu_all.sh", carry [".whl"], timeout_s 540
# The CPU dry form (tests/bench/test_gpu_all.py): `bash bench/gpu_all.sh --dry` runs every part
# at tiny shapes with $PYTHON (default python3); GPU_INJECT (JSON) is handed to the block check's
# --inject, to test the verdicts on given figures; GPU_PARTS (comma-separated) runs only those parts.
set -uo pipefail
DRY=0
[ "${1:-}" = "--dry" ] && DRY=1
OUT=${OUT:-/tmp/marin-gpu-bench}
mkdir -p "$OUT"
export OUT
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUDGET=${GPU_BUDGET_S:-480}
T0=$(date +%s)
export PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
: > "$OUT/summary.jsonl"

part() {  # part NAME LIMIT_S COMMAND...: run it under its limit (capped by what is left), log, record
  local name=$1 limit=$2 left rc start status
  shift 2
  left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ "$left" -lt 20 ]; then
    echo "{\"part\": \"$name\", \"status\": \"skipped\", \"why\": \"$left s of the $BUDGET s budget left\"}" >> "$OUT/summary.jsonl"
    echo "== $name: skipped, $left s left"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit $limit s)"
  start=$(date +%s)
  timeout -k 5 "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
  rc=${PIPESTATUS[0]}
  case $rc in 0) status=ok ;; 124|137) status="timed out" ;; *) status=failed ;; esac
  echo "{\"part\": \"$name\", \"status\": \"$status\", \"exit\": $rc, \"seconds\": $(( $(date +%s) - start )), \"limit\": $limit}" >> "$OUT/summary.jsonl"
}

env_part() {
  if [ "$DRY" = 0 ] && [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || return 1
  fi
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda); import triton; print('triton', triton.__version__); import pydantic, zstandard; print('pydantic', pydantic.VERSION, 'zstandard', zstandard.__version__)"
}
[ "$DRY" = 0 ] && [ -d .whl ] && export PYTHONPATH=/tmp/site:$PYTHONPATH
export -f env_part
export DRY PY
PARTS=${GPU_PARTS:-env,block,train,router}
want() { case ",$PARTS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

if [ "$DRY" = 1 ]; then
  want env && part env 30 bash -c env_part
  want block && part block 120 "$PY" bench/gpu_block_memory.py --dry ${GPU_INJECT:+--inject "$GPU_INJECT"}
  want train && part train 120 "$PY" bench/train_gpu.py --device cpu --preset tiny --seq 32 --batch 2 --steps 1 --warmup 1 \
    --checkpointing selective --layer-tokens 64 --repeats 1
  want router && part router 60 env TRITON_INTERPRET=1 "$PY" bench/router.py --device cpu --small --tokens 64 --experts 16 --k 4 \
    --no-compile --no-sweep
else
  want env && part env 30 bash -c env_part
  want block && part block 150 "$PY" bench/gpu_block_memory.py --checkpointing selective
  want train && part train 170 "$PY" bench/train_gpu.py --checkpointing selective,full --steps 8 --warmup 3 --repeats 10
  want router && part router 90 "$PY" bench/router.py --device cuda --no-sweep --no-compile
fi
echo "== summary ($(( $(date +%s) - T0 )) s of the $BUDGET s budget)"
cat "$OUT/summary.jsonl"
"$PY" - <<'EOF' || true
import json, os
try:
    got = json.load(open(os.path.join(os.environ["OUT"], "block.json")))
except (OSError, ValueError) as e:
    print(f"block.json: none ({type(e).__name__})")
    raise SystemExit(0)
print("block check:", got.get("verdict", "unfinished"), "|", ", ".join(
    f"{k} {v.get('verdict', 'ERROR' if 'error' in v else '-')}" for k, v in got["parts"].items()))
EOF

#!/usr/bin/env bash
# The GPU benchmarks of issues 12 and 22 in one run on one H200 (the last part, issue 22's block check, may need
# a run of its own: `python3 bench/gpu_block_memory.py`, under 3 minutes): the router kernel
# (bench/router.py: fused forward + backward against eager torch and against copy bandwidth) and
# training the `small` preset (bench/train_gpu.py: MFU under none / selective / full activation
# checkpointing, the grouped-GEMM expert path, the fused router; our MoE layer beside torchtitan's
# when torchtitan is importable). Each part has its own time limit, so one that overruns still
# leaves the other's table. Results: $OUT/*.txt (and the JSON each script prints last).
#
# The device image has python3 with torch and Triton but not every package the project imports.
# Prepare once, here, in the repository root (wheels for Python 3.12 on x86-64):
#   echo /.whl/ >> "$(git rev-parse --git-path info/exclude)"
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 zstandard==0.25.0
# then run it with the device tool: command "bash bench/gpu_all.sh", carry [".whl"], timeout_s 540.
set -uo pipefail
OUT=${OUT:-/tmp/marin-gpu-bench}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  2>&1 | tee "$OUT/env.txt"
start=$(date +%s)
timeout 200 python3 bench/router.py --device cuda --no-sweep 2>&1 | tee "$OUT/router.txt"
echo "router: exit ${PIPESTATUS[0]}, $(( $(date +%s) - start )) s" | tee -a "$OUT/router.txt"
start=$(date +%s)
timeout 250 python3 bench/train_gpu.py 2>&1 | tee "$OUT/train_gpu.txt"
echo "train_gpu: exit ${PIPESTATUS[0]}, $(( $(date +%s) - start )) s" | tee -a "$OUT/train_gpu.txt"
start=$(date +%s)
# issue 22 item 6: one 535B block's memory and time against the plan (under 3 minutes)
timeout 170 python3 bench/gpu_block_memory.py --checkpointing selective 2>&1 | tee "$OUT/gpu_block_memory.txt"
echo "gpu_block_memory: exit ${PIPESTATUS[0]}, $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu_block_memory.txt"

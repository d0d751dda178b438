#!/usr/bin/env bash
# Create .venv and install marin-voyage into it (editable). `./setup.sh --dev` adds the test tools.
#
# torch is installed first, pinned to 2.13.0: on our dev and CI machines pip takes the CPU wheel
# that lies on disk; an unpinned torch would pull a CUDA build of several GB. Set
# MARIN_TORCH_SPEC (e.g. "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128")
# to choose another build on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")"
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev]"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# shellcheck disable=SC2086
.venv/bin/python -m pip install -q ${MARIN_TORCH_SPEC:-torch==2.13.0}
.venv/bin/python -m pip install -q -e ".${extras}"
echo "marin-voyage installed in .venv (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"

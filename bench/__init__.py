"""The benchmarks: one script a module, run from the repository root as `python -m bench.NAME`
(`python bench/NAME.py` works too). bench.kit holds what they share: ROOT, `timed` and `emit`;
bench/report.py turns the JSON lines `emit` appends into a markdown table."""

import pathlib as _pathlib
import sys as _sys

# The repository root and tests/ (the kits: `from kits import faultkit`) on the path, once, here.
for _p in (_pathlib.Path(__file__).resolve().parents[1], _pathlib.Path(__file__).resolve().parents[1] / "tests"):
    if str(_p) not in _sys.path:
        _sys.path.append(str(_p))

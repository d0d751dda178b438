"""The full-scale plan of a training step: per-GPU memory and per-step communication of a mesh,
from the real model sharded in a fake process group and one block traced under FakeTensorMode
(docs/training.md, "The plan at full scale").

Torch-free: `hardware`, `memory`, `comms`, `anchor` (the efficiency calibrated on Marin's
published run), `plan` (the closed forms, the checks, the search), `table` (the text).
Torch: `trace` (activation bytes of one block), `measure` (the fake-process-group build).
"""

"""A voyage for the ladder's `--diff` test: kits.ladderkit's synthetic ladder (rungs, fit, predict,
target, its eval, check), its fit's floor as the config field a commit changes."""

import os
import sys
from dataclasses import dataclass

if os.path.dirname(os.path.dirname(os.path.abspath(__file__))) not in sys.path:  # tests/, for `kits` (--diff
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # plans it in a subprocess)

from kits import ladderkit  # noqa: E402


@dataclass(frozen=True)
class LadderConfig:
    floor: float | None = None  # None: E free; a number pins it (the prediction moves)


def voyage(config: LadderConfig):
    return ladderkit.all_steps(ladderkit.ladder(floor=config.floor))

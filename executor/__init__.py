"""marin-voyage's executor: versioned, content-hashed Steps planned and run on Ray.

The public API, for step types and voyages:

    from executor import Step, step_type, output_of, this_output, Resources, RetryPolicy, StepContext

Importing it imports neither Ray nor torch.
"""

from executor.context import StepContext
from executor.errors import IdentityError, VoyageError
from executor.step import (
    InputRef,
    OwnOutput,
    Resources,
    RetryPolicy,
    Step,
    StepType,
    output_of,
    run_only,
    step_type,
    this_output,
)

__all__ = [
    "IdentityError",
    "InputRef",
    "OwnOutput",
    "Resources",
    "RetryPolicy",
    "Step",
    "StepContext",
    "StepType",
    "VoyageError",
    "output_of",
    "run_only",
    "step_type",
    "this_output",
]

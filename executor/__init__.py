"""marin-voyage's executor: versioned, content-hashed Steps planned and run on Ray.

The public API, for step types and voyages:

    from executor import Step, step_type, output_of, this_output, Resources, RetryPolicy, StepContext
    from executor import AtomicFile, write_atomic   # files readers see whole or not at all

Importing it imports neither Ray nor torch.
"""

from executor.context import StepContext
from executor.errors import IdentityError, VoyageError
from executor.files import AtomicFile, is_local, is_object_store, write_atomic
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
    "AtomicFile",
    "IdentityError",
    "InputRef",
    "OwnOutput",
    "Resources",
    "RetryPolicy",
    "Step",
    "StepContext",
    "StepType",
    "VoyageError",
    "is_local",
    "is_object_store",
    "output_of",
    "run_only",
    "step_type",
    "this_output",
    "write_atomic",
]

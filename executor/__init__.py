"""marin-voyage's executor: versioned, content-hashed Steps planned and run on Ray.

The public API, for step types and voyages:

    from executor import Step, step_type, output_of, this_output, InputPath, Resources, RetryPolicy, StepContext

and for planning and running from Python (what `marin-run` does):

    from executor import plan_steps, run_steps, Selection

and for licences (docs/provenance.md):

    from executor import License, LicensePolicy

and for failures that know their class (executor.failures: the retry policy's budgets):

    from executor import Hang, NonFinite

and for files that readers see whole or not at all:

    from executor import AtomicFile, write_atomic

and for naming other outputs without their attempts (docs/concepts.md, "Attempts"):

    from executor import attempt_root, logical_url, served_url

Importing it imports neither Ray nor torch.
"""

from typing import TYPE_CHECKING, Any

from executor.api import plan_steps, run_plan, run_steps
from executor.storage.attempts import attempt_root
from executor.storage.attempts import logical as logical_url
from executor.storage.attempts import served as served_url
from executor.context import StepContext
from executor.errors import IdentityError, VoyageError
from executor.failures import Hang, LeaseLost, NonFinite
from executor.storage.files import AtomicFile, is_local, is_object_store, write_atomic
from executor.licenses import License, LicensePolicy
from executor.views.lineage_view import step_span
from executor.plan import Plan, Selection
from executor.state import StepState
from executor.step import (
    InputPath,
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

if TYPE_CHECKING:
    from executor.runner import RunSummary


def __getattr__(name: str) -> Any:
    # The runner imports the worker and the record's pydantic models: only a run needs them, and
    # `marin-run --dry-run` imports this package (through the voyage) without running anything.
    if name == "RunSummary":
        from executor.runner import RunSummary

        return RunSummary
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AtomicFile",
    "Hang",
    "IdentityError",
    "InputPath",
    "InputRef",
    "LeaseLost",
    "License",
    "NonFinite",
    "LicensePolicy",
    "OwnOutput",
    "Plan",
    "Resources",
    "RetryPolicy",
    "RunSummary",
    "Selection",
    "Step",
    "StepContext",
    "StepState",
    "StepType",
    "VoyageError",
    "attempt_root",
    "is_local",
    "logical_url",
    "is_object_store",
    "output_of",
    "plan_steps",
    "run_only",
    "run_plan",
    "run_steps",
    "served_url",
    "step_span",
    "step_type",
    "this_output",
    "write_atomic",
]

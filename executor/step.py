"""Step types, Steps and the references that wire them into a DAG.

A *step type* is a function `(config, ctx) -> None` registered with a name and an explicit
version. A *Step* is one node of a voyage: a name, a step type, a frozen config dataclass that may
hold references to other steps' outputs, and run-only settings (resources, retries). Building a
Step runs nothing and computes nothing; identity is computed when the DAG is built.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from executor.errors import VoyageError

# Names become folder names on every store: keep them to a portable alphabet.
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")


def run_only(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A config field that does not change the result (logging, worker counts, W&B mode, ...).

    Such fields are left out of the step's identity, so changing them never forks an output.
    """
    kwargs: dict[str, Any] = {"metadata": {"run_only": True}}
    if default is not dataclasses.MISSING:
        kwargs["default"] = default
    if default_factory is not dataclasses.MISSING:
        kwargs["default_factory"] = default_factory
    return field(**kwargs)


@dataclass(frozen=True)
class Resources:
    """What one worker of a step needs. `workers > 1` asks for that many such workers (Ray Train).

    `accelerator` names an accelerator type (e.g. "GB200", "H100"); it is matched against a Ray
    custom resource of that name, one unit per GPU asked for (one if no GPUs are asked for).
    """

    cpus: float = 1.0
    memory_gb: float | None = None
    gpus: float = 0.0
    accelerator: str | None = None
    workers: int = 1
    custom: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.cpus < 0 or self.gpus < 0 or (self.memory_gb is not None and self.memory_gb < 0):
            raise VoyageError(f"Resources: negative amount in {self}")
        if self.workers < 1:
            raise VoyageError(f"Resources: workers must be >= 1, got {self.workers}")
        if isinstance(self.custom, dict):  # accept a dict for convenience, store it canonically
            object.__setattr__(self, "custom", tuple(sorted(self.custom.items())))

    def per_worker(self) -> dict[str, float]:
        """The demand of one worker as Ray resource names -> amounts."""
        need: dict[str, float] = {}
        if self.cpus:
            need["CPU"] = float(self.cpus)
        if self.gpus:
            need["GPU"] = float(self.gpus)
        if self.memory_gb:
            need["memory"] = float(self.memory_gb) * 2**30
        if self.accelerator:
            need[self.accelerator] = float(self.gpus or 1)
        for key, amount in self.custom:
            need[key] = float(amount)
        return need

    def describe(self) -> str:
        parts = [f"{self.cpus:g} cpu"]
        if self.memory_gb:
            parts.append(f"{self.memory_gb:g} GiB")
        if self.gpus:
            parts.append(f"{self.gpus:g} gpu")
        if self.accelerator:
            parts.append(self.accelerator)
        parts += [f"{k}={v:g}" for k, v in self.custom]
        text = ", ".join(parts)
        return f"{self.workers} x ({text})" if self.workers > 1 else text


@dataclass(frozen=True)
class RetryPolicy:
    """How often a step is tried again.

    Node loss and worker crashes are always retried up to `max_node_failures` times. A user
    exception is retried only when `on_exception` is set, up to `max_attempts` attempts in all.
    """

    max_attempts: int = 1
    on_exception: bool = False
    max_node_failures: int = 3


@dataclass(frozen=True, eq=False)
class StepType:
    """A registered step function with a name and an explicit version."""

    name: str
    version: str
    fn: Callable[..., Any]
    resumable: bool = False
    description: str = ""

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    def __call__(self, config: Any, ctx: Any) -> Any:
        return self.fn(config, ctx)

    def __repr__(self) -> str:
        return f"StepType({self.key})"


_REGISTRY: dict[str, StepType] = {}


def step_type(version: str, name: str | None = None, *, resumable: bool = False) -> Callable[[Callable], StepType]:
    """Register a function `(config, ctx) -> None` as a step type.

    `version` is required and enters every digest of this type: bump it when the function's
    output changes for the same config (a changed default included). `resumable` step types keep
    their partial output between attempts (training resumes from checkpoints); others start
    from an empty folder.
    """
    if not isinstance(version, str) or not version:
        raise TypeError("step_type(version=...) needs an explicit, non-empty string version")

    def register(fn: Callable) -> StepType:
        type_name = name or fn.__name__
        st = StepType(name=type_name, version=version, fn=fn, resumable=resumable,
                      description=(fn.__doc__ or "").strip().split("\n")[0])
        _REGISTRY[st.key] = st
        return st

    return register


@dataclass(frozen=True)
class InputRef:
    """Another step's output folder, or a path inside it; resolved to a URL when the step runs.

    `step` is a Step, or a step name that must name a Step of the same voyage.
    """

    step: "Step | str"
    subpath: str = ""

    def __truediv__(self, more: str) -> "InputRef":
        return InputRef(self.step, _join(self.subpath, more))

    @property
    def step_name(self) -> str:
        return self.step if isinstance(self.step, str) else self.step.name


@dataclass(frozen=True)
class OwnOutput:
    """The running step's own output folder, or a path inside it."""

    subpath: str = ""


def output_of(step: "Step | str", subpath: str = "") -> InputRef:
    """A reference to `step`'s output (or `subpath` inside it), usable anywhere in a config."""
    return InputRef(step, subpath.strip("/"))


def this_output(subpath: str = "") -> OwnOutput:
    """A reference to the running step's own output folder (or `subpath` inside it)."""
    return OwnOutput(subpath.strip("/"))


def _join(a: str, b: str) -> str:
    return "/".join(p for p in (a.strip("/"), b.strip("/")) if p)


def _caller_origin() -> str:
    """file:line of the voyage code that built a Step, for error messages."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "?"


class Step:
    """One node of a voyage: a name, a step type, a config and run-only settings.

    The config is a (frozen) dataclass; any field, list item, dict value or nested dataclass may
    hold `output_of(...)`/`this_output(...)` references. Building a Step runs nothing.
    """

    __slots__ = ("name", "type", "config", "resources", "retry", "origin", "__weakref__")

    def __init__(self, name: str, type: StepType, config: Any, *, resources: Resources | None = None,
                 retry: RetryPolicy | None = None) -> None:
        origin = _caller_origin()
        if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name.split("/"):
            raise VoyageError(
                f"{origin}: bad step name {name!r}: use letters, digits and . _ - / "
                "(no leading '/', no '..' segment)")
        if not isinstance(type, StepType):
            raise VoyageError(f"{origin}: step {name!r}: {type!r} is not a step type "
                              "(decorate the function with @step_type)")
        if not dataclasses.is_dataclass(config) or isinstance(config, builtins_type):
            raise VoyageError(f"{origin}: step {name!r}: config must be a dataclass instance, "
                              f"got {config.__class__.__name__}")
        self.name = name
        self.type = type
        self.config = config
        self.resources = resources or Resources()
        self.retry = retry or RetryPolicy()
        self.origin = origin

    def output(self, subpath: str = "") -> InputRef:
        """A reference to this step's output folder or a path inside it."""
        return output_of(self, subpath)

    def __truediv__(self, subpath: str) -> InputRef:
        return output_of(self, subpath)

    def __repr__(self) -> str:
        return f"Step({self.name!r}, {self.type.key})"


builtins_type = type

"""Step types, Steps and the references that wire them into a DAG.

A *step type* is a function `(config, ctx) -> None` registered with a name and an explicit
version. A *Step* is one node of a voyage: a name, a step type, a frozen config dataclass that may
hold references to other steps' outputs, and run-only settings (resources, retries). Building a
Step runs nothing and computes nothing; identity is computed when the DAG is built.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import inspect
import math
import re
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from executor.errors import VoyageError
from executor.licenses import LicensePolicy

# Names become folder names on every store: keep them to a portable alphabet, with no segment
# that aliases another folder (`x/./y` is `x/y`, `x/../y` is `y`, `x//y` is `x/y` on most stores).
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")
_ALIASING = frozenset({".", ".."})


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
        amounts = [self.cpus, self.gpus, *([self.memory_gb] if self.memory_gb is not None else []),
                   *(v for _, v in (self.custom.items() if isinstance(self.custom, dict) else self.custom))]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in amounts):
            raise VoyageError(f"Resources: every amount must be a finite number, got {self}")
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

    Node loss and worker crashes are always retried up to `max_node_failures` times by Ray. A
    failure that comes back to the executor is classified (executor.failures: lost node, hang,
    non-finite, out of memory, code error) and retried within its class's budget, after its
    backoff. A code error is retried only when `on_exception` is set, up to `max_attempts`
    attempts in all.
    """

    max_attempts: int = 1
    on_exception: bool = False
    max_node_failures: int = 3
    # per failure class (executor.failures): (class, Budget or a number of retries) overriding
    # the defaults, e.g. (("hang", 5),); a code error is retried only through on_exception
    budgets: tuple = ()

    def __post_init__(self) -> None:
        from executor.failures import CLASSES

        if isinstance(self.budgets, dict):
            object.__setattr__(self, "budgets", tuple(sorted(self.budgets.items())))
        unknown = sorted({name for name, _ in self.budgets} - set(CLASSES))
        if unknown:
            raise VoyageError(f"RetryPolicy.budgets: unknown failure classes {unknown}; known: "
                              f"{[str(c) for c in CLASSES]}")


@dataclass(frozen=True, eq=False)
class StepType:
    """A registered step function with a name and an explicit version.

    `logs` are glob patterns (relative to the output folder; `**` crosses folders) of the files
    the step writes that are logs, not artifacts (W&B runs, timings): they are kept and listed in
    the record but left out of the output digest, so an identical rerun cuts off downstream."""

    name: str
    version: str
    fn: Callable[..., Any]
    resumable: bool = False
    description: str = ""
    logs: tuple[str, ...] = ()
    # config -> {first folder of the output: the config value whose inputs alone fill that folder}
    # (executor.lineage: a consumer reading only that folder gets only those inputs' licences)
    partitions: Callable[[Any], Mapping[str, Any]] | None = None
    # At each commit, `{prefix}/{step name}` is made to point at the committed attempt (a relative
    # symlink on a local disk, a pointer object on an object store; executor.storage.alias): a stable,
    # human-readable way in that the executor itself never reads back.
    alias: bool = False
    # A torch-free check of a finished output, by its served URL: a line saying what is wrong, or
    # None. The plan calls it for CACHED outputs of the types that declare it (one cheap look, no
    # data read: training steps check their newest checkpoint's file sizes) and a dry-run warns.
    check_output: Callable[[str], str | None] | None = None

    def is_log(self, relpath: str) -> bool:
        """Whether a file of the output (path relative to the folder) is one of its logs."""
        return bool(self.logs) and _log_pattern(self.logs).match(relpath) is not None

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    def __call__(self, config: Any, ctx: Any) -> Any:
        return self.fn(config, ctx)

    def __repr__(self) -> str:
        return f"StepType({self.key})"


_REGISTRY: dict[str, StepType] = {}  # by name: a name is one step type, whatever its version


def step_type(version: str, name: str | None = None, *, resumable: bool = False,
              logs: tuple[str, ...] | list[str] = (),
              partitions: Callable[[Any], Mapping[str, Any]] | None = None,
              alias: bool = False,
              check_output: Callable[[str], str | None] | None = None) -> Callable[[Callable], StepType]:
    """Register a function `(config, ctx) -> None` as a step type.

    `version` is required and enters every digest of this type: bump it when the function's
    output changes for the same config (a changed default included). `resumable` step types keep
    their partial output between attempts of one recipe and code (training resumes from
    checkpoints; `--rerun` starts clean); others start from an empty folder. `logs` names the
    files that are logs, not artifacts (e.g. `("wandb/**", "metrics.jsonl")`): they are kept but
    not digested. `partitions(config)` says which folders of the output hold which inputs' data
    alone (dedup of several sources: `{source: documents[source]}`), so that a step reading one of
    them is reached only by those inputs' sources and licences (docs/provenance.md); without it
    every input reaches every folder. `alias`: each commit points `{prefix}/{step name}` at the
    committed attempt (exports: `out/export/laptop/hf`; executor.storage.alias). `check_output(url)`:
    a cheap, torch-free look at a finished output (its served URL) returning what is wrong with it
    or None; the plan calls it for each CACHED output of this type, and `--dry-run` prints a
    warning on the step (training: the newest checkpoint's file sizes against its meta.json).

    The name (default: the function's) is the step type's identity: a second definition of the
    same name in another file, with other code, is an error naming both (they would share digests).
    """
    if not isinstance(version, str) or not version:
        raise TypeError("step_type(version=...) needs an explicit, non-empty string version")
    if check_output is not None and not callable(check_output):
        raise TypeError(f"step_type(check_output=...) takes a function of the output URL, got {check_output!r}")
    if isinstance(logs, str) or not all(isinstance(p, str) and p and not p.startswith("/") for p in logs):
        raise TypeError(f"step_type(logs=...) takes relative glob patterns, e.g. ('wandb/**',), got {logs!r}")

    def register(fn: Callable) -> StepType:
        _check_plain_function(fn)
        type_name = name or fn.__name__
        st = StepType(name=type_name, version=version, fn=fn, resumable=resumable,
                      description=(fn.__doc__ or "").strip().split("\n")[0], logs=tuple(logs), partitions=partitions,
                      alias=bool(alias), check_output=check_output)
        _check_unique(st)
        _REGISTRY[type_name] = st
        return st

    return register


_DATA = (str, bytes, int, float, bool, list, tuple, dict, set, frozenset)


def _check_plain_function(fn: Any) -> None:
    """A step type is a plain function: values bound outside its config (a partial's arguments,
    an object's attributes, a closure's data) are in neither the digest nor the code fingerprint,
    so changing them would change the bytes under one recipe."""
    if isinstance(fn, functools.partial):
        what = f"functools.partial of {getattr(fn.func, '__qualname__', fn.func)!r}"
    elif inspect.ismethod(fn):
        what = f"the method {fn.__qualname__} bound to an object"
    elif inspect.isbuiltin(fn) or (callable(fn) and not inspect.isfunction(fn) and isinstance(fn, type(print))):
        what = f"the builtin {getattr(fn, '__qualname__', fn)!r}"
    elif isinstance(fn, type):
        what = f"the class {fn.__qualname__}"
    elif not inspect.isfunction(fn):
        what = f"an instance of {type(fn).__qualname__}"
    else:
        bound = [name for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ())
                 if _holds_data(cell)]
        if not bound:
            return
        what = f"a closure over {', '.join(bound)} (values of the function that made it)"
    raise VoyageError(
        f"step_type: {what} is not a plain function: values bound outside the config are in neither the "
        "digest nor the code fingerprint; define the step type with `def` at module level and put "
        "the values in its config")


def _holds_data(cell: Any) -> bool:
    try:
        value = cell.cell_contents
    except ValueError:  # not yet bound (a function that names itself)
        return False
    return isinstance(value, _DATA) or (dataclasses.is_dataclass(value) and not isinstance(value, type))


def _check_unique(new: StepType) -> None:
    """Two definitions of one step type name share every digest: refuse it unless they are the
    same definition (one file loaded twice, or the same code in another module)."""
    old = _REGISTRY.get(new.name)
    if old is None or old.fn is new.fn:
        return
    old_where, new_where = _definition(old.fn), _definition(new.fn)
    # Two definitions of one name and version in one module's namespace: two functions of one file
    # (a reload re-executes the file in the same namespace, but then the old type is bound to the
    # same name). Two versions of one type may live side by side: their digests differ.
    scope = getattr(new.fn, "__globals__", None)
    if scope is not None and scope is getattr(old.fn, "__globals__", None) and old.version == new.version \
            and scope.get(new.fn.__name__) is not old:
        raise VoyageError(
            f"two step types are named {new.name!r} (version {new.version!r}) in {new_where[0]}: {old_where[1]} and {new_where[1]}; they "
            f"would share every digest: give one another name (@step_type(..., name=...))")
    if old_where[0] == new_where[0] or (old_where[2] is not None and old_where[2] == new_where[2]):
        return
    raise VoyageError(
        f"two step types are named {new.name!r}: {old.fn.__module__} ({old_where[1]}) and {new.fn.__module__} "
        f"({new_where[1]}), with different code; they would share every digest: give one another name "
        f"(@step_type(..., name=...))")


def _definition(fn: Callable) -> tuple[str, str, str | None]:
    """(file, file:line, source text or None) of a function."""
    code = getattr(fn, "__code__", None)
    file = code.co_filename if code is not None else "?"
    line = code.co_firstlineno if code is not None else 0
    try:
        source: str | None = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        source = None
    return file, f"{file}:{line}", source


_LOG_PATTERNS: dict[tuple[str, ...], re.Pattern] = {}


def _log_pattern(patterns: tuple[str, ...]) -> re.Pattern:
    """One regex for glob patterns: `**` any path (crossing `/`), `*` and `?` within a name."""
    rx = _LOG_PATTERNS.get(patterns)
    if rx is None:
        alternatives = []
        for pattern in patterns:
            out, i = [], 0
            while i < len(pattern):
                if pattern.startswith("**/", i):
                    out.append("(?:.*/)?")
                    i += 3
                elif pattern.startswith("**", i):
                    out.append(".*")
                    i += 2
                elif pattern[i] == "*":
                    out.append("[^/]*")
                    i += 1
                elif pattern[i] == "?":
                    out.append("[^/]")
                    i += 1
                else:
                    out.append(re.escape(pattern[i]))
                    i += 1
            alternatives.append("".join(out))
        rx = _LOG_PATTERNS[patterns] = re.compile("(?:" + "|".join(alternatives) + ")")
    return rx


@dataclass(frozen=True)
class InputRef:
    """Another step's output folder, or a path inside it; resolved to a URL when the step runs.

    `step` is a Step, or a step name that must name a Step of the same voyage.
    """

    step: "Step | str"
    subpath: str = ""
    # False: the step reads figures about the output (an eval's results for a model card), none
    # of its data, so the output's sources and licences do not flow along this edge
    # (executor.lineage). The edge still orders the steps and its digest is still in the identity.
    data: bool = True

    def __truediv__(self, more: str) -> "InputRef":
        return InputRef(self.step, clean_subpath(_join(self.subpath, more)), self.data)

    @property
    def step_name(self) -> str:
        return self.step if isinstance(self.step, str) else self.step.name


@dataclass(frozen=True)
class OwnOutput:
    """The running step's own output folder, or a path inside it."""

    subpath: str = ""


# The type of a config field that holds another step's output: `output_of(...)` when the voyage
# builds the step (so a type checker accepts it), the output's URL (a str) when the step runs.
InputPath = str | InputRef


def output_of(step: "Step | str", subpath: str = "", data: bool = True) -> InputRef:
    """A reference to `step`'s output (or `subpath` inside it), usable in any config field,
    list or tuple item (named tuples included) or dict value; never in a set or as a dict key.
    `data=False`: the step reads figures about that output, not its data, so no licence of it
    reaches the step (an eval's results in a model card)."""
    return InputRef(step, clean_subpath(subpath), data)


def this_output(subpath: str = "") -> OwnOutput:
    """A reference to the running step's own output folder (or `subpath` inside it)."""
    return OwnOutput(clean_subpath(subpath))


def clean_subpath(subpath: str) -> str:
    """One spelling per path inside an output: `a//b`, `./a/b` and `/a/b/` are `a/b`; a `..`
    segment, which would leave the output folder, is an error."""
    if not isinstance(subpath, str):
        raise VoyageError(f"a sub-path must be a string, got {type(subpath).__name__}: {subpath!r}")
    parts = [p for p in subpath.split("/") if p and p != "."]
    if ".." in parts:
        raise VoyageError(f"sub-path {subpath!r}: a '..' segment leaves the step's output folder")
    return "/".join(parts)


def _join(a: str, b: str) -> str:
    return "/".join(p for p in (a.strip("/"), b.strip("/")) if p)


def _caller_origin() -> tuple[Any, int] | str:
    """Where the voyage code that built a Step is: (its code object, the instruction), turned into
    `file:line` by `_origin_text` only when an error message asks (`Step.origin`): finding a line
    reads the code's whole line table, 76,000 entries for one generated voyage of 3,000 steps."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return (frame.f_code, frame.f_lasti) if frame else "?"


def _origin_text(where: tuple[Any, int] | str) -> str:
    if isinstance(where, str):
        return where
    code, lasti = where
    return f"{code.co_filename}:{_line(code, lasti)}"


# id(code) -> (code, offsets, lines), see _line; by id: hashing a code object hashes all of it
_LINE_TABLES: dict[int, tuple[Any, list[int], list[int | None]]] = {}


def _line(code: Any, lasti: int) -> int:
    """The line of instruction `lasti` in `code`. `frame.f_lineno` scans the code's line table
    from its start on every call, so asking it once per Step of one long generated `voyage()`
    made building N steps O(N^2) (docs/benchmarks.md, whole-process planning); the table is read once per code."""
    table = _LINE_TABLES.get(id(code))
    if table is None or table[0] is not code:
        if len(_LINE_TABLES) >= 64:
            _LINE_TABLES.clear()
        starts, lines = [], []
        for start, _end, line in code.co_lines():
            starts.append(start)
            lines.append(line)
        table = _LINE_TABLES[id(code)] = (code, starts, lines)
    i = bisect.bisect_right(table[1], lasti) - 1
    line = table[2][i] if i >= 0 else None
    return line if line is not None else code.co_firstlineno


class Step:
    """One node of a voyage: a name, a step type, a config and run-only settings.

    The config is a (frozen) dataclass; any field, list item, dict value or nested dataclass may
    hold `output_of(...)`/`this_output(...)` references. Building a Step runs nothing.
    `licenses=LicensePolicy(...)` says which licences may reach the step (checked at plan time).
    """

    __slots__ = ("name", "type", "config", "resources", "retry", "licenses", "_origin", "__weakref__")

    def __init__(self, name: str, type: StepType, config: Any, *, resources: Resources | None = None,
                 retry: RetryPolicy | None = None, licenses: Any = None) -> None:
        self._origin = _caller_origin()  # its text is worked out only if an error message shows it
        if not isinstance(name, str) or not _NAME_RE.match(name) or _ALIASING & set(name.split("/")):
            raise VoyageError(
                f"{self.origin}: bad step name {name!r}: use ASCII letters, digits and . _ - / "
                "(no leading or trailing '/', no empty, '.' or '..' segment)")
        if not isinstance(type, StepType):
            raise VoyageError(f"{self.origin}: step {name!r}: {type!r} is not a step type "
                              "(decorate the function with @step_type)")
        if not dataclasses.is_dataclass(config) or isinstance(config, builtins_type):
            raise VoyageError(f"{self.origin}: step {name!r}: config must be a dataclass instance, "
                              f"got {config.__class__.__name__}")
        self.name = name
        self.type = type
        self.config = config
        self.resources = resources or Resources()
        self.retry = retry or RetryPolicy()
        # Which licences may reach this step (an executor.licenses.LicensePolicy, checked when the
        # plan is made); like resources, not part of the digest: a policy refuses, it never changes
        # what a step makes.
        if licenses is not None and not isinstance(licenses, LicensePolicy):
            raise VoyageError(f"{self.origin}: step {name!r}: licenses= takes a LicensePolicy, got {licenses!r}")
        self.licenses = licenses

    @property
    def origin(self) -> str:
        """`file:line` of the voyage code that built this Step, for error messages."""
        if not isinstance(self._origin, str):
            self._origin = _origin_text(self._origin)
        return self._origin

    def __getstate__(self) -> tuple[None, dict[str, Any]]:
        # A copy or a pickle carries the origin's text, never a code object.
        return None, {slot: self.origin if slot == "_origin" else getattr(self, slot)
                      for slot in Step.__slots__ if slot != "__weakref__" and hasattr(self, slot)}

    def output(self, subpath: str = "") -> InputRef:
        """A reference to this step's output folder or a path inside it."""
        return output_of(self, subpath)

    def __truediv__(self, subpath: str) -> InputRef:
        return output_of(self, subpath)

    def __repr__(self) -> str:
        return f"Step({self.name!r}, {self.type.key})"


builtins_type = type

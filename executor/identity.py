"""What a step's digest covers, and how values are encoded for it.

The encoding is canonical, typed and strict (DESIGN.md, identity rules 1-6):
- every value carries a type tag; floats are encoded by their exact value (`float.hex`), NaN is
  refused; dict keys are sorted by their own encoding; a type we do not know is an error naming
  the field path, never a `str()` fallback (memory addresses once leaked into Marin's hashes);
- dataclass fields declared run-only, and fields equal to their declared default, are left out,
  so adding a knob with a default re-addresses nothing;
- a reference to another step contributes that step's digest, never its path, so the prefix,
  bucket or region never enters identity;
- the step type's name and version and a scheme salt are mixed into every digest.

The step function's code fingerprint (normalized AST of the function and the project-local
helpers it calls) is *recorded* next to the digest, not keyed, so the plan can say "code drifted"
without forking a new output on every edit.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import hashlib
import inspect
import json
import math
import pathlib
import sys
import sysconfig
import textwrap
import types
from typing import Any, Callable

from executor.errors import IdentityError
from executor.step import InputRef, OwnOutput, StepType

SCHEME = "marin-voyage/identity/1"

DigestOf = Callable[[InputRef], str]


def encode(value: Any, digest_of: DigestOf, path: str = "config") -> Any:
    """The canonical, JSON-serializable, type-tagged encoding of a config value."""
    if value is None:
        return ["none"]
    if value is True or value is False:
        return ["bool", value]
    if isinstance(value, enum.Enum):
        return ["enum", type(value).__qualname__, encode(value.value, digest_of, path)]
    if isinstance(value, int):
        return ["int", str(value)]
    if isinstance(value, float):
        if math.isnan(value):
            raise IdentityError(f"{path}: NaN has no identity (it is not equal to itself)")
        return ["float", value.hex()]
    if isinstance(value, str):
        return ["str", value]
    if isinstance(value, bytes):
        return ["bytes", value.hex()]
    if isinstance(value, pathlib.PurePath):
        return ["path", value.as_posix()]
    if isinstance(value, InputRef):
        return ["ref", digest_of(value), value.subpath]
    if isinstance(value, OwnOutput):
        return ["own", value.subpath]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ["dc", type(value).__qualname__, _encode_fields(value, digest_of, path)]
    if isinstance(value, (list, tuple)):
        # list and tuple encode alike: draccus and JSON round-trips turn one into the other.
        return ["seq", [encode(v, digest_of, f"{path}[{i}]") for i, v in enumerate(value)]]
    if isinstance(value, (set, frozenset)):
        items = [encode(v, digest_of, f"{path}{{}}") for v in value]
        return ["set", sorted(items, key=_canonical)]
    if isinstance(value, dict):
        pairs = [(encode(k, digest_of, f"{path}.<key>"), encode(v, digest_of, f"{path}[{k!r}]"))
                 for k, v in value.items()]
        return ["dict", sorted(pairs, key=lambda kv: _canonical(kv[0]))]
    raise IdentityError(
        f"{path}: cannot hash a value of type {type(value).__module__}.{type(value).__qualname__}; "
        "use plain values, dataclasses, enums, lists, dicts or output_of(...)")


def _encode_fields(obj: Any, digest_of: DigestOf, path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, default_enc in _field_plan(type(obj), digest_of):
        fpath = f"{path}.{name}"
        enc = encode(getattr(obj, name), digest_of, fpath)
        # Encodings are plain lists/strings/bools, so == is exact (1, 1.0 and True differ by tag).
        if default_enc is not _NO_DEFAULT and enc == default_enc:
            continue
        out[name] = enc
    return out


_NO_DEFAULT = object()
_FIELD_PLANS: dict[type, list[tuple[str, Any]]] = {}


def _field_plan(cls: type, digest_of: DigestOf) -> list[tuple[str, Any]]:
    """(name, encoding of its default) for the identity fields of a dataclass type, once per type."""
    plan = _FIELD_PLANS.get(cls)
    if plan is None:
        plan = []
        for f in dataclasses.fields(cls):
            if f.metadata.get("run_only") or not f.init:
                continue
            default = _default_of(f)
            default_enc: Any = _NO_DEFAULT
            if default is not dataclasses.MISSING:
                try:
                    default_enc = encode(default, digest_of, f"{cls.__qualname__}.{f.name}")
                except Exception:  # a default that cannot be encoded is never "equal to default"
                    default_enc = _NO_DEFAULT
            plan.append((f.name, default_enc))
        _FIELD_PLANS[cls] = plan
    return plan


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _canonical(enc: Any) -> str:
    return json.dumps(enc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def step_digest(step_type: StepType, config: Any, digest_of: DigestOf) -> str:
    """The full sha256 recipe digest of a step (hex)."""
    body = ["step", SCHEME, step_type.name, step_type.version, encode(config, digest_of)]
    return hashlib.sha256(_canonical(body).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# A readable form of a config, for records and for "what changed" reasons.


def plain(value: Any, name_of: Callable[[InputRef], str] | None = None) -> Any:
    """A readable JSON form of a config: dataclasses as dicts (all fields), refs as markers."""
    if isinstance(value, InputRef):
        target = name_of(value) if name_of else value.step_name
        return {"$output_of": target + (f"/{value.subpath}" if value.subpath else "")}
    if isinstance(value, OwnOutput):
        return {"$this_output": value.subpath}
    if isinstance(value, enum.Enum):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name), name_of) for f in dataclasses.fields(value)
                if not f.metadata.get("run_only")}
    if isinstance(value, (list, tuple)):
        return [plain(v, name_of) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((plain(v, name_of) for v in value), key=repr)
    if isinstance(value, dict):
        return {str(k): plain(v, name_of) for k, v in value.items()}
    if isinstance(value, pathlib.PurePath):
        return value.as_posix()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


def diff(old: Any, new: Any, path: str = "config", limit: int = 8) -> list[str]:
    """Leaf-level differences between two plain configs, as `path: old -> new` lines."""
    out: list[str] = []
    _diff(old, new, path, out, limit)
    return out


_ABSENT = object()


def _diff(old: Any, new: Any, path: str, out: list[str], limit: int) -> None:
    if len(out) >= limit or old == new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            _diff(old.get(key, _ABSENT), new.get(key, _ABSENT), f"{path}.{key}", out, limit)
        return
    if isinstance(old, list) and isinstance(new, list):
        for i in range(max(len(old), len(new))):
            _diff(old[i] if i < len(old) else _ABSENT, new[i] if i < len(new) else _ABSENT,
                  f"{path}[{i}]", out, limit)
        return
    out.append(f"{path}: {_short(old)} -> {_short(new)}")


def _short(v: Any) -> str:
    if v is _ABSENT:
        return "(absent)"
    text = json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------------------------
# Code fingerprint: recorded, compared, never keyed.

_NON_PROJECT = tuple(
    str(pathlib.Path(p).resolve())
    for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    | {sys.prefix, sys.base_prefix, sys.exec_prefix}
)


def _is_project_code(obj: Any) -> bool:
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    file = getattr(module, "__file__", None)
    if not file:
        return False
    resolved = str(pathlib.Path(file).resolve())
    return not resolved.startswith(_NON_PROJECT)


class _Normalize(ast.NodeTransformer):
    """Drop what does not change behaviour: docstrings and type annotations."""

    def _strip_doc(self, node: Any) -> Any:
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        node.returns = None
        node.decorator_list = []
        self.generic_visit(node)
        return self._strip_doc(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> Any:
        self.generic_visit(node)
        return self._strip_doc(node)

    def visit_arg(self, node: ast.arg) -> Any:
        node.annotation = None
        return node


def _source_ast(obj: Any) -> ast.AST | None:
    try:
        src = textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return None
    try:
        return _Normalize().visit(ast.parse(src))
    except SyntaxError:
        return None


def code_fingerprint(fn: Callable[..., Any]) -> str:
    """sha256 over the normalized AST of `fn` and the project-local functions/classes it uses."""
    seen: dict[str, str] = {}
    stack: list[Any] = [inspect.unwrap(fn)]
    while stack:
        obj = stack.pop()
        key = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
        if key in seen:
            continue
        tree = _source_ast(obj)
        seen[key] = ast.dump(tree, annotate_fields=False) if tree is not None else "<no source>"
        if tree is None:
            continue
        namespace = getattr(obj, "__globals__", None)
        if namespace is None:
            namespace = vars(sys.modules.get(obj.__module__, types.ModuleType("_")))
        for name in _loaded_names(tree):
            target = _resolve(name, namespace)
            if target is not None and _is_project_code(target):
                stack.append(target)
    digest = hashlib.sha256()
    for key in sorted(seen):
        digest.update(key.encode() + b"\0" + seen[key].encode() + b"\0")
    return digest.hexdigest()


def _loaded_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            names.add(f"{node.value.id}.{node.attr}")
    return names


def _resolve(dotted: str, namespace: dict[str, Any]) -> Any:
    head, _, attr = dotted.partition(".")
    obj = namespace.get(head)
    if attr:
        if not isinstance(obj, types.ModuleType):
            return None
        obj = getattr(obj, attr, None)
    if isinstance(obj, StepType):
        obj = obj.fn
    if isinstance(obj, (types.FunctionType, type)):
        return obj
    return None

"""Where a reference (`output_of(...)`, `this_output(...)`) may stand in a config, and how it is
found and resolved: one rule for the digest (executor.identity), the DAG (executor.dag) and the
worker's resolver.

A reference needs a place to be replaced by its URL when the step runs: a dataclass field, a list
or tuple item (named tuples included, and they stay that named tuple), or a dict value. A set has
no places (its items are unordered, and a URL would be hashed anew), and a dict key is not a
value: a reference in either is refused when the DAG is built, naming the field path.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from typing import Any, Callable

from executor.errors import IdentityError
from executor.step import InputRef, OwnOutput

REFS = (InputRef, OwnOutput)
_SCALARS = (str, int, float, bool, type(None), bytes)
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(cls: type) -> tuple[str, ...]:
    """The fields of a dataclass type, once per type."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


_PLAIN = frozenset({str, int, float, bool, type(None), bytes, InputRef, OwnOutput})


def value_types(config: Any) -> tuple[type, ...]:
    """Every dataclass, enum and named tuple type that a config holds, by what its values are
    (not by what its fields declare: an untyped field, a subclass, a dict value), the config's own
    class first, each once. The code fingerprint follows each one's module and defaults."""
    found: dict[type, None] = {}
    stack = [config]
    while stack:
        value = stack.pop()
        t = type(value)
        if t in _PLAIN:
            continue
        if isinstance(value, enum.Enum):
            found[t] = None
        elif isinstance(value, (list, tuple, set, frozenset)):
            if hasattr(t, "_fields"):
                found[t] = None
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif dataclasses.is_dataclass(value) and not isinstance(value, type) and not isinstance(value, REFS):
            found[t] = None
            stack.extend(getattr(value, name) for name in field_names(t))
    return tuple(found)


def input_refs(config: Any) -> list[InputRef]:
    """Every `output_of` reference in a config, in the order of its fields; an IdentityError naming
    the field path if one stands where it cannot be resolved (in a set, or as a dict key)."""
    out: list[InputRef] = []
    if not _collect(config, out):
        refuse_misplaced(config, "config")
    return out


def _collect(value: Any, out: list[InputRef]) -> bool:
    """Append the InputRefs of `value`; False if a reference is misplaced (found again with paths)."""
    if isinstance(value, _SCALARS):
        return True
    if isinstance(value, InputRef):
        out.append(value)
        return True
    if isinstance(value, OwnOutput):
        return True
    ok = True
    if isinstance(value, (list, tuple)):
        for v in value:
            if not isinstance(v, _SCALARS):
                ok = _collect(v, out) and ok
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(v, _SCALARS):
                ok = _collect(v, out) and ok
            if not isinstance(k, _SCALARS) and _holds_ref(k):
                ok = False
    elif isinstance(value, (set, frozenset)):
        ok = not any(_holds_ref(v) for v in value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for name in field_names(type(value)):
            v = getattr(value, name)
            if not isinstance(v, _SCALARS):
                ok = _collect(v, out) and ok
    return ok  # anything else is not a container: encoding decides whether it has an identity


def _holds_ref(value: Any) -> bool:
    if isinstance(value, _SCALARS):
        return False
    if isinstance(value, REFS):
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_holds_ref(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_ref(k) or _holds_ref(v) for k, v in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_holds_ref(getattr(value, name)) for name in field_names(type(value)))
    return False


def refuse_misplaced(value: Any, path: str) -> None:
    """Raise an IdentityError at the first reference of `value` that has no place to resolve to."""
    if isinstance(value, (_SCALARS, *REFS)):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            refuse_misplaced(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            if _holds_ref(k):
                raise IdentityError(f"{path}: a dict key holds {_show(k)}; a reference has no identity as a key "
                                    "(use it as a value: {name: output_of(step)})")
            refuse_misplaced(v, f"{path}[{k!r}]")
    elif isinstance(value, (set, frozenset)):
        if _holds_ref(value):
            raise IdentityError(f"{path}: a set holds {_show(value)}; a reference in a set has no place to be "
                                "resolved to its URL (use a tuple or a list)")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for name in field_names(type(value)):
            refuse_misplaced(getattr(value, name), f"{path}.{name}")


def _show(value: Any) -> str:
    """The first reference inside `value`, as the voyage wrote it."""
    if isinstance(value, InputRef):
        return f"output_of({value.step_name!r}{', ' + repr(value.subpath) if value.subpath else ''})"
    if isinstance(value, OwnOutput):
        return f"this_output({value.subpath!r})"
    items = value.items() if isinstance(value, dict) else value if isinstance(value, (list, tuple, set, frozenset)) \
        else [getattr(value, n) for n in field_names(type(value))]
    for item in items:
        for part in (item if isinstance(value, dict) else (item,)):
            if _holds_ref(part):
                return _show(part)
    return repr(value)


def resolve(value: Any, url_of: Callable[[str], str], own: str | None) -> Any:
    """A copy of a config with every reference replaced by its URL (`own=None` leaves the
    `this_output` ones, which only the worker that chose the attempt's folder can resolve);
    containers keep their type (a named tuple stays that named tuple) and a dataclass is copied
    without re-running its `__post_init__`. Parts without references are shared, not copied."""
    def url(ref: Any) -> Any:
        if isinstance(ref, InputRef):
            base = url_of(ref.step_name)
            return f"{base}/{ref.subpath}" if ref.subpath else base
        if own is None:
            return ref
        return f"{own}/{ref.subpath}" if ref.subpath else own
    return map_refs(value, url)


def detach(value: Any) -> Any:
    """A copy of a config whose `output_of(step)` references name their step by name, so that it
    travels to a worker without the Steps (and their configs) it points to."""
    return map_refs(value, lambda ref: InputRef(ref.step_name, ref.subpath, ref.data)
                    if isinstance(ref, InputRef) and not isinstance(ref.step, str) else ref)


def with_fields(value: Any, names: Any, new_of: Callable[[str, Any], Any]) -> Any:
    """A dataclass instance with each field of `names` set to `new_of(name, old value)`: the same
    object when no field changed, else a copy (frozen ones too) without re-running its
    `__post_init__`."""
    changes = {}
    for name in names:
        old = getattr(value, name)
        new = new_of(name, old)
        if new is not old:
            changes[name] = new
    if not changes:
        return value
    clone = copy.copy(value)
    for k, v in changes.items():
        object.__setattr__(clone, k, v)
    return clone


def map_refs(value: Any, fn: Callable[[Any], Any]) -> Any:
    """A copy of `value` with every reference `r` replaced by `fn(r)` (see `resolve`)."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, REFS):
        return fn(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return with_fields(value, field_names(type(value)), lambda name, old: map_refs(old, fn))
    if isinstance(value, (list, tuple)):
        items = [map_refs(v, fn) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        if isinstance(value, list):
            return type(value)(items)
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        out = {k: map_refs(v, fn) for k, v in value.items()}
        return value if all(out[k] is value[k] for k in value) else type(value)(out)
    return value

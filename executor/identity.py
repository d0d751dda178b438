"""What a step's digest covers, and how values are encoded for it.

The encoding is canonical, typed and strict (DESIGN.md, identity rules 1-6):
- every value carries a type tag; floats are encoded by their exact value (`float.hex`), NaN is
  refused; dict keys are sorted by their own encoding; a type we do not know is an error naming
  the field path, never a `str()` fallback (memory addresses once leaked into Marin's hashes);
- one meaning, one encoding: -0.0 is 0.0; an int in a field declared float is that float (and
  one no float can hold exactly is refused); a whole float in a field declared int is that int (a
  fractional one is refused); a path is its string; a named tuple is its type and fields, not a
  plain tuple; a sub-path inside an output has one spelling (executor.step.clean_subpath);
- dataclass fields declared run-only, and fields equal to their declared default, are left out,
  so adding a knob with a default re-addresses nothing;
- a reference to another step contributes that step's digest, never its path, so the prefix,
  bucket or region never enters identity; a reference in a set or as a dict key is refused
  (executor.refs: one rule for the digest, the DAG and the resolver);
- the step type's name and version and a scheme salt are mixed into every digest.

The step function's code fingerprint (executor.fingerprint) is *recorded* next to the digest,
not keyed, so the plan can say "code drifted" without forking a new output on every edit.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import pathlib
import sys
import threading
import types
import typing
from typing import Any, Callable

from executor import refs
from executor.errors import IdentityError
from executor.step import InputRef, OwnOutput, StepType

SCHEME = "marin-voyage/identity/1"

DigestOf = Callable[[InputRef], str]

# What a field's declared type says about its values, for normalizing them: a float field, an
# int field, a sequence or a mapping of such, or nothing (None: values encode as they are).
Kind = Any


def encode(value: Any, digest_of: DigestOf, path: str = "config", kind: Kind = None) -> Any:
    """The canonical, JSON-serializable, type-tagged encoding of a config value."""
    t = type(value)  # the commonest values first, by exact type: each is what its branch below gives
    if t is str:
        return ["str", value]
    if t is int and kind != "float":
        return ["int", _int_text(value, path)]
    if t is InputRef:
        return ["ref", digest_of(value), value.subpath]
    if value is None:
        return ["none"]
    if value is True or value is False:
        return ["bool", value]
    if isinstance(value, enum.Enum):
        if _SEEN.types is not None:
            _SEEN.types[t] = None
        return ["enum", type(value).__qualname__, encode(value.value, digest_of, path)]
    if isinstance(value, int):
        if kind == "float":
            return ["float", _exact_float(value, path).hex()]
        return ["int", _int_text(int(value), path)]
    if isinstance(value, float):
        if math.isnan(value):
            raise IdentityError(f"{path}: NaN has no identity (it is not equal to itself)")
        if kind == "int":
            if not value.is_integer():
                raise IdentityError(f"{path}: {value!r} in a field declared int")
            return ["int", str(int(value))]
        return ["float", (value + 0.0).hex()]  # -0.0 + 0.0 is 0.0
    if isinstance(value, str):
        return ["str", value]
    if isinstance(value, bytes):
        return ["bytes", value.hex()]
    if isinstance(value, pathlib.PurePath):
        return ["str", value.as_posix()]  # a path means its string
    if isinstance(value, InputRef):
        return ["ref", digest_of(value), value.subpath]
    if isinstance(value, OwnOutput):
        return ["own", value.subpath]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if _SEEN.types is not None:
            _SEEN.types[t] = None
        return ["dc", type(value).__qualname__, _encode_fields(value, digest_of, path)]
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        if _SEEN.types is not None:
            _SEEN.types[t] = None
        names = type(value)._fields
        return ["ntuple", type(value).__qualname__,
                [[n, encode(v, digest_of, f"{path}.{n}")] for n, v in zip(names, value)]]
    if isinstance(value, (list, tuple)):
        # list and tuple encode alike: draccus and JSON round-trips turn one into the other.
        item = kind[1] if isinstance(kind, tuple) and kind[0] == "seq" else None
        return ["seq", [encode(v, digest_of, f"{path}[{i}]", item) for i, v in enumerate(value)]]
    if isinstance(value, (set, frozenset)):
        refs.refuse_misplaced(value, path)
        items = [encode(v, digest_of, f"{path}{{}}") for v in value]
        return ["set", sorted(items, key=_canonical)]
    if isinstance(value, dict):
        if not all(isinstance(k, (str, int)) for k in value):
            refs.refuse_misplaced({k: None for k in value}, path)  # a reference is no key
        item = kind[1] if isinstance(kind, tuple) and kind[0] == "map" else None
        pairs = [(encode(k, digest_of, f"{path}.<key>"), encode(v, digest_of, f"{path}[{k!r}]", item))
                 for k, v in value.items()]
        return ["dict", sorted(pairs, key=lambda kv: _canonical(kv[0]))]
    raise IdentityError(
        f"{path}: cannot hash a value of type {type(value).__module__}.{type(value).__qualname__}; "
        "use plain values, dataclasses, enums, lists, dicts or output_of(...)")


def _int_text(value: int, path: str) -> str:
    try:
        return str(value)
    except ValueError:  # past Python's limit on int-to-text conversion (4,300 digits)
        raise IdentityError(f"{path}: an integer of about {int(value.bit_length() * 0.30103) + 1} digits; "
                            f"a config value must be written out in at most {sys.get_int_max_str_digits()} digits") from None


def _exact_float(value: int, path: str) -> float:
    try:
        as_float = float(value)
    except OverflowError:
        as_float = math.inf
    if as_float != value:
        raise IdentityError(f"{path}: {_int_text(value, path)} in a field declared float has no exact float value")
    return as_float


def _encode_fields(obj: Any, digest_of: DigestOf, path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, default_enc, kind in _field_plan(type(obj), digest_of):
        fpath = f"{path}.{name}"
        enc = encode(getattr(obj, name), digest_of, fpath, kind)
        # Encodings are plain lists/strings/bools, so == is exact (1, 1.0 and True differ by tag).
        if default_enc is not _NO_DEFAULT and enc == default_enc:
            continue
        out[name] = enc
    return out


# The classes of the values `encode` meets (dataclasses, enums, named tuples), collected while
# `step_digest` is asked for them: the code fingerprint follows each one (executor.dag), and the
# encoding already visits every value, so no second walk of each config is needed.
class _Seen(threading.local):
    types: dict[type, None] | None = None  # (a class attribute: the default in every thread)


_SEEN = _Seen()

_NO_DEFAULT = object()
_FIELD_PLANS: dict[type, list[tuple[str, Any, Kind]]] = {}


def _field_plan(cls: type, digest_of: DigestOf) -> list[tuple[str, Any, Kind]]:
    """(name, encoding of its default, declared kind) for the identity fields of a dataclass
    type, once per type."""
    plan = _FIELD_PLANS.get(cls)
    if plan is None:
        plan = []
        hints = _type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.metadata.get("run_only") or not f.init:
                continue
            kind = _kind(hints.get(f.name, f.type))
            default = _default_of(f)
            default_enc: Any = _NO_DEFAULT
            if default is not dataclasses.MISSING:
                collecting, _SEEN.types = _SEEN.types, None  # a default is no value of this config
                try:
                    default_enc = encode(default, digest_of, f"{cls.__qualname__}.{f.name}", kind)
                except Exception:  # a default that cannot be encoded is never "equal to default"
                    default_enc = _NO_DEFAULT
                finally:
                    _SEEN.types = collecting
            plan.append((f.name, default_enc, kind))
        _FIELD_PLANS[cls] = plan
    return plan


def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation that does not evaluate here: read its text instead
        return {}


_NONE = type(None)


def _kind(hint: Any) -> Kind:
    """float, int, ("seq", kind), ("map", kind) or None, from a declared type (or its text)."""
    if isinstance(hint, str):
        return _kind_of_text(hint.replace(" ", ""))
    if hint is float:
        return "float"
    if hint is int:
        return "int"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = {_kind(a) for a in args if a is not _NONE}
        return kinds.pop() if len(kinds) == 1 else None  # `int | float` says nothing
    if origin in (tuple, list, typing.Sequence, _abc_sequence()):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return None
        return ("seq", _kind(args[0])) if args and _kind(args[0]) else None
    if origin in (dict, typing.Mapping, _abc_mapping()):
        return ("map", _kind(args[1])) if len(args) == 2 and _kind(args[1]) else None
    return None


def _kind_of_text(text: str) -> Kind:
    for none in ("|None", "None|"):
        text = text.replace(none, "")
    if text.startswith("Optional[") and text.endswith("]"):
        text = text[len("Optional["):-1]
    if text in ("float", "int"):
        return text
    for head, tail in (("tuple[", ",...]"), ("list[", "]"), ("Sequence[", "]")):
        if text.startswith(head) and text.endswith(tail):
            inner = _kind_of_text(text[len(head):-len(tail)])
            return ("seq", inner) if inner else None
    if text.startswith("dict[str,") and text.endswith("]"):
        inner = _kind_of_text(text[len("dict[str,"):-1])
        return ("map", inner) if inner else None
    return None


def _abc_sequence() -> Any:
    import collections.abc

    return collections.abc.Sequence


def _abc_mapping() -> Any:
    import collections.abc

    return collections.abc.Mapping


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _canonical(enc: Any) -> str:
    return _CANONICAL.encode(enc)


# json.dumps with these arguments builds an encoder on every call; one is kept (same output).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# How deep a config may nest. Deeper (or cyclic: a list that holds itself) is a bad config, one
# line naming the step, never a RecursionError of hundreds of frames.
MAX_DEPTH = 200


def check_depth(value: Any, path: str = "config") -> None:
    """Raise IdentityError if `value` holds itself (a cycle) or nests deeper than MAX_DEPTH,
    naming the field path where it happens. Iterative: it never recurses itself."""
    stack: list[tuple[Any, str, int, tuple[int, ...]]] = [(value, path, 0, ())]
    while stack:
        v, where, depth, above = stack.pop()
        if isinstance(v, (str, bytes, int, float, bool, type(None), enum.Enum, pathlib.PurePath, InputRef, OwnOutput)):
            continue
        if id(v) in above:
            raise IdentityError(f"{where}: the config holds itself (a cycle); a config must be a tree of values")
        if depth >= MAX_DEPTH:
            raise IdentityError(f"{where}: the config nests deeper than {MAX_DEPTH} levels")
        here = (*above, id(v))
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            children = [(getattr(v, f.name), f"{where}.{f.name}") for f in dataclasses.fields(v)]
        elif isinstance(v, dict):
            children = [(x, f"{where}[{k!r}]") for k, x in v.items()]
        elif isinstance(v, (list, tuple, set, frozenset)):
            children = [(x, f"{where}[{i}]") for i, x in enumerate(v)]
        else:
            continue
        stack.extend((x, p, depth + 1, here) for x, p in children)


def normalized(value: Any, kind: Kind = None) -> Any:
    """`value` as it was hashed, so that the step receives exactly what its digest covers: values
    that encode alike reach the step as one value. An int in a field declared float is
    that float, a whole float in a field declared int is that int, -0.0 is 0.0; a dict is in the
    order of its keys' encodings (a plain dict); a list or tuple is the sequence type its field
    declares (`list[...]`, `tuple[...]`), and a list where nothing declares one (JSON's sequence);
    a path is its string; a subclass of str, int or float is the plain value. Named tuples, sets
    and enums keep their types (their encodings keep them apart). Parts that need no change are
    shared, not copied."""
    t = type(value)
    if t is str or t is bool or value is None or t is bytes:
        return value
    if t is int:
        return float(value) if kind == "float" else value
    if t is float:
        if kind == "int" and value.is_integer():
            return int(value)
        return value + 0.0 if value == 0 else value
    if isinstance(value, (enum.Enum, InputRef, OwnOutput)):
        return value
    if isinstance(value, pathlib.PurePath):
        return value.as_posix()
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return normalized(int(value), kind)
    if isinstance(value, float):
        return normalized(float(value), kind)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kinds = dict(_field_kinds(type(value)))
        return refs.with_fields(value, kinds, lambda name, old: normalized(old, kinds[name]))
    if isinstance(value, (list, tuple)) and not hasattr(t, "_fields"):
        seq = kind if isinstance(kind, tuple) and kind[0] == "seq" else ("seq", None, None)
        want = seq[1] if len(seq) == 3 and seq[1] is not None else list
        item = seq[-1]
        items = [normalized(v, item) for v in value]
        if t is want and all(a is b for a, b in zip(items, value)):
            return value
        return want(items)
    if isinstance(value, tuple):  # a named tuple: its fields, by no declared kind
        items = [normalized(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else t(*items)
    if isinstance(value, dict):
        item = kind[1] if isinstance(kind, tuple) and kind[0] == "map" else None
        keys = sorted(value, key=_key_text)
        out = {_normalized_key(k): normalized(value[k], item) for k in keys}
        if t is dict and keys == list(value) and all(a is b for a, b in zip(out, value)) \
                and all(out[k] is value[k] for k in value):
            return value
        return out
    return value


def _normalized_key(key: Any) -> Any:
    """A dict key as a step receives it: a path is its string; anything else stays (a key must
    stay hashable, so a tuple stays a tuple)."""
    if isinstance(key, pathlib.PurePath):
        return key.as_posix()
    return key


def _key_text(key: Any) -> str:
    """The order of dict keys: by their canonical encoding, as `encode` sorts them."""
    return _canonical(encode(key, _no_digest, "config.<key>"))


def _no_digest(ref: InputRef) -> str:
    raise IdentityError("a reference is no dict key")


_FIELD_KINDS: dict[type, list[tuple[str, Kind]]] = {}


def _field_kinds(cls: type) -> list[tuple[str, Kind]]:
    """(name, declared kind for normalizing) of the identity fields of a dataclass type, once per
    type: as `_kind`, and a sequence says which sequence type it declares."""
    kinds = _FIELD_KINDS.get(cls)
    if kinds is None:
        hints = _type_hints(cls)
        kinds = _FIELD_KINDS[cls] = [(f.name, _norm_kind(hints.get(f.name, f.type))) for f in dataclasses.fields(cls)
                                     if f.init and not f.metadata.get("run_only")]
    return kinds


def _norm_kind(hint: Any) -> Kind:
    """float, int, ("seq", list | tuple | None, kind) or ("map", kind) or None, from a declared
    type (or its text)."""
    if isinstance(hint, str):
        return _norm_kind_of_text(hint.replace(" ", ""))
    if hint is float or hint is int:
        return hint.__name__
    if hint is list or hint is tuple:
        return ("seq", hint, None)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [_norm_kind(a) for a in args if a is not _NONE]
        return kinds[0] if len(kinds) == 1 else None
    if origin in (tuple, list):
        variadic = origin is list or (len(args) == 2 and args[1] is Ellipsis)
        return ("seq", origin, _norm_kind(args[0]) if args and variadic else None)
    if origin in (typing.Sequence, _abc_sequence()):
        return ("seq", None, _norm_kind(args[0]) if args else None)
    if origin in (dict, typing.Mapping, _abc_mapping()):
        return ("map", _norm_kind(args[1]) if len(args) == 2 else None)
    return None


def _norm_kind_of_text(text: str) -> Kind:
    for none in ("|None", "None|"):
        text = text.replace(none, "")
    if text.startswith("Optional[") and text.endswith("]"):
        text = text[len("Optional["):-1]
    if text in ("float", "int"):
        return text
    if text in ("list", "tuple"):
        return ("seq", {"list": list, "tuple": tuple}[text], None)
    for head, ctype in (("tuple[", tuple), ("list[", list), ("Sequence[", None)):
        if text.startswith(head) and text.endswith("]"):
            inner = text[len(head):-1]
            if ctype is tuple:
                if not inner.endswith(",..."):
                    return ("seq", tuple, None)
                inner = inner[:-len(",...")]
            return ("seq", ctype, _norm_kind_of_text(inner))
    if text.startswith("dict[str,") and text.endswith("]"):
        return ("map", _norm_kind_of_text(text[len("dict[str,"):-1]))
    if text == "dict" or text.startswith("dict["):
        return ("map", None)
    return None


def step_digest(step_type: StepType, config: Any, digest_of: DigestOf,
                types: dict[type, None] | None = None) -> str:
    """The full sha256 recipe digest of a step (hex); `types`, if given, receives the class of
    every dataclass, enum and named tuple value of the config."""
    if types is not None:
        _SEEN.types = types
        try:
            encoded = encode(config, digest_of)
        finally:
            _SEEN.types = None
    else:
        encoded = encode(config, digest_of)
    body = ["step", SCHEME, step_type.name, step_type.version, encoded]
    try:
        data = _canonical(body).encode()
    except UnicodeEncodeError:  # a lone surrogate: bytes of another encoding, read as text
        raise IdentityError(_bad_unicode(config, "config") or "a string of the config is not valid Unicode") from None
    return hashlib.sha256(data).hexdigest()


def _bad_unicode(value: Any, path: str) -> str | None:
    """The first string of a config that is not valid Unicode, named by its field path."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError as e:
            return (f"{path}: {value!r} is not valid Unicode (a lone surrogate at position {e.start}: bytes of "
                    "another encoding read as text, as a command line in a non-UTF-8 locale gives)")
        return None
    items: Any = ()
    if isinstance(value, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, dict):
        items = [(f"{path}.<key>", k) for k in value] + [(f"{path}[{k!r}]", v) for k, v in value.items()]
    elif isinstance(value, (set, frozenset)):
        items = ((f"{path}{{}}", v) for v in value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f"{path}.{n}", getattr(value, n)) for n in refs.field_names(type(value)))
    for p, v in items:
        found = _bad_unicode(v, p)
        if found:
            return found
    return None


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

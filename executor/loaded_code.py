"""Is the code this process runs the code on record? (critical 3)

The code fingerprint (executor.fingerprint) is read from the source files on the driver, and the
record says that code made the output. Three ways the code that runs is another:
- a stale `__pycache__` file: a module edited to the same size within the same mtime second is
  imported from its old bytecode, while the fingerprint hashes the new source;
- a long-lived process (a Ray worker kept for the next task, a notebook, a service on
  `executor.api`) imported a module that was edited afterwards;
- a worker whose checkout is behind (or ahead of) the driver's.

`mismatch(parts)` checks, in the worker, every module of the fingerprint's closure that this
process has imported from a project file (`module <name>` parts): (1) the file's normalized
source hashes to the plan's part (the same checkout), and (2) what was imported is that file:
every function and method the module defines (found in its namespace and its classes) has the
code object that compiling the file gives (bytecode, constants, names; not line numbers), and
its upper-case literal constants (`LIMIT = 10`) have the file's values. The answer is one line
naming the module, or None. (2) needs Python's own file loader (another, such as pytest's
assertion rewriter, compiles to other code: only (1) is checked for those). Modules the closure names that are not imported here (a voyage file's
functions arrive by value from the driver) are not checked. What (2) cannot see: module-level
values that are computed (`TABLE = build()`) or lower-case, edited after the import; (1) still
sees them when the checkout differs.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import inspect
import sys
import types
from typing import Any

from executor import fingerprint

_COMPILED: dict[tuple[str, str], tuple[dict[str, list[tuple]], dict[str, Any]]] = {}  # (file, sha) -> code, constants
_PYTHONS_LOADERS = (importlib.machinery.SourceFileLoader, importlib.machinery.SourcelessFileLoader)
_CHECKED: dict[tuple[int, str], str | None] = {}  # (id(module), sha of its file) -> the answer


def mismatch(parts: dict[str, str]) -> str | None:
    """One line naming the first module whose code here is not the code of `parts` (a
    fingerprint's parts), or None."""
    for key in sorted(parts):
        if not key.startswith("module "):
            continue
        name = key[len("module "):]
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if module is None or not file or not file.endswith(".py") or not fingerprint._is_project(file):
            continue
        if fingerprint._label(name) != name:
            continue  # a file loaded by path under another name: its label is not its import name
        try:
            with open(file, "rb") as f:
                data = f.read()
        except OSError:
            return f"module {name}: its file {file} cannot be read here ({type(sys.exc_info()[1]).__name__})"
        sha = hashlib.sha256(data).hexdigest()
        parsed = fingerprint._parse(name, file)
        if parsed is None or parsed.source_hash() != parts[key].partition(" ")[0]:
            return (f"module {name}: the file here ({file}) is not the source the plan fingerprinted "
                    "(this worker's checkout differs from the driver's); update it, or plan again here")
        loader = type(getattr(getattr(module, "__spec__", None), "loader", None))
        if loader not in _PYTHONS_LOADERS:
            continue  # compiled by another loader (pytest rewrites its test files' asserts): no reference
        why = _loaded_differs(module, file, data, sha)
        if why:
            return (f"module {name}: the code this process imported is not its file ({why}): a stale "
                    f"__pycache__ .pyc, or the file was edited after this process imported it; restart "
                    f"the process (or delete {name}'s .pyc)")
    return None


def _loaded_differs(module: types.ModuleType, file: str, data: bytes, sha: str) -> str | None:
    key = (id(module), sha)
    if key not in _CHECKED:
        _CHECKED[key] = _compare(module, file, data, sha)
    return _CHECKED[key]


def _compare(module: types.ModuleType, file: str, data: bytes, sha: str) -> str | None:
    compiled = _COMPILED.get((file, sha))
    if compiled is None:
        try:
            code = compile(data, file, "exec", dont_inherit=True)
            tree = ast.parse(data)
        except (SyntaxError, ValueError):
            return "its file does not compile"
        by_name: dict[str, list[tuple]] = {}  # a qualname may have several codes (`if`: two defs)
        stack = [code]
        while stack:
            c = stack.pop()
            by_name.setdefault(c.co_qualname, []).append(_shape(c))
            stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        compiled = _COMPILED[(file, sha)] = (by_name, _constants(tree))
    by_name, constants = compiled
    for qualname, code in _loaded_code(module):
        want = by_name.get(qualname)
        if want is None:
            return f"{qualname} is not in the file"
        if _shape(code) not in want:
            return f"{qualname} differs"
    for name, value in constants.items():
        if name in module.__dict__ and not _same(module.__dict__[name], value):
            return f"{name} is {module.__dict__[name]!r} here, {value!r} in the file"
    return None


def _shape(code: types.CodeType) -> tuple:
    """What a code object does, without where it is (line numbers, file name)."""
    consts = tuple(("<code>", k.co_qualname) if isinstance(k, types.CodeType) else (type(k).__name__, repr(k))
                   for k in code.co_consts)
    return (code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
            code.co_argcount, code.co_kwonlyargcount, code.co_posonlyargcount, code.co_flags)


def _loaded_code(module: types.ModuleType) -> list[tuple[str, types.CodeType]]:
    """(qualname, code) of every function and method `module` defines, as loaded."""
    out: dict[str, types.CodeType] = {}
    seen: set[int] = set()
    stack: list[Any] = list(module.__dict__.values())
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        for _ in range(8):  # through wrappers: a StepType (.fn), functools.wraps, lru_cache
            inner = getattr(obj, "__wrapped__", None) or (getattr(obj, "fn", None) if not inspect.isfunction(obj)
                                                          and not isinstance(obj, type) else None)
            if inner is None or inner is obj or not callable(inner):
                break
            obj = inner
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            stack.extend(f for f in (obj.fget, obj.fset, obj.fdel) if f is not None)
            continue
        if inspect.isfunction(obj):
            code = obj.__code__
            if getattr(obj, "__module__", None) == module.__name__ and code.co_filename == module.__file__:
                out.setdefault(code.co_qualname, code)
        elif isinstance(obj, type) and obj.__module__ == module.__name__:
            stack.extend(obj.__dict__.values())
    return list(out.items())


_LITERALS = (int, float, complex, str, bytes, bool, type(None))


def _constants(tree: ast.Module) -> dict[str, Any]:
    """`NAME = literal` at the top of a module (upper-case names: constants, not state)."""
    out: dict[str, Any] = {}
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] \
            if isinstance(stmt, ast.AnnAssign) and stmt.value is not None else []
        for target in targets:
            if isinstance(target, ast.Name) and target.id.isupper():
                try:
                    value = ast.literal_eval(stmt.value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    out.pop(target.id, None)
                    continue
                if _immutable(value):
                    out[target.id] = value
                else:
                    out.pop(target.id, None)
    return out


def _immutable(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_immutable(v) for v in value)
    return isinstance(value, _LITERALS)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)

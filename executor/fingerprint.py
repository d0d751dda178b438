"""The code fingerprint of a step type: what its function runs, read from the source files.

It is recorded next to every output (`.status` holds the digest, the record each part) and never
keyed: when it differs from the recorded one under the same version, the plan says "code
drifted" and names the functions, classes, constants and defaults that changed.

What it follows, statically from the source (nothing is imported or run, so every process and
every Python version computes the same fingerprint for the same files):
- the step function, and every module-level function, class or assignment it names, in its own
  module or through imports (`from m import f`, `import pkg.mod` then `pkg.mod.f()`, relative
  imports, imports inside functions), transitively, whatever decorates them: behind
  `functools.lru_cache`, `functools.wraps` or `@triton.jit` the decorated `def` is what is read;
- module-level constants: an assignment is a unit like a function (`LIMIT = 10`, `B = A * 2`);
- the config class (given by the step's config), every config dataclass nested in it, and every
  dataclass, enum or named tuple the live config's values are of (an untyped field holding a class
  of the voyage file: its module joins the closure, its defaults count by value): each
  class's source with its field defaults left out, and each field's default *by value*, so a
  changed default is named with its old and new value (identity leaves fields equal to their
  default out of the digest: a changed default must be caught here, or by a version bump).
Only project code is followed: not the standard library, not installed packages, and not the
executor itself (its changes are the identity scheme's business).

What it cannot see: values read at import or run time from outside the source (files, the
environment), methods reached through an instance (`obj.method()`, unless `obj`'s class is named
in the code), code chosen by name at run time (`getattr`, registries), installed packages, data.

Each unit is normalized (docstrings and function annotations dropped; comments and layout are not
in the AST) and serialized by our own canonical form: node names, fields sorted by name, empty
fields left out. Not `ast.dump`, whose output changes between Python versions.

This module imports only the standard library (the config-default part imports executor.identity
when asked), so the fingerprint of a source can be checked under any interpreter. Loaded as part
of the package, it keeps each walk on disk (executor.fingerprint_cache), served only when every
file the walk read has the same content hash and every module name resolves to the same file.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import os
import sys
import sysconfig
import threading
from dataclasses import dataclass
from typing import Any, Callable

SCHEME = "fp3"  # fp3: fp2's units plus the normalized source of every module in the import closure

_NON_PROJECT = tuple(
    os.path.realpath(p) + os.sep
    for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    | {sys.prefix, sys.base_prefix, sys.exec_prefix}
)
_EXECUTOR = os.path.dirname(os.path.realpath(__file__)) + os.sep
_UNITS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign, ast.AugAssign)
_SKIPPED_FIELDS = frozenset({"type_comment", "kind", "type_params"})


@dataclass(frozen=True)
class Fingerprint:
    """`digest` (f"{SCHEME}:<sha256>", now "fp3:...") over `parts`: unit name -> short hash, and for a default,
    "hash value" (e.g. `default steps.data.tokenize.TokenizeConfig.seed` -> `1a2b... 0`)."""

    digest: str
    parts: dict[str, str]


def code_fingerprint(fn: Callable[..., Any], config_class: type | None = None,
                     value_types: tuple[type, ...] = ()) -> Fingerprint:
    """The fingerprint of step function `fn` (a StepType, or anything wrapping a function) and,
    if given, of its config class and of `value_types`, the classes the live config's values are
    of (executor.refs.value_types): a dataclass held by an untyped field, an enum in a dict, a
    subclass of a declared type. Each such class's module joins the closure, and a dataclass's
    defaults are parts by value like the config class's (identity leaves out a field equal to
    its default, so a default changed in a class defined in the voyage file is seen only here).

    The parts read from source files come from the on-disk cache (executor.fingerprint_cache)
    when every file the walk read still has the same content and every module name still
    resolves as it did; the config defaults are read from the live classes every time."""
    cache = _cache()
    inner = _unwrap(fn)
    classes = _config_classes(config_class) if config_class is not None else []
    for t in value_types:
        if dataclasses.is_dataclass(t):
            classes += [c for c in _config_classes(t) if c not in classes]
    roots = [getattr(inner, "__module__", None), getattr(fn, "__module__", None),
             getattr(getattr(fn, "fn", None), "__module__", None)]
    if config_class is not None:
        roots.append(config_class.__module__)
    roots = [r for r in roots if r]
    # the modules of the values' classes join the closure only when they are project code (a
    # named tuple of the standard library is not followed, as an import of it is not)
    others = sorted({t.__module__ for t in value_types} - set(roots))
    key = _cache_key(inner, classes, roots + ["|", *others]) if cache is not None else None
    source_parts = cache.get(key) if key is not None else None
    if source_parts is None:
        _TRACE.list = trace = []
        try:
            walker = _Walker()
            walker.config_classes(classes)
            walker.function(inner)
            walker.parts.update(module_parts(roots, others))
        finally:
            _TRACE.list = None
        source_parts = walker.parts
        if key is not None:
            cache.put(key, source_parts, trace)
    return _result({**source_parts, **_default_parts(classes)})


def _cache() -> Any:
    """executor.fingerprint_cache; None when this file is loaded alone (as another Python's
    check of the fingerprint does: standard library only, and no cache)."""
    if not __package__:
        return None
    import importlib

    return importlib.import_module(f"{__package__}.fingerprint_cache")


# What the walk in progress in this thread asked of the world outside the live objects (see
# _observe); `.list` is None when no walk records. A cached walk is served only if every answer is
# still the same, so a walk's trace must hold all its own questions: one trace a thread.
_TRACE = threading.local()


def _observe(kind: str, arg: str, answer: Any) -> Any:
    trace = getattr(_TRACE, "list", None)
    if trace is not None:
        trace.append((kind, arg, answer))
    return answer


def replay(kind: str, arg: str) -> Any:
    """The answer to one question a walk asked (executor.fingerprint_cache checks a cached walk
    by asking them all again): where module `arg` is, its label, whether file `arg` is project
    code, the content hash of file `arg`."""
    if kind == "file":
        return _module_file(arg)
    if kind == "label":
        return _label(arg)
    if kind == "project":
        return _is_project(arg)
    if kind == "content":
        return _content_hash(arg)
    raise ValueError(kind)


def _content_hash(file: str) -> str | None:
    try:
        with open(file, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


_SELF: str | None = None


def _cache_key(fn: Any, classes: list[type], roots: list[str]) -> str | None:
    """What a cached walk is for, besides the files it read: this fingerprint code itself (its
    file's content), the Python version (its parser), where project code ends, the step
    function as the live object names it, its config classes and the walk's roots. None (do not
    cache) for a function without code."""
    global _SELF
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    if _SELF is None:
        _SELF = _content_hash(__file__) or "?"
    items = [SCHEME, _SELF, "%d.%d" % sys.version_info[:2], _EXECUTOR, *sorted(_NON_PROJECT),
             getattr(fn, "__module__", None) or "?", getattr(fn, "__qualname__", "?"), fn.__name__,
             code.co_filename, str(code.co_firstlineno),
             *[f"{c.__module__}:{c.__qualname__}" for c in classes], "|", *roots]
    return hashlib.sha256("\0".join(items).encode("utf-8", "backslashreplace")).hexdigest()


def _result(parts: dict[str, str]) -> Fingerprint:
    h = hashlib.sha256()
    for key in sorted(parts):
        h.update(key.encode("utf-8", "backslashreplace") + b"\0" + parts[key].partition(" ")[0].encode() + b"\0")
    return Fingerprint(f"{SCHEME}:{h.hexdigest()}", dict(sorted(parts.items())))


def _default_parts(classes: list[type]) -> dict[str, str]:
    """Each field default of the config classes, by value (read from the live classes)."""
    out: dict[str, str] = {}
    for c in classes:
        for f in dataclasses.fields(c):
            if f.init and not f.metadata.get("run_only"):
                out[f"default {_label(c.__module__)}.{c.__qualname__}.{f.name}"] = _default_part(f)
    return out


# -- the fail-safe part: every project module the step's code can reach -----------------------------

def module_parts(roots: list[str], others: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """`module <label>` -> hash of the normalized source (its AST without docstrings, comments or
    layout) of each project module in the import closure of `roots`: every `import` and
    `from ... import` anywhere in a module (inside functions too, `*` included), with the
    packages above each. The walk by units names what changed; this part is what makes the
    fingerprint fail safe: an edit it cannot follow (a decorator without `functools.wraps`, a
    module-level `TABLE.update(...)`, a `ClassVar`, a star import, a default nested in an untyped
    field) still changes a module's source, so it is still noted. `others` are followed only if
    they are project code (a root is followed anyway, the executor's own modules excepted)."""
    key = tuple(sorted(set(roots)))
    seen: dict[str, _Module] = {}
    stack = list(others) + list(key)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        module = _project_module(name, entry=name in key)
        if module is None:
            continue
        seen[name] = module
        stack.extend(n for n in module.imports() if n not in seen)
    return {f"module {_label(name)}": m.source_hash() for name, m in seen.items()}


_FILES: dict[str, str | None] = {}  # module name -> its source file, for names not imported yet


def _project_module(name: str, entry: bool = False) -> "_Module | None":
    if name in sys.modules:
        file = _module_file(name)
    else:
        if name not in _FILES:
            _FILES[name] = _find_module_file(name)
        file = _observe("file", name, _FILES[name])  # (a walk's trace holds every answer it used)
    if not file or not (entry and not file.startswith(_EXECUTOR) or _is_project(file)):
        return None
    return _parse(name, file)


def drift(old: dict[str, str], new: dict[str, str], limit: int = 4) -> list[str]:
    """What changed between the parts of two fingerprints, as short phrases."""
    out: list[str] = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        if key.startswith("default "):
            name = key[len("default "):]
            out.append(f"default of {name}: {_value(before)} -> {_value(after)}")
        elif before is None:
            out.append(f"{key} is new")
        elif after is None:
            out.append(f"{key} no longer used")
        else:
            out.append(f"{key} changed")
    if len(out) > limit:
        out = out[:limit] + [f"{len(out) - limit} more"]
    return out


def _value(part: str | None) -> str:
    if part is None:
        return "(no field)"
    return part.partition(" ")[2] or "?"


def _unwrap(obj: Any) -> Any:
    """The function inside a StepType (`.fn`), a Triton JITFunction (`.fn`), a partial (`.func`)
    or a `functools.wraps` wrapper (`__wrapped__`)."""
    for _ in range(32):
        inner = getattr(obj, "__wrapped__", None)
        if inner is None and not hasattr(obj, "__code__"):
            inner = getattr(obj, "fn", None) or getattr(obj, "func", None)
        if inner is None or inner is obj or not callable(inner):
            return obj
        obj = inner
    return obj


# -- the source of modules ----------------------------------------------------------------------

class _Module:
    """A parsed module: its top-level bindings (name -> the statements that bind it)."""

    def __init__(self, name: str, file: str, tree: ast.Module, key: bytes = b"") -> None:
        self.name, self.file, self.tree, self.key = name, file, tree, key
        is_package = os.path.basename(file) == "__init__.py"
        self.package = name if is_package else name.rpartition(".")[0]
        self.bindings: dict[str, list[ast.stmt]] = {}
        self._bind(tree.body)
        self._functions: dict[tuple[str, int], ast.AST] | None = None
        self._imports: list[str] | None = None
        self._source_hash: str | None = None

    def imports(self) -> list[str]:
        """Every module this one imports, anywhere in it, with the packages above each (absolute
        names; a name that is not a module, `from m import f`, names only `m`)."""
        if self._imports is None:
            found: dict[str, None] = {}

            def add(dotted: str) -> None:
                parts = dotted.split(".")
                for i in range(1, len(parts) + 1):
                    found.setdefault(".".join(parts[:i]), None)

            for node in _statements(self.tree.body):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        add(alias.name)
                elif isinstance(node, ast.ImportFrom):
                    base = _absolute(node.module, node.level, self.package)
                    if base is None:
                        continue
                    add(base)
                    for alias in node.names:
                        if alias.name != "*":
                            found.setdefault(f"{base}.{alias.name}", None)  # a sub-module, if it is one
            self._imports = list(found)
        return self._imports

    def source_hash(self) -> str:
        """The hash of the whole module's normalized source (docstrings, comments, layout and
        function annotations left out), the same on every Python version."""
        if self._source_hash is None:
            text = canonical(_without_docstring(self.tree.body))
            self._source_hash = hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()[:16]
        return self._source_hash

    def _bind(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._add(stmt.name, stmt)
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    for name in _stored_names(target):
                        self._add(name, stmt)
            elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and isinstance(stmt.target, ast.Name):
                self._add(stmt.target.id, stmt)
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    self._add(alias.asname or alias.name.partition(".")[0], stmt)
            elif isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    self._add(alias.asname or alias.name, stmt)
            elif isinstance(stmt, (ast.If, ast.Try, ast.With, ast.For, ast.While)) or \
                    type(stmt).__name__ == "TryStar":
                for field in ("body", "orelse", "finalbody"):
                    self._bind(getattr(stmt, field, []) or [])
                for handler in getattr(stmt, "handlers", []) or []:
                    self._bind(handler.body)

    def _add(self, name: str, stmt: ast.stmt) -> None:
        found = self.bindings.setdefault(name, [])
        if stmt not in found:
            found.append(stmt)

    def function_at(self, name: str, line: int) -> ast.AST | None:
        """The def of function `name` whose `def` or first decorator is on `line`."""
        if self._functions is None:
            self._functions = {}
            for node in _statements(self.tree.body):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self._functions[(node.name, node.lineno)] = node
                    if node.decorator_list:
                        self._functions[(node.name, node.decorator_list[0].lineno)] = node
        return self._functions.get((name, line))

    def class_named(self, qualname: str) -> ast.ClassDef | None:
        """The (last) class def with this qualified name, nested in functions or classes."""
        found: list[ast.ClassDef] = []

        def walk(body: list[ast.stmt], prefix: str) -> None:
            for stmt in body:
                if isinstance(stmt, ast.ClassDef):
                    name = prefix + stmt.name
                    if name == qualname:
                        found.append(stmt)
                    walk(stmt.body, name + ".")
                elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    walk(stmt.body, prefix + stmt.name + ".<locals>.")
                else:
                    for field in ("body", "orelse", "finalbody"):
                        walk(getattr(stmt, field, []) or [], prefix)

        walk(self.tree.body, "")
        return found[-1] if found else None


def _statements(body: list[ast.stmt]) -> Any:
    """Every statement in `body` and in the statements nested in it (bodies of functions,
    classes, if, for, while, with, try, match), not the expressions: an import or a def is
    always a statement, and a module of 3,000 generated lines is mostly expressions
    (`ast.walk` of every node cost 0.1 s twice for one)."""
    stack = list(reversed(body))
    while stack:
        stmt = stack.pop()
        yield stmt
        nested: list[ast.stmt] = []
        for field in ("body", "orelse", "finalbody"):
            value = getattr(stmt, field, None)
            if isinstance(value, list):
                nested += value
        for handler in getattr(stmt, "handlers", None) or []:
            nested += handler.body
        for case in getattr(stmt, "cases", None) or []:
            nested += case.body
        stack.extend(reversed(nested))


_PARSED: dict[str, tuple[bytes, _Module]] = {}  # file -> (content hash, module)


def _parse(name: str, file: str) -> _Module | None:
    try:
        with open(file, "rb") as f:
            data = f.read()
    except OSError:
        _observe("content", file, None)
        return None
    key = hashlib.sha256(data).digest()
    _observe("content", file, key.hex())
    cached = _PARSED.get(file)
    if cached is not None and cached[0] == key and cached[1].name == name:
        return cached[1]
    try:
        tree = ast.parse(data, filename=file)
    except (SyntaxError, ValueError):
        return None
    module = _Module(name, file, tree, key)
    _PARSED[file] = (key, module)
    return module


def _module_file(name: str) -> str | None:
    """The source file of module `name`, without importing it."""
    return _observe("file", name, _find_module_file(name))


def _find_module_file(name: str) -> str | None:
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    if file:
        return file if file.endswith(".py") else None
    if module is not None and not hasattr(module, "__path__"):
        return None  # built in, or made at run time
    return _on_path(name)


def _on_path(name: str) -> str | None:
    """Where `import name` would find its source on sys.path."""
    parts = name.split(".")
    for entry in sys.path:
        base = os.path.join(entry or os.getcwd(), *parts)
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


_LABELS: dict[tuple[str, str | None], str] = {}


def _label(name: str) -> str:
    """How parts name a module: its import name, or, for a file loaded by path under a name of
    the loader's choosing (a voyage file is `marin_voyage_hello` under marin-run, something
    else under a test or a notebook), the file's own name, so both agree on its parts."""
    file = _module_file(name)
    label = _LABELS.get((name, file))
    if label is None:
        found = _on_path(name) if file else None
        if file is None or (found is not None and os.path.realpath(found) == os.path.realpath(file)):
            label = name
        else:
            stem = os.path.splitext(os.path.basename(file))[0]
            label = os.path.basename(os.path.dirname(file)) if stem == "__init__" else stem
        _LABELS[(name, file)] = label
    return _observe("label", name, label)


_PROJECT: dict[str, bool] = {}  # file -> is it project code (realpath is costly: once per file)


def _is_project(file: str) -> bool:
    found = _PROJECT.get(file)
    if found is None:
        real = os.path.realpath(file)
        found = _PROJECT[file] = not real.startswith(_NON_PROJECT) and not real.startswith(_EXECUTOR)
    return _observe("project", file, found)


# -- the walk -------------------------------------------------------------------------------------

class _Walker:
    """Visits units (functions, classes, assignments) from the step function outwards."""

    def __init__(self) -> None:
        self.parts: dict[str, str] = {}
        self.config_keys: set[str] = set()
        self._modules: dict[str, _Module | None] = {}
        self._files: dict[str, str | None] = {}
        self._followed: set[tuple[str, tuple[str, ...]]] = set()

    # -- modules ----------------------------------------------------------------------------------
    def _file(self, name: str) -> str | None:
        if name not in self._files:
            self._files[name] = _module_file(name)
        return self._files[name]

    def _module(self, name: str, entry: bool = False) -> _Module | None:
        """A project module's source (any module's, for the step function's own)."""
        if name in self._modules and not entry:
            return self._modules[name]
        file = self._file(name)
        module = _parse(name, file) if file and (entry or _is_project(file)) else None
        if not entry:
            self._modules[name] = module
        return module

    # -- entry points -----------------------------------------------------------------------------
    def function(self, fn: Any) -> None:
        code = getattr(fn, "__code__", None)
        modname = getattr(fn, "__module__", None) or "?"
        key = f"{_label(modname)}.{getattr(fn, '__qualname__', getattr(fn, '__name__', repr(fn)))}"
        module = self._module(modname, entry=True) if code is not None else None
        node = module.function_at(fn.__name__, code.co_firstlineno) if module is not None else None
        if node is None:
            self.parts[key] = "no-source"
            return
        self._visit(module, key, [node])

    def config_classes(self, classes: list[type]) -> None:
        """The source of each config class, its field defaults left out (`_default_parts` has
        them by value)."""
        self.config_keys.update(f"{_label(c.__module__)}.{c.__qualname__}" for c in classes)
        for c in classes:
            module = self._module(c.__module__)
            node = module.class_named(c.__qualname__) if module is not None else None
            if node is not None:
                self._visit(module, f"{_label(c.__module__)}.{c.__qualname__}", [node])

    # -- units ------------------------------------------------------------------------------------
    def _visit(self, module: _Module, key: str, nodes: list[ast.AST]) -> None:
        if key in self.parts:
            return
        unit = _unit(module, key, nodes, key in self.config_keys)
        self.parts[key] = unit.hash
        for chain in unit.chains:
            self._follow(module, chain, unit.local_imports.get(chain[0]))

    def _follow(self, module: _Module, chain: tuple[str, ...], stmts: list[ast.stmt] | None = None) -> None:
        """Visit what `chain` (a name, or a dotted attribute chain) names in `module`."""
        mark = (module.name, chain)
        if mark in self._followed:
            return
        self._followed.add(mark)
        head = chain[0]
        stmts = stmts if stmts is not None else module.bindings.get(head, [])
        units = [s for s in stmts if isinstance(s, _UNITS)]
        if units:
            self._visit(module, f"{_label(module.name)}.{head}", units)
        for stmt in stmts:
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname == head:
                        self._follow_module(alias.name, chain[1:])
                    elif alias.asname is None and alias.name.partition(".")[0] == head:
                        self._follow_module(head, chain[1:])
            elif isinstance(stmt, ast.ImportFrom):
                base = _absolute(stmt.module, stmt.level, module.package)
                for alias in stmt.names:
                    if (alias.asname or alias.name) != head or base is None:
                        continue
                    sub = f"{base}.{alias.name}"
                    if self._file(sub) is not None and alias.name not in self._bindings_of(base):
                        self._follow_module(sub, chain[1:])
                    else:
                        self._follow_in(base, (alias.name, *chain[1:]))

    def _bindings_of(self, modname: str) -> dict[str, list[ast.stmt]]:
        module = self._module(modname)
        return module.bindings if module is not None else {}

    def _follow_module(self, modname: str, rest: tuple[str, ...]) -> None:
        """Follow `rest` from module `modname` (through sub-modules while they are modules)."""
        file = self._file(modname)
        if file is not None and not _is_project(file):
            return
        while rest:
            if rest[0] in self._bindings_of(modname) or self._file(f"{modname}.{rest[0]}") is None:
                break
            modname, rest = f"{modname}.{rest[0]}", rest[1:]
        if rest:
            self._follow_in(modname, rest)

    def _follow_in(self, modname: str, chain: tuple[str, ...]) -> None:
        module = self._module(modname)
        if module is not None:
            self._follow(module, chain)


def _absolute(module: str | None, level: int, package: str) -> str | None:
    """The absolute name of `from {'.' * level}{module} import ...` inside `package`."""
    if not level:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    base = parts[:len(parts) - (level - 1)]
    return ".".join(base + ([module] if module else [])) or None


def _stored_names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


@dataclass(frozen=True)
class _Unit:
    """What a unit contributes: its hash, the names it loads (outside its own locals), and the
    imports made inside it."""

    hash: str
    chains: tuple[tuple[str, ...], ...]
    local_imports: dict[str, list[ast.stmt]]


_UNIT_CACHE: dict[tuple[str, bytes, str, bool], _Unit] = {}  # shared by every fingerprint of a process


def _unit(module: _Module, key: str, nodes: list[ast.AST], blank: bool) -> _Unit:
    cache_key = (module.file, module.key, key, blank)
    unit = _UNIT_CACHE.get(cache_key)
    if unit is None:
        text = canonical(nodes, blank)
        local_imports: dict[str, list[ast.stmt]] = {}
        for n in nodes:
            for sub in _walk(n, blank):
                if isinstance(sub, (ast.Import, ast.ImportFrom)) and sub is not n:
                    for alias in sub.names:
                        bound = alias.asname or (alias.name.partition(".")[0] if isinstance(sub, ast.Import)
                                                 else alias.name)
                        local_imports.setdefault(bound, []).append(sub)
        local = _local_names(nodes, blank) - set(local_imports)
        chains = tuple(c for c in _chains(nodes, blank) if c[0] not in local)
        unit = _UNIT_CACHE[cache_key] = _Unit(
            hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()[:16], chains, local_imports)
    return unit


def _walk(node: ast.AST, blank: bool = False) -> Any:
    """Every node under `node`, as the fingerprint sees it: not inside function annotations, nor
    inside the field defaults of a config class (`blank`)."""
    stack = [(node, blank)]
    while stack:
        current, blank_here = stack.pop()
        yield current
        kind = type(current)
        for name, value in ast.iter_fields(current):
            if _dropped(kind, name):
                continue
            if blank_here and kind is ast.ClassDef and name == "body":
                for stmt in value:
                    if isinstance(stmt, ast.AnnAssign):
                        stack.extend((part, False) for part in (stmt.target, stmt.annotation))
                    else:
                        stack.append((stmt, False))
                continue
            if isinstance(value, ast.AST):
                stack.append((value, False))
            elif isinstance(value, list):
                stack.extend((item, False) for item in value if isinstance(item, ast.AST))


def _dropped(kind: type, name: str) -> bool:
    """Fields that do not change behaviour: function annotations (and version-specific fields)."""
    return name in _SKIPPED_FIELDS or (name == "returns" and kind in (ast.FunctionDef, ast.AsyncFunctionDef)) \
        or (name == "annotation" and kind is ast.arg)


def _local_names(nodes: list[ast.AST], blank: bool = False) -> set[str]:
    """Names bound inside functions (parameters, assignments, loop and comprehension variables,
    nested defs): a name loaded there refers to them, not to the module."""
    out: set[str] = set()
    for n in nodes:
        for fn in _walk(n, blank):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            a = fn.args
            out.update(arg.arg for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs))
            out.update(arg.arg for arg in (a.vararg, a.kwarg) if arg is not None)
            for sub in _walk(fn):
                if sub is fn:
                    continue
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                    out.add(sub.id)
                elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    out.add(sub.name)
                elif isinstance(sub, ast.ExceptHandler) and sub.name:
                    out.add(sub.name)
    return out


def _chains(nodes: list[ast.AST], blank: bool = False) -> list[tuple[str, ...]]:
    """Every loaded name and dotted chain (`pkg.mod.fn`), in order of appearance, once each."""
    seen: dict[tuple[str, ...], None] = {}
    for n in nodes:
        for sub in _walk(n, blank):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                seen.setdefault((sub.id,), None)
            elif isinstance(sub, ast.Attribute):
                parts: list[str] = []
                value: ast.AST = sub
                while isinstance(value, ast.Attribute):
                    parts.append(value.attr)
                    value = value.value
                if isinstance(value, ast.Name):
                    seen.setdefault((value.id, *reversed(parts)), None)
    return list(seen)


_PASS = ast.Pass()


def canonical(node: Any, blank: bool = False) -> str:
    """A text for an AST that is the same on every Python version, normalized on the way:
    node type names, fields in name order, empty fields (None, []) and version-specific ones
    (type_params, kind, type_comment) left out, constants by type and repr; docstrings and
    function annotations dropped, f-string literal pieces merged (3.12 splits them otherwise);
    with `blank`, the field defaults of a class body are left out (a config class: its defaults
    are fingerprinted by value, one part each)."""
    out: list[str] = []
    if isinstance(node, list):
        out.append("[")
        for item in node:
            _emit(item, out, blank)
            out.append(",")
        out.append("]")
    else:
        _emit(node, out, blank)
    return "".join(out)


def _emit(node: Any, out: list[str], blank: bool = False, without_value: bool = False) -> None:
    if isinstance(node, ast.AST):
        kind = type(node)
        out.append(kind.__name__ + "(")
        for name in sorted(node._fields):
            if _dropped(kind, name) or (without_value and name == "value"):
                continue
            value = getattr(node, name, None)
            if name == "body" and kind in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
                value = _without_docstring(value)
            elif name == "values" and kind is ast.JoinedStr:
                value = _merged(value)
            if value is None or (isinstance(value, list) and not value):
                continue
            out.append(name + "=")
            if blank and kind is ast.ClassDef and name == "body":
                out.append("[")
                for stmt in value:
                    _emit(stmt, out, without_value=isinstance(stmt, ast.AnnAssign))
                    out.append(",")
                out.append("]")
            else:
                _emit(value, out)
            out.append(";")
        out.append(")")
    elif isinstance(node, list):
        out.append("[")
        for item in node:
            _emit(item, out)
            out.append(",")
        out.append("]")
    else:
        out.append(f"{type(node).__name__}:{node!r}")


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:] or [_PASS]
    return body


def _merged(values: list[ast.expr]) -> list[ast.expr]:
    """One piece per run of literal text in an f-string, none empty."""
    out: list[ast.expr] = []
    for value in values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            if not value.value:
                continue
            if out and isinstance(out[-1], ast.Constant) and isinstance(out[-1].value, str):
                out[-1] = ast.Constant(out[-1].value + value.value)
                continue
        out.append(value)
    return out


# -- config classes ---------------------------------------------------------------------------------

def _config_classes(cls: type) -> list[type]:
    """`cls` and every dataclass nested in it (through defaults and declared field types)."""
    import typing

    found: list[type] = []
    stack = [cls]
    while stack:
        c = stack.pop()
        if c in found or not dataclasses.is_dataclass(c) or c.__module__.partition(".")[0] == "executor":
            continue  # the executor's own (an InputRef in an InputPath field) is not config
        found.append(c)
        try:
            hints = typing.get_type_hints(c)
        except Exception:  # annotations that do not evaluate here: defaults still lead the way
            hints = {}
        for f in dataclasses.fields(c):
            default = _default_value(f)
            if dataclasses.is_dataclass(default) and not isinstance(default, type):
                stack.append(type(default))
            stack.extend(_dataclasses_in(hints.get(f.name)))
    return found


def _dataclasses_in(hint: Any) -> list[type]:
    import typing

    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return [hint]
    return [c for arg in typing.get_args(hint) for c in _dataclasses_in(arg)]


def _default_value(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        try:
            return f.default_factory()  # type: ignore[misc]
        except Exception:
            return dataclasses.MISSING
    return dataclasses.MISSING


def _default_part(f: dataclasses.Field) -> str:
    """"hash value" of a field's default, by its canonical encoding (executor.identity)."""
    import json

    from executor.identity import _canonical, encode, plain

    default = _default_value(f)
    if default is dataclasses.MISSING:
        return "required (required)"
    try:
        body = _canonical(encode(default, lambda ref: f"ref:{ref.step_name}", f.name))
        shown = _shown(default, json, plain)
    except Exception:  # no identity (an opaque object): its type is all that can be compared
        body = shown = f"<{type(default).__qualname__}>"
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return hashlib.sha256(body.encode("utf-8", "backslashreplace")).hexdigest()[:16] + " " + shown


def _shown(value: Any, json: Any, plain: Any) -> str:
    """A short text of a default: a nested config by the fields it sets (its own defaults are
    parts of their own), anything else as JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        set_fields = [f"{f.name}={_shown(getattr(value, f.name), json, plain)}" for f in dataclasses.fields(value)
                      if f.init and _default_value(f) is not dataclasses.MISSING
                      and getattr(value, f.name) != _default_value(f)]
        return f"{type(value).__qualname__}({', '.join(set_fields)})"
    return json.dumps(plain(value), sort_keys=True, default=str, ensure_ascii=False)

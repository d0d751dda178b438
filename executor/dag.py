"""The DAG of a voyage, built from the references inside step configs.

Nodes are keyed by step name. Identical steps (same name, same digest) built twice are one node;
one name with two different digests is an error naming both places they were built. A reference
by name to a step that does not exist, or a cycle, is an error naming the steps involved.
Digests are computed here, dependencies first (Merkle), each exactly once.
"""

from __future__ import annotations

import functools
import gc
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, TypeVar

from executor.errors import IdentityError, VoyageError
from executor.fingerprint import Fingerprint, code_fingerprint
from executor.identity import check_depth, step_digest
from executor.refs import input_refs, value_types
from executor.step import InputRef, Step

T = TypeVar("T")


@dataclass(eq=False)
class Node:
    """A step placed in the DAG, with its identity."""

    step: Step
    deps: list["Node"] = field(default_factory=list)
    # the deps whose data the step reads (a reference with `data=False` orders steps only)
    data_deps: list["Node"] = field(default_factory=list)
    # the references that carry data, each with the folder of the input it reads (`subpath`)
    data_refs: list[InputRef] = field(default_factory=list)
    consumers: list["Node"] = field(default_factory=list)
    digest: str = ""
    # the classes of its config's dataclass, enum and named tuple values (found by the digest's
    # encoding), which the code fingerprint follows
    value_types: tuple[type, ...] = ()

    @property
    def name(self) -> str:
        return self.step.name

    @property
    def dirname(self) -> str:
        """Folder name of the output under the prefix: `{name}-{digest[:10]}`."""
        return f"{self.step.name}-{self.digest[:10]}"

    def __repr__(self) -> str:
        return f"Node({self.name}, {self.digest[:10]})"


class Dag:
    """Nodes in topological order (dependencies before consumers)."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.by_name = {n.name: n for n in nodes}
        self._fingerprints: dict[tuple[int, tuple[type, ...]], Fingerprint] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __getitem__(self, name: str) -> Node:
        return self.by_name[name]

    def fingerprint(self, node: Node) -> Fingerprint:
        """Code fingerprint of a node's step function, its config class and every class its config's
        values are of (a dataclass in an untyped field, an enum in a dict: their modules and
        defaults count as the config class's do), once per such combination."""
        reached = node.value_types or value_types(node.step.config)
        key = (id(node.step.type), reached)
        found = self._fingerprints.get(key)
        if found is None:
            found = self._fingerprints[key] = code_fingerprint(node.step.type.fn, type(node.step.config), reached)
        return found

    def upstream(self, names: Iterable[str]) -> set[str]:
        """The named steps and every step they depend on, transitively."""
        return self._closure(names, lambda n: n.deps)

    def downstream(self, names: Iterable[str]) -> set[str]:
        """The named steps and every step that depends on them, transitively."""
        return self._closure(names, lambda n: n.consumers)

    def _closure(self, names: Iterable[str], edges: Any) -> set[str]:
        out: set[str] = set()
        stack = [self.by_name[n] for n in names]
        while stack:
            node = stack.pop()
            if node.name in out:
                continue
            out.add(node.name)
            stack.extend(edges(node))
        return out


def gc_paused(fn: Callable[..., T]) -> Callable[..., T]:
    """Run `fn` with the cyclic garbage collector paused: planning allocates many small objects
    and no cycles, and the collector's full passes made 100k-step plans superlinear."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return wrapper


@gc_paused
def build_dag(steps: Iterable[Step]) -> Dag:
    """Place `steps` (and every step they reference) in a DAG and compute their digests."""
    by_name: dict[str, Step] = {}
    pending = list(steps)[::-1]  # popped from the end: visit in the order given
    seen_objects: set[int] = set()
    duplicates: list[Step] = []  # same name, another object: must have the same digest
    types: dict[str, Step] = {}  # step type name -> the first step of that type
    refs_of: dict[int, list[InputRef]] = {}  # id(step) -> its references, found once
    while pending:
        s = pending.pop()
        if not isinstance(s, Step):
            raise VoyageError(f"a voyage must return Steps, got {type(s).__name__}: {s!r}")
        if id(s) in seen_objects:
            continue
        seen_objects.add(id(s))
        other = by_name.get(s.name)
        if other is None:
            by_name[s.name] = s
        elif other.type is not s.type:
            raise VoyageError(f"two different steps are named {s.name!r}: {other.origin} ({other.type.key}) "
                              f"and {s.origin} ({s.type.key})")
        else:
            duplicates.append(s)
        _check_type_name(types, s)
        try:
            found = refs_of[id(s)] = _deep_guard(s, input_refs)
        except IdentityError as e:
            raise IdentityError(f"step {s.name!r} ({s.origin}): {e}") from None
        for ref in found:
            if isinstance(ref.step, Step):
                pending.append(ref.step)

    nodes: dict[str, Node] = {name: Node(step) for name, step in by_name.items()}
    for node in nodes.values():
        dep_names: list[str] = []
        data_names: set[str] = set()
        for ref in refs_of[id(node.step)]:
            target = ref.step_name
            if target not in nodes:
                raise VoyageError(f"step {node.name!r} ({node.step.origin}) refers to unknown step {target!r}")
            if target not in dep_names:
                dep_names.append(target)
            if ref.data:
                data_names.add(target)
        node.deps = [nodes[d] for d in dep_names]
        node.data_deps = [nodes[d] for d in dep_names if d in data_names]
        node.data_refs = [ref for ref in refs_of[id(node.step)] if ref.data]
        for dep in node.deps:
            dep.consumers.append(node)

    order = _toposort(list(nodes.values()))
    for node in order:
        seen: dict[type, None] = {}
        try:
            node.digest = _deep_guard(node.step, lambda c: step_digest(node.step.type, c,
                                                                       lambda ref: nodes[ref.step_name].digest, seen))
        except IdentityError as e:
            raise IdentityError(f"step {node.name!r} ({node.step.origin}): {e}") from None
        node.value_types = tuple(seen) if len(seen) == 1 else tuple(sorted(seen, key=_type_order))
    for other in duplicates:
        kept = nodes[other.name]
        digest = step_digest(other.type, other.config, lambda ref: nodes[ref.step_name].digest)
        if digest != kept.digest:
            raise VoyageError(
                f"two different steps are named {other.name!r}: {kept.step.origin} and {other.origin} "
                f"(digests {kept.digest[:10]} and {digest[:10]})")
    return Dag(order)


def _type_order(t: type) -> tuple[str, str]:
    return t.__module__, t.__qualname__


def _deep_guard(step: Step, fn: Any) -> Any:
    """`fn(step.config)`; a config that holds itself or nests too deep for Python's recursion is
    an IdentityError naming the field path (found only then: nothing is paid on good configs)."""
    try:
        return fn(step.config)
    except RecursionError:
        pass
    check_depth(step.config)
    raise IdentityError("config: nests too deeply to be hashed (over Python's recursion limit)")


def _check_type_name(types: dict[str, Step], step: Step) -> None:
    """Two step types of one name (say, a module's `tokenize` and another's) would share every
    digest: an error naming both modules, whatever the registry kept."""
    first = types.setdefault(step.type.name, step)
    a, b = first.type.fn, step.type.fn
    if first.type is step.type or (_file_of(a) == _file_of(b) and not (
            _one_execution(a, b) and first.type.version == step.type.version)):
        return  # one definition loaded twice
    raise VoyageError(f"two step types are named {step.type.name!r}: {a.__module__}.{a.__qualname__} "
                      f"(step {first.name!r}) and {b.__module__}.{b.__qualname__} (step {step.name!r}); "
                      f"they would share every digest: give one another name (@step_type(..., name=...))")


def _one_execution(a: Any, b: Any) -> bool:
    """Two functions defined by one execution of one module (two `name=` clashing in one file),
    as opposed to one file loaded twice (each load has globals of its own)."""
    return getattr(a, "__globals__", None) is getattr(b, "__globals__", object()) and a is not b


def _file_of(fn: Any) -> str:
    code = getattr(fn, "__code__", None)
    return code.co_filename if code is not None else repr(fn)


def _toposort(nodes: list[Node]) -> list[Node]:
    """Depth-first post-order (dependencies first, in the order configs name them), iterative so
    that a 100k-step chain needs no deep recursion; a cycle is an error naming its steps."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {id(n): WHITE for n in nodes}
    order: list[Node] = []
    for root in nodes:
        if color[id(root)] != WHITE:
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        color[id(root)] = GREY
        while stack:
            node, i = stack[-1]
            if i < len(node.deps):
                stack[-1] = (node, i + 1)
                dep = node.deps[i]
                if color[id(dep)] == GREY:
                    names = [n.name for n, _ in stack]
                    cycle = names[names.index(dep.name):] + [dep.name]
                    cycle.reverse()  # deps point backwards: print in data-flow order
                    raise VoyageError("cycle between steps: " + " -> ".join(cycle))
                if color[id(dep)] == WHITE:
                    color[id(dep)] = GREY
                    stack.append((dep, 0))
            else:
                color[id(node)] = BLACK
                order.append(node)
                stack.pop()
    return order

"""The DAG of a voyage, built from the references inside step configs.

Nodes are keyed by step name. Identical steps (same name, same digest) built twice are one node;
one name with two different digests is an error naming both places they were built. A reference
by name to a step that does not exist, or a cycle, is an error naming the steps involved.
Digests are computed here, dependencies first (Merkle), each exactly once.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, TypeVar

from executor.errors import VoyageError
from executor.identity import code_fingerprint, step_digest
from executor.step import InputRef, OwnOutput, Step

T = TypeVar("T")


@dataclass(eq=False)
class Node:
    """A step placed in the DAG, with its identity."""

    step: Step
    deps: list["Node"] = field(default_factory=list)
    consumers: list["Node"] = field(default_factory=list)
    digest: str = ""

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
        self._fingerprints: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __getitem__(self, name: str) -> Node:
        return self.by_name[name]

    def fingerprint(self, node: Node) -> str:
        """Code fingerprint of a node's step function (computed once per step type)."""
        key = id(node.step.type)
        if key not in self._fingerprints:
            self._fingerprints[key] = code_fingerprint(node.step.type.fn)
        return self._fingerprints[key]

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


_SCALARS = (str, int, float, bool, type(None), OwnOutput, bytes)


def iter_refs(value: Any) -> Iterator[InputRef]:
    """Every InputRef anywhere inside a config value."""
    out: list[InputRef] = []
    _collect_refs(value, out)
    return iter(out)


def _collect_refs(value: Any, out: list[InputRef]) -> None:
    if isinstance(value, _SCALARS):
        return
    if isinstance(value, InputRef):
        out.append(value)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            _collect_refs(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _collect_refs(v, out)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for name in _field_names(type(value)):
            _collect_refs(getattr(value, name), out)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


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
        for ref in iter_refs(s.config):
            if isinstance(ref.step, Step):
                pending.append(ref.step)

    nodes: dict[str, Node] = {name: Node(step) for name, step in by_name.items()}
    for node in nodes.values():
        dep_names: list[str] = []
        for ref in iter_refs(node.step.config):
            target = ref.step_name
            if target not in nodes:
                raise VoyageError(f"step {node.name!r} ({node.step.origin}) refers to unknown step {target!r}")
            if target not in dep_names:
                dep_names.append(target)
        node.deps = [nodes[d] for d in dep_names]
        for dep in node.deps:
            dep.consumers.append(node)

    order = _toposort(list(nodes.values()))
    for node in order:
        node.digest = step_digest(node.step.type, node.step.config, lambda ref: nodes[ref.step_name].digest)
    for other in duplicates:
        kept = nodes[other.name]
        digest = step_digest(other.type, other.config, lambda ref: nodes[ref.step_name].digest)
        if digest != kept.digest:
            raise VoyageError(
                f"two different steps are named {other.name!r}: {kept.step.origin} and {other.origin} "
                f"(digests {kept.digest[:10]} and {digest[:10]})")
    return Dag(order)


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

"""Lineage from the DAG alone: which sources (and so which licences) reach each step, and the
licence policies checked against it before anything runs.

A *source* is a step whose config declares a licence (a field typed `License`, executor.licenses).
Licences flow along every edge: a step is reached by every source upstream of it, itself
included. That is the conservative reading (a tokenizer trained on a source's documents carries
its licence into everything tokenized with it), and the only one a plan can check without data.

Everything here is computed from the DAG and the configs, in one pass in topological order, so a
policy violation is found when the plan is made, before any output exists. Steps that share
their sources share one frozenset (a 10,000-step chain holds one set, not 10,000).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

from executor.dag import Dag, Node
from executor.errors import VoyageError
from executor.licenses import License, LicensePolicy, declared_license, licenses_json

_EMPTY: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Violation:
    """A licence that would reach a step whose policy does not allow it."""

    step: str
    policy: LicensePolicy
    source: str
    license: License
    path: tuple[str, ...]  # source -> ... -> step

    def line(self) -> str:
        return (f"licence policy of step {self.step!r} ({self.policy.describe()}): source {self.source!r} "
                f"under {self.license.describe()!r} reaches it via {' -> '.join(self.path)}")


class Lineage:
    """Sources and licences of every step of a DAG, and the policies that bind them."""

    def __init__(self, dag: Dag, policy: LicensePolicy | None = None) -> None:
        self.dag = dag
        self.policy = policy  # the voyage's: binds every step
        self.declared: dict[str, License] = {}  # source step name -> its licence
        self.reach: dict[str, frozenset[str]] = {}  # step name -> sources upstream (itself included)
        self.order: dict[str, int] = {}  # source step name -> its place in the DAG (reports go in this order)
        interned: dict[frozenset[str], frozenset[str]] = {_EMPTY: _EMPTY}
        for node in dag:
            own = declared_license(node.step.config)
            if own is not None:
                self.declared[node.name] = own
                self.order[node.name] = len(self.order)
            distinct = {id(r): r for r in (self.reach[dep.name] for dep in node.deps) if r}
            if own is None and len(distinct) <= 1:  # nothing new joins here: share the input's set
                self.reach[node.name] = next(iter(distinct.values()), _EMPTY)
                continue
            found = _EMPTY.union(*distinct.values())
            if own is not None:
                found = found | {node.name}
            key = frozenset(found)
            self.reach[node.name] = interned.setdefault(key, key)

    # -- queries -----------------------------------------------------------------------------
    def sources_of(self, name: str) -> dict[str, License]:
        """{source step name: licence} of every source reaching step `name`."""
        return {s: self.declared[s] for s in self._ordered(self.reach[name])}

    def _ordered(self, sources: Iterable[str]) -> list[str]:
        return sorted(sources, key=self.order.__getitem__)

    def licenses_of(self, name: str) -> list[str]:
        """The licence ids reaching step `name`, sorted."""
        return sorted({self.declared[s].id for s in self.reach[name]})

    def record_of(self, name: str) -> dict[str, Any]:
        """What the record of step `name` starts its `provenance` with: its sources' licences."""
        sources = self.sources_of(name)
        return {"sources": licenses_json(sources), "licenses": sorted({lic.id for lic in sources.values()})}

    def policy_of(self, node: Node) -> LicensePolicy | None:
        return node.step.licenses or self.policy

    def path(self, source: str, step: str) -> tuple[str, ...]:
        """The shortest chain of steps from `source` to `step` (both included), found by walking
        back from `step` through the inputs `source` reaches."""
        by_name = self.dag.by_name
        parent: dict[str, str | None] = {step: None}
        queue = deque([step])
        while queue:
            name = queue.popleft()
            if name == source:
                break
            for dep in by_name[name].deps:
                if dep.name not in parent and source in self.reach[dep.name]:
                    parent[dep.name] = name
                    queue.append(dep.name)
        chain: list[str] = []
        at: str | None = source if source in parent else None
        while at is not None:
            chain.append(at)
            at = parent[at]
        return tuple(chain)

    def violations(self, limit: int | None = None) -> list[Violation]:
        """Every (step with a policy, source) pair the policy refuses, in DAG order."""
        out: list[Violation] = []
        checked: dict[tuple[int, frozenset[str]], list[str]] = {}
        for node in self.dag:
            policy = self.policy_of(node)
            reach = self.reach[node.name]
            if policy is None or not reach:
                continue
            key = (id(policy), reach)
            bad = checked.get(key)
            if bad is None:
                bad = checked[key] = [s for s in self._ordered(reach) if not policy.allows(self.declared[s])]
            for source in bad:
                out.append(Violation(node.name, policy, source, self.declared[source], self.path(source, node.name)))
                if limit is not None and len(out) >= limit:
                    return out
        return out

    def check(self) -> None:
        """Raise VoyageError (one line) if a disallowed licence would reach a step with a policy:
        the first such step in DAG order, the source, its licence and the path of steps; how
        many other pairs are refused as well."""
        found = self.violations()
        if not found:
            return
        first = found[0]
        rest = found[1:]
        tail = ""
        if rest:
            others = list(dict.fromkeys(f"{v.source} ({v.license.id})" for v in rest if v.source != first.source))
            tail = f"; {len(rest)} more refused pair(s) of step and source" + (
                f", other sources: {', '.join(others[:5])}" + (" ..." if len(others) > 5 else "") if others else "")
        raise VoyageError(first.line() + tail)

    def policies(self) -> Iterable[tuple[str, LicensePolicy]]:
        """(step, policy) for every step bound by one."""
        for node in self.dag:
            policy = self.policy_of(node)
            if policy is not None:
                yield node.name, policy

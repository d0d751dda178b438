"""`marin-run VOYAGE --explain NAME`: why a step has the digest it has, and what changed.

Three parts:
1. the step: its full digest, type@version, identity scheme, path, state and reason;
2. the digest tree: what the digest covers, i.e. the step's own type@version and config, and the
   digest of each dependency, recursively (compact: a subtree already shown is not repeated, and
   long lists of inputs are cut to a few plus counts by name prefix);
3. what changed since the newest earlier output of the same name: the config leaves that differ,
   and, for each input that was re-addressed, the leaf upstream that caused it (found by reading
   the record of the input's old output folder); then the steps downstream whose digests contain
   this one, which every such change re-addresses.
"""

from __future__ import annotations

import difflib
import time
from collections import Counter
from typing import Iterable, TextIO

from rich.text import Text
from rich.tree import Tree

from executor.dag import Node
from executor.errors import VoyageError
from executor.identity import SCHEME, diff, plain
from executor.plan import Plan
from executor.views.report import console_for, emit
from executor.state import StepState
from executor.storage.store import Record
from executor.views.viz.style import RICH

MAX_CHILDREN = 6  # inputs listed under one node before the rest are summarized
SHOWN_WHEN_CUT = 3
MAX_DEPTH = 12  # levels of the digest tree
MAX_CAUSES = 5  # re-addressed inputs traced upstream per step
MAX_LEAVES = 20  # config leaves listed per step


def check_name(names: Iterable[str], name: str) -> None:
    """A VoyageError naming the closest steps when `name` is not one of `names`."""
    names = list(names)
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        hint = f" (closest: {', '.join(close)})" if close else ""
        raise VoyageError(f"--explain: no step named {name!r} in this voyage{hint}")


def explain(plan: Plan, name: str, out: TextIO) -> None:
    """Print the identity of step `name`, its digest tree and what changed since its last output."""
    check_name(plan.dag.by_name, name)
    node, d = plan.dag[name], plan[name]
    con = console_for(out)
    con.print(Text(name, style="bold") + Text(f"  {node.step.type.key}  ") +
              Text(d.state, style=RICH.get(d.state, "")) + Text(f": {d.reason}" if d.reason else ""))
    con.print(f"  digest   {node.digest}")
    con.print(f"  scheme   {SCHEME}")
    con.print(f"  path     {plan.path(node)}")
    con.print(f"  runs on  {node.step.resources.describe()}")
    for s in d.stale_inputs:
        con.print(Text(f"  stale    input {s.name} output {s.recorded[:16]} -> {s.current[:16]}", style=RICH[StepState.STALE]))

    con.print()
    con.print(Text("digest tree", style="bold") +
              Text(" (each digest covers its type@version, its config less run-only fields and defaults, "
                   "and the digests of its inputs)", style="dim"))
    emit(con, digest_tree(node))

    con.print()
    for line in changes(plan, node):
        con.print(line)

    con.print()
    below = plan.dag.downstream([name]) - {name}
    if not below:
        con.print("downstream: none (no step's digest contains this one)")
        return
    states = Counter(plan[n].state for n in below)
    ordered = [n.name for n in plan.dag if n.name in below]
    con.print(Text(f"downstream: {len(below):,} step(s) contain this digest, so any change above re-addresses "
                   f"them all ({', '.join(f'{s} {c:,}' for s, c in states.most_common())}):"))
    con.print("  " + _names(ordered))


def _label(node: Node) -> Text:
    return Text(node.name, style="bold") + Text(f"  {node.digest[:10]}  ") + Text(node.step.type.key, style="dim")


def digest_tree(root: Node) -> Tree:
    """The compact digest tree of `root` (iterative: a 10,000-step chain is cut at MAX_DEPTH).

    Nodes are expanded in the order they are printed, so the first occurrence of a shared input
    carries its subtree and later ones say "(shown above)"."""
    tree = Tree(_label(root))
    expanded: set[str] = set()
    stack: list[tuple[Tree, Node, int]] = [(tree, root, 0)]
    while stack:
        branch, node, depth = stack.pop()
        if node.name in expanded:
            branch.label = _label(node) + Text("  (shown above)", style="dim")
            continue
        expanded.add(node.name)
        deps = node.deps
        if not deps:
            continue
        if depth >= MAX_DEPTH:
            branch.add(Text(f"... {len(deps):,} input(s) further up", style="dim"))
            continue
        listed = deps if len(deps) <= MAX_CHILDREN else deps[:SHOWN_WHEN_CUT]
        children = [(branch.add(_label(dep)), dep, depth + 1) for dep in listed]
        if len(listed) < len(deps):
            rest = [dep.name for dep in deps[len(listed):]]
            branch.add(Text(f"... and {len(rest):,} more: {_names(rest)}", style="dim"))
        stack.extend(reversed(children))
    return tree


def changes(plan: Plan, node: Node) -> list[Text]:
    """What differs from the newest earlier output of the same name, leaves first."""
    prev = plan.store.newest_sibling_record(node.name, exclude=node.dirname)
    if prev is None:
        return [Text(f"no earlier output of {node.name} under {plan.store.prefix}: nothing to compare with")]
    made = time.strftime("%Y-%m-%d %H:%M", time.localtime(prev.updated))
    lines = [Text("changes", style="bold") +
             Text(f" since the newest earlier output, {prev.output_path} (digest {prev.digest[:10]}, made {made}):")]
    found = _explain_node(plan, node, prev, indent="  ", seen=set())
    if not found:
        found = [Text(f"  same config and inputs: the digest changed through the identity scheme "
                      f"({prev.scheme} -> {SCHEME}) or a field's default")]
    return lines + found


def _explain_node(plan: Plan, node: Node, prev: Record, indent: str, seen: set[str]) -> list[Text]:
    seen.add(node.name)
    out: list[Text] = []
    if prev.step_type != node.step.type.name or prev.version != node.step.type.version:
        out.append(Text(f"{indent}{node.name}: step type {prev.step_type}@{prev.version} -> {node.step.type.key}",
                        style="yellow"))
    for leaf in diff(prev.config, plain(node.step.config), limit=MAX_LEAVES):
        out.append(Text(f"{indent}{node.name}: ", style="bold") + Text(leaf, style="yellow"))
    before = {i.name: i.digest for i in prev.inputs}
    traced = 0
    for dep in node.deps:
        old = before.get(dep.name)
        if old is None:
            out.append(Text(f"{indent}{node.name}: new input {dep.name}"))
        elif old != dep.digest:
            out.append(Text(f"{indent}{node.name}: input {dep.name} re-addressed {old[:10]} -> {dep.digest[:10]}"))
            if dep.name in seen:
                continue
            traced += 1
            if traced > MAX_CAUSES:
                continue
            old_record = plan.store.read_record(f"{dep.name}-{old[:10]}")
            if old_record is None:
                out.append(Text(f"{indent}  (its old output {dep.name}-{old[:10]} has no record to compare with)",
                                style="dim"))
            else:
                out.extend(_explain_node(plan, dep, old_record, indent + "  ", seen))
    if traced > MAX_CAUSES:
        out.append(Text(f"{indent}... {traced - MAX_CAUSES:,} more re-addressed inputs not traced", style="dim"))
    now = {dep.name for dep in node.deps}
    for gone in before:
        if gone not in now:
            out.append(Text(f"{indent}{node.name}: no longer reads {gone}"))
    return out


def _names(names: list[str], limit: int = 8) -> str:
    """A short list of names: the first few, then counts by name prefix."""
    if len(names) <= limit:
        return ", ".join(names)
    prefixes = Counter((n.rsplit("/", 1)[0] + "/*") if "/" in n else n for n in names)
    return ", ".join(f"{p} x {c:,}" if c > 1 else p for p, c in prefixes.most_common(limit)) + \
        (f", ... ({len(prefixes) - limit:,} more names)" if len(prefixes) > limit else "")

"""Lineage in the terminal: `--lineage STEP` (everything it was built from, down to the raw
sources, with licences and token counts), `--consumers STEP` (everything built from it, down to
checkpoints and evals, with each one's state), and the licences block of `--dry-run`.

A DAG is drawn as a tree: a step reached a second time is printed once more as `name (above)`
without its subtree, so the output grows with the number of edges, not of paths. Counts come from
the records under the prefix (one batch read); a step not made yet shows none.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any, Callable, TextIO

from executor.dag import Node
from executor.plan import Plan
from executor.state import StepState


MAX_LISTED = 6  # source names listed per licence in the dry-run block


def records(plan: Plan, names: list[str]) -> dict[str, dict[str, Any]]:
    """The records (as JSON) of the named steps that have an output folder, in one batch."""
    wanted = [plan[n] for n in names if plan[n].status is not None]
    if not wanted:
        return {}
    store = plan.store
    where = store.record_paths({d.node.dirname: d.status for d in wanted})  # the committed attempt's
    paths = {where[d.node.dirname]: d.name for d in wanted if d.node.dirname in where}
    if not paths:
        return {}
    raw = store.fs.cat(list(paths), on_error="return")
    out: dict[str, dict[str, Any]] = {}
    for path, name in paths.items():
        data = raw.get(path) if isinstance(raw, dict) else None
        if isinstance(data, bytes):
            try:
                out[name] = json.loads(data)
            except ValueError:
                continue
    return out


def step_span(start: int, end: int) -> str:
    """Optimizer steps [start, end) as the CLI prints them: inclusive, `320-399` (the last step
    named), the convention of --lineage and --which-saw alike."""
    return f"{start}-{end - 1}" if end - start > 1 else (str(start) if end > start else "none")


def _count(n: int) -> str:
    return f"{n:,}"


def amounts(rec: dict[str, Any] | None) -> str:
    """What a step's record says it holds or consumed: tokens per source and licence for the
    mixture and training, tokens or documents for the data steps."""
    if not rec:
        return ""
    tokens = (rec.get("provenance") or {}).get("tokens")
    results = rec.get("results") or {}
    if results.get("verdict") in ("HIT", "MISS") and isinstance(results.get("line"), str):
        return results["line"]  # a ladder's check (docs/ladder.md): the target against its sealed prediction
    law = results.get("law")
    against = f"; {law['text']}" if isinstance(law, dict) and isinstance(law.get("text"), str) else ""
    if isinstance(tokens, dict) and tokens.get("total"):
        per = "; ".join(f"{src} {_count(v['tokens'])} ({v.get('license', '?')})"
                        for src, v in (tokens.get("by_source") or {}).items())
        steps = tokens.get("steps")
        # the record keeps [first, end); printed inclusive, as --which-saw prints ranges: "320-399"
        where = f" in steps {step_span(steps[0], steps[1])}" if steps else ""
        return f"consumed {_count(tokens['total']['tokens'])} tokens{where}" + (f": {per}" if per else "") + against
    if isinstance(results.get("tokens"), int):
        return f"{_count(results['tokens'])} tokens, {_count(results.get('documents') or 0)} documents"
    if isinstance(results.get("documents_kept"), int):
        return f"{_count(results['documents_kept'])} of {_count(results.get('documents_in') or 0)} documents kept"
    if isinstance(results.get("documents"), int):
        return f"{_count(results['documents'])} documents"
    return ""


def _tree(root: Node, edges: Callable[[Node], list[Node]], line: Callable[[Node], str], out: TextIO) -> None:
    seen: set[str] = set()
    stack: list[tuple[Node, str, str]] = [(root, "", "")]  # node, prefix of its line, prefix of its children
    while stack:
        node, lead, child_lead = stack.pop()
        again = node.name in seen
        out.write(f"{lead}{node.name}  {line(node) if not again else '(above)'}".rstrip() + "\n")
        if again:
            continue
        seen.add(node.name)
        kids = edges(node)
        for k, kid in reversed(list(enumerate(kids))):
            last = k == len(kids) - 1
            stack.append((kid, child_lead + ("└── " if last else "├── "), child_lead + ("    " if last else "│   ")))


def print_lineage(plan: Plan, name: str, out: TextIO) -> None:
    """Everything `name` was built from, down to its raw sources: state, licences, amounts."""
    dag = plan.dag
    lineage = plan.lineage
    upstream = sorted(dag.upstream([name]))
    recs = records(plan, upstream)
    sources = lineage.sources_of(name) if lineage is not None else {}
    out.write(f"lineage of {name}: {len(upstream) - 1:,} upstream steps, {len(sources):,} sources "
              f"({', '.join(sorted({lic.id for lic in sources.values()})) or 'no licence declared upstream'})\n")

    def line(node: Node) -> str:
        d = plan[node.name]
        parts = [str(d.state)]
        if lineage is not None and node.name in lineage.declared:
            parts.append(f"SOURCE under {lineage.declared[node.name].describe()}")
        elif lineage is not None:
            ids = lineage.licenses_of(node.name)
            if ids:
                parts.append("licences " + ", ".join(ids))
        shown = amounts(recs.get(node.name))
        if shown:
            parts.append(shown)
        return "  ".join(parts)

    _tree(dag[name], lambda n: n.deps, line, out)


def print_consumers(plan: Plan, name: str, out: TextIO) -> None:
    """Everything built from `name` (its consumers, transitively), each with its state."""
    dag = plan.dag
    downstream = dag.downstream([name])
    states: dict[str, int] = defaultdict(int)
    for n in downstream - {name}:
        states[str(plan[n].state)] += 1
    summary = ", ".join(f"{s} {c:,}" for s, c in sorted(states.items())) or "none"
    out.write(f"consumers of {name}: {len(downstream) - 1:,} steps built from it ({summary})\n")

    def line(node: Node) -> str:
        d = plan[node.name]
        telling = d.state in (StepState.STALE, StepState.RETRY, StepState.WAITING, StepState.BLOCKED) \
            or d.code_drift or d.env_drift
        return f"{d.state}  {d.reason}" if telling and d.reason else str(d.state)

    _tree(dag[name], lambda n: n.consumers, line, out)


def print_licences(plan: Plan, out: TextIO) -> None:
    """The dry-run's provenance block: each licence with its sources, the policies and whether
    they hold, and the commits the finished outputs were made from."""
    lineage = plan.lineage
    if lineage is None:
        return
    by_license: dict[str, list[str]] = defaultdict(list)
    urls: dict[str, str] = {}
    for source, lic in lineage.declared.items():
        by_license[lic.id].append(source)
        urls.setdefault(lic.id, lic.url)
    if by_license:
        out.write(f"\nlicences: {len(lineage.declared):,} sources under {len(by_license):,} licences\n")
        width = max(len(k) for k in by_license)
        for lic, sources in by_license.items():
            listed = ", ".join(sources[:MAX_LISTED]) + (f" and {len(sources) - MAX_LISTED:,} more"
                                                        if len(sources) > MAX_LISTED else "")
            note = " (none declared)" if lic == "NOASSERTION" else (f" <{urls[lic]}>" if urls[lic] else "")
            out.write(f"  {lic:<{width}}  {listed}{note}\n")
    policies = list(lineage.policies())
    if policies:
        grouped: dict[str, list[str]] = defaultdict(list)
        for step, policy in policies:
            grouped[policy.describe()].append(step)
        for what, steps in grouped.items():
            reaching = sorted({i for s in steps for i in lineage.licenses_of(s)})
            listed = ", ".join(steps[:MAX_LISTED]) + (f" and {len(steps) - MAX_LISTED:,} more"
                                                      if len(steps) > MAX_LISTED else "")
            out.write(f"policy {what}: {listed}: holds ({', '.join(reaching) or 'no licensed data'} reach it)\n")
    commits = plan.commits()
    if commits:
        from executor import environment

        now = environment.commit_text(environment.current())
        other = Counter({c: n for c, n in commits.items() if c != now})
        if other:
            listed = ", ".join(f"{c} ({n:,})" for c, n in other.most_common(4))
            out.write(f"outputs made from other code than this checkout ({now or 'no git commit'}): {listed}\n")

"""Plans and run summaries as text for the terminal.

Compact by design: the counts by state first, then one line per step (state, path, reason). At
scale, steps that share a state and a name prefix collapse into one line (`tokenized/* x 412`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TextIO

from executor.plan import STATES, Plan
from executor.runner import RunSummary

COLLAPSE_OVER = 40  # steps per state before grouping by name prefix


def counts_line(counter: dict[str, int]) -> str:
    order = [s for s in (*STATES, "SUCCESS", "FAILED", "PENDING") if counter.get(s)]
    return "  ".join(f"{s} {counter[s]}" for s in order) or "no steps"


def print_plan(plan: Plan, out: TextIO, unplaceable: dict[str, str] | None = None) -> None:
    """`--dry-run`: counts by state, then every step with its state, path and reason."""
    unplaceable = unplaceable or {}
    print(f"plan of {len(plan.decisions)} steps under {plan.store.prefix}: {counts_line(plan.counts())}", file=out)
    by_state: dict[str, list] = defaultdict(list)
    for d in plan.decisions:
        by_state[d.state].append(d)
    width = min(48, max((len(d.name) for d in plan.decisions), default=10))
    for state in STATES:
        group = by_state.get(state, [])
        if not group:
            continue
        if len(group) > COLLAPSE_OVER:
            prefixes: dict[str, int] = defaultdict(int)
            for d in group:
                prefixes[d.name.rsplit("/", 1)[0] + "/*" if "/" in d.name else d.name] += 1
            for prefix, n in sorted(prefixes.items()):
                print(f"  {state:<8} {prefix:<{width}} x {n}", file=out)
            continue
        for d in group:
            line = f"  {state:<8} {d.name:<{width}} {plan.store.url(d.node.dirname)}"
            if d.reason and d.reason != "cached":
                line += f"  ({d.reason})"
            if d.name in unplaceable:
                line += f"  CANNOT BE PLACED: {unplaceable[d.name]}"
            print(line, file=out)


def print_summary(summary: RunSummary, plan: Plan, out: TextIO) -> None:
    """The end of a run: what ran, how long, what failed and where its record is."""
    counter: dict[str, int] = defaultdict(int)
    for o in summary.outcomes.values():
        counter[o.state] += 1
    print(f"\nvoyage finished in {summary.seconds:.1f}s: {counts_line(counter)}", file=out)
    for o in summary.outcomes.values():
        if o.state in ("SUCCESS", "FAILED", "BLOCKED") or (o.state == "CACHED" and "cutoff" in o.reason):
            took = f"{o.seconds:.1f}s" if o.seconds is not None else ""
            detail = o.error or (o.reason if o.state != "SUCCESS" else "")
            print(f"  {o.state:<8} {o.name:<40} {took:>8}  {detail}", file=out)
            if o.state == "FAILED":
                print(f"           record: {plan.store.url(plan.dag[o.name].dirname)}/.step.json", file=out)
    if summary.stale_after:
        print("  now STALE (an input's output changed; --downstream reruns them): "
              + ", ".join(summary.stale_after), file=out)
    print(time.strftime("finished at %Y-%m-%d %H:%M:%S"), file=out)

"""Plans and run summaries in the terminal (rich).

The counts by state first, then one table per state (most urgent first): each step with its
resources, output path and reason. A state with more than `COLLAPSE_OVER` steps is shown by name
prefix instead (`tokenized/*  x 412`, with the resources, the path pattern and the commonest
reason), so a 1,000-step plan fits on a screen. Piped or captured output is plain text with one
line per step, wide enough never to wrap, so it can be grepped.

rich draws only for a terminal: a piped plan is laid out here (the same columns, byte for byte),
which spares a dry-run rich's import and its table measurement (about a tenth of the whole
process at 3,000 steps). A plan whose text rich would lay out differently (a line break, a tab,
a wide character, a line over the width) still goes through rich.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, TextIO

from executor.plan import STATES, Decision, Plan
from executor.state import StepState
from executor.views.viz.style import DESCRIPTIONS, RICH

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from executor.runner import Outcome, RunSummary

PIPE_WIDTH = 1_000  # a non-terminal's line width: wide enough that a plan's lines never wrap
COLLAPSE_OVER = 40  # steps of one state before they are grouped by name prefix
MAX_ROWS = 40  # rows per state once grouped (the grouping coarsens to get there)
ORDER = (*STATES, StepState.SUCCESS, StepState.FAILED, StepState.PENDING)
S = StepState


def console_for(out: TextIO) -> Console:
    """A rich console on `out`: coloured and wrapped to a terminal, plain and unwrapped otherwise."""
    from rich.console import Console

    tty = _is_tty(out)
    return Console(file=out, width=None if tty else PIPE_WIDTH, color_system="auto" if tty else None,
                   highlight=False, emoji=False, soft_wrap=not tty)


def _is_tty(out: TextIO) -> bool:
    return hasattr(out, "isatty") and out.isatty()


def emit(con: Console, *renderables: object) -> None:
    """Print; on a non-terminal without the padding rich leaves at the ends of table lines."""
    if con.is_terminal:
        con.print(*renderables)
        return
    with con.capture() as cap:
        con.print(*renderables)
    con.file.write("".join(line.rstrip() + "\n" for line in cap.get().splitlines()))


def counts_line(counter: dict[str, int]) -> str:
    order = [s for s in ORDER if counter.get(s)] + sorted(s for s in counter if s not in ORDER and counter[s])
    return "  ".join(f"{s} {counter[s]:,}" for s in order) or "no steps"


def _counts_text(counter: dict[str, int]) -> Text:
    from rich.text import Text

    text = Text()
    for k, state in enumerate(s for s in ORDER if counter.get(s)):
        if k:
            text.append("  ")
        text.append(f"{state} {counter[state]:,}", style=RICH.get(state, ""))
    return text or Text("no steps")


# -- grouping rows by name prefix ------------------------------------------------------------------

@dataclass
class Row:
    """One line of a state's table: a step, or `prefix/*` standing for several."""

    name: str
    members: list[Decision]

    @property
    def many(self) -> bool:
        return len(self.members) > 1


def rows_for(group: list[Decision]) -> list[Row]:
    """Each step its own row, or, past COLLAPSE_OVER, rows by name prefix (coarsened to MAX_ROWS)."""
    if len(group) <= COLLAPSE_OVER:
        return [Row(d.name, [d]) for d in group]
    depth = max(d.name.count("/") for d in group)
    rows: list[Row] = []
    for level in range(depth, -1, -1):
        buckets: dict[str, list[Decision]] = defaultdict(list)
        for d in group:
            parts = d.name.split("/")
            key = "/".join(parts[:min(level, len(parts) - 1)])
            buckets[key + "/*" if key else d.name].append(d)
        rows = [Row(key if len(ds) > 1 else ds[0].name, ds) for key, ds in buckets.items()]
        if len(rows) <= MAX_ROWS:
            break
    return rows  # in plan order (dependencies first), by first member


def _commonest(values: Iterable[str], what: str) -> str:
    counts = Counter(values)
    top, n = counts.most_common(1)[0]
    others = len(counts) - 1
    return top + (f"  (+{others:,} other {what})" if others else "")


# -- plan --------------------------------------------------------------------------------------------

@dataclass
class Cells:
    """One row of a state's table, as text: what rich draws for a terminal and `_plain` for a pipe."""

    step: str
    count: str
    resources: str
    path: str
    reason: str
    flag: str = ""  # CANNOT BE PLACED, in bold red after the reason
    drifted: bool = False  # the reason in yellow (code drift)


def print_plan(plan: Plan, out: TextIO, unplaceable: dict[str, str] | None = None) -> None:
    """`--dry-run`: counts by state, then each state's steps with resources, path and reason."""
    unplaceable = unplaceable or {}
    by_state: dict[str, list[Decision]] = defaultdict(list)
    for d in plan.decisions:
        by_state[d.state].append(d)

    def tables(relative: bool) -> list[tuple[str, int, list[Cells]]]:
        return [(state, len(by_state[state]), _plan_rows(plan, state, by_state[state], unplaceable, relative))
                for state in STATES if by_state.get(state)]

    piped = not _is_tty(out) and not _TERMINAL_ENV & os.environ.keys()
    if piped:  # what rich calls no terminal: paths whole, laid out here when it can be
        rows = tables(relative=False)
        text = _plain_plan(plan, rows, unplaceable)
        if text is not None:
            out.write(text)
            return
        _rich_plan(console_for(out), plan, rows, unplaceable, relative=False)
        return
    con = console_for(out)
    # A terminal gets paths relative to the prefix, so that they fit; a pipe gets whole URLs.
    _rich_plan(con, plan, tables(relative=con.is_terminal), unplaceable, con.is_terminal)


# Variables with which rich takes any output for a terminal (or not): rich decides where they are set.
_TERMINAL_ENV = frozenset({"FORCE_COLOR", "TTY_COMPATIBLE"})


def _rich_plan(con: Console, plan: Plan, tables: list[tuple[str, int, list[Cells]]], unplaceable: dict[str, str],
               relative: bool) -> None:
    from rich.text import Text

    head = Text(f"plan of {len(plan.decisions):,} steps under {plan.store.prefix}: ")
    con.print(head + _counts_text(plan.counts()))
    for state, n, rows in tables:
        con.print()
        title = Text(f"{state} {n:,}", style=RICH.get(state, "") + " bold")
        con.print(title + Text(f"  {DESCRIPTIONS.get(state, '')}", style="dim"))
        emit(con, _plan_table(rows, relative))
    if unplaceable:
        con.print()
        con.print(Text(f"{len(unplaceable):,} step(s) cannot be placed on this cluster", style="bold red"))
    for line in _output_warnings(plan):
        con.print(Text(line, style="bold yellow"), overflow="fold")


def _plain_plan(plan: Plan, tables: list[tuple[str, int, list[Cells]]], unplaceable: dict[str, str]) -> str | None:
    """The plan as rich lays it out on a non-terminal (`console_for`, `emit`), without rich; None
    where rich would lay it out otherwise (see the module's docstring)."""
    lines = [f"plan of {len(plan.decisions):,} steps under {plan.store.prefix}: {counts_line(plan.counts())}"]
    for state, n, rows in tables:
        lines += ["", f"{state} {n:,}  {DESCRIPTIONS.get(state, '')}"]
        cols = [[r.step for r in rows], [r.count for r in rows], [r.resources for r in rows],
                [r.path for r in rows], [r.reason + r.flag for r in rows]]
        widths = [max(map(len, col)) for col in cols]
        if sum(widths) + 2 * (len(cols) - 1) > PIPE_WIDTH:
            return None
        for step, count, resources, path, reason in zip(*cols):
            lines.append(f"{step:<{widths[0]}}  {count:>{widths[1]}}  {resources:<{widths[2]}}  "
                         f"{path:<{widths[3]}}  {reason}".rstrip())
    if unplaceable:
        lines += ["", f"{len(unplaceable):,} step(s) cannot be placed on this cluster"]
    lines += _output_warnings(plan)
    # Plain ASCII without control characters (a line break or a tab inside a cell included)
    # measures one column a character, as in rich.
    if not all(line.isascii() and line.isprintable() for line in lines):
        return None
    return "\n".join(lines) + "\n"


def _output_warnings(plan: Plan) -> list[str]:
    """One line a CACHED step whose type's output check found a problem (executor.plan)."""
    bad = [d for d in plan.decisions if d.output_problem]
    return (["", f"WARNING {len(bad):,} cached output(s) fail their step type's check (a run that loads "
                 f"them refuses them; --rerun makes them again):"]
            + [f"WARNING {d.name}: {d.output_problem}" for d in bad]) if bad else []


def _plan_rows(plan: Plan, state: str, group: list[Decision], unplaceable: dict[str, str],
               relative: bool = False) -> list[Cells]:
    base = "" if relative else f"{plan.store.prefix}/"
    rows: list[Cells] = []
    for row in rows_for(group):
        ds = row.members
        if row.many:
            prefix = row.name[:-1]
            resources = _commonest((d.node.step.resources.describe() for d in ds), "resources")
            reason = _commonest((d.reason for d in ds), "reasons") if state != S.CACHED else ""
            bad = [d for d in ds if d.name in unplaceable]
            flag = f"  {len(bad):,} CANNOT BE PLACED: {unplaceable[bad[0].name]}" if bad else ""
            rows.append(Cells(row.name, f"x {len(ds):,}", resources, f"{base}{prefix}*", reason, flag))
            continue
        d = ds[0]
        flag = f"  CANNOT BE PLACED: {unplaceable[d.name]}" if d.name in unplaceable else ""
        path = d.node.dirname if relative else plan.store.url(d.node.dirname)
        rows.append(Cells(d.name, "", d.node.step.resources.describe(), path,
                          d.reason if d.reason != "cached" else "", flag, d.code_drift))
    return rows


def _plan_table(rows: list[Cells], relative: bool = False) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(show_header=False, box=None, pad_edge=False, padding=(0, 2, 0, 0))
    table.add_column("step", style="bold", no_wrap=True)
    table.add_column("count", justify="right", style="dim", no_wrap=True)
    table.add_column("resources", style="cyan")
    table.add_column("path", style="dim", no_wrap=relative, overflow="fold")
    table.add_column("reason", overflow="fold", ratio=1 if relative else None)
    for r in rows:
        reason_text = Text(r.reason)
        if r.drifted:
            reason_text.stylize("yellow")
        if r.flag:
            reason_text.append(r.flag, style="bold red")
        table.add_row(r.step, r.count, r.resources, r.path, reason_text)
    return table


# -- summary -------------------------------------------------------------------------------------------

def print_summary(summary: RunSummary, plan: Plan, out: TextIO, page: str | None = None) -> None:
    """The end of a run: counts, what ran and how long, what failed and where its record is."""
    from rich.table import Table
    from rich.text import Text

    con = console_for(out)
    counter = Counter(o.state for o in summary.outcomes.values())
    con.print()
    con.print(Text(f"voyage finished in {summary.seconds:.1f}s: ") + _counts_text(counter))
    shown = [o for o in summary.outcomes.values()
             if o.state in (S.SUCCESS, S.FAILED, S.BLOCKED) or (o.state == S.CACHED and "cutoff" in o.reason)]
    by_state: dict[str, list[Outcome]] = defaultdict(list)
    for o in shown:
        by_state[o.state].append(o)
    table = Table(show_header=False, box=None, pad_edge=False, padding=(0, 2, 0, 0))
    table.add_column("state", no_wrap=True)
    table.add_column("step", style="bold", no_wrap=True)
    table.add_column("time", justify="right")
    table.add_column("detail", overflow="fold")
    for state in (S.FAILED, S.BLOCKED, S.SUCCESS, S.CACHED):
        outcomes = by_state.get(state, [])
        if not outcomes:
            continue
        decisions = {o.name: plan[o.name] for o in outcomes}
        for row in rows_for([decisions[o.name] for o in outcomes]):
            os_ = [summary.outcomes[d.name] for d in row.members]
            took = sum(o.seconds or 0.0 for o in os_)
            style = RICH.get(state, "")
            if row.many:
                detail = _commonest((o.error or o.reason or "" for o in os_), "messages")
                table.add_row(Text(state, style=style), f"{row.name} x {len(os_):,}", f"{took:.1f}s", detail)
                continue
            o = os_[0]
            detail = o.error or (o.reason if o.state != S.SUCCESS else "")
            if o.state == S.FAILED:
                detail = (f"({o.failure}) " if o.failure else "") + detail
                detail = f"{detail}\nrecord: {_record_url(plan, o.name)}"
            table.add_row(Text(state, style=style), o.name, f"{o.seconds:.1f}s" if o.seconds is not None else "",
                          detail)
    if table.row_count:
        emit(con, table)
    if summary.stale_after:
        con.print(Text("now STALE (an input's output changed; --downstream reruns them): "
                       + ", ".join(summary.stale_after), style=RICH[S.STALE]))
    if page:
        con.print(f"voyage page: {page}")
    con.print(time.strftime("finished at %Y-%m-%d %H:%M:%S"))


def _record_url(plan: Plan, name: str) -> str:
    """Where the record of a step's newest attempt is (the folder of that attempt)."""
    dirname = plan.dag[name].dirname
    try:
        status = plan.store.read_status(dirname)
    except Exception:  # noqa: BLE001 - a pointer in a report; the folder is a good enough answer
        status = None
    return plan.store.url(f"{status.data_dir(dirname) if status is not None else dirname}/.step.json")

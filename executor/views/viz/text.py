"""A drawing as Graphviz DOT, as SVG (through graphviz's `dot`), and as Mermaid.

Boxes become nodes: a step shows its name, type@version, digest and state (with the reason when
it is not plain "cached"); a group shows its size and counts by state. A STALE step is drawn
dashed and names each changed input with its recorded and current output digests; the link from
that input is dashed as well. A legend lists the states present.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter

from executor.errors import VoyageError
from executor.state import StepState
from executor.views.viz.graph import Box, Drawing
from executor.views.viz.style import COLORS, DESCRIPTIONS, STATE_ORDER

REASON_CHARS = 90
DOT_TIMEOUT = 300.0


def box_lines(drawing: Drawing, box: Box) -> list[str]:
    """The text of a node, one entry per line."""
    if box.is_group:
        counts = Counter(drawing.steps[m]["state"] for m in box.members)
        return [f"{box.label}  ({len(box.members):,} steps)", _counts(counts)]
    s = drawing.steps[box.members[0]]
    lines = [s["name"], f"{s['type']} · {s['digest'][:10]}"]
    reason = s.get("reason") or ""
    if s.get("stale"):  # the reason would repeat the digests the lines below give in full
        reason = "an input's output changed since it was made"
    lines.append(s["state"] + (f": {_clip(reason)}" if reason and reason != "cached" else ""))
    for st in s.get("stale", ()):
        lines.append(f"input {st['input']}: {st['recorded'][:10]} → {st['current'][:10]}")
    if s.get("source"):
        lines.append(f"licence: {s['source']['id']}")
    if s.get("policy"):
        lines.append(f"policy: {s['policy']}")
    return lines


def box_state(drawing: Drawing, box: Box) -> str:
    """The state a box is coloured by: the step's, or the most urgent one of a group."""
    states = {drawing.steps[m]["state"] for m in box.members}
    return min(states, key=lambda s: STATE_ORDER.index(s) if s in STATE_ORDER else len(STATE_ORDER))


def box_is_stale(drawing: Drawing, box: Box) -> bool:
    return any(drawing.steps[m]["state"] == StepState.STALE for m in box.members)


# -- DOT ----------------------------------------------------------------------------------------

def to_dot(drawing: Drawing) -> str:
    """Graphviz DOT text of the drawing (left to right, coloured by state, with a legend)."""
    out = [f"digraph {_dot_str(drawing.title)} {{",
           '  graph [rankdir=LR, fontname="Helvetica", fontsize=11, nodesep=0.15, ranksep=0.6, '
           f'label={_dot_str(f"{drawing.title}: {len(drawing.steps):,} steps under {drawing.prefix}")}, '
           'labelloc=t];',
           '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, margin="0.12,0.05"];',
           '  edge [color="#94a3b8", arrowsize=0.6, fontname="Helvetica", fontsize=9];']
    for b, box in enumerate(drawing.boxes):
        state = box_state(drawing, box)
        fill, line = COLORS.get(state, ("#ffffff", "#000000"))
        style = "rounded,filled" + (",dashed" if box_is_stale(drawing, box) else "")
        attrs = [f"label={_dot_str(chr(10).join(box_lines(drawing, box)))}", f'fillcolor="{fill}"',
                 f'color="{line}"', f'style="{style}"']
        if box.is_group:
            attrs.append("peripheries=2")
        if box_is_stale(drawing, box):
            attrs.append("penwidth=2")
        tip = drawing.steps[box.members[0]]["path"] if not box.is_group else f"{len(box.members)} steps"
        attrs.append(f"tooltip={_dot_str(tip)}")
        out.append(f"  b{b} [{', '.join(attrs)}];")
    for a, b, n, stale in drawing.links:
        attrs = []
        if n > 1:
            attrs.append(f'label="{n:,}"')
            attrs.append(f"penwidth={min(4.0, 1 + n.bit_length() / 4):.2f}")
        if stale:
            attrs += ['style=dashed', f'color="{COLORS[StepState.STALE][1]}"', 'fontcolor="#b45309"',
                      f'xlabel="{"output changed" if n == 1 else f"{stale:,} changed"}"']
        out.append(f"  b{a} -> b{b}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
    out += _dot_legend(drawing)
    out.append("}")
    return "\n".join(out) + "\n"


def _dot_legend(drawing: Drawing) -> list[str]:
    counts = drawing.counts()
    present = [s for s in STATE_ORDER if counts.get(s)]
    if not present:
        return []
    out = ['  subgraph cluster_legend {', '    label="states"; fontsize=10; color="#cbd5e1"; style=rounded;']
    for s in present:
        fill, line = COLORS[s]
        label = f"{s} {counts[s]:,}: {DESCRIPTIONS[s]}"
        style = "rounded,filled" + (",dashed" if s == StepState.STALE else "")
        out.append(f'    legend_{s} [label={_dot_str(label)}, fillcolor="{fill}", color="{line}", '
                   f'style="{style}", fontsize=9];')
    out.append("    " + " -> ".join(f"legend_{s}" for s in present) + " [style=invis];" if len(present) > 1 else "")
    out.append("  }")
    return [line for line in out if line]


def _dot_str(text: str) -> str:
    """A DOT double-quoted string; newlines become centred line breaks."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# -- SVG ----------------------------------------------------------------------------------------

def dot_available() -> bool:
    return shutil.which("dot") is not None


def to_svg(drawing: Drawing) -> bytes:
    """SVG laid out by graphviz's `dot`; a VoyageError where `dot` is not installed."""
    exe = shutil.which("dot")
    if exe is None:
        raise VoyageError(NO_DOT)
    result = subprocess.run([exe, "-Tsvg"], input=to_dot(drawing).encode(), capture_output=True,
                            timeout=DOT_TIMEOUT)
    if result.returncode != 0:
        first = (result.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[0]
        raise VoyageError(f"graphviz dot failed: {first}")
    return result.stdout


NO_DOT = ("--viz .svg needs graphviz's `dot`, which is not installed (apt-get install graphviz); "
           "or draw to .html, .dot or .mmd")


# -- Mermaid ------------------------------------------------------------------------------------

def to_mermaid(drawing: Drawing) -> str:
    """A Mermaid flowchart of the drawing, with one class per state."""
    title = json.dumps(f"{drawing.title}: {len(drawing.steps):,} steps under {drawing.prefix}")  # YAML-safe
    out = ["---", f"title: {title}", "---", "flowchart LR"]
    for b, box in enumerate(drawing.boxes):
        label = "<br/>".join(_mmd_text(line) for line in box_lines(drawing, box))
        shape = ('[["', '"]]') if box.is_group else ('["', '"]')
        out.append(f"  b{b}{shape[0]}{label}{shape[1]}:::{box_state(drawing, box)}")
    stale_links = []
    for i, (a, b, n, stale) in enumerate(drawing.links):
        text = f"|{n:,}|" if n > 1 else ""
        out.append(f"  b{a} -.->{text} b{b}" if stale else f"  b{a} -->{text} b{b}")
        if stale:
            stale_links.append(i)
    if stale_links:
        out.append(f"  linkStyle {','.join(map(str, stale_links))} stroke:{COLORS['STALE'][1]},stroke-width:2px")
    counts = drawing.counts()
    present = [s for s in STATE_ORDER if counts.get(s)]
    if present:
        out.append('  subgraph legend["states"]')
        for s in present:
            out.append(f'    legend_{s}["{s} {counts[s]:,}: {_mmd_text(DESCRIPTIONS[s])}"]:::{s}')
        out.append("  end")
    for s in STATE_ORDER:
        fill, line = COLORS[s]
        dash = ",stroke-dasharray:5 3" if s == StepState.STALE else ""
        out.append(f"  classDef {s} fill:{fill},stroke:{line},color:#0f172a{dash}")
    return "\n".join(out) + "\n"


def _mmd_text(text: str) -> str:
    """Text safe inside a quoted Mermaid label (entity codes for what Mermaid would parse)."""
    return (text.replace("#", "#35;").replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")
            .replace("\n", " "))


def _counts(counts: Counter) -> str:
    return " · ".join(f"{s} {counts[s]:,}" for s in sorted(counts, key=_order))


def _order(state: str) -> int:
    return STATE_ORDER.index(state) if state in STATE_ORDER else len(STATE_ORDER)


def _clip(text: str) -> str:
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 3] + "..."

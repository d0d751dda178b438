"""The voyage page: one self-contained HTML file (styles, data, dagre and our script inline).

A Content-Security-Policy forbids every network access (a live page may only re-read the
`voyage.json` next to it). Data goes in `<script type="application/json">` blocks with `<`, `>`
and `&` escaped, and the script sets every text with `textContent`, so a config string such as
`</script><script>...` shows as text and never runs.

The page is built in two parts around the run block, so that the live page rewrites only the
small run JSON between two pre-rendered byte strings (see `executor.views.live`).
"""

from __future__ import annotations

import html
import json
from functools import lru_cache
from importlib import resources
from typing import Any

from executor.views.viz.style import COLORS, DESCRIPTIONS, STATE_ORDER

_CSP_PLAN = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"
_CSP_LIVE = _CSP_PLAN + "; connect-src 'self'"

_BODY = """<header>
<h1 id="title">{title}</h1><span id="summary"></span>
<div class="tools"><input id="search" type="search" placeholder="find a step (Enter: next)" autocomplete="off">
<span id="found"></span><button id="zoomout" title="zoom out">−</button><button id="zoomin" title="zoom in">+</button>
<button id="fit" title="fit the whole plan">fit</button></div>
</header>
<nav id="legend"></nav>
<section id="failed" hidden></section>
<main><div id="canvas"><div id="status"></div>
<svg id="dag" xmlns="http://www.w3.org/2000/svg"><defs>
<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" markerHeight="9"
 markerUnits="userSpaceOnUse" orient="auto-start-reverse">
<path class="arrow" d="M0,0L10,5L0,10z"/></marker>
<marker id="arrow-stale" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" markerHeight="9"
 markerUnits="userSpaceOnUse" orient="auto-start-reverse">
<path class="arrow stale" d="M0,0L10,5L0,10z"/></marker></defs>
<g id="viewport"><g id="links"></g><g id="focus"></g><g id="boxes"></g></g></svg></div>
<aside id="details" hidden></aside></main>
<section id="ladder" hidden></section>
<section id="curves" hidden></section>
"""


def script_json(value: Any) -> str:
    """JSON safe inside an HTML `<script>` element (no `</script>`, no `<!--`)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def page(data: dict[str, Any], title: str, run: dict[str, Any] | None = None) -> str:
    """The whole page for a drawing's JSON (`Drawing.to_json()`), with a run block if given."""
    head, tail = page_parts(data, title, live=run is not None)
    return head + (script_json(run) if run is not None else "") + tail


def page_parts(data: dict[str, Any], title: str, live: bool) -> tuple[str, str]:
    """The page split where the run JSON goes (for a live page; empty for a plan)."""
    data = dict(data, states=list(STATE_ORDER), descriptions=DESCRIPTIONS)
    head = ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_CSP_LIVE if live else _CSP_PLAN}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{_css()}</style></head>\n<body>\n"
            + _BODY.format(title=html.escape(title))
            + f"<script type=\"application/json\" id=\"voyage-data\">{script_json(data)}</script>\n")
    if live:
        head += "<script type=\"application/json\" id=\"voyage-run\">"
        tail = "</script>\n"
    else:
        tail = ""
    tail += f"<script>{_asset('vendor/dagre.min.js')}</script>\n<script>{_asset('page.js')}</script>\n</body></html>\n"
    return head, tail


@lru_cache(maxsize=None)
def _css() -> str:
    states = "\n".join(f".s-{s} {{ --c1: {fill}; --c2: {line}; }}" for s, (fill, line) in COLORS.items())
    only = "\n".join(f"#dag[data-only=\"{s}\"] .step:not(.s-{s}) {{ opacity: .12; }}" for s in COLORS)
    return _asset("page.css") + states + "\n" + only + "\n"


@lru_cache(maxsize=None)
def _asset(name: str) -> str:
    text = resources.files("executor.views.viz").joinpath(name).read_text(encoding="utf-8")
    lowered = text.lower()
    if "</script" in lowered or "<!--" in lowered:  # would end or confuse the inline <script>
        raise ValueError(f"executor/views/viz/{name} cannot be inlined in a <script> element")
    return text

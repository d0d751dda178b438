"""The logbook read (executor.logbook): `marin-run VOYAGE --log` lines, and the voyage's index page
`{prefix}/voyages/{voyage}/index.html`.

The page is static HTML with no script: the runs and notes newest first, each with its config
difference, its failures (class and stack excerpt), links to its run page, the records of the
steps it ran and their model cards and outputs, and one chart of the loss curves of every run.
Every link is relative to the page (the `voyages/` folder is a static site: a copied, served or
published prefix links its own files); no local path is ever written into it.
"""

from __future__ import annotations

import html
import json
from typing import Any, TextIO

CHART_W, CHART_H, PAD = 760, 280, 44
PAGE_ENTRIES = 100  # the newest entries the page shows (all of them: `marin-run VOYAGE --log`)
CHART_RUNS = 20  # the newest runs whose loss curves the chart draws
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
           "#bcbd22")


# -- lines -------------------------------------------------------------------------------------------------
def _value(v: Any) -> str:
    text = json.dumps(v, separators=(",", ":"), default=repr) if not isinstance(v, str) else v
    return text if len(text) <= 40 else text[:39] + "…"


def diff_text(entry: dict[str, Any], limit: int = 4) -> str:
    diff = entry.get("config_diff") or []
    parts = [f"{d['path']} {_value(d['before'])} -> {_value(d['after'])}" for d in diff[:limit]]
    if len(diff) > limit:
        parts.append(f"+{len(diff) - limit} more")
    return "; ".join(parts)


def commit_text(entry: dict[str, Any]) -> str:
    git = entry.get("git") or {}
    commit = git.get("commit")
    if not commit:
        return "no-commit"
    return commit[:12] + ("-dirty" if git.get("dirty") else "")


def failures(entry: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, row) for name, row in (entry.get("steps") or {}).items() if row.get("state") == "failed"]


def headlines(entry: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The steps whose results gave a `headline` (a sealed prediction, a verdict), in plan order."""
    return [(name, row) for name, row in (entry.get("steps") or {}).items() if isinstance(row.get("headline"), dict)]


def line(entry: dict[str, Any]) -> str:
    """One line: when, who, commit, kind, what happened, the config difference, the note."""
    parts = [entry.get("when", "?"), entry.get("who", "?"), commit_text(entry), entry.get("kind", "?")]
    counts = entry.get("counts") or {}
    if entry.get("kind") == "run":
        parts.append(", ".join(f"{k} {counts[k]}" for k in ("ran", "cached", "failed", "blocked", "skipped")
                               if counts.get(k))
                     or "no steps")
    flags = entry.get("flags") or {}
    shown = [f"--rerun {' '.join(flags['rerun'])}" if flags.get("rerun") else "",
             "--downstream" if flags.get("downstream") else "",
             f"--only {' '.join(flags['only'])}" if flags.get("only") else ""]
    if any(shown):
        parts.append(" ".join(s for s in shown if s))
    failed = failures(entry)
    if failed:
        parts.append("failed: " + ", ".join(f"{n} ({r.get('failure') or 'unknown'})" for n, r in failed))
    for name, row in headlines(entry):
        parts.append(f"{name}: {row['headline'].get('text') or _value(row['headline'])}")
    gc = entry.get("gc")
    if gc:
        parts.append(f"gc deleted {gc.get('bytes', 0):,} bytes in {gc.get('items', 0):,} items")
    diff = diff_text(entry)
    if diff:
        parts.append(f"config: {diff}")
    if entry.get("note"):
        parts.append(f"note: {entry['note']}")
    return "  ".join(" ".join(str(p).split()) for p in parts if p)


def print_log(found: list[dict[str, Any]], out: TextIO) -> None:
    for entry in found:
        out.write(line(entry) + "\n")


def to_json(found: list[dict[str, Any]]) -> str:
    return json.dumps([{k: v for k, v in e.items() if k != "_name"} | {"name": e.get("_name")} for e in found],
                      indent=1, sort_keys=True, default=repr)


# -- the index page -----------------------------------------------------------------------------------------
def _up(rel: str) -> str:
    """A prefix-relative path as a link from `voyages/{voyage}/index.html`."""
    return "../../" + "/".join(_quote(p) for p in rel.strip("/").split("/"))


def _quote(segment: str) -> str:
    from urllib.parse import quote

    return quote(segment, safe="-._~")


def _link(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


def chart(found: list[dict[str, Any]]) -> str:
    """One SVG of every run's loss curves (by tokens where the trainer logs them, else by step)."""
    curves = []
    with_curves = [e for e in found if any(r.get("loss") for r in (e.get("steps") or {}).values())][:CHART_RUNS]
    for entry in reversed(with_curves):  # oldest first: colours follow the order of the runs
        for name, row in (entry.get("steps") or {}).items():
            points = row.get("loss")
            if points:
                curves.append((f"{entry.get('when', '?')} {name}", points))
    if not curves:
        return '<p class="none">no training step has run in this voyage\'s logged runs yet</p>'
    xs = [p[0] for _, pts in curves for p in pts]
    ys = [p[1] for _, pts in curves for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

    def sx(x: float) -> float:
        return PAD + (x - x0) / (x1 - x0) * (CHART_W - 2 * PAD)

    def sy(y: float) -> float:
        return CHART_H - PAD + (y - y0) / (y1 - y0) * -(CHART_H - 2 * PAD)

    lines, legend = [], []
    for i, (label, pts) in enumerate(curves):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        lines.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}">'
                     f"<title>{html.escape(label)}</title></polyline>")
        legend.append(f'<li><span style="color:{colour}">&#9632;</span> {html.escape(label)}</li>')
    axes = (f'<line x1="{PAD}" y1="{CHART_H - PAD}" x2="{CHART_W - PAD}" y2="{CHART_H - PAD}" stroke="#888"/>'
            f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{CHART_H - PAD}" stroke="#888"/>'
            f'<text x="{PAD}" y="{CHART_H - 12}">{x0:,.0f}</text>'
            f'<text x="{CHART_W - PAD}" y="{CHART_H - 12}" text-anchor="end">{x1:,.0f}</text>'
            f'<text x="4" y="{PAD}">{y1:.2f}</text><text x="4" y="{CHART_H - PAD}">{y0:.2f}</text>'
            f'<text x="{CHART_W / 2}" y="{CHART_H - 12}" text-anchor="middle">tokens (or step)</text>')
    return (f'<svg id="loss-chart" width="{CHART_W}" height="{CHART_H}" viewBox="0 0 {CHART_W} {CHART_H}" '
            f'role="img" aria-label="loss curves of every run">{axes}{"".join(lines)}</svg>'
            f'<ul class="legend">{"".join(legend)}</ul>')


def _entry_html(entry: dict[str, Any]) -> str:
    kind = entry.get("kind", "?")
    head = (f'<h2>{html.escape(entry.get("when", "?"))} <span class="kind {html.escape(kind)}">{html.escape(kind)}'
            f'</span></h2><p class="meta">{html.escape(entry.get("who", "?"))} · commit '
            f'<code>{html.escape(commit_text(entry))}</code>')
    diff_digest = (entry.get("git") or {}).get("diff")
    if diff_digest:
        head += f" (diff <code>{html.escape(diff_digest)}</code>)"
    if entry.get("exit_code") is not None:
        head += f" · exit {int(entry['exit_code'])}"
    head += "</p>"
    parts = [head]
    if entry.get("note"):
        parts.append(f'<p class="note">{html.escape(entry["note"])}</p>')
    flags = entry.get("flags") or {}
    shown = [f"--{k} {' '.join(v) if isinstance(v, list) else ''}".strip() for k, v in flags.items()
             if v and k in ("rerun", "only", "downstream")]
    if shown:
        parts.append(f'<p class="flags">{html.escape(" ".join(shown))}</p>')
    diff = entry.get("config_diff")
    if diff:
        rows = "".join(f"<tr><td><code>{html.escape(d['path'])}</code></td><td>{html.escape(_value(d['before']))}</td>"
                       f"<td>{html.escape(_value(d['after']))}</td></tr>" for d in diff)
        parts.append(f'<table class="diff"><tr><th>config field</th><th>before</th><th>after</th></tr>{rows}</table>')
    elif "previous" in entry:
        parts.append('<p class="same">config unchanged since the entry before</p>')
    counts = entry.get("counts") or {}
    if counts:
        parts.append('<p class="counts">' + html.escape(", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
                     + "</p>")
    for name, row in failures(entry):
        links = _link(_up(row["record"]), "record") if row.get("record") else ""
        parts.append(f'<div class="failure"><p><b>{html.escape(name)}</b> failed: '
                     f'<span class="class">{html.escape(str(row.get("failure") or "unknown"))}</span> '
                     f'{html.escape(row.get("error", ""))} {links}</p>'
                     f'<pre>{html.escape(row.get("stack", ""))}</pre></div>')
    heads = headlines(entry)
    if heads:
        items = "".join(f'<li class="{html.escape(str(row["headline"].get("kind", "")))}"><b>{html.escape(name)}</b> '
                        f'{html.escape(str(row["headline"].get("text") or _value(row["headline"])))}</li>'
                        for name, row in heads)
        parts.append(f'<ul class="headlines">{items}</ul>')
    links = []
    if entry.get("page"):
        links.append(_link(entry["page"], "run page"))
    if entry.get("gc"):
        gc = entry["gc"]
        links.append(html.escape(f"gc deleted {gc.get('bytes', 0):,} bytes in {gc.get('items', 0):,} items"))
    parts.append(f'<p class="links">{" · ".join(links)}</p>' if links else "")
    ran = [(n, r) for n, r in (entry.get("steps") or {}).items() if r.get("state") == "ran"]
    if ran:
        items = []
        for name, row in ran:
            extra = []
            if row.get("record"):
                extra.append(_link(_up(row["record"]), "record"))
            if row.get("attempt_dir"):
                extra.append(_link(_up(row["attempt_dir"]) + "/", "output"))
            if row.get("card"):
                extra.append(_link(_up(row["card"]), "model card"))
            for label, url in (row.get("links") or {}).items():  # http(s) only (executor.logbook)
                if isinstance(url, str) and url.startswith(("https://", "http://")):
                    extra.append(_link(url, str(label)))
            items.append(f"<li>{html.escape(name)} {' '.join(extra)}</li>")
        parts.append(f'<details><summary>{len(ran)} step{"s" if len(ran) > 1 else ""} ran</summary>'
                     f'<ul>{"".join(items)}</ul></details>')
    return f'<section class="entry">{"".join(parts)}</section>'


STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:980px;color:#222}
h1{font-size:22px}h2{font-size:16px;margin:0}.entry{border-top:1px solid #ddd;padding:.8em 0}
.meta,.counts,.flags,.same{color:#555;margin:.2em 0}.note{background:#fff8d6;padding:.3em .6em;margin:.3em 0}
.kind{font-size:12px;padding:1px 6px;border-radius:3px;background:#eee}.kind.note{background:#fff0a8}
.failure .class{color:#b00;font-weight:600}pre{background:#f6f6f6;padding:.5em;overflow:auto;font-size:12px}
table.diff{border-collapse:collapse}table.diff td,table.diff th{border:1px solid #ddd;padding:2px 8px;text-align:left}
.headlines .verdict b,.headlines .prediction b{font-family:monospace}
.legend{list-style:none;padding:0;font-size:12px;columns:2}svg text{font-size:11px;fill:#555}"""


def index_html(voyage: str, found: list[dict[str, Any]], total: int | None = None) -> str:
    """The voyage's index page from its newest entries (newest first); `total`: entries in the log."""
    total = len(found) if total is None else total
    runs = sum(1 for e in found if e.get("kind") == "run")
    notes = sum(1 for e in found if e.get("note"))
    body = "".join(_entry_html(e) for e in found) or '<p class="none">no entries yet</p>'
    shown = (f"{total:,} entries, the newest {len(found):,} here ({runs:,} runs, {notes:,} notes; every one: "
             f"<code>marin-run {html.escape(voyage)}.py --log</code>)" if total > len(found)
             else f"{total:,} entries: {runs:,} runs, {notes:,} notes")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "img-src data:\"><link rel=\"icon\" href=\"data:,\">"
            f"<title>{html.escape(voyage)}: logbook</title><style>{STYLE}</style></head><body>"
            f"<h1>{html.escape(voyage)}: logbook</h1>"
            f"<p>{shown}. Newest first.</p>"
            f"<h2>loss, the newest {CHART_RUNS} runs that trained</h2>{chart(found)}{body}</body></html>\n")


def write_index(store: Any, voyage: str) -> str:
    """Rewrite `voyages/{voyage}/index.html` from every entry; returns its URL."""
    from executor.logbook import entries, voyage_folder
    from executor.storage.files import is_gcs, write_atomic

    from executor.logbook import entry_names

    names = entry_names(store, voyage)  # one listing; only the newest entries are read
    found = entries(store, voyage, names[-PAGE_ENTRIES:])
    page = index_html(voyage, found, total=len(names)).encode()
    path = store.path(voyage_folder(voyage), "index.html")
    gcs = {"content_type": "text/html; charset=utf-8",
           "fixed_key_metadata": {"cache_control": "no-cache, max-age=0"}}
    write_atomic(path, page, fs=store.fs, **(gcs if is_gcs(store.fs) else {}))
    return store.to_url(path)


def rewrite_index(store: Any, voyage: str) -> None:
    """write_index, a warning if it fails: the entries are in, the page is rebuilt at the next one."""
    import logging

    try:
        write_index(store, voyage)
    except Exception as e:
        logging.getLogger("marin.logbook").warning("logbook: the page of %s not written (%s: %s)", voyage,
                                                   type(e).__name__, e)

"""Drawings of a plan: `marin-run VOYAGE --viz FILE.{html,svg,dot,mmd}`.

    from executor.views.viz import write_viz
    write_viz(plan, "plan.html", title="hello")

The format follows the extension. `.html` is one self-contained page (no network) laid out in the
browser by dagre (vendored); `.svg` is laid out by graphviz's `dot`; `.dot` and `.mmd` (Mermaid)
are text. All share one model (`executor.views.viz.graph`), in which large fan-outs are drawn as groups.
"""

from __future__ import annotations

import posixpath

from executor.errors import VoyageError
from executor.plan import Plan

FORMATS = (".html", ".svg", ".dot", ".mmd")


def check_target(target: str) -> str:
    """The format of `target` by extension, or a VoyageError naming the known ones.

    Checked before anything is planned or written; `.svg` also needs graphviz's `dot`.
    """
    ext = posixpath.splitext(target)[1].lower()
    if ext not in FORMATS:
        known = ", ".join(FORMATS)
        raise VoyageError(f"--viz {target}: unknown format {ext or '(no extension)'!r}; use one of {known}")
    if ext == ".svg":
        from executor.views.viz.text import NO_DOT, dot_available

        if not dot_available():
            raise VoyageError(NO_DOT)
    return ext


def render(plan: Plan, ext: str, title: str = "") -> bytes:
    """The drawing of `plan` in format `ext` (one of FORMATS)."""
    from executor.views.viz import graph, text

    drawing = graph.draw(plan, title=title, records=ext == ".html")
    if ext == ".html":
        from executor.views.viz.html import page

        return page(drawing.to_json(), f"{drawing.title}: plan").encode()
    if ext == ".svg":
        return text.to_svg(drawing)
    if ext == ".dot":
        return text.to_dot(drawing).encode()
    if ext == ".mmd":
        return text.to_mermaid(drawing).encode()
    raise VoyageError(f"unknown drawing format {ext!r}")


def write_viz(plan: Plan, target: str, title: str = "") -> str:
    """Draw `plan` to `target` (a local path or any fsspec URL); returns the format written."""
    import fsspec

    ext = check_target(target)
    data = render(plan, ext, title)
    local = "://" not in target or target.startswith("file://")
    with fsspec.open(target, "wb", **({"auto_mkdir": True} if local else {})) as f:
        f.write(data)
    return ext

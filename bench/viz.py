"""Drawing synthetic plans: time to write each --viz format, the HTML's size, and the time until
headless Chromium has the drawing on screen.

    .venv/bin/python -m bench.viz                      # 100, 1,000 and 10,000 steps
    .venv/bin/python -m bench.viz --sizes 100 --no-browser

The plan is voyage-shaped: per shard `raw/{i} -> tokenized/{i} -> dedup/{i}` (the tokenizer feeds
every tokenize step), one mixture over every dedup, then pretrain, midtrain and a few evals. Its
states are mixed as a voyage in progress would have them: CACHED, RUN, STALE (with digests),
RETRY, SKIPPED. Planning itself is not timed here (bench/plan.py does that). "On screen" is the
time from navigation start until the page's two animation frames after drawing, read from
`document.documentElement.dataset.drawn`. The live page is timed on a local prefix: preparing it
(drawing model and pre-rendered page, once per run) and one rewrite (the median of five). Every
other figure is the best of `--repeat` runs (3), since the machine may be shared.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass

from bench import kit  # noqa: E402
from executor import Resources, Step, output_of, step_type  # noqa: E402
from executor.dag import build_dag  # noqa: E402
from executor.plan import CACHED, RETRY, RUN, SKIPPED, STALE, Decision, Plan, StaleInput  # noqa: E402
from executor.storage.store import Store  # noqa: E402

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@dataclass(frozen=True)
class Cfg:
    kind: str
    index: int = 0
    inputs: tuple = ()
    tokenizer: str = "llama3"
    seq_len: int = 4096


@step_type(version="1")
def work(config: Cfg, ctx) -> None:
    """Does nothing: only drawing is measured."""


def synthetic_steps(n: int) -> list[Step]:
    """About `n` steps shaped like a voyage: shards fanned out, then a mixture and training."""
    shards = max(1, (n - 7) // 3)
    tok = Step("tokenizer", work, Cfg("tokenizer"))
    dedups = []
    for i in range(shards):
        raw = Step(f"raw/{i}", work, Cfg("raw", i))
        tokd = Step(f"tokenized/{i}", work, Cfg("tokenize", i, (output_of(raw), output_of(tok))))
        dedups.append(Step(f"dedup/{i}", work, Cfg("dedup", i, (output_of(tokd),))))
    mix = Step("mixture", work, Cfg("mixture", inputs=tuple(output_of(d) for d in dedups)))
    pre = Step("pretrain", work, Cfg("pretrain", inputs=(output_of(mix),)), resources=Resources(gpus=8, workers=4))
    mid = Step("midtrain", work, Cfg("midtrain", inputs=(output_of(pre), output_of(mix))),
               resources=Resources(gpus=8, workers=4))
    evals = [Step(f"eval/{t}", work, Cfg("eval", inputs=(output_of(mid),))) for t in ("mmlu", "gsm8k", "humaneval")]
    return [*evals]


def synthetic_plan(n: int, prefix: str) -> Plan:
    """A plan of `synthetic_steps(n)` with mixed states set directly (nothing is read from disk)."""
    dag = build_dag(synthetic_steps(n))
    decisions = []
    for k, node in enumerate(dag):
        if node.name.startswith("raw/"):
            d = Decision(node, CACHED, "cached")
        elif node.name.startswith("tokenized/"):
            i = int(node.name.rsplit("/", 1)[1])
            if i % 10 == 3:
                was, now = _hex(f"was{i}"), _hex(f"now{i}")
                d = Decision(node, STALE, f"input raw/{i} output changed {was[:10]} -> {now[:10]}",
                             stale_inputs=(StaleInput(f"raw/{i}", was, now),))
            else:
                d = Decision(node, CACHED, "cached")
        elif node.name.startswith("dedup/"):
            i = int(node.name.rsplit("/", 1)[1])
            d = Decision(node, RETRY if i % 50 == 7 else RUN,
                         "failed before (attempt 1)" if i % 50 == 7 else "config.threshold: 0.8 -> 0.85", will_run=True)
        elif node.name == "tokenizer":
            d = Decision(node, CACHED, "cached")
        elif node.name.startswith("eval/humaneval"):
            d = Decision(node, SKIPPED, "not selected")
        else:
            d = Decision(node, RUN, "new step: no earlier output of this name", will_run=True)
        decisions.append(d)
    return Plan(dag, Store(prefix), decisions)


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    from executor.views.viz import FORMATS, render
    from executor.views.viz.text import dot_available

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="*", default=[100, 1000, 10000])
    p.add_argument("--no-browser", action="store_true", help="skip the Chromium timing")
    p.add_argument("--keep", default=None, help="keep the files in this folder")
    p.add_argument("--repeat", type=int, default=3, help="keep the best of this many timings (default 3)")
    args = p.parse_args(argv)

    out = args.keep or tempfile.mkdtemp(prefix="viz-bench-")
    os.makedirs(out, exist_ok=True)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    rows = []
    for n in args.sizes:
        plan = synthetic_plan(n, os.path.join(out, "prefix"))  # never written: drawing reads no status
        row = {"steps": len(plan.decisions)}
        for ext in FORMATS:
            if ext == ".svg" and not dot_available():
                row[ext] = None
                continue
            rendered = kit.timed(lambda: render(plan, ext, title=f"synthetic {n}"), repeats=args.repeat)
            data, row[ext] = rendered.value, rendered.wall_min
            path = os.path.join(out, f"plan-{n}{ext}")
            with open(path, "wb") as f:
                f.write(data)
            if ext == ".html":
                row["html_bytes"] = len(data)
                row["html_path"] = path
        row["live"] = _live_write(plan)
        row["on_screen"] = None if args.no_browser or not chromium else \
            min(_on_screen(chromium, row["html_path"]) for _ in range(args.repeat))
        rows.append(row)
        print(_line(row), flush=True)
    print()
    print("| steps | .html | .svg | .dot | .mmd | HTML size | on screen in Chromium | live page: prepare / one write |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| " + " | ".join([f"{r['steps']:,}", *(_secs(r[e]) for e in FORMATS),
                                 f"{r['html_bytes'] / 1e6:.2f} MB", _secs(r["on_screen"]),
                                 f"{_secs(r['live'][0])} / {_secs(r['live'][1])}"]) + " |")
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return 0


def _live_write(plan: Plan) -> tuple[float, float]:
    """The live page on the plan's (local) prefix: time to prepare it, then the median of 5 writes."""
    from executor.views.live import LivePage

    made = kit.timed(lambda: LivePage(plan, "bench", "0123456789"))
    page, prepare = made.value, made.wall_min
    writes = kit.timed(page.flush, repeats=5)
    assert page.failures == 0
    return prepare, writes.wall_median


def _on_screen(chromium: str, path: str) -> float:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto("file://" + os.path.abspath(path))
            page.wait_for_selector("html[data-drawn]", state="attached", timeout=300_000)
            return int(page.evaluate("document.documentElement.dataset.drawn")) / 1000
        finally:
            browser.close()


def _secs(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def _line(r: dict) -> str:
    from executor.views.viz import FORMATS

    parts = [f"{e} {_secs(r[e])}" for e in FORMATS]
    return (f"{r['steps']:>6} steps: " + ", ".join(parts) + f", html {r['html_bytes'] / 1e6:.2f} MB, "
            f"on screen {_secs(r['on_screen'])}, live page prepare {_secs(r['live'][0])} write {_secs(r['live'][1])}")


if __name__ == "__main__":
    raise SystemExit(main())

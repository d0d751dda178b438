"""`marin-run VOYAGE.py [flags] [voyage config overrides]`.

The executor's own flags are parsed first; everything else is the voyage's config dataclass,
parsed by draccus (`--help` lists both). Exit codes: 0 success, 1 a step failed, 2 a bad voyage,
config, flag or prefix (one line on stderr, nothing written). `--help` and `--dry-run` never
import Ray or torch.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from executor.errors import VoyageError

if TYPE_CHECKING:
    from executor.lease import Leases
    from executor.plan import Plan
    from executor.voyage import VoyageFile

PROG = "marin-run"


@dataclass
class Options:
    voyage: str
    dry_run: bool
    viz: str | None
    explain: str | None
    rerun: tuple[str, ...]
    downstream: bool
    only: tuple[str, ...]
    prefix: str
    ray_address: str | None
    max_concurrent: int
    lease_ttl: float
    live_page: bool
    verbose: bool
    overrides: list[str]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, add_help=False,
        description="Plan and run a voyage: a DAG of versioned, content-hashed steps on Ray.",
        epilog="Any other --flags set fields of the voyage's config (see below).")
    p.add_argument("voyage", help="the voyage file, e.g. voyages/hello.py")
    p.add_argument("-h", "--help", action="store_true", help="show this help (and the voyage's config fields)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (what would run and why); run nothing")
    p.add_argument("--viz", metavar="FILE",
                   help="draw the plan to FILE (.html, .svg, .dot or .mmd; any fsspec URL); run nothing")
    p.add_argument("--explain", metavar="NAME",
                   help="show step NAME's digest tree and what changed since its last output; run nothing")
    p.add_argument("--rerun", metavar="NAME", action="append", default=[],
                   help="run NAME again even if it is cached (repeatable)")
    p.add_argument("--downstream", action="store_true",
                   help="also run steps downstream of --rerun, and STALE steps, whose inputs changed")
    p.add_argument("--only", metavar="NAME", nargs="+", default=[],
                   help="run only these steps and whatever they need that is missing")
    p.add_argument("--prefix", default=os.environ.get("MARIN_PREFIX", "out"),
                   help="where outputs live: a local folder or gs://bucket/path (env MARIN_PREFIX; default ./out)")
    p.add_argument("--ray-address", default=None,
                   help="join this Ray cluster (env RAY_ADDRESS); default: an embedded local Ray")
    p.add_argument("--max-concurrent", type=int, default=16, help="steps running at once (default 16)")
    p.add_argument("--lease-ttl", type=float, default=float(os.environ.get("MARIN_LEASE_TTL", 60)),
                   help="seconds a lease lives without renewal (env MARIN_LEASE_TTL; default 60)")
    p.add_argument("--no-live-page", dest="live_page", action="store_false",
                   help="do not keep the voyage page {prefix}/voyages/{voyage}/{run}/index.html during the run")
    p.add_argument("-v", "--verbose", action="store_true", help="log more")
    return p


def parse(argv: Sequence[str]) -> tuple[Options, argparse.ArgumentParser, bool]:
    parser = _parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        raise SystemExit(0 if argv else 2)
    ns, rest = parser.parse_known_args(argv)
    opts = Options(voyage=ns.voyage, dry_run=ns.dry_run, viz=ns.viz, explain=ns.explain, rerun=tuple(ns.rerun),
                   downstream=ns.downstream, only=tuple(ns.only), prefix=ns.prefix, ray_address=ns.ray_address,
                   max_concurrent=ns.max_concurrent, lease_ttl=ns.lease_ttl, live_page=ns.live_page,
                   verbose=ns.verbose, overrides=rest)
    return opts, parser, ns.help


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        opts, parser, want_help = parse(argv)
    except SystemExit as e:
        return int(e.code or 0)
    _setup_logging(opts.verbose)
    try:
        return _main(opts, parser, want_help)
    except VoyageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _main(opts: Options, parser: argparse.ArgumentParser, want_help: bool) -> int:
    from executor import voyage as voyage_mod

    if opts.viz and not want_help:
        from executor.viz import check_target

        check_target(opts.viz)  # a bad extension, or .svg without graphviz: before anything is done
    vf = voyage_mod.load(opts.voyage)
    if want_help:
        parser.print_help()
        if vf.config_class is not None:
            print(f"\nconfig of {opts.voyage} ({vf.config_class.__name__}):")
            _config_help(vf.config_class, opts.voyage)
        return 0
    config = _parse_config(vf, opts.overrides)
    steps = voyage_mod.build_steps(vf, config)

    from executor.dag import build_dag
    from executor.lease import Leases
    from executor.plan import Selection, make_plan
    from executor.store import Store

    dag = build_dag(steps)
    if opts.explain and opts.explain not in dag.by_name:
        from executor.explain import check_name

        check_name(dag.by_name, opts.explain)
    store = Store(opts.prefix)
    looking = opts.dry_run or opts.viz or opts.explain  # these run nothing and write nothing under the prefix
    if not looking:
        try:
            store.check_writable()
        except Exception as e:
            raise VoyageError(f"prefix {opts.prefix!r} cannot be written: {type(e).__name__}: {e}") from None
    leases = Leases(store, ttl=opts.lease_ttl)
    plan = make_plan(dag, store, Selection(rerun=opts.rerun, downstream=opts.downstream, only=opts.only), leases)

    from executor import report

    if opts.viz or opts.explain:
        return _look(opts, vf, plan)
    if opts.dry_run:
        from executor.placement import check_placement, local_nodes

        nodes = _cluster_nodes_for_dry_run(opts) or local_nodes()
        unplaceable = {}
        for d in plan.to_run():
            problems = check_placement({d.name: d.node.step.resources}, nodes)
            if problems:
                unplaceable[d.name] = problems[0].split(": ", 1)[-1]
        report.print_plan(plan, sys.stdout, unplaceable)
        _print_voyage_summary(vf, config)
        return 0

    return _run(opts, vf, plan, leases)


def _run(opts: Options, vf: VoyageFile, plan: Plan, leases: Leases) -> int:
    from executor import report
    from executor.api import run_plan

    report.print_plan(plan, sys.stdout)
    if not plan.to_run():
        print("nothing to run: every selected step is cached")
        return 0
    page = None
    if opts.live_page:
        from executor.live import open_page

        page = open_page(plan, vf.name, leases.owner.run_id)
        if page is not None:
            print(f"voyage page: {page.url}", flush=True)
    summary = run_plan(plan, leases, opts.ray_address, opts.max_concurrent, pickle_by_value=[vf.module], page=page)
    report.print_summary(summary, plan, sys.stdout, page=page.url if page is not None else None)
    return summary.exit_code


def _print_voyage_summary(vf: VoyageFile, config: object) -> None:
    """A voyage may define `summary(config) -> str` (its budget, say): printed after the plan."""
    summary = getattr(vf.module, "summary", None)
    if not callable(summary):
        return
    try:
        text = summary(config) if vf.config_class is not None else summary()
    except Exception as e:  # a broken summary must not hide the plan
        text = f"(the voyage's summary() failed: {type(e).__name__}: {e})"
    if text:
        print()
        print(text)


def _look(opts: Options, vf: VoyageFile, plan: Plan) -> int:
    """--explain and --viz (with --dry-run, after the plan): they run nothing."""
    from executor import report

    if opts.dry_run:
        report.print_plan(plan, sys.stdout)
    if opts.explain:
        from executor.explain import explain

        explain(plan, opts.explain, sys.stdout)
    if opts.viz:
        from executor.viz import write_viz

        write_viz(plan, opts.viz, title=vf.name)
        print(f"drew {len(plan.decisions):,} steps to {opts.viz} ({report.counts_line(plan.counts())})")
    return 0


def _cluster_nodes_for_dry_run(opts: Options) -> list[dict[str, float]] | None:
    address = opts.ray_address or os.environ.get("RAY_ADDRESS")
    if not address:
        return None
    from executor import ray_backend

    ray_backend.start(address)
    try:
        return ray_backend.cluster_nodes()
    finally:
        ray_backend.stop()


def _parse_config(vf: VoyageFile, overrides: list[str]) -> object:
    config_class = vf.config_class
    if config_class is None:
        if overrides:
            raise VoyageError(f"unrecognized arguments: {' '.join(overrides)} (the voyage takes no config; "
                              f"see {PROG} {vf.path} --help)")
        return None
    import contextlib
    import io

    import draccus
    from draccus.utils import DraccusException

    overrides = _bare_bool_flags(config_class, overrides)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return draccus.parse(config_class=config_class, args=overrides, prog=f"{PROG} {vf.path}")
    except DraccusException as e:
        raise VoyageError(f"config: {e}") from None
    except SystemExit:
        last = [line for line in err.getvalue().splitlines() if line.strip()]
        msg = last[-1].split("error: ", 1)[-1] if last else "bad arguments"
        raise VoyageError(f"{msg} (see {PROG} {vf.path} --help)") from None


def _bare_bool_flags(config_class: type, args: list[str]) -> list[str]:
    """`--laptop` alone means `--laptop true` for a bool field (draccus wants the value)."""
    import dataclasses
    import typing

    def bool_fields(cls: type, prefix: str) -> set[str]:
        out: set[str] = set()
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = hints.get(f.name)
            if kind is bool:
                out.add(prefix + f.name)
            elif isinstance(kind, type) and dataclasses.is_dataclass(kind):
                out |= bool_fields(kind, f"{prefix}{f.name}.")
        return out

    flags = {f"--{name}" for name in bool_fields(config_class, "")}
    out: list[str] = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg in flags and (i + 1 == len(args) or args[i + 1].startswith("--")):
            out.append("true")
    return out


def _config_help(config_class: type, voyage_path: str) -> None:
    import draccus

    try:
        draccus.parse(config_class=config_class, args=["--help"], prog=f"{PROG} {voyage_path}")
    except SystemExit:
        pass


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname).1s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("fsspec", "gcsfs", "urllib3", "asyncio", "filelock", "google", "aiohttp"):
        # Their retries and tracebacks stay out of the terminal: a store error is one line of ours.
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.CRITICAL)


if __name__ == "__main__":
    raise SystemExit(main())

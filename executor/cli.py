"""`marin-run VOYAGE.py [flags] [voyage config overrides]`: a thin layer over `executor.api`.

The executor's own flags are parsed first, by their exact names only (no abbreviations: `--max`
is a voyage's field, never `--max-concurrent`); everything else is the voyage's config
dataclass, parsed by draccus, also exactly (`--help` lists both). Exit codes: 0 success, 1 a step
failed, 2 a bad voyage, config, flag, setting or prefix (one line on stderr, nothing written).
`--help` and `--dry-run` never import Ray or torch.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc as cyclic_gc
import logging
import math
import os
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from executor.config_args import PROG, bool_flags, parse_config
from executor.errors import VoyageError

if TYPE_CHECKING:
    from executor.plan import Plan
    from executor.voyage import VoyageFile



@dataclass
class Options:
    voyage: str
    dry_run: bool
    viz: str | None
    explain: str | None
    which_saw: str | None
    json: bool
    lineage: str | None
    consumers: str | None
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
    gc: bool = False
    yes: bool = False
    note: str | None = None
    log: bool = False
    path: tuple[str, ...] = ()
    diff: str | None = None
    format: str = "text"
    gc_grace: float = 300.0


class _Parser(argparse.ArgumentParser):
    """Flags by their exact names, and a bad one is a VoyageError (one line, exit 2), not usage."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise VoyageError(f"{message} (see {PROG} --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG, add_help=False, allow_abbrev=False,
        description="Plan and run a voyage: a DAG of versioned, content-hashed steps on Ray.",
        epilog="Any other --flags set fields of the voyage's config (see below).")
    p.add_argument("voyage", help="the voyage file, e.g. voyages/hello.py")
    p.add_argument("-h", "--help", action="store_true", help="show this help (and the voyage's config fields)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (what would run and why); run nothing")
    p.add_argument("--viz", metavar="FILE",
                   help="draw the plan to FILE (.html, .svg, .dot or .mmd; any fsspec URL); run nothing")
    p.add_argument("--explain", metavar="NAME",
                   help="show step NAME's digest tree and what changed since its last output; run nothing")
    p.add_argument("--which-saw", metavar="SOURCE:DOC_ID",
                   help="which training steps and checkpoints saw this document (from the prefix); run nothing")
    p.add_argument("--json", action="store_true",
                   help="with --which-saw or --log: print the answer as JSON, every list whole")
    _add_lineage_flags(p)
    _add_logbook_flags(p)
    _add_gc_flags(p)
    p.add_argument("--rerun", metavar="NAME", action="append", default=[],
                   help="run NAME again even if it is cached (repeatable)")
    p.add_argument("--downstream", action="store_true",
                   help="also run steps downstream of --rerun, and STALE steps, whose inputs changed")
    p.add_argument("--only", metavar="NAME", nargs="+", default=[],
                   help="run only these steps and whatever they need that is missing")
    p.add_argument("--prefix", default=None,
                   help="where outputs live: a local folder or gs://bucket/path (env MARIN_PREFIX; default ./out)")
    p.add_argument("--ray-address", default=None,
                   help="join this Ray cluster (env RAY_ADDRESS); default: an embedded local Ray")
    p.add_argument("--max-concurrent", type=_count, default=16, help="steps running at once (default 16)")
    p.add_argument("--lease-ttl", type=_ttl, default=None,
                   help="seconds a lease lives without renewal (env MARIN_LEASE_TTL; default 60)")
    p.add_argument("--no-live-page", dest="live_page", action="store_false",
                   help="do not keep the voyage page {prefix}/voyages/{voyage}/{run}/index.html during the run")
    p.add_argument("-v", "--verbose", action="store_true", help="log more")
    return p


def _add_lineage_flags(p: argparse.ArgumentParser) -> None:
    """--lineage and --consumers (docs/provenance.md): both directions of a step's lineage."""
    p.add_argument("--lineage", metavar="NAME",
                   help="print everything step NAME was built from, down to the raw sources, with licences and "
                        "token counts; run nothing")
    p.add_argument("--consumers", metavar="NAME",
                   help="print everything built from step NAME, with each one's state; run nothing")


def _add_logbook_flags(p: argparse.ArgumentParser) -> None:
    """--note, --log, --path, --diff, --format (docs/logbook.md): the voyage's logbook."""
    p.add_argument("--note", metavar="TEXT",
                   help="the reason for this run, kept in its log entry; with nothing to run, a note-only entry")
    p.add_argument("--log", action="store_true",
                   help="print the voyage's log, one line per run, --gc --yes or note, newest first; run nothing")
    p.add_argument("--path", metavar=("STEP", "FILE"), nargs="+",
                   help="print where step STEP's output (or FILE in it) is served: its committed attempt; run nothing")
    p.add_argument("--diff", metavar="REV",
                   help="plan the voyage as of git revision REV against the working tree: which steps change "
                        "and why, what stays cached, what the change costs; run nothing")
    p.add_argument("--format", choices=("text", "markdown"), default="text",
                   help="with --diff: text (default) or markdown (a pull-request comment)")


def _check_logbook_flags(ns: argparse.Namespace) -> None:
    """--note, --log, --path and --diff: one line naming what does not go together."""
    looks = [flag for flag, on in (("--dry-run", ns.dry_run), ("--viz", ns.viz), ("--explain", ns.explain),
                                   ("--which-saw", ns.which_saw), ("--lineage", ns.lineage),
                                   ("--consumers", ns.consumers), ("--log", ns.log), ("--path", ns.path),
                                   ("--diff", ns.diff)) if on]
    if ns.note is not None:
        if not ns.note.strip():
            raise VoyageError("--note: empty; say why (e.g. --note \"lowered the peak lr after the spike\")")
        if looks:
            raise VoyageError(f"--note does not combine with {', '.join(looks)}: a note goes into the log entry of a "
                              "run (or alone, into a note-only entry), and these run nothing")
        if ns.gc and not ns.yes:
            raise VoyageError("--note with --gc: only with --yes (a listing writes no log entry)")
    for flag, on in (("--log", ns.log), ("--path", ns.path), ("--diff", ns.diff)):
        if not on:
            continue
        others = [f for f in looks if f != flag and not (flag == "--diff" and f == "--dry-run")]
        others += [f for f, o in (("--rerun", ns.rerun), ("--downstream", ns.downstream), ("--only", ns.only),
                                  ("--gc", ns.gc)) if o]
        if others:
            raise VoyageError(f"{flag} does not combine with {', '.join(others)}")
    if ns.path is not None and len(ns.path) > 2:
        raise VoyageError(f"--path takes a step and at most one file in its output, got {' '.join(ns.path)}")
    if ns.format != "text" and not ns.diff:
        raise VoyageError("--format: only with --diff (the change it prints)")
    if ns.diff is not None and not ns.diff.strip():
        raise VoyageError("--diff: empty; give a git revision (a commit, a branch, HEAD~1)")


def _add_gc_flags(p: argparse.ArgumentParser) -> None:
    """--gc and --yes (executor.gc.collect): what no named voyage reaches under the prefix."""
    p.add_argument("--gc", action="store_true",
                   help="list what under the prefix no named voyage reaches (old versions, abandoned attempts, "
                        "temporaries), bytes per step; several voyages: A.py [overrides] B.py [overrides] --gc")
    p.add_argument("--yes", action="store_true", help="with --gc: delete what it lists")
    p.add_argument("--gc-grace", type=_grace, default=None, metavar="SECONDS",
                   help="with --gc: keep whole every output whose .status was written less than SECONDS ago "
                        "(default MARIN_GC_GRACE or 300; 0: none)")


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (0 would renew a lease in a tight loop, NaN never expire)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive number of seconds")
    return value


# The lease's ttl has a floor: the heartbeat renews every quarter ttl and, on an object store, the
# fence wants a quarter ttl left, so a quarter ttl must hold a renewal (a flock and a write on a
# local disk; a conditional upload, 0.1-0.5 s, on GCS) and a pause of the process (a collection,
# a busy machine). Below 2 s a run with no other executor "loses" its own leases (0.001 s gave
# thousands of lost-lease lines and attempt folders). The ceiling is what a thread can wait.
LEASE_TTL_FLOOR = 2.0


def _ttl(text: str) -> float:
    value = _seconds(text)
    if value < LEASE_TTL_FLOOR:
        raise argparse.ArgumentTypeError(
            f"{text!r}: at least {LEASE_TTL_FLOOR:g} seconds (the heartbeat renews every quarter ttl; shorter "
            "leases are lost to pauses of the process itself)")
    if value > threading.TIMEOUT_MAX:
        raise argparse.ArgumentTypeError(f"{text!r}: at most {threading.TIMEOUT_MAX:.0f} seconds (what a thread can wait)")
    return value


_FS_PROTOCOLS = {"gs": "gcsfs", "gcs": "gcsfs", "s3": "s3fs", "s3a": "s3fs", "az": "adlfs", "abfs": "adlfs"}


def check_prefix(prefix: str, where: str) -> None:
    """A VoyageError for a URL prefix no run can use: one without a bucket or host (`gs://` from
    an unset `$BUCKET`, which fsspec would take for a local folder `./gs:`), a protocol fsspec
    does not know, or one whose package is not installed. A local folder is not checked here."""
    scheme, sep, rest = prefix.partition("://")
    if not sep:
        return
    if not scheme or not rest.strip("/") or rest.startswith("/") and scheme not in ("file", "local", "memory"):
        raise VoyageError(f"{where}: {prefix!r} names no bucket or host (an unset variable?); give e.g. "
                          f"{scheme or 'gs'}://bucket/path")
    import fsspec

    try:
        fsspec.get_filesystem_class(scheme)
    except ValueError:
        raise VoyageError(f"{where}: {prefix!r}: fsspec knows no protocol {scheme!r}") from None
    except ImportError:
        package = _FS_PROTOCOLS.get(scheme, f"the fsspec implementation of {scheme}://")
        raise VoyageError(f"{where}: {prefix!r} needs {package}, which is not installed") from None


def _grace(text: str) -> float:
    """A finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or more seconds")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 1")
    return value


def _flag_or_env(given: float | None, var: str, read: Callable[[str], float], default: float) -> float:
    """A flag's value; else its environment variable's, checked as the flag is (a bad one is a
    VoyageError naming the variable); else the default."""
    if given is not None:
        return given
    env = os.environ.get(var)
    try:
        return read(env) if env is not None else default
    except argparse.ArgumentTypeError as e:
        raise VoyageError(f"environment variable {var}: {e}") from None


def parse(argv: Sequence[str]) -> tuple[Options, argparse.ArgumentParser, bool]:
    """The executor's flags (exact names), with their environment defaults checked; the rest are
    the voyage's config overrides. A bad flag or setting is a VoyageError."""
    parser = _parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        raise SystemExit(0 if argv else 2)
    ns, rest = parser.parse_known_args(argv)
    lease_ttl = _flag_or_env(ns.lease_ttl, "MARIN_LEASE_TTL", _ttl, 60.0)
    prefix = ns.prefix if ns.prefix is not None else os.environ.get("MARIN_PREFIX", "out")
    gc_grace = _flag_or_env(ns.gc_grace, "MARIN_GC_GRACE", _grace, 300.0)
    if ns.gc_grace is not None and not ns.gc:
        raise VoyageError("--gc-grace only applies to --gc")
    if ns.json and not (ns.which_saw or ns.log):
        raise VoyageError("--json: only with --which-saw or --log (the answer it prints as JSON)")
    _check_logbook_flags(ns)
    if not prefix.strip():
        where = "--prefix" if ns.prefix is not None else "environment variable MARIN_PREFIX"
        raise VoyageError(f"{where}: empty; give a folder or a URL such as gs://bucket/path (the default is ./out)")
    check_prefix(prefix, "--prefix" if ns.prefix is not None else "environment variable MARIN_PREFIX")
    opts = Options(voyage=ns.voyage, dry_run=ns.dry_run, viz=ns.viz, explain=ns.explain, which_saw=ns.which_saw,
                   json=ns.json,
                   lineage=ns.lineage, consumers=ns.consumers, rerun=tuple(ns.rerun),
                   downstream=ns.downstream, only=tuple(ns.only), prefix=prefix, ray_address=ns.ray_address,
                   max_concurrent=ns.max_concurrent, lease_ttl=lease_ttl, live_page=ns.live_page,
                   verbose=ns.verbose, overrides=rest, gc=ns.gc, yes=ns.yes, note=ns.note, log=ns.log,
                   path=tuple(ns.path or ()), diff=ns.diff, format=ns.format, gc_grace=gc_grace)
    if ns.yes and not ns.gc:
        raise VoyageError("--yes only confirms --gc's deletions; without --gc it means nothing")
    if ns.gc:
        others = [flag for flag, on in (("--dry-run", ns.dry_run and ns.yes), ("--viz", ns.viz),
                                        ("--explain", ns.explain), ("--which-saw", ns.which_saw),
                                        ("--lineage", ns.lineage), ("--consumers", ns.consumers),
                                        ("--rerun", ns.rerun), ("--downstream", ns.downstream),
                                        ("--only", ns.only)) if on]
        if others:
            raise VoyageError(f"--gc does not combine with {', '.join(others)}: it only lists (and with --yes "
                              "deletes) what no named voyage reaches")
    return opts, parser, ns.help


def main(argv: Sequence[str] | None = None) -> int:
    """`marin-run`: with no `argv`, this process's own command line (the console script)."""
    whole_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        opts, parser, want_help = parse(argv)
    except SystemExit as e:
        return int(e.code or 0)
    except VoyageError as e:
        _error(e)
        return 2
    _setup_logging(opts.verbose)
    rc = 1
    try:
        rc = _main(opts, parser, want_help)
    except VoyageError as e:
        _error(e)
        rc = 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        rc = 130
    except BrokenPipeError:  # the reader went away (`marin-run ... | head`): exit 1 quietly, as rich did
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is still buffered goes nowhere
        rc = 1
    finally:
        if whole_process and opts.dry_run and not opts.viz:
            _left_to_exit(rc)
    return rc


def _left_to_exit(rc: int) -> None:
    """A dry-run's process ends next: the plan it made (nodes and their consumers are reference
    cycles) is then freed by the OS at once, where the interpreter's last collection would first
    walk it (about 0.9 s of the 535B voyage's 5.2 s dry-run). A dry-run holds no file or lock that
    a collection would have to close; a caller of `main(argv)` keeps its collector as it was.

    The interpreter's teardown is skipped too: after every exit handler has run (in their order),
    the process ends with `rc`. Torn down with the frozen objects still alive, extension modules
    would report them as leaks (Triton's nanobind bindings printed some 30 lines after each plan)."""
    cyclic_gc.disable()
    cyclic_gc.freeze()

    def end() -> None:
        atexit.unregister(end)
        atexit._run_exitfuncs()  # the others, last registered first, as the interpreter runs them
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(rc)

    atexit.register(end)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Loading the voyage, building its steps and the plan make many objects and no garbage
    cycles: the cyclic collector's passes over them were 10% of a dry-run's CPU. Paused for that
    only; what follows (a run, which-saw, drawings) collects as usual."""
    collecting = cyclic_gc.isenabled()
    cyclic_gc.disable()
    try:
        yield
    finally:
        if collecting:
            cyclic_gc.enable()


def _error(e: Exception) -> None:
    """One line on stderr, whatever it holds (a lone surrogate from a command line included)."""
    line = " ".join(str(e).split("\n"))
    print(f"{PROG}: error: {line}".encode("utf-8", "backslashreplace").decode("utf-8"), file=sys.stderr)


def _main(opts: Options, parser: argparse.ArgumentParser, want_help: bool) -> int:
    from executor import voyage as voyage_mod

    if opts.viz and not want_help:
        from executor.views.viz import check_target

        check_target(opts.viz)  # a bad extension, or .svg without graphviz: before anything is done
    if opts.gc and not want_help:
        return _gc(opts)
    if opts.log and not want_help:
        return _log(opts)
    if opts.diff and not want_help:
        from executor.diff import diff_command

        return diff_command(opts)
    if want_help:
        vf = voyage_mod.load(opts.voyage)
        parser.print_help()
        if vf.config_class is not None:
            print(f"\nconfig of {opts.voyage} ({vf.config_class.__name__}):")
            _config_help(vf.config_class, opts.voyage)
        return 0
    from executor import api
    from executor.plan import Selection

    with _collector_paused():
        vf = voyage_mod.load(opts.voyage)
        config = parse_config(vf, opts.overrides)
        steps = voyage_mod.build_steps(vf, config)
        # Planning reads and writes nothing under the prefix but status reads: a bad step name,
        # selection or setting is found here, before anything is written.
        plan = api.plan_steps(steps, opts.prefix, Selection(rerun=opts.rerun, downstream=opts.downstream,
                                                             only=opts.only), lease_ttl=opts.lease_ttl,
                              policy=_voyage_policy(vf, config))
    if opts.explain:
        from executor.views.explain import check_name

        check_name(plan.dag.by_name, opts.explain)
    if opts.lineage or opts.consumers:
        return _lineage(opts, plan)
    if opts.path:
        return _path(opts, plan)

    from executor.views import report

    if opts.which_saw:
        return _which_saw(opts, plan)
    if opts.viz or opts.explain:
        return _inspect(opts, vf, plan)
    if opts.dry_run:
        from executor.placement import check_placement, local_nodes

        nodes = _cluster_nodes_for_dry_run(opts) or local_nodes()
        unplaceable = {}
        for d in plan.to_run():
            problems = check_placement({d.name: d.node.step.resources}, nodes)
            if problems:
                unplaceable[d.name] = problems[0].split(": ", 1)[-1]
        report.print_plan(plan, sys.stdout, unplaceable)
        _print_licences(plan)
        _print_voyage_summary(vf, config, plan)
        return 0

    return _run(opts, vf, plan, config)


def _run(opts: Options, vf: VoyageFile, plan: Plan, config: object) -> int:
    from executor.views import report
    from executor.api import run_plan

    report.print_plan(plan, sys.stdout)
    _print_licences(plan)
    log = {"config": config, "voyage_file": opts.voyage, "note": opts.note,
           "flags": {"rerun": list(opts.rerun), "downstream": opts.downstream, "only": list(opts.only),
                     "overrides": list(opts.overrides)}}
    if not plan.to_run():
        print("nothing to run: every selected step is cached")
        if opts.note:  # a decision with no run: a note-only entry
            _write_note(plan, vf, log)
        return 0
    summary = run_plan(plan, ray_address=opts.ray_address, max_concurrent=opts.max_concurrent,
                       pickle_by_value=[vf.module], voyage=vf.name, live_page=opts.live_page, log=log,
                       on_page=lambda url: print(f"voyage page: {url}", flush=True))
    report.print_summary(summary, plan, sys.stdout, page=summary.page)
    return summary.exit_code


def _gc(opts: Options) -> int:
    """--gc: the DAGs of every named voyage (each with the config overrides that follow it) are
    what is reached; the rest under the prefix is listed, and deleted with --yes (executor.gc.collect)."""
    from executor import voyage as voyage_mod
    from executor.gc import collect as gc
    from executor.gc import sweep
    from executor.api import check_settings
    from executor.dag import build_dag
    from executor.storage.store import Store

    check_settings(prefix=opts.prefix, names={"prefix": "--prefix"})
    dags, pins, named = [], [], []
    for vf, overrides in _split_voyages(opts.voyage, opts.overrides):
        named.append(" ".join([os.path.basename(vf.path), *overrides]))
        config = parse_config(vf, overrides)
        dags.append(build_dag(voyage_mod.build_steps(vf, config)))
        pins += gc.voyage_pins(vf, config)
    store = Store(opts.prefix)
    report = gc.collect(store, gc.reached_of(dags), gc.read_pins_file(store) + pins, ttl=opts.lease_ttl,
                        grace=opts.gc_grace)
    print(f"--gc of {store.prefix}: {len(dags)} voyage{'s' if len(dags) > 1 else ''} "
          f"({'; '.join(named)}), {sum(len(d) for d in dags):,} steps reached")
    print(report.table())
    if not opts.yes:
        print("nothing deleted: run again with --yes to delete what is listed" if report.items else "nothing to delete")
        return 0
    outcome = sweep.sweep(store, report, ttl=opts.lease_ttl)
    print(outcome.describe())
    _log_gc(opts, store, outcome)
    return 0


def _log_gc(opts: Options, store: object, outcome: object) -> None:
    """An entry in the log of each named voyage: the bytes `--gc --yes` deleted (never failing it)."""
    from executor import logbook
    from executor.views.logbook import rewrite_index

    gc = {"bytes": outcome.bytes, "items": len(outcome.deleted), "files": sum(i.files for i in outcome.deleted),
          "skipped": len(outcome.skipped)}
    for vf, _ in _split_voyages(opts.voyage, opts.overrides):
        try:
            entry = logbook.new_entry("gc", vf.name, note=opts.note, voyage_file=vf.path)
            entry["gc"] = gc
            logbook.write_entry(store, vf.name, entry)
            rewrite_index(store, vf.name)
        except Exception as e:
            logging.getLogger("marin.logbook").warning("no log entry for this --gc --yes in %s (%s: %s)",
                                                       vf.name, type(e).__name__, e)


def _write_note(plan: Plan, vf: VoyageFile, log: dict) -> None:
    """A note-only entry: the decision is the point, so a failed write is an error (exit 2)."""
    from executor import logbook

    extra = dict(log)
    entry = logbook.new_entry("note", vf.name, config=extra.pop("config"), note=extra.pop("note"),
                              flags=extra.pop("flags"), voyage_file=extra.pop("voyage_file"))
    entry["steps"] = logbook.step_outcomes(plan, None)
    entry["counts"] = logbook._counts(entry["steps"])
    try:
        plan.store.check_writable()
        rel = logbook.write_entry(plan.store, vf.name, entry)
        from executor.views.logbook import rewrite_index

        rewrite_index(plan.store, vf.name)
    except VoyageError:
        raise
    except Exception as e:
        raise VoyageError(f"the note was not written under {plan.store.prefix}: {type(e).__name__}: {e}") from None
    print(f"note written: {plan.store.url(rel)}")


def _log(opts: Options) -> int:
    """--log: the voyage's entries, newest first (--json: whole). An empty log is one line, exit 2."""
    from executor import logbook, voyage as voyage_mod
    from executor.api import check_settings
    from executor.storage.store import Store
    from executor.views.logbook import print_log, to_json

    check_settings(prefix=opts.prefix, names={"prefix": "--prefix"})
    if not os.path.isfile(opts.voyage):  # the log is found by the voyage's name: the file is not run
        voyage_mod.load(opts.voyage)  # its one-line error
    name = voyage_mod.name_of(opts.voyage)
    store = Store(opts.prefix)
    found = logbook.entries(store, name)
    if not found:
        raise VoyageError(f"the log of voyage {name!r} under {store.prefix} is empty: no run, --gc --yes or "
                          f"--note has written an entry in {store.url(logbook.log_folder(name))}/")
    if opts.json:
        print(to_json(found))
    else:
        print_log(found, sys.stdout)
    return 0


def _path(opts: Options, plan: Plan) -> int:
    """--path STEP [FILE]: where the step's committed output (or FILE in it) is served."""
    import difflib

    name, file = opts.path[0], (opts.path[1] if len(opts.path) > 1 else "")
    d = plan.dag.by_name.get(name)
    if d is None:
        close = difflib.get_close_matches(name, list(plan.dag.by_name), n=3, cutoff=0.5)
        raise VoyageError(f"--path: no step named {name!r} in this voyage"
                          + (f" (closest: {', '.join(close)})" if close else ""))
    status = plan[name].status
    served = status.served() if status is not None else None
    if served is None:
        raise VoyageError(f"--path: {name} has no committed output under {plan.store.prefix} "
                          f"({plan[name].state}: {plan[name].reason}); run the voyage first")
    folder = served.data_dir(d.dirname)
    file = file.strip("/")
    if file:
        if any(part in ("", ".", "..") for part in file.split("/")):
            raise VoyageError(f"--path: {file!r} is not a path inside the output")
        target = plan.store.path(folder, file)
        if not plan.store.fs.exists(target):
            raise VoyageError(f"--path: {name}'s output has no {file!r} (in {plan.store.url(folder)})")
    print(plan.store.url(f"{folder}/{file}" if file else folder))
    return 0


def _split_voyages(first: str, args: list[str]) -> list[tuple[VoyageFile, list[str]]]:
    """`A.py [A's overrides] B.py [B's overrides] ...`: an argument ending in `.py` starts the
    next voyage, unless it is the value of the flag before it (a `--field` that is not a bool
    field of the voyage being read and has no `=value`)."""
    from executor import voyage as voyage_mod

    vf = voyage_mod.load(first)
    groups: list[tuple[VoyageFile, list[str]]] = [(vf, [])]
    flags = bool_flags(vf.config_class)
    prev = ""
    for arg in args:
        is_value = prev.startswith("--") and "=" not in prev and prev not in flags
        if arg.endswith(".py") and not arg.startswith("-") and not is_value:  # a missing file: one line
            vf = voyage_mod.load(arg)
            groups.append((vf, []))
            flags, prev = bool_flags(vf.config_class), ""
            continue
        groups[-1][1].append(arg)
        prev = arg
    return groups


def _voyage_policy(vf: VoyageFile, config: object) -> object:
    """A voyage may define `license_policy(config) -> LicensePolicy | None`: which licences may
    reach any of its steps (a step's own `licenses=` adds to it)."""
    from executor.voyage import call_hook

    return call_hook(vf, "license_policy", config)


def _lineage(opts: Options, plan: Plan) -> int:
    """--lineage and --consumers: read the plan and the records; run nothing."""
    import difflib

    from executor.views import lineage_view

    for flag, name in (("--lineage", opts.lineage), ("--consumers", opts.consumers)):
        if name and name not in plan.dag.by_name:
            close = difflib.get_close_matches(name, list(plan.dag.by_name), n=3, cutoff=0.5)
            raise VoyageError(f"{flag}: no step named {name!r} in this voyage"
                              + (f" (closest: {', '.join(close)})" if close else ""))
    if opts.lineage:
        lineage_view.print_lineage(plan, opts.lineage, sys.stdout)
    if opts.consumers:
        if opts.lineage:
            print()
        lineage_view.print_consumers(plan, opts.consumers, sys.stdout)
    return 0


def _print_licences(plan: Plan) -> None:
    from executor.views import lineage_view

    lineage_view.print_licences(plan, sys.stdout)


def _print_voyage_summary(vf: VoyageFile, config: object, plan: Plan | None = None) -> None:
    """A voyage may define `summary(config) -> str` (its budget, say): printed after the plan.
    A summary that takes a second argument also gets the plan (to read cached outputs)."""
    import inspect

    summary = getattr(vf.module, "summary", None)
    if not callable(summary):
        return
    try:
        takes_plan = len(inspect.signature(summary).parameters) >= 2
        if vf.config_class is None:
            text = summary()
        else:
            text = summary(config, plan) if takes_plan else summary(config)
    except Exception as e:  # a broken summary must not hide the plan
        text = f"(the voyage's summary() failed: {type(e).__name__}: {e})"
    if text:
        print()
        print(text)


def _inspect(opts: Options, vf: VoyageFile, plan: Plan) -> int:
    """--explain and --viz (with --dry-run, after the plan): they run nothing."""
    from executor.views import report

    if opts.dry_run:
        report.print_plan(plan, sys.stdout)
    if opts.explain:
        from executor.views.explain import explain

        explain(plan, opts.explain, sys.stdout)
    if opts.viz:
        from executor.views.viz import write_viz

        write_viz(plan, opts.viz, title=vf.name)
        print(f"drew {len(plan.decisions):,} steps to {opts.viz} ({report.counts_line(plan.counts())})")
    return 0


def _which_saw(opts: Options, plan: Plan) -> int:
    """--which-saw SOURCE:DOC_ID: the document followed from ingest to the checkpoints that hold
    it, read from the prefix (steps/provenance/which_saw.py: the step library knows its formats;
    the executor only hands it the plan). Runs nothing; imports neither torch nor Ray."""
    import importlib

    which = importlib.import_module("steps.provenance.which_saw")
    source, doc_id = which.parse_query(opts.which_saw)
    answer = which.which_saw(plan, source, doc_id)
    if opts.json:
        import json

        print(json.dumps(answer.to_json(), indent=1))
    else:
        print(answer.describe())
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

"""The plan: one decision per step, with a reason a person can read.

Decisions are states of the one step state machine (executor.state): CACHED, RUN (no valid output
yet), RERUN (forced), STALE (an input's output changed since this output was made), RETRY (failed
or interrupted before), WAITING (leased by a live executor), SKIPPED (not selected, or needed
only by cached steps); BLOCKED is set while running.

Planning is one pass over the DAG in topological order with one status read per step (issued as
one concurrent batch on remote stores), then one reverse pass that settles what runs:
- a missing step whose consumers are all cached does not run (Marin #6783);
- an input with no output never counts as up to date: a step that runs pulls in its inputs that
  have no output (they run first, even if not selected), and a step recorded as made while an
  input had no output is never CACHED (it runs again);
- with `--rerun X --downstream`, what is downstream of X is selected like X itself.
Reasons for new outputs come from diffing the config against the newest record of the same step
name; a cached step whose code fingerprint differs from the one it was made with says which
functions, classes, constants or defaults changed.
"""

from __future__ import annotations

import posixpath
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from executor import environment
from executor.dag import Dag, Node, gc_paused
from executor.errors import VoyageError
from executor.fingerprint import SCHEME as FINGERPRINT_SCHEME
from executor.fingerprint import drift
from executor.identity import diff, plain
from executor.licenses import LicensePolicy
from executor.lineage import Lineage
from executor.state import PLAN_ORDER, StepState
from executor.storage.store import STATUS, Status, Store, parse_status

if TYPE_CHECKING:
    from executor.storage.lease import LeaseInfo, Leases
    from executor.storage.records import Record

CACHED, RUN, RERUN, STALE, RETRY, WAITING, BLOCKED, SKIPPED = (
    StepState.CACHED, StepState.RUN, StepState.RERUN, StepState.STALE, StepState.RETRY, StepState.WAITING,
    StepState.BLOCKED, StepState.SKIPPED)
SUCCESS, RUNNING, FAILED = StepState.SUCCESS, StepState.RUNNING, StepState.FAILED
STATES = PLAN_ORDER


@dataclass
class Selection:
    """What the user asked for on the command line."""

    rerun: tuple[str, ...] = ()
    downstream: bool = False
    only: tuple[str, ...] = ()


@dataclass(frozen=True)
class StaleInput:
    """An input whose output changed since this output was made: full output digests."""

    name: str
    recorded: str  # the input's output digest this output was made from
    current: str  # the input's output digest now


@dataclass
class Decision:
    node: Node
    state: StepState
    reason: str
    will_run: bool = False
    status: Status | None = None
    holder: LeaseInfo | None = None
    conditional_on: tuple[str, ...] = ()  # runs only if these forced steps change their output
    code_drift: bool = False
    stale_inputs: tuple[StaleInput, ...] = ()  # STALE: which inputs changed, and from what to what
    fresh: bool = False  # starts from an empty folder even if its type is resumable
    unselected: tuple[StepState, str] | None = None  # SKIPPED as not selected: what it would have been
    env_drift: str = ""  # the package versions it was made with differ from this process's: how
    output_problem: str = ""  # CACHED: what its type's `check_output` found wrong with the output

    @property
    def has_output(self) -> bool:
        """Whether the folder holds a finished output now (SUCCESS)."""
        return self.status is not None and self.status.state == SUCCESS

    @property
    def name(self) -> str:
        return self.node.name


@dataclass
class Plan:
    dag: Dag
    store: Store
    decisions: list[Decision] = field(default_factory=list)
    planned_at: float = field(default_factory=time.time)
    lineage: Lineage | None = None  # sources and licences of every step (None: planned without)
    # This executor's leases, when the plan may be run (`leases`): given, or made when first asked
    # for from `lease_ttl`. A dry-run never asks, and making them makes the store's filesystem,
    # which on a local folder is the only reason a dry-run would import fsspec.
    given_leases: Leases | None = field(default=None, repr=False)
    lease_ttl: float | None = field(default=None, repr=False)
    voyage: str | None = field(default=None, repr=False)  # the voyage's name: a run's steps see it (StepContext)

    def __post_init__(self) -> None:
        self.by_name = {d.name: d for d in self.decisions}

    @property
    def leases(self) -> Leases | None:
        """This executor's leases (None: a plan made without them cannot be run)."""
        if self.given_leases is None and self.lease_ttl is not None:
            from executor.storage.lease import Leases

            self.given_leases = Leases(self.store, ttl=self.lease_ttl)
        return self.given_leases

    def commits(self) -> Counter:
        """How many finished outputs were made from each git commit (executor.environment)."""
        return Counter(d.status.commit for d in self.decisions if d.has_output and d.status.commit)

    def __getitem__(self, name: str) -> Decision:
        return self.by_name[name]

    def counts(self) -> Counter:
        return Counter(d.state for d in self.decisions)

    def to_run(self) -> list[Decision]:
        return [d for d in self.decisions if d.will_run]

    def path(self, node: Node) -> str:
        """The URL a reader reads for `node`: the folder of the attempt its `.status` commits
        (executor.storage.attempts), as planned; the output folder itself if it has none."""
        status = self.by_name[node.name].status
        if status is not None and status.served() is not None:
            return self.store.url(status.served().data_dir(node.dirname))
        return self.store.url(self.store.served_dir(node.dirname))  # made since it was planned, or never


@gc_paused
def make_plan(dag: Dag, store: Store, selection: Selection | None = None,
              leases: Leases | None = None, explain_new: bool = True, policy: LicensePolicy | None = None,
              provenance: bool = True, lease_ttl: float | None = None) -> Plan:
    """Decide, for every step, whether it is cached, must run, waits, or is skipped, and why.

    `leases` are this executor's; without them, `lease_ttl` makes them when they are first
    needed (a step's folder RUNNING, or the plan run): a plan made without either cannot be run,
    and reads a RUNNING folder as interrupted.

    Before any status is read, the lineage of every step (its sources and their licences) is
    worked out from the DAG and every licence policy checked (`policy` binds every step; a
    step's own `licenses=` binds it): a disallowed licence is a VoyageError. `provenance=False`
    leaves both out, and the environment notes (what the planning benchmark compares against)."""
    sel = selection or Selection()
    check_names(dag, store)
    for name in (*sel.rerun, *sel.only):
        if name not in dag.by_name:
            raise VoyageError(f"no step named {name!r} in this voyage{_closest(name, dag.by_name)}")
    lineage = None
    if provenance:
        lineage = Lineage(dag, policy)
        lineage.check()
    latest = store.read_statuses([n.dirname for n in dag])
    # What each folder serves: its committed SUCCESS, which a newer attempt (running, or failed)
    # does not replace until it commits itself; else its newest attempt's status, or None.
    statuses = {k: (v.served() or v) if v is not None else None for k, v in latest.items()}
    forced = set(sel.rerun)
    downstream_of_forced = dag.downstream(forced) - forced if forced else set()
    if sel.only:
        wanted = dag.upstream(sel.only)
    elif forced:
        wanted = dag.upstream(forced) | (downstream_of_forced if sel.downstream else set())
    else:
        wanted = None  # everything

    plan = Plan(dag, store, lineage=lineage, given_leases=leases, lease_ttl=lease_ttl)
    decisions: dict[str, Decision] = {}
    for node in dag:
        status = statuses[node.dirname]
        if status is not None and status.digest and status.digest != node.digest:
            raise VoyageError(
                f"step {node.name!r}: folder {store.url(node.dirname)} belongs to digest "
                f"{status.digest[:16]}..., not {node.digest[:16]}... (a 10-hex-digit prefix collision)")
        done = status is not None and status.state == SUCCESS
        if node.name in forced:
            d = Decision(node, RERUN, "forced by --rerun", will_run=True, status=status, fresh=True)
        elif done:
            d = _decide_done(node, status, statuses, forced, downstream_of_forced, sel)
        elif status is not None and status.state == RUNNING and (ours := plan.leases) is not None and \
                (holder := ours.holder(node.dirname)) is not None and holder.live() and \
                holder.run_id != ours.owner.run_id:
            d = Decision(node, WAITING, f"leased by {holder.describe()}", will_run=True,
                         status=status, holder=holder)
        elif status is not None and status.state == RUNNING:
            d = Decision(node, RETRY, "an earlier attempt was interrupted (RUNNING without a live lease)",
                         will_run=True, status=status)
        elif status is not None and status.state == FAILED:
            d = Decision(node, RETRY, f"failed before (attempt {status.attempt})", will_run=True, status=status)
        else:
            d = Decision(node, RUN, "", will_run=True, status=status)
        newest = latest[node.dirname]
        if done and newest is not None and newest.state != SUCCESS and newest.attempt != status.attempt:
            d.reason += (f"; its newest attempt ({newest.attempt}) " + ("failed" if newest.state == FAILED else
                         "is running or was interrupted") + f": attempt {status.attempt}'s output is still served")
        if wanted is not None and node.name not in wanted:
            if d.will_run or d.state == STALE:
                d.unselected = (d.state, d.reason)
                d.state, d.will_run = SKIPPED, False
                d.reason = "not selected" + (f" (would be {d.reason})" if d.reason else "")
        if sel.downstream and d.state == CACHED and (wanted is None or node.name in wanted):
            changing = tuple(dep.name for dep in node.deps if decisions[dep.name].will_run)
            if changing:  # decided when they finish: runs only if an input's output changed
                d.state, d.will_run, d.conditional_on = STALE, True, changing
                d.reason = f"downstream of {', '.join(changing)}: runs only if their outputs change"
        decisions[node.name] = d

    targets = set(sel.only) | forced | (downstream_of_forced if sel.downstream else set())
    _settle(dag, decisions, targets)
    _note_code_drift(dag, decisions, store)
    if provenance:
        _note_env_drift(decisions, store)
    _check_outputs(decisions, store)
    if explain_new:
        listings: dict[str, set[str]] = {}
        for d in decisions.values():
            if d.state == RUN and not d.reason:
                d.reason = _corrupt_status(store, d.node.dirname, listings) or _why_new(d.node, store, dag)
    plan.decisions = [decisions[n.name] for n in dag]
    plan.by_name = {d.name: d for d in plan.decisions}
    return plan


# Limits of the stores an output path must fit: a file name (one segment) on every common local
# filesystem, and a whole object name on GCS and S3 (bytes, without the bucket). The longest path
# the executor writes under an output folder is an attempt's record written through a temporary.
MAX_SEGMENT = 255
MAX_OBJECT_NAME = 1024
_LONGEST_INSIDE = len("/.attempts/0000-00000000/.tmp-000000000000-.step.json")


def check_names(dag: Dag, store: Store) -> None:
    """A VoyageError, when the plan is made, for a step whose output folder no store could hold:
    a name segment over a file name's limit, or a path over an object name's (not mid-run, as
    "File name too long")."""
    base = len(store.root.encode()) + 1 if not store.is_local else 0
    for node in dag:
        for segment in node.dirname.split("/"):
            if len(segment.encode()) > MAX_SEGMENT:
                raise VoyageError(
                    f"step {node.name!r} ({node.step.origin}): its folder name {segment[:40]}... is "
                    f"{len(segment.encode())} bytes; a store holds at most {MAX_SEGMENT} a name (the step "
                    f"name's part, plus 11 for '-<digest>', must fit): use a shorter name")
        total = base + len(node.dirname.encode()) + _LONGEST_INSIDE
        if not store.is_local and total > MAX_OBJECT_NAME:
            raise VoyageError(f"step {node.name!r} ({node.step.origin}): its files' object names would be "
                              f"{total} bytes under {store.prefix}; the store holds at most {MAX_OBJECT_NAME}: use "
                              "a shorter name or prefix")


def recorded_input(status: Status, dep: Node) -> tuple[bool, str | None]:
    """(whether `status` recorded input `dep`, the output digest it recorded for it): by name, or
    by digest in a status written before inputs were keyed by name."""
    key = dep.name if status.inputs_by == "name" else dep.digest
    return key in status.inputs, status.inputs.get(key)


def _decide_done(node: Node, status: Status, statuses: dict[str, Status | None], forced: set[str],
                 downstream_of_forced: set[str], sel: Selection) -> Decision:
    changed: list[str] = []
    stale: list[StaleInput] = []
    without: list[str] = []
    for dep in node.deps:
        dep_status = statuses[dep.dirname]
        now = dep_status.output_digest if dep_status is not None and dep_status.state == SUCCESS else None
        known, then = recorded_input(status, dep)
        if then is None:  # made while this input had no output (or never recorded it)
            without.append(dep.name)
        elif now is not None and now != then:
            changed.append(f"input {dep.name} output changed {then[:10]} -> {now[:10]}")
            stale.append(StaleInput(dep.name, then, now))
    if without:
        return Decision(node, RUN, f"made while input {', '.join(without)} had no output: never up to date",
                        will_run=True, status=status, fresh=True)
    if changed:
        run = sel.downstream
        hint = "" if run else " (run with --downstream, or --rerun it)"
        return Decision(node, STALE, "; ".join(changed) + hint, will_run=run, status=status,
                        stale_inputs=tuple(stale))
    if node.name in downstream_of_forced and not sel.downstream:
        upstream_forced = tuple(sorted(forced))
        return Decision(node, CACHED, "cached; becomes STALE if the rerun of " + ", ".join(upstream_forced) +
                        " changes its output", status=status)
    return Decision(node, CACHED, "cached", status=status)


def _note_code_drift(dag: Dag, decisions: dict[str, Decision], store: Store) -> None:
    """The fingerprint is recorded, not keyed: a drift is reported, never a new path. What
    changed is read from the record of one output per (step type, recorded fingerprint)."""
    explained: dict[tuple[int, type, str], str] = {}
    for d in decisions.values():
        recorded = d.status.code if d.state == CACHED and d.status is not None else ""
        if not recorded.startswith(FINGERPRINT_SCHEME + ":"):
            continue  # none, or of an older fingerprint scheme: nothing comparable
        now = dag.fingerprint(d.node)
        if now.digest == recorded:
            continue
        key = (id(d.node.step.type), type(d.node.step.config), recorded, now.digest)
        if key not in explained:
            record = store.read_record(d.node.dirname)
            what = drift(record.code_parts, now.parts) if record is not None and record.code_parts else []
            explained[key] = "; ".join(what) if what else f"fingerprint {recorded[4:12]} -> {now.digest[4:12]}"
        d.code_drift = True
        d.reason += (f"; code drifted since it was made ({explained[key]}; bump the version of "
                     f"{d.node.step.type.name} if the output changes, or --rerun it)")


def _note_env_drift(decisions: dict[str, Decision], store: Store) -> None:
    """Recorded, not keyed (like the code fingerprint): a cached output made with other package
    versions than this process has says which, read from one record per recorded set."""
    drifted = [d for d in decisions.values() if d.state == CACHED and d.status is not None and d.status.env]
    if not drifted:
        return
    now = environment.current()
    digest = environment.packages_digest(now)
    explained: dict[str, str] = {}
    for d in drifted:
        recorded = d.status.env  # type: ignore[union-attr]
        if recorded == digest:
            continue
        if recorded not in explained:
            record = store.read_record(d.node.dirname)
            what = environment.differences(record.environment, now) if record is not None and record.environment \
                else []
            explained[recorded] = ", ".join(what) if what else "other package versions"
        d.env_drift = explained[recorded]
        d.reason += f"; made with {explained[recorded]} (recorded, not keyed: --rerun it if that matters)"


def _check_outputs(decisions: dict[str, Decision], store: Store) -> None:
    """The step types' own cheap checks of their CACHED outputs (`StepType.check_output`; only
    the types that declare one are looked at). A problem is reported, not acted on: the output
    stays CACHED (a run that loads it verifies it fully, and `--rerun` makes it again)."""
    for d in decisions.values():
        check = d.node.step.type.check_output
        if check is None or d.state != CACHED or d.status is None or d.status.served() is None:
            continue
        url = store.url(d.status.served().data_dir(d.node.dirname))
        try:
            problem = check(url)
        except Exception as e:  # noqa: BLE001 - a check that cannot look is itself a finding
            problem = f"the output check could not look: {type(e).__name__}: {e}"
        if problem:
            d.output_problem = problem
            d.reason += f"; {problem}"


def _settle(dag: Dag, decisions: dict[str, Decision], targets: set[str]) -> None:
    """The reverse pass: a missing step needed by nothing that runs is skipped; an input with no
    output of a step that runs is pulled in, even if not selected (never run without it)."""
    for node in reversed(dag.nodes):
        d = decisions[node.name]
        consumers = [c.name for c in node.consumers if decisions[c.name].will_run]
        is_target = node.name in targets or (not targets and not node.consumers)
        if d.will_run and not (is_target or consumers):
            if d.state in (RUN, RETRY, WAITING):
                d.state, d.will_run = SKIPPED, False
                d.reason = "needed only by cached steps" + (f" (would be {d.reason})" if d.reason else "")
        elif consumers and not d.will_run and not d.has_output and d.unselected is not None:
            was, why = d.unselected
            d.state, d.will_run, d.unselected = was, True, None
            d.reason = f"needed by {', '.join(consumers[:3])}, which run{'s' if len(consumers) == 1 else ''}, " \
                       f"and it has no output" + (f"; {why}" if why else "")


def _why_new(node: Node, store: Store, dag: Dag) -> str:
    prev: Record | None = store.newest_sibling_record(node.name, exclude=node.dirname)
    if prev is None:
        return "new step: no earlier output of this name"
    if prev.step_type != node.step.type.name or prev.version != node.step.type.version:
        return f"step type {prev.step_type}@{prev.version} -> {node.step.type.key}"
    now = plain(node.step.config)
    changes = diff(prev.config, now)
    dep_changes = []
    prev_inputs = {i.name: i.digest for i in prev.inputs}
    for dep in node.deps:
        if dep.name in prev_inputs and prev_inputs[dep.name] != dep.digest:
            dep_changes.append(f"input {dep.name} re-addressed {prev_inputs[dep.name][:10]} -> {dep.digest[:10]}")
    parts = changes + dep_changes
    if not parts:
        return f"new digest {node.digest[:10]} (was {prev.digest[:10]}; identity scheme or defaults changed)"
    return "; ".join(parts)


def _corrupt_status(store: Store, dirname: str, listings: dict[str, set[str]]) -> str:
    """Why a folder whose status did not read as a status is not done: its `.status` is there but
    corrupt (a truncated write, another tool), as opposed to a new step. One listing per parent
    folder tells which folders exist at all."""
    parent, _, leaf = store.path(dirname).rpartition("/")
    if parent not in listings:
        try:
            listings[parent] = {posixpath.basename(p.rstrip("/")) for p in store.fs.ls(parent, detail=False)}
        except (FileNotFoundError, NotADirectoryError):
            listings[parent] = set()
    if leaf not in listings[parent]:
        return ""
    path = store.path(dirname, STATUS)
    try:
        data = store.fs.cat_file(path)
    except (FileNotFoundError, NotADirectoryError):
        return "its folder exists without a .status (an attempt died before its first write): not done"
    except OSError as e:
        return f"its .status cannot be read ({type(e).__name__}: {e}): not done; runs again"
    status, problem = parse_status(data)
    if status is not None and store.is_local and store.missing_dir(dirname, status):
        return (f"its .status is corrupt (it names attempt folder {(status.served() or status).dir}, which does not "
                f"exist; {store.to_url(path)}): not done; runs again")
    if status is not None:
        return ""
    what = "empty" if not data.strip() else f"not a status: {problem[:80]}"
    return f"its .status is corrupt ({what}; {store.to_url(path)}): not done; runs again"


def _closest(name: str, names: Iterable[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(names), n=3, cutoff=0.5)
    return f" (closest: {', '.join(close)})" if close else ""

"""`marin-run VOYAGE [overrides] --diff REV [--format markdown]`: a change priced like a pull request.

The voyage is planned twice, with the same config flags: as of git revision REV (its voyage file
and its code, taken from git with `git archive` into a temporary folder and planned there in a
subprocess, so that the old code computes the old identities) and as in the working tree. Per
step name the two are compared:

- changed identity (a new output folder, so it runs again): why, by config field path, step
  type version, or the inputs whose identity changed; the code modules whose fingerprint changed
  are named beside it;
- unchanged identity: stays cached where it was made;
- new and removed steps;
- code that changed under a step whose identity did not (a note in the plan, never a rerun).

The cost of the change is what the voyage's `costs(config)` (the dry-run's plans; voyages/535b.py)
says the changed steps cost: core-hours of data steps and GPU-hours of training.

How a changed step's headline moves (a ladder's predicted loss: docs/logbook.md): for each step
whose identity changes and whose old output is committed under the prefix with a `headline` in
its record's results, the old headline against the new output's when that is committed too, or
that it is made again when the step runs (a prediction: re-predicted). Only the statuses and
records of those outputs are read (one batch each); nothing is written under the prefix, and a
prefix that cannot be read shows no headlines.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import TYPE_CHECKING, Any

from executor.errors import VoyageError

if TYPE_CHECKING:
    from executor.cli import Options

# Run with the old revision's code on sys.path: only long-standing entry points of the executor.
DRIVER = r"""
import json, sys
root, voyage, overrides = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path.insert(0, root)
from executor import voyage as voyage_mod
from executor.config_args import parse_config
from executor.dag import build_dag
from executor.identity import plain
vf = voyage_mod.load(voyage)
config = parse_config(vf, overrides)
dag = build_dag(voyage_mod.build_steps(vf, config))
out = {}
for node in dag:
    fp = dag.fingerprint(node)
    out[node.name] = {"digest": node.digest, "dirname": node.dirname, "type": node.step.type.key,
                      "deps": [d.name for d in node.deps], "config": plain(node.step.config),
                      "code": fp.digest, "code_parts": fp.parts}
sys.stdout.write("\n@@identities@@" + json.dumps(out, default=repr))
"""
GIT_TIMEOUT = 60.0
PLAN_TIMEOUT = 600.0


def _git(repo: str, *args: str, binary: bool = False) -> Any:
    git = shutil.which("git")
    if git is None:
        raise VoyageError("--diff: no git program on this machine")
    out = subprocess.run([git, "-C", repo, *args], capture_output=True, timeout=GIT_TIMEOUT, check=False)
    if out.returncode != 0:
        return None
    return out.stdout if binary else out.stdout.decode("utf-8", "replace").strip()


def checkout_of(voyage: str) -> str:
    """The root of the git checkout holding the voyage file; a VoyageError if there is none."""
    where = os.path.dirname(os.path.abspath(voyage))
    top = _git(where, "rev-parse", "--show-toplevel") if os.path.isdir(where) else None
    if not top:
        raise VoyageError(f"--diff: {voyage} is not in a git checkout (--diff plans the voyage as of a git revision)")
    return top


def resolve(repo: str, rev: str) -> str:
    if rev.startswith("-"):
        raise VoyageError(f"--diff: {rev!r} is not a git revision")
    commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if not commit:
        raise VoyageError(f"--diff: no revision {rev!r} in the git checkout {repo}")
    return commit


def identities_at(repo: str, commit: str, voyage_rel: str, overrides: list[str]) -> dict[str, Any]:
    """Each step's identity as the revision's own code computes it (a subprocess in a folder
    holding the revision's files)."""
    data = _git(repo, "archive", "--format=tar", commit, binary=True)
    if data is None:
        raise VoyageError(f"--diff: git archive of {commit[:12]} failed")
    with tempfile.TemporaryDirectory(prefix="marin-diff-") as tmp:
        import io

        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(tmp, filter="data")
        if not os.path.isfile(os.path.join(tmp, voyage_rel)):
            raise VoyageError(f"--diff: {voyage_rel} does not exist at {commit[:12]}")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = tmp
        try:
            out = subprocess.run([sys.executable, "-c", DRIVER, tmp, voyage_rel, json.dumps(overrides)], cwd=tmp,
                                 env=env, capture_output=True, timeout=PLAN_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise VoyageError(f"--diff: planning {voyage_rel} at {commit[:12]} took over {PLAN_TIMEOUT:.0f} s") from None
        text = out.stdout.decode("utf-8", "replace")
        if out.returncode != 0 or "\n@@identities@@" not in text:
            err = [line for line in out.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
            raise VoyageError(f"--diff: the voyage at {commit[:12]} could not be planned: "
                              f"{err[-1] if err else 'exit ' + str(out.returncode)}")
        return json.loads(text.rpartition("\n@@identities@@")[2])


def identities_here(vf: Any, config: Any) -> dict[str, Any]:
    from executor import voyage as voyage_mod
    from executor.dag import build_dag
    from executor.identity import plain

    dag = build_dag(voyage_mod.build_steps(vf, config))
    out = {}
    for node in dag:
        fp = dag.fingerprint(node)
        out[node.name] = json.loads(json.dumps(
            {"digest": node.digest, "dirname": node.dirname, "type": node.step.type.key,
             "deps": [d.name for d in node.deps], "config": plain(node.step.config), "code": fp.digest,
             "code_parts": fp.parts}, default=repr))
    return out


def compare(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """{"changed": [(name, [why...], [code modules])], "cached": [...], "new": [...], "removed": [...],
    "code_only": [(name, [modules])]} in the working tree's step order."""
    from executor.logbook import config_diff

    changed, cached, added, code_only = [], [], [], []
    moved = {n for n in new if n in old and old[n]["digest"] != new[n]["digest"]}
    for name, now in new.items():
        then = old.get(name)
        if then is None:
            added.append(name)
            continue
        modules = _code_modules(then.get("code_parts") or {}, now.get("code_parts") or {})
        if then["digest"] == now["digest"]:
            cached.append(name)
            if modules:
                code_only.append((name, modules))
            continue
        why = []
        if then["type"] != now["type"]:
            why.append(f"step type {then['type']} -> {now['type']}")
        for d in config_diff(then["config"], now["config"]):
            if _is_ref(d["before"]) and _is_ref(d["after"]) and d["before"] == d["after"]:
                continue
            why.append(f"config {d['path']}: {_short(d['before'])} -> {_short(d['after'])}")
        inputs = [d for d in now["deps"] if d in moved or d not in old]
        if inputs:
            why.append(f"input{'s' if len(inputs) > 1 else ''} {', '.join(inputs)} changed")
        if set(then["deps"]) != set(now["deps"]):
            why.append(f"inputs {sorted(then['deps'])} -> {sorted(now['deps'])}")
        changed.append((name, why or ["identity changed (scheme)"], modules))
    removed = [n for n in old if n not in new]
    return {"changed": changed, "cached": cached, "new": added, "removed": removed, "code_only": code_only}


def _is_ref(v: Any) -> bool:
    return isinstance(v, dict) and ("$output_of" in v or "$this_output" in v)


def _short(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"), default=repr)
    return text if len(text) <= 60 else text[:59] + "…"


def _code_modules(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The modules (of `module:qualname` units) whose parts differ."""
    units = {u for u in set(before) | set(after) if before.get(u) != after.get(u)}
    return sorted({u.split(":", 1)[0] for u in units})


def headline_moves(prefix: str, old: dict[str, Any], new: dict[str, Any],
                   result: dict[str, Any]) -> list[dict[str, Any]]:
    """[{"step", "before", "after"}] of the changed steps whose old output has a headline
    (`after` None: the new output is not committed). [] when the prefix cannot be read."""
    changed = [c[0] for c in result["changed"]]
    if not changed or not prefix:
        return []
    try:
        from executor.storage.store import Store

        store = Store(prefix)
        dirs = sorted({old[n]["dirname"] for n in changed} | {new[n]["dirname"] for n in changed})
        statuses = store.read_statuses(dirs)
        heads = {}
        for dirname in dirs:
            status = statuses.get(dirname)
            served = status.served() if status is not None else None
            record = store.read_record_in(served.data_dir(dirname)) if served is not None else None
            headline = (record.results or {}).get("headline") if record is not None else None
            if isinstance(headline, dict):
                heads[dirname] = headline
    except Exception as e:  # no prefix here, no access: the diff stands without headlines
        import logging

        logging.getLogger("marin.diff").info("--diff: headlines not read under %s (%s)", prefix, e)
        return []
    out = []
    for name in changed:
        before = heads.get(old[name]["dirname"])
        if before is not None:
            out.append({"step": name, "before": before, "after": heads.get(new[name]["dirname"])})
    return out


def _headline_text(h: dict[str, Any]) -> str:
    return str(h.get("text") or json.dumps(h, separators=(",", ":"), default=repr))


def move_lines(moves: list[dict[str, Any]], old_label: str) -> list[str]:
    lines = []
    for m in moves:
        before, after = m["before"], m["after"]
        if after is None:
            again = "re-predicted" if before.get("kind") == "prediction" else "made again"
            lines.append(f"{m['step']}: at {old_label}: {_headline_text(before)}; now: not made yet, it is "
                         f"{again} when it runs")
            continue
        text = f"{m['step']}: {_headline_text(before)} -> {_headline_text(after)}"
        p0, p1 = before.get("predicted"), after.get("predicted")
        if all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in (p0, p1)) and p0:
            text += f" (predicted {p0:.4g} -> {p1:.4g}, {100 * (p1 - p0) / p0:+.2f}%)"
        lines.append(text)
    return lines


def priced(result: dict[str, Any], costs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The cost of the change: GPU-hours and core-hours of the changed and new steps the voyage
    prices, and the names of those it does not."""
    gpu = core = 0.0
    unpriced = []
    for name in [c[0] for c in result["changed"]] + result["new"]:
        cost = costs.get(name) or {}
        if "gpu_hours" in cost:
            gpu += float(cost["gpu_hours"])
        elif "core_hours" in cost:
            core += float(cost["core_hours"])
        else:
            unpriced.append(name)
    return {"gpu_hours": gpu, "core_hours": core, "unpriced": unpriced}


def cost_text(cost: dict[str, Any] | None) -> str:
    if not cost:
        return ""
    if "gpu_hours" in cost:
        text = f"{cost['gpu_hours']:,.0f} GPU-hours"
    elif "core_hours" in cost:
        text = f"{cost['core_hours']:,.0f} core-hours"
    else:
        return ""
    return text + (f" (at full scale: {cost['at']})" if cost.get("at") else "")


def render_text(head: str, result: dict[str, Any], costs: dict[str, Any], total: dict[str, Any],
                moves: list[str] | None = None) -> str:
    lines = [head]
    n = len(result["changed"]) + len(result["cached"]) + len(result["new"])
    lines.append(f"changed identity: {len(result['changed'])} of {n} steps (they run again)")
    width = max((len(c[0]) for c in result["changed"]), default=0)
    for name, why, modules in result["changed"]:
        extra = f"; code: {', '.join(modules)}" if modules else ""
        cost = cost_text(costs.get(name))
        lines.append(f"  {name:<{width}}  {'; '.join(why)}{extra}" + (f"  [{cost}]" if cost else ""))
    if result["new"]:
        lines.append(f"new steps: {', '.join(result['new'])}")
    if result["removed"]:
        lines.append(f"removed steps: {', '.join(result['removed'])}")
    lines.append(f"unchanged identity (stays cached): {len(result['cached'])} steps"
                 + (f": {', '.join(result['cached'])}" if result["cached"] else ""))
    for name, modules in result["code_only"]:
        lines.append(f"  note: {name}: code changed ({', '.join(modules)}), identity did not: no rerun")
    lines.append(_total_text(total))
    if moves:
        lines.append("headlines that move (from the prefix):")
        lines.extend(f"  {m}" for m in moves)
    return "\n".join(lines)


def _total_text(total: dict[str, Any]) -> str:
    text = (f"cost of the change: {total['gpu_hours']:,.0f} GPU-hours of training, "
            f"{total['core_hours']:,.0f} core-hours of data steps")
    if total["unpriced"]:
        text += f" (not priced by the voyage's plans: {', '.join(total['unpriced'])})"
    return text


def render_markdown(command: str, old_label: str, new_label: str, result: dict[str, Any], costs: dict[str, Any],
                    total: dict[str, Any], moves: list[str] | None = None) -> str:
    n = len(result["changed"]) + len(result["cached"]) + len(result["new"])
    out = [f"### `{command}`", "",
           f"Planned at `{old_label}` and at `{new_label}`: **{len(result['changed'])} of {n} steps change "
           f"identity** and run again; {len(result['cached'])} stay cached.", ""]
    if result["changed"] or result["new"]:
        out += ["| step | why | cost |", "|---|---|---|"]
        for name, why, modules in result["changed"]:
            reasons = "; ".join(why) + (f"; code: {', '.join(modules)}" if modules else "")
            out.append(f"| `{name}` | {_md(reasons)} | {cost_text(costs.get(name)) or '–'} |")
        for name in result["new"]:
            out.append(f"| `{name}` | new step | {cost_text(costs.get(name)) or '–'} |")
        out.append("")
    if result["removed"]:
        out += [f"Removed: {', '.join(f'`{n}`' for n in result['removed'])}", ""]
    out += [f"**Cost of the change:** {_total_text(total).split(': ', 1)[1]}", ""]
    if moves:
        out += ["**Headlines that move:**", "", *(f"- {_md(m)}" for m in moves), ""]
    if result["cached"]:
        out += [f"<details><summary>{len(result['cached'])} steps stay cached</summary>", "",
                ", ".join(f"`{n}`" for n in result["cached"]), "", "</details>", ""]
    if result["code_only"]:
        out += ["Code changed without changing identity (no rerun): "
                + "; ".join(f"`{n}` ({', '.join(m)})" for n, m in result["code_only"]), ""]
    return "\n".join(out)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def diff_command(opts: Options) -> int:
    from executor import voyage as voyage_mod
    from executor.config_args import PROG, parse_config

    repo = checkout_of(opts.voyage)
    commit = resolve(repo, opts.diff)
    vf = voyage_mod.load(opts.voyage)
    config = parse_config(vf, opts.overrides)
    voyage_rel = os.path.relpath(os.path.realpath(opts.voyage), os.path.realpath(repo))
    old = identities_at(repo, commit, voyage_rel, list(opts.overrides))
    new = identities_here(vf, config)
    result = compare(old, new)
    costs: dict[str, Any] = voyage_mod.call_hook(vf, "costs", config, missing={}) if result["changed"] or result["new"] else {}
    total = priced(result, costs)
    head_commit = _git(repo, "rev-parse", "HEAD") or ""
    dirty = bool(_git(repo, "status", "--porcelain"))
    new_label = f"working tree ({head_commit[:12]}{'-dirty' if dirty else ''})"
    old_label = f"{opts.diff} ({commit[:12]})"
    command = " ".join([PROG, voyage_rel, *opts.overrides, "--diff", opts.diff])
    moves = move_lines(headline_moves(opts.prefix, old, new, result), opts.diff)
    if opts.format == "markdown":
        print(render_markdown(command, old_label, new_label, result, costs, total, moves))
    else:
        print(render_text(f"--diff {old_label} -> {new_label}: {voyage_rel}", result, costs, total, moves))
    return 0

"""`marin-run VOYAGE --diff REV` (executor.diff): the voyage planned as of a git revision
against the working tree, on throwaway git repositories holding this checkout's files."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from executor import cli
from executor.storage.store import Store

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]


def throwaway_repo(where, edit):
    """A git repository of this checkout's tracked files (as they are now) with one more commit
    that applies `edit(root)`; returns its root."""
    root = str(where / "repo")
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, check=True).stdout
    for rel in files.decode().split("\0"):
        if rel and os.path.isfile(os.path.join(ROOT, rel)):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, rel), os.path.join(root, rel))
    subprocess.run(["git", "init", "-q", root], check=True)
    subprocess.run([*GIT, "-C", root, "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", root, "commit", "-qm", "base"], check=True)
    edit(root)
    subprocess.run([*GIT, "-C", root, "commit", "-qam", "the change"], check=True)
    return root


def _replace(path, old, new):
    text = open(path).read()
    assert text.count(old) == 1, old
    open(path, "w").write(text.replace(old, new))


def _run(root, args, capsys, monkeypatch):
    monkeypatch.chdir(root)
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_diff_names_the_changed_steps_and_why_and_what_stays_cached(tmp_path, capsys, monkeypatch):
    """hello with one text step's words changed in the last commit (through its config default):
    the four text steps and everything after them change; the markdown is the expected text."""
    root = throwaway_repo(tmp_path, lambda r: _replace(os.path.join(r, "voyages", "hello.py"),
                                                       "    top_k: int = 10\n    zipf: float = 1.1",
                                                       "    top_k: int = 5\n    zipf: float = 1.1"))
    head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    base = subprocess.run(["git", "-C", root, "rev-parse", "HEAD~1"], capture_output=True, text=True).stdout.strip()
    code, out, err = _run(root, ["voyages/hello.py", "--diff", "HEAD~1"], capsys, monkeypatch)
    assert code == 0, err
    changed = re.findall(r"^  (\S+)  ", out.split("unchanged identity")[0], re.M)
    assert changed == ["hello/report"]  # only the report reads top_k
    assert "config top_k: 10 -> 5" in out and "stays cached): 9 steps" in out
    code, out, err = _run(root, ["voyages/hello.py", "--diff", "HEAD~1", "--format", "markdown"], capsys, monkeypatch)
    cached = ", ".join(f"`hello/{n}`" for n in ("text/0", "count/0", "text/1", "count/1", "text/2", "count/2",
                                                  "text/3", "count/3", "merge"))
    assert out == f"""### `marin-run voyages/hello.py --diff HEAD~1`

Planned at `HEAD~1 ({base[:12]})` and at `working tree ({head[:12]})`: **1 of 10 steps change identity** and run again; 9 stay cached.

| step | why | cost |
|---|---|---|
| `hello/report` | config top_k: 10 -> 5; code: module hello | – |

**Cost of the change:** 0 GPU-hours of training, 0 core-hours of data steps (not priced by the voyage's plans: hello/report)

<details><summary>9 steps stay cached</summary>

{cached}

</details>

Code changed without changing identity (no rerun): {"; ".join(f"{c} (module hello)" for c in cached.split(", "))}

"""


def test_diff_bad_revision_and_outside_a_checkout_are_one_line(tmp_path, capsys, monkeypatch):
    code, out, err = _run(ROOT, ["voyages/hello.py", "--diff", "nosuchrev"], capsys, monkeypatch)
    assert code == 2 and out == "" and err.count("\n") == 1 and "no revision 'nosuchrev'" in err
    code, out, err = _run(ROOT, ["voyages/hello.py", "--diff", "--rerun"], capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(os.path.join(ROOT, "voyages", "hello.py"), outside / "hello.py")
    code, out, err = _run(str(outside), ["hello.py", "--diff", "HEAD"], capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1 and "is not in a git checkout" in err, err


@pytest.mark.slow_tier
def test_diff_prices_a_change_of_the_laptop_midtrain_mixture(tmp_path, capsys, monkeypatch):
    """The laptop's midtrain weights changed in the last commit. The mixture holds both stages, so
    it changes, and with it pretrain (it reads the mixture), midtrain, eval, export and card; the
    data steps stay cached; pretrain and midtrain are priced in GPU-hours at full scale."""
    root = throwaway_repo(tmp_path, lambda r: (
        _replace(os.path.join(r, "voyages", "535b.py"), "0.7, 0.3, dedup_group", "0.7, 0.4, dedup_group"),
        _replace(os.path.join(r, "voyages", "535b.py"), "0.3, 0.7, dedup_group", "0.3, 0.6, dedup_group")))
    code, out, err = _run(root, ["voyages/535b.py", "--laptop", "--diff", "HEAD~1"], capsys, monkeypatch)
    assert code == 0, err
    changed = re.findall(r"^  (\S+)  ", out.split("unchanged identity")[0], re.M)
    assert changed == ["mixture/laptop", "pretrain/laptop", "midtrain/laptop", "eval/laptop", "export/laptop",
                       "card/laptop"]
    assert "config stages[1].weights.kjv: 0.3 -> 0.4" in out and "config stages[1].weights.pydocs: 0.7 -> 0.6" in out
    assert "stays cached): 10 steps" in out
    sys.path.insert(0, root)
    import importlib.util

    spec = importlib.util.spec_from_file_location("diff_535b", os.path.join(root, "voyages", "535b.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    costs = module.costs(module.VoyageConfig(laptop=True))
    gpu = costs["pretrain/laptop"]["gpu_hours"] + costs["midtrain/laptop"]["gpu_hours"]
    assert gpu > 0 and f"cost of the change: {gpu:,.0f} GPU-hours of training, 0 core-hours of data steps" in out
    assert f"[{costs['midtrain/laptop']['gpu_hours']:,.0f} GPU-hours (at full scale: midtrain/535b-a23b)]" in out


def test_diff_says_how_the_predicted_loss_moves(tmp_path, capsys, monkeypatch):
    """A commit pins the ladder's floor: the prediction's identity changes. Cached only at the old
    revision, it would be re-predicted; once both are cached, old and new predicted losses."""
    from executor.testing import run_inline
    from kits import ladderkit

    voyage = "tests/kits/ladder_voyage.py"
    root = throwaway_repo(tmp_path, lambda r: _replace(os.path.join(r, voyage), "floor: float | None = None",
                                                       "floor: float | None = 1.5"))
    prefix = str(tmp_path / "p")
    plan, summary = run_inline(ladderkit.all_steps(ladderkit.ladder()), prefix)
    assert summary.exit_code == 0
    old = json.load(open(os.path.join(prefix, Store(prefix).served_dir(plan["ladder/predict"].node.dirname),
                                      "prediction.json")))
    code, out, err = _run(root, [voyage, "--prefix", prefix, "--diff", "HEAD~1"], capsys, monkeypatch)
    assert code == 0, err
    assert re.search(r"^  ladder/fit +config floor: null -> 1.5$", out, re.M)
    assert re.search(r"^  ladder/predict +input ladder/fit changed$", out, re.M)
    moves = out.split("headlines that move (from the prefix):\n")[1].splitlines()
    assert moves[0] == (f"  ladder/predict: at HEAD~1: sealed target: predicted {old['sealed']['predicted']:.4g} "
                        f"[{old['sealed']['band'][0]:.4g}, {old['sealed']['band'][1]:.4g}], record "
                        f"{old['digest'][:12]}; now: not made yet, it is re-predicted when it runs")
    assert moves[1].startswith("  ladder/check: at HEAD~1: HIT target") and moves[1].endswith("made again when it runs")
    plan, summary = run_inline(ladderkit.all_steps(ladderkit.ladder(floor=1.5)), prefix)
    assert summary.exit_code == 0
    new = json.load(open(os.path.join(prefix, Store(prefix).served_dir(plan["ladder/predict"].node.dirname),
                                      "prediction.json")))
    p0, p1 = old["sealed"]["predicted"], new["sealed"]["predicted"]
    assert p0 != p1
    code, out, err = _run(root, [voyage, "--prefix", prefix, "--diff", "HEAD~1", "--format", "markdown"], capsys,
                          monkeypatch)
    assert code == 0, err
    assert f"record {old['digest'][:12]} -> sealed target: predicted {p1:.4g}" in out
    assert f"(predicted {p0:.4g} -> {p1:.4g}, {100 * (p1 - p0) / p0:+.2f}%)" in out
    assert "**Headlines that move:**" in out
    code, out, err = _run(root, [voyage, "--prefix", str(tmp_path / "empty"), "--diff", "HEAD~1"], capsys, monkeypatch)
    assert code == 0 and "headlines that move" not in out  # nothing cached there: the diff alone

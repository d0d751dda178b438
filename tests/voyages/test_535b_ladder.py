"""The laptop ladder for real, shrunk (slow tier): the voyage's own rungs of the tiny MoE at a
tenth of their tokens (`--ladder_tokens 0.1`), on a copy of the session's laptop run (its data
steps cached), through marin-run: the fit, the sealed prediction, the held-out top rung trained
against it, the check; then `--lineage` and `--dry-run` read them back. The full-size laptop
ladder is bench/ladder_laptop.py's (docs/benchmarks.md)."""

import json
import os

import pytest

from executor.storage.store import Store

pytestmark = pytest.mark.slow_tier

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOYAGE = os.path.join(ROOT, "voyages", "535b.py")
FLAGS = ["--laptop", "--ladder", "--ladder_tokens", "0.1"]


@pytest.mark.timeout(900)
def test_the_laptop_ladder_seals_trains_and_checks(laptop_voyage, laptop_copy, capsys, monkeypatch):
    from executor.api import plan_steps, run_steps

    v, prefix = laptop_voyage.module, laptop_copy
    monkeypatch.chdir(ROOT)
    config = v.VoyageConfig(laptop=True, ladder=True, ladder_tokens=0.1)
    _tok, tokenized, heldout = v.data_and_heldout(config)
    built = v.ladder_steps(config, tokenized, heldout)
    before = plan_steps(built.steps, prefix)
    assert before["tokenized/kjv"].state == "CACHED"  # the rungs share the laptop run's data steps
    _, summary = run_steps(built.steps, prefix, voyage="535b")
    assert summary.exit_code == 0, [(o.name, o.error) for o in summary.failed]
    plan = plan_steps(built.steps, prefix)
    store = Store(prefix)

    def read(name, file):
        return json.load(open(os.path.join(prefix, store.served_dir(plan[name].node.dirname), file)))

    verdict = read("ladder/check", "verdict.json")
    sealed = read("ladder/predict", "prediction.json")
    target = read("pretrain/ladder/9.5e11flops/s0", ".step.json")
    assert verdict["verdict"] in ("HIT", "MISS") and verdict["prediction"]["digest"] == sealed["digest"]
    assert sealed["sealed"]["sealed_at"] < target["attempts"][0]["started"]
    assert "the law at" in target["results"]["law"]["text"]
    ev = read("eval/ladder/9.5e11flops/s0", "results.json")
    assert verdict["landed"] == ev["loss"]

    card = open(os.path.join(prefix, store.served_dir(plan["card/ladder/9.5e11flops"].node.dirname), "MODEL_CARD.md")).read()
    assert f"**{verdict['line']}**" in card

    from executor.cli import main

    capsys.readouterr()
    assert main([VOYAGE, *FLAGS, "--prefix", prefix, "--lineage", "ladder/check"]) == 0
    assert verdict["line"] in capsys.readouterr().out
    assert main([VOYAGE, *FLAGS, "--prefix", prefix, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "prediction the 4 cached rungs would seal: " in out
    assert f"{sealed['sealed']['predicted']:.4f}" in out  # the same fit, deterministic
    assert " s\n" in out.split("scaling ladder")[1]  # the rungs' wall time measured here

"""The data plan (steps/data/budget.py): figures from declared tokens and measured rates, the
voyage's data steps sized from it, and a task that cannot fit a node is exit 2, one line."""

import importlib.util
import os
import sys

import pytest

from executor import VoyageError
from steps.data.budget import BYTES_PER_TOKEN, RATES, ZSTD_RATIO, CpuNodes, DataSource, format_data_plan, plan_data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
VOYAGE = os.path.join(ROOT, "voyages", "535b.py")


def test_figures_follow_from_tokens_and_rates():
    nodes = CpuNodes(10, 64, 256)
    plan = plan_data([DataSource("a", 1e12), DataSource("b", 1e11, group="a")], nodes, heldout_tokens=1e8)
    ingest = plan["raw/a"]
    assert ingest.tasks == 10_000  # 1e9 documents of 1k tokens, 100k a shard
    assert ingest.core_hours == pytest.approx(1e12 * BYTES_PER_TOKEN / RATES["ingest"].value / 3600)
    assert ingest.read_bytes == pytest.approx(1e12 * BYTES_PER_TOKEN / ZSTD_RATIO.value)
    # one dedup step for the group, over both sources' documents; pass 2: 29 sections x key ranges of 2^20
    dd = plan["dedup/a"]
    assert "pass 2 30,450 x" in dd.detail and dd.tasks > 30_450  # 29 x ceil(1.1e9 / 2^20)
    assert plan["tokenized/a"].written_bytes > 4e12  # uint32 tokens and int64 offsets
    assert plan["tokenized/a"].resources().cpus == 8 and plan["decontam/a"].resources().memory_gb > 2
    # wall: never faster than the cores a step can use at once
    t = plan["tokenized/a"]
    assert t.wall_hours == pytest.approx(t.core_hours / (10 * 8 * 8))
    assert "from: 1,000 tokens a document" in format_data_plan(plan)
    assert all(r.command.startswith(".venv/bin/python bench/") for r in RATES.values())


def test_a_task_that_cannot_fit_a_node_is_an_error_naming_it():
    with pytest.raises(VoyageError, match=r"data plan: a task of tokenized/a needs 8 CPUs and .* a CPU node has 4 cores"):
        plan_data([DataSource("a", 1e9)], CpuNodes(10, 4, 256))
    # the eval index of 2e8 held-out tokens (1.5e8 n-grams, 16 B each, twice while loading) does not fit 4 GiB
    with pytest.raises(VoyageError, match=r"a task of decontam/a needs 1 CPUs and 5.0 GiB, a CPU node has 64 cores and 4 GiB"):
        plan_data([DataSource("a", 1e9)], CpuNodes(10, 64, 4), heldout_tokens=2e8)


def test_the_voyage_sizes_its_data_steps_from_the_plan_and_exits_2_when_one_cannot_fit(capsys):
    from executor.cli import main

    spec = importlib.util.spec_from_file_location("voyage_535b_plan_test", VOYAGE)
    v535 = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = v535
    spec.loader.exec_module(v535)
    config = v535.VoyageConfig()
    plan = v535.data_plan_of(config)
    _tok, tokenized, heldout = v535.data_and_heldout(config)
    step = tokenized["nemotron-cc"]
    assert step.resources == plan.resources("tokenized/nemotron-cc")
    assert v535.FULL.data_resources is None  # no guessed figure left
    # dedup's tasks (not only the step) ask Ray for the plan's memory (its largest pass: pass 2's
    # chunk of each of ~100k runs), not DedupConfig's 1 GiB default
    from executor.dag import build_dag

    dedups = [n.step for n in build_dag(v535.voyage(config)) if n.step.type.name == "dedup"]
    assert dedups and all(s.config.task_memory_gb == plan.resources(s.name).memory_gb > 0.5 for s in dedups)
    code = main([VOYAGE, "--dry-run", "--prefix", "/nonexistent/never-written", "--data_node_memory_gb", "0.9"])
    # (lines a Ray worker of an earlier test still forwards to this process's stderr are not ours)
    err = "".join(line for line in capsys.readouterr().err.splitlines(keepends=True) if not line.startswith("\x1b[36m("))
    assert code == 2 and err.count("\n") == 1 and "data plan: a task of dedup/common-crawl needs" in err, err
    assert not os.path.exists("/nonexistent/never-written")


def test_the_decontam_rate_follows_the_eval_sides_size_and_says_how_it_is_known():
    from steps.data.budget import DECONTAM_RATES, decontam_rate

    (n0, r0), (n1, r1), (n2, r2) = DECONTAM_RATES
    assert decontam_rate(n1) == (pytest.approx(r1), "measured")
    mid, how = decontam_rate((n1 * n2) ** 0.5)
    assert how == "interpolated" and min(r1, r2) < mid < max(r1, r2)
    far, how = decontam_rate(1.5e8)
    assert how == "extrapolated" and far < r2  # past the largest measured size: slower still
    plan = plan_data([DataSource("a", 1e11)], CpuNodes(10, 64, 256), heldout_tokens=2e8)
    assert "extrapolated" in plan["decontam/a"].detail
    assert plan["decontam/a"].core_hours == pytest.approx(1e11 * BYTES_PER_TOKEN / far / 3600)


def test_the_plan_says_which_rates_are_measured_under_ray_in_one_process_or_extrapolated():
    from steps.data.budget import ONE_PROCESS, UNDER_RAY

    lines = {line.split()[0]: line for line in format_data_plan(plan_data([DataSource("a", 1e11)], CpuNodes(10, 64, 256),
                                                                          heldout_tokens=2e8)).splitlines()
             if line.strip()}
    for name in ("ingest", "dedup"):  # re-measured under Ray on documents of the plan's size
        assert UNDER_RAY in lines[name] and "bench/data_ray_rates.py" in lines[name], lines[name]
        assert RATES[name].basis == UNDER_RAY
    assert ONE_PROCESS in lines["tokenize"] and "bench/data_plan.py" in lines["tokenize"]
    assert os.path.exists(os.path.join(ROOT, "bench", "data_ray_rates.py"))
    assert lines["rates:"].strip() == ("rates: measured under Ray: ingest, dedup; measured in one process only: tokenize; "
                               "extrapolated: decontaminate in decontam/a (an eval side past the largest measured)")
    # an eval side between the measured sizes: nothing extrapolated, and the line says so
    text = format_data_plan(plan_data([DataSource("a", 1e11)], CpuNodes(10, 64, 256), heldout_tokens=3e6))
    last = text.splitlines()[-1]
    assert "extrapolated" not in last and last.endswith("decontaminate measured or interpolated in decontam/a"), last

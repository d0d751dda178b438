"""voyages/535b.py: the full plan with its budget, and the laptop rehearsal end to end."""

from executor.storage.store import Store  # outputs are read in their committed attempt
import collections
import glob
import importlib.util
import json
import os
import re
import shutil
import sys

import pytest

from steps.export.to_hf import hf_folder
from steps.moe.config import PRESETS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOYAGE = os.path.join(ROOT, "voyages", "535b.py")



@pytest.fixture(scope="module")
def v535():
    spec = importlib.util.spec_from_file_location("voyage_535b_under_test", VOYAGE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def shape(steps):
    """(kind of step, kinds of its inputs) for every step. The tokenizer is one kind: pinned from
    the hub at full scale (no inputs), trained on the deduplicated corpus on a laptop."""
    from executor.dag import build_dag

    dag = build_dag(steps)
    kind = {"pin_tokenizer": "tokenizer", "train_tokenizer": "tokenizer"}
    name = lambda n: kind.get(n.step.type.name, n.step.type.name)  # noqa: E731
    return {(name(n), frozenset(name(d) for d in n.deps) if name(n) != "tokenizer" else None)
            for n in dag}, dag


def test_full_plan_budget_mesh_and_unplaceable_steps(capsys, tmp_path):
    """The real CLI's dry-run of the full voyage: the budget by the trainer's FLOP formula, and
    the plan of the training step measured at its full size (704 ranks of a fake process group)."""
    from executor.cli import main

    code = main([VOYAGE, "--dry-run", "--prefix", str(tmp_path / "p")])
    out = capsys.readouterr().out
    assert code == 0
    # 8 sources x (ingest, decontaminate, tokenize) + 7 dedup steps (nemotron-cc and dclm-baseline
    # share one) + held-out ingest, tokenize + 7
    assert "plan of 40 steps" in out
    assert "533.8B total, 22.83B active" in out  # within 1% of 535.3B and 22.76B
    assert "18.75T = 15T pretrain + 3.75T midtrain (switch at 80%)" in out
    assert "11,264 x 4,096" in out and "406,395 optimizer steps" in out
    assert "138.14 GFLOP a token" in out and "= 2.59e+24" in out and "the trainer's MFU formula" in out
    pretrain_line = next(line for line in out.splitlines() if line.startswith("pretrain/535b-a23b"))
    assert "CANNOT BE PLACED" in pretrain_line and "704 x (32 cpu, 200 GiB, 1 gpu, GB200)" in pretrain_line
    # the plan: one 64-GPU expert mesh a rack, 8 GPUs a rack spare, figures measured
    assert "704 of 792 GPUs train on 11 racks (64 a rack, 8 a rack spare)" in out
    # kept rows at the 1.25 cap, NCCL's documented buffers and 5% of the target kept had ruled out
    # EP64 at micro-batch 1 (136 GiB, EP8 x efsdp 8 was chosen); with the router weights applied on
    # the expert side (the combine's output not kept) and the in-place reduce-scatter it fits again
    assert "dp_replicate 11 x dp_shard 64, expert-parallel EP64 inside a rack (6 experts a GPU)" in out
    assert "fake process group of 704 ranks" in out and "traced" in out
    assert "8.34B elements on the largest rank" in out
    # the data plan (steps/data/budget.py), each data step sized from it
    assert "data plan at full size, on 100 nodes of 64 cores and 256 GiB" in out
    assert re.search(r"tokenized/nemotron-cc +63,000 +8 cpu", out) and "(.venv/bin/python bench/data_plan.py" in out
    a2a = next(line for line in out.splitlines() if line.strip().startswith("expert all-to-all"))
    assert "ep 64" in a2a and "nvlink" in a2a and " TB " in a2a
    assert any("over 11 racks" in line and "network" in line for line in out.splitlines())  # the replicas
    assert ("16 micro-batches of 1; selective checkpointing; fp32 masters, grads and Adam sharded over the replicas "
            "(offload replicas)") in out
    saved = next(line for line in out.splitlines() if line.strip().startswith("router weights after w2: saved"))
    assert 17 < float(saved.split()[5]) < 19 and "not in the peak" in saved  # the combine's output, 48 blocks
    syncs = next(line for line in out.splitlines() if "host syncs of the expert dispatch (in the step)" in line)
    assert "1,536 a step" in syncs and "30 us of idle GPU each" in syncs
    peak = next(line for line in out.splitlines() if line.strip().startswith("peak "))
    assert " fits, " in peak and "under the 140 GiB target (at least 5% kept)" in peak and "anchor 137.9 GiB" in peak
    assert float(peak.split()[1]) < 0.95 * 140  # the memory target, with 5% kept
    share = float(re.search(r"GiB \(([\d.]+)%\) under the 140 GiB target", peak).group(1))
    assert share >= 5.0 and share == pytest.approx(100 * (140 - float(peak.split()[1])) / 140, abs=0.06)
    headroom = next(line for line in out.splitlines() if line.strip().startswith("expert-load headroom"))
    assert "1.25x the mean rows kept in every block" in headroom  # the margin is at the cap
    nccl = next(line for line in out.splitlines() if line.strip().startswith("NCCL buffers"))
    assert "all-to-all with 63 peers" in nccl and "NCCL's documented sizes" in nccl
    # the enforced target, the tolerated skew and the cross-rack sharding (or why not)
    assert "memory target 140 GiB a GPU (memory_target_gib), enforced; tolerated skew: dropless up to 1.25x" in out
    # the distributed optimizer across the 11 racks' replicas, nothing on the host
    cross = next(line for line in out.splitlines() if "the distributed optimizer across the 11 replicas" in line)
    assert cross.strip().startswith("chosen:") and "with the moments on the host instead" in cross
    assert any(line.strip().startswith("fp32 master weights") for line in out.splitlines())
    assert any(line.strip().startswith("replicas: all-gather (bf16 weights)") and "network" in line
               for line in out.splitlines())
    assert any(line.strip().startswith(name) for line in out.splitlines()
               for name in ("NCCL buffers", "allocator fragmentation reserve"))
    # the time target: the plan's step at the efficiency calibrated on the anchor's own configuration
    assert "against the anchor (17.0 s a step at 22.9% MFU by its own count, 21.3% by the trainer's" in out
    assert "efficiency while computing 37.9%, calibrated: the anchor's configuration through the same model" in out
    comparable = next(line for line in out.splitlines() if "this plan at that efficiency:" in line)
    step_s = float(comparable.split("efficiency: ")[1].split(" s a step")[0])
    assert step_s < 17.0 and "the anchor's 17.00 s" in comparable and "MFU over the step by the trainer's count" in comparable
    # the anchor under both readings of its unpublished checkpointing, side by side
    assert "the anchor's checkpointing is not published; both readings side by side" in out
    full = next(line for line in out.splitlines() if line.strip().startswith("full checkpointing, micro-batch 8"))
    sel = next(line for line in out.splitlines() if line.strip().startswith("selective checkpointing, micro-batch 1"))
    assert f"{step_s:.2f} s" in full and "37.9%" in full
    anchor_peak = {r: float(x.split("GiB")[0].split()[-1]) for r, x in (("full", full), ("selective", sel))}
    assert anchor_peak["full"] < anchor_peak["selective"]  # selective at 1 models nearer the published 137.9 GiB
    assert abs(anchor_peak["selective"] - 137.9) < abs(anchor_peak["full"] - 137.9)
    assert float(sel.split()[-1].rstrip("x")) > float(full.split()[-1].rstrip("x"))  # a harder anchor to beat
    assert "the fastest meshes under the 140 GiB target on 792 GPUs" in out
    assert f"406,395 steps x {step_s:.2f} s" in out and "days on 704 GB200 that train" in out
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("flags, message", [
    (["--gpus", "8"], "the step does not fit on 8 GPUs: its least-memory mesh (dp_replicate 1 x dp_shard 8 (EP8)"),
    (["--ep", "5"], "ep: 5 does not divide the model's 384 routed experts"),
    (["--dp_replicate", "12", "--dp_shard", "64"], "gpus: dp_replicate 12 x dp_shard 64 needs 12 racks"),
    (["--dp_replicate", "11", "--dp_shard", "64", "--ep", "64", "--microbatch", "16", "--checkpointing", "none",
      "--offload", "none"], "the step does not fit on 792 GPUs: the mesh asked for"),
    (["--offload", "cpu"], "offload must be one of ('none', 'moments', 'all', 'replicas') or auto, got 'cpu'"),
    (["--memory_target_gib", "200"], "memory_target_gib must lie in (0, 173.2]"),
    (["--efficiency", "1.5"], "efficiency must lie in [0, 1] (0: calibrated on the anchor), got 1.5"),
    (["--mfu", "0.9"], "mfu: the anchor's configuration cannot take"),
])
def test_a_step_that_does_not_divide_or_fit_exits_2(capsys, tmp_path, flags, message):
    from executor.cli import main

    code = main([VOYAGE, "--dry-run", "--prefix", str(tmp_path / "p"), *flags])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    line = captured.err.strip()
    assert "\n" not in line and message in line, line
    if "fit" in message:
        assert "GiB a GPU" in line and "GiB more than the memory target of 140 GiB" in line  # the memory it lacks
    assert not (tmp_path / "p").exists()


def test_help_lists_the_plan_flags(capsys):
    from executor.cli import main

    assert main([VOYAGE, "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--gpus", "--mfu", "--efficiency", "--dp_replicate", "--dp_shard", "--ep", "--microbatch",
                 "--checkpointing", "--offload", "--memory_target_gib"):
        assert flag in out, flag


def test_laptop_dry_run_plans_nothing_at_full_scale(tmp_path):
    """The laptop preset stays quick to plan: its dry-run builds no fake process group and
    imports neither torch nor Ray."""
    import subprocess

    code = ("import sys; from executor.cli import main; "
            f"rc = main([{VOYAGE!r}, '--dry-run', '--laptop', '--prefix', {str(tmp_path / 'p')!r}]); "
            "print('IMPORTED', [m for m in ('torch', 'ray') if m in sys.modules]); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "laptop rehearsal of the 535B voyage" in out.stdout and "IMPORTED []" in out.stdout
    assert "plan of the training step" not in out.stdout


def test_the_training_step_runs_the_planned_mesh(v535):
    from executor.dag import build_dag

    dag = build_dag(v535.voyage(v535.VoyageConfig()))
    pre = dag["pretrain/535b-a23b"].step
    trainer, parallel = pre.config.trainer, pre.config.trainer.parallel
    assert (parallel.dp_replicate, parallel.dp_shard, parallel.ep) == (11, 64, 64)  # EP64 (was EP8 x efsdp 8)
    assert trainer.workers == pre.resources.workers == 704 and trainer.microbatch in (1, 2)
    assert parallel.checkpointing in ("selective", "full") and parallel.offload == "replicas"
    # the trainer's own checks accept what the plan picked (whole sequences, ep inside a rack)
    parallel.validate(704, PRESETS["535b-a23b"], batch_size=11_264, microbatch=trainer.microbatch, ranks_per_rack=64)
    pinned = dict(ep=32, microbatch=1, checkpointing="full", offload="moments")  # Adam on the GPU no longer fits
    fixed = build_dag(v535.voyage(v535.VoyageConfig(**pinned)))
    assert fixed["pretrain/535b-a23b"].step.config.trainer.parallel.ep == 32
    assert fixed["pretrain/535b-a23b"].step.config.trainer.parallel.offload == "moments"
    # the mesh is run-only: the step's identity does not change with it
    assert fixed["pretrain/535b-a23b"].digest == dag["pretrain/535b-a23b"].digest
    # eval loads the 535B checkpoint sharded over one rack's expert mesh (2.14 TB of fp32 weights)
    ev = dag["eval/535b-a23b"].step
    assert ev.resources.workers == 64 and ev.resources.accelerator == "GB200"
    ev.config.parallel.validate(64, PRESETS["535b-a23b"])
    assert ev.config.parallel.resolve(64).ep == 64


def test_laptop_has_the_same_dag_shape(v535):
    full, full_dag = shape(v535.voyage(v535.VoyageConfig()))
    laptop, laptop_dag = shape(v535.voyage(v535.VoyageConfig(laptop=True)))
    assert full == laptop
    counts = collections.Counter(n.step.type.name for n in full_dag)
    # the two Common-Crawl sources are deduplicated together, the others one by one
    assert counts["decontaminate"] == len(v535.FULL_SOURCES) == counts["dedup"] + 1
    assert counts["ingest"] == counts["tokenize"] == len(v535.FULL_SOURCES) + 1  # and the held-out set
    mix = full_dag["mixture/535b"].step.config
    assert mix.token_budget == int(18.75e12) and mix.seq_len == 4096
    assert [round(s.fraction, 6) for s in mix.stages] == [0.8, 0.2]
    pre = full_dag["pretrain/535b-a23b"].step
    assert pre.config.data.batch_size == 11_264 and pre.resources.workers == 704
    assert pre.resources.accelerator == "GB200" and pre.config.model.preset == "535b-a23b"
    assert full_dag["tokenizer/llama3"].step.config.expect_vocab_size == 128_256


def test_sources_deduplicated_together_keep_their_own_licences_downstream(v535):
    """One dedup step covers several sources (Nemotron-CC and DCLM; kjv and pydocs), but each
    source's folder of its output holds that source's documents alone: decontamination and
    tokenization of one source are reached by its licence only (the plan's lineage, the records'
    provenance and `--lineage`), while the dedup step itself carries both."""
    from executor.dag import build_dag
    from executor.lineage import Lineage

    full = Lineage(build_dag(v535.voyage(v535.VoyageConfig())))
    pair = [full.licenses_of(f"decontam/{s}") for s in ("nemotron-cc", "dclm-baseline")]
    assert pair[0] != pair[1] and len(pair[0]) == len(pair[1]) == 1  # each its own, one licence
    assert full.licenses_of("dedup/common-crawl") == sorted(pair[0] + pair[1])
    # tokenized: its own source's and the hub tokenizer's licence (Llama 3.1), not Nemotron-CC's
    assert full.licenses_of("tokenized/dclm-baseline") == sorted(pair[1] + full.licenses_of("tokenizer/llama3"))
    laptop = Lineage(build_dag(v535.voyage(v535.VoyageConfig(laptop=True))))
    assert laptop.licenses_of("decontam/kjv") == ["public domain"]
    assert laptop.licenses_of("decontam/pydocs") == ["PSF-2.0"]
    # the laptop's tokenizer is trained on both sources' documents: it carries both, conservatively
    assert laptop.licenses_of("tokenized/kjv") == ["PSF-2.0", "public domain"]


def test_laptop_steps_shortens_only_the_laptop_rehearsal(v535):
    """The tests' shorter laptop run (`--laptop_steps`): the same DAG, batch and 80/20 split;
    refused without --laptop and below 10 steps."""
    from executor import VoyageError

    short = v535.scale_of(v535.VoyageConfig(laptop=True, laptop_steps=200))
    per_step = 32 * 65
    assert (short.pretrain_tokens / per_step, short.midtrain_tokens / per_step) == (160, 40)
    assert v535.scale_of(v535.VoyageConfig(laptop=True)) is v535.LAPTOP
    assert shape(v535.voyage(v535.VoyageConfig(laptop=True, laptop_steps=200)))[0] == \
        shape(v535.voyage(v535.VoyageConfig(laptop=True)))[0]
    for config, message in ((v535.VoyageConfig(laptop_steps=200), "laptop_steps: only with --laptop"),
                            (v535.VoyageConfig(laptop=True, laptop_steps=5), "laptop_steps: at least 10")):
        with pytest.raises(VoyageError, match=message):
            v535.voyage(config)


def test_laptop_voyage_end_to_end(laptop_voyage, laptop_copy, tmp_path, monkeypatch):
    """The session's laptop run (tests/conftest.py: `laptop_voyage`, shared with which-saw and the
    model card): it succeeds, learns, exports, and then plans cached, cuts off an identical
    rerun, and survives a copied prefix. The reruns and the move happen on a copy of its prefix
    (`laptop_copy`): other workers read the session's prefix meanwhile."""
    from executor.api import plan_steps, run_steps
    from executor.plan import Selection

    v535, config, prefix = laptop_voyage.module, laptop_voyage.config, laptop_voyage.prefix
    plan, summary = laptop_voyage.plan, laptop_voyage.summary
    monkeypatch.chdir(ROOT)  # the bundled corpus is named by repository-relative paths
    assert summary.exit_code == 0, [(o.name, o.error) for o in summary.failed]
    licences_and_tokens_are_recorded(laptop_voyage, prefix, plan)
    ev = plan.dag["eval/laptop"]
    results = json.load(open(os.path.join(prefix, Store(prefix).served_dir(ev.dirname), "results.json")))
    assert results["loss"] < 0.75 * results["unigram_loss"], results
    hf_folder_loads_and_scores(hf_folder(os.path.join(prefix, Store(prefix).served_dir(plan.dag["export/laptop"].dirname))),
                               tmp_path, monkeypatch)
    pages = list(glob.glob(os.path.join(prefix, "voyages", "535b", "*", "index.html")))
    assert pages, "the live page was not written"

    own = laptop_copy
    again = plan_steps(v535.voyage(config), own)
    assert again.counts() == {"CACHED": len(again.decisions)}
    # dedup is deterministic: a rerun makes identical bytes, so nothing downstream goes stale
    _, summary = run_steps(v535.voyage(config), own, Selection(rerun=("dedup/corpus",)))
    assert summary.outcomes["dedup/corpus"].state == "SUCCESS" and summary.stale_after == []
    after = plan_steps(v535.voyage(config), own)
    assert after.counts() == {"CACHED": len(after.decisions)}

    # the prefix copied elsewhere and the original moved away (so any read of it
    # fails): every step plans CACHED with the same output digests, and a rerun of a training step
    # reads only the copy. Midtrain, the shorter of the two: it reads pretrain's checkpoint and the
    # mixture, so both must come from the copy (pretrain's own rerun reads the mixture alone).
    copy, away = str(tmp_path / "copy" / "out"), str(tmp_path / "away")
    shutil.copytree(own, copy, symlinks=True)
    shutil.move(own, away)
    moved = plan_steps(v535.voyage(config), copy)
    assert moved.counts() == {"CACHED": len(moved.decisions)}
    digests = {d.name: d.status.output_digest for d in after.decisions}
    assert {d.name: d.status.output_digest for d in moved.decisions} == digests
    licences_and_tokens_are_recorded(laptop_voyage, copy, moved)
    _, summary = run_steps(v535.voyage(config), copy, Selection(rerun=("midtrain/laptop",)))
    assert summary.outcomes["midtrain/laptop"].state == "SUCCESS", summary.outcomes["midtrain/laptop"].error
    assert not os.path.exists(own)
    # item 11: the rerun wrote the same artifacts (timings are logs), so nothing downstream is stale
    assert summary.stale_after == []


def licences_and_tokens_are_recorded(lv, prefix, plan):
    """Both sources' licences reach every trained artifact, and the tokens each
    training step consumed per source and licence are the sampler's own choice of every sequence
    of the optimizer steps it trained (not the declared weights)."""
    from steps.data.mixture import MixtureSampler, load_mixture

    def record(name):
        return json.load(open(os.path.join(prefix, Store(prefix).served_dir(plan.dag[name].dirname), ".step.json")))

    sampler = MixtureSampler(load_mixture(os.path.join(prefix, Store(prefix).served_dir(plan.dag["mixture/laptop"].dirname))))
    B, switch, end = lv.batch_size, lv.pretrain_steps, lv.steps  # 32 sequences of 65 tokens a step
    assert (B, sampler.seq_len) == (32, 65) and 0 < switch < end
    for name, steps in (("pretrain/laptop", [0, switch]), ("midtrain/laptop", [switch, end])):
        tokens = record(name)["provenance"]["tokens"]
        assert tokens["steps"] == steps and tokens["sequences"] == [steps[0] * B, steps[1] * B]
        drawn = collections.Counter(sampler.locate(i).dataset for i in range(steps[0] * B, steps[1] * B))
        assert tokens["by_source"] == {
            "raw/kjv": {"sequences": drawn["kjv"], "tokens": 65 * drawn["kjv"], "license": "public domain"},
            "raw/pydocs": {"sequences": drawn["pydocs"], "tokens": 65 * drawn["pydocs"], "license": "PSF-2.0"}}
        assert sum(v["tokens"] for v in tokens["by_license"].values()) == 65 * B * (steps[1] - steps[0])
    # eval also reads the held-out passages; decontamination read them too, but put none of their
    # text in training, so their licence reaches eval and not the exported model
    assert record("eval/laptop")["provenance"]["licenses"] == ["KJV and Python docs excerpts", "PSF-2.0", "public domain"]
    assert record("export/laptop")["provenance"]["licenses"] == ["PSF-2.0", "public domain"]
    for name in ("eval/laptop", "export/laptop"):
        assert record(name)["environment"]["packages"]["torch"]


def hf_folder_loads_and_scores(folder, tmp_path, monkeypatch):
    """The voyage's Hugging Face folder loads with transformers, generates, and lm-eval's own `hf`
    model scores it on a local task (the export itself is tested in tests/steps/export)."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))  # read when transformers is imported
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steps.eval.harness_hf import run_hf_tasks
    from steps.eval.evaluate import HarnessConfig

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)  # config.json names remote code
    out = model.generate(**tok("And God said", return_tensors="pt"), max_new_tokens=20, min_new_tokens=20)
    assert out.shape[1] == len(tok("And God said").input_ids) + 20
    (tmp_path / "tasks").mkdir()
    (tmp_path / "verses.jsonl").write_text(json.dumps({"text": "The LORD is my shepherd; I shall not want."}) + "\n")
    (tmp_path / "tasks" / "verses.yaml").write_text(
        "task: verses\ndataset_path: json\ndataset_kwargs: {data_files: {test: %s}}\ntest_split: test\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list: [{metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}]\n"
        % (tmp_path / "verses.jsonl"))
    for k, v in {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf-cache")}.items():
        monkeypatch.setenv(k, v)
    got = run_hf_tasks(folder, HarnessConfig(tasks=("verses",), include_path=str(tmp_path / "tasks")), "cpu", 4)
    assert 0 < got["verses"]["bits_per_byte,none"] < 8


def test_the_full_ladder_is_under_one_percent_and_the_run_takes_the_prediction(v535, capsys, tmp_path):
    """The full voyage's ladder (docs/ladder.md): its rungs cost under 1% of the 535B run's
    compute (the dry-run prints their GPU-hours); the run itself is the target, taking the
    sealed prediction (its identity includes it: another ladder, another run) and its card the
    check; `--size` plans the same DAG as the full run."""
    from executor.cli import main
    from executor.dag import build_dag

    plain = build_dag(v535.voyage(v535.VoyageConfig()))
    dag = build_dag(v535.voyage(v535.VoyageConfig(ladder=True)))
    assert "ladder/predict" in {d.name for d in dag["pretrain/535b-a23b"].deps}
    assert "ladder/check" in {d.name for d in dag["card/535b-a23b"].deps}
    run = "pretrain/535b-a23b"
    assert dag[run].digest != plain[run].digest
    assert build_dag(v535.voyage(v535.VoyageConfig(ladder=True, ladder_floor=1.5)))[run].digest != dag[run].digest
    assert {n.name: n.digest for n in plain if n.name.startswith(("raw/", "tokenized/", "mixture/"))} == \
        {n.name: n.digest for n in dag if n.name.startswith(("raw/", "tokenized/", "mixture/"))}
    kinds = lambda d: {(n.step.type.name, frozenset(x.step.type.name for x in n.deps)) for n in d}  # noqa: E731
    assert kinds(build_dag(v535.voyage(v535.VoyageConfig(size="1b")))) == kinds(plain)
    assert main([VOYAGE, "--ladder", "--dry-run", "--prefix", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    share = next(line for line in out.splitlines() if line.strip().startswith("the ladder:"))
    assert "of the 535B run's 2.59e+24" in share and "GPU-hours" in share
    assert float(share.split("FLOPs, ")[1].split("%")[0]) < 1.0
    assert "nothing to seal yet" in out and "1.6e22flops" in out
    assert main([VOYAGE, "--ladder", "--ladder_rungs", "1e20flops,1e21flops,1e26flops", "--dry-run", "--prefix",
                 str(tmp_path / "p")]) == 2
    assert "the target's compute 2.59e+24 does not exceed the top fitted rung's" in capsys.readouterr().err

"""Lineage from the DAG (executor.lineage) and licence policies checked when the plan is made:
which sources reach each step, a refused voyage exits 2 before anything runs with one line naming
the source, the licence and the path; --lineage and --consumers through the real CLI."""

import os
import re
import textwrap
from dataclasses import dataclass

import sys

import pytest

from kits.vizkit import run_inline  # noqa: E402

from executor import License, LicensePolicy, Step, VoyageError, output_of, plan_steps, step_type
from executor.cli import main
from executor.dag import build_dag
from executor.lineage import Lineage
from executor.licenses import NOASSERTION

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOYAGE_535B = os.path.join(ROOT, "voyages", "535b.py")
OPEN = LicensePolicy.open_only()
NVIDIA = License("NVIDIA data agreement", url="https://example.org/nvidia")


@dataclass(frozen=True)
class Raw:
    text: str
    license: License | None = None


@dataclass(frozen=True)
class Use:
    inputs: tuple = ()


@step_type(version="1", name="lineage_test_raw")
def raw(config: Raw, ctx) -> None:
    """A source."""
    with ctx.open("text.txt", "w") as f:
        f.write(config.text)


@step_type(version="1", name="lineage_test_use")
def use(config: Use, ctx) -> None:
    """Reads its inputs."""
    with ctx.open("n.txt", "w") as f:
        f.write(str(len(config.inputs)))


def voyage(release_policy=None, web_license=NVIDIA):
    """web (NVIDIA) and wiki (CC-BY-SA) and an undeclared source, mixed, trained, released."""
    web = Step("raw/web", raw, Raw("w", web_license))
    wiki = Step("raw/wiki", raw, Raw("k", License("cc-by-sa-4.0")))
    mystery = Step("raw/mystery", raw, Raw("m"))
    plain = Step("plain/gen", use, Use())  # makes its own data: no source
    mix = Step("mix", use, Use((output_of(web), output_of(wiki))))
    side = Step("side", use, Use((output_of(mystery), output_of(plain))))
    train = Step("train", use, Use((output_of(mix),)))
    release = Step("release", use, Use((output_of(train),)), licenses=release_policy)
    wiki_only = Step("wiki-model", use, Use((output_of(wiki), output_of(plain))), licenses=OPEN)
    return [release, side, wiki_only]


def test_sources_reach_every_step_downstream_and_sets_are_shared():
    lin = Lineage(build_dag(voyage()))
    assert lin.sources_of("release") == {"raw/web": NVIDIA, "raw/wiki": License("CC-BY-SA-4.0")}
    assert lin.licenses_of("release") == ["CC-BY-SA-4.0", "NVIDIA data agreement"]
    assert lin.sources_of("side") == {"raw/mystery": NOASSERTION}  # declared nothing: NOASSERTION
    assert lin.sources_of("plain/gen") == {}
    assert lin.sources == ["raw/web", "raw/wiki", "raw/mystery"]  # bit k: the k-th source in DAG order
    assert lin.mask["train"] == lin.mask["mix"] == lin.mask["release"] == 0b011 and lin.mask["side"] == 0b100
    assert lin.reaches("raw/wiki", "release") and not lin.reaches("raw/wiki", "side")
    assert lin.path("raw/web", "release") == ("raw/web", "mix", "train", "release")
    assert lin.record_of("raw/wiki") == {"sources": {"raw/wiki": {"id": "CC-BY-SA-4.0", "url": "", "spdx": True}},
                                         "licenses": ["CC-BY-SA-4.0"]}


def test_a_policy_on_one_step_binds_only_that_step(tmp_path):
    # wiki-model allows open licences only, and only wiki reaches it: the plan holds
    plan = plan_steps(voyage(), str(tmp_path / "p"))
    assert [(s, p.describe()) for s, p in plan.lineage.policies()] == [("wiki-model", "open licences only")]
    # the release refuses the NVIDIA source, one line: step, policy, source, licence, path
    with pytest.raises(VoyageError) as e:
        plan_steps(voyage(OPEN), str(tmp_path / "p"))
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith("licence policy of step 'release' (open licences only): source 'raw/web' under "
                           "'NVIDIA data agreement <https://example.org/nvidia>' reaches it via "
                           "raw/web -> mix -> train -> release")
    assert not (tmp_path / "p").exists()


def test_a_voyage_wide_policy_binds_every_step_and_refuses_an_undeclared_licence(tmp_path):
    with pytest.raises(VoyageError, match=r"step 'raw/web' \(open licences only\): source 'raw/web'"):
        plan_steps(voyage(), str(tmp_path / "p"), policy=OPEN)
    nvidia = License("NVIDIA data agreement", url="https://example.org/nvidia")
    lenient = LicensePolicy(allow=(nvidia, "CC-BY-SA-4.0"), name="web and wiki")
    with pytest.raises(VoyageError, match=r"step 'raw/mystery' \(web and wiki\): source 'raw/mystery' under "
                                          r"'NOASSERTION'"):
        plan_steps(voyage(), str(tmp_path / "p"), policy=lenient)
    ok = LicensePolicy(allow=(nvidia, "CC-BY-SA-4.0", "NOASSERTION"))
    assert plan_steps(voyage(), str(tmp_path / "p"), policy=ok).counts() == {"RUN": 9}


def _write_voyage(tmp_path, body):
    path = tmp_path / "v.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_the_nvidia_source_routed_into_an_open_only_step_exits_2_before_anything_runs(tmp_path, capsys):
    """The full voyage's own sources and data steps (voyages/535b.py), the
    Nemotron-CC source under the NVIDIA data agreement, mixed and trained into a checkpoint that
    allows only open licences: the real CLI, a real run (not --dry-run), exit 2, one line,
    nothing written."""
    path = _write_voyage(tmp_path, f"""
        import importlib.util
        import sys
        from dataclasses import dataclass

        from executor import LicensePolicy, Step, output_of
        from steps.train.config import DataConfig, ModelSpec, TrainConfig
        from steps.train.pretrain import pretrain

        spec = importlib.util.spec_from_file_location("v535_policy_probe", {VOYAGE_535B!r})
        v535 = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(v535)

        @dataclass(frozen=True)
        class Config:
            open_only: bool = True

        def voyage(config: Config):
            full = v535.VoyageConfig()
            _tok, tokenized = v535.data_steps(full)
            mix = v535.mixture_step(full, tokenized, 18.75e12)
            policy = LicensePolicy.open_only() if config.open_only else None
            return [Step("pretrain/public", pretrain,
                         TrainConfig(data=DataConfig(mixture=output_of(mix), batch_size=11264),
                                     model=ModelSpec("tiny")), licenses=policy)]
        """)
    prefix = tmp_path / "out"
    code = main([path, "--prefix", str(prefix)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert ("licence policy of step 'pretrain/public' (open licences only): source 'raw/nemotron-cc' under "
            "'NVIDIA data agreement <https://data.commoncrawl.org/contrib/Nemotron/Nemotron-CC/index.html>' "
            "reaches it via raw/nemotron-cc -> dedup/common-crawl -> decontam/nemotron-cc -> tokenized/nemotron-cc -> mixture/535b -> "
            "pretrain/public") in err
    assert "other sources: tokenizer/llama3 (Llama 3.1 Community License)" in err
    assert not prefix.exists()
    # without the policy the same voyage plans (and would run)
    assert main([path, "--prefix", str(prefix), "--dry-run", "--open_only", "false"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  NVIDIA data agreement +raw/nemotron-cc <https://data.commoncrawl.org", out, re.M)
    assert re.search(r"^  CC-BY-SA-4.0 +raw/wikipedia, raw/stackexchange$", out, re.M)


def test_a_voyage_file_declares_a_policy_for_all_its_steps(tmp_path, capsys):
    path = _write_voyage(tmp_path, """
        from dataclasses import dataclass
        from executor import License, LicensePolicy, Step
        import tests.executor.test_lineage as t

        @dataclass(frozen=True)
        class Config:
            strict: bool = False

        def voyage(config: Config):
            return [Step("raw/a", t.raw, t.Raw("a", License("MIT"))), Step("raw/b", t.raw, t.Raw("b"))]

        def license_policy(config: Config):
            return LicensePolicy(allow=("MIT",), name="MIT only") if config.strict else None
        """)
    assert main([path, "--prefix", str(tmp_path / "o"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "licences: 2 sources under 2 licences" in out and "NOASSERTION  raw/b (none declared)" in out
    assert main([path, "--prefix", str(tmp_path / "o"), "--strict"]) == 2
    err = capsys.readouterr().err
    assert "licence policy of step 'raw/b' (MIT only): source 'raw/b' under 'NOASSERTION'" in err


def test_lineage_and_consumers_through_the_cli(tmp_path, capsys):
    path = _write_voyage(tmp_path, """
        from dataclasses import dataclass
        import tests.executor.test_lineage as t

        @dataclass(frozen=True)
        class Config:
            x: int = 0

        def voyage(config: Config):
            return t.voyage()
        """)
    prefix = str(tmp_path / "o")
    plan, summary = run_inline(voyage()[:1], prefix)  # release and what it needs
    assert summary.exit_code == 0
    assert main([path, "--prefix", prefix, "--lineage", "release"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "lineage of release: 4 upstream steps, 2 sources (CC-BY-SA-4.0, NVIDIA data agreement)"
    assert lines[1] == "release  CACHED  licences CC-BY-SA-4.0, NVIDIA data agreement"
    assert any(line.endswith("raw/web  CACHED  SOURCE under NVIDIA data agreement <https://example.org/nvidia>")
               for line in lines)
    assert main([path, "--prefix", prefix, "--consumers", "raw/wiki"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "consumers of raw/wiki: 4 steps built from it (CACHED 3, RUN 1)"
    assert out[1:] == ["raw/wiki  CACHED", "├── mix  CACHED", "│   └── train  CACHED", "│       └── release  CACHED",
                       "└── wiki-model  RUN"]
    assert main([path, "--prefix", prefix, "--consumers", "raw/wik"]) == 2
    assert "--consumers: no step named 'raw/wik' in this voyage (closest: raw/wiki" in capsys.readouterr().err


def test_drawings_name_a_sources_licence_and_a_steps_policy(tmp_path):
    from executor.views.viz import graph, text

    plan = plan_steps(voyage(), str(tmp_path / "p"))
    drawing = graph.draw(plan, records=False)
    by_name = {s["name"]: s for s in drawing.steps}
    assert by_name["raw/web"]["source"] == NVIDIA.to_json()
    assert by_name["train"]["licenses"] == ["CC-BY-SA-4.0", "NVIDIA data agreement"]
    assert by_name["wiki-model"]["policy"] == "open licences only" and "policy" not in by_name["train"]
    dot, mmd = text.to_dot(drawing), text.to_mermaid(drawing)
    for out in (dot, mmd):
        assert "licence: NVIDIA data agreement" in out and "policy: open licences only" in out


def test_a_string_where_a_licence_belongs_is_refused_naming_the_step(tmp_path):
    with pytest.raises(VoyageError, match=r"step 'raw/s' \(.*test_lineage.py:\d+\): config.license: 'MIT' is not a "
                                          r"License"):
        plan_steps([Step("raw/s", raw, Raw("s", "MIT"))], str(tmp_path / "p"))


def test_a_reference_to_figures_only_carries_no_licence_and_keeps_the_digest():
    """An eval read for its figures (`output_of(ev, data=False)`, as a model card reads eval's
    results): the eval set's licence does not reach the card, the training data's still does
    through its own edge, a policy is checked the same way, and the flag is not in the digest."""
    train = Step("raw/train", raw, Raw("t", License("MIT")))
    held = Step("raw/held", raw, Raw("h", NVIDIA))
    model = Step("model", use, Use((output_of(train),)))
    ev = Step("eval", use, Use((output_of(model), output_of(held))))
    card = Step("card", use, Use((output_of(model), output_of(ev, data=False))), licenses=OPEN)
    lineage = Lineage(build_dag([card]))
    assert lineage.licenses_of("eval") == ["MIT", NVIDIA.id]
    assert lineage.licenses_of("card") == ["MIT"]
    lineage.check()  # NVIDIA's data never reaches the card: nothing refused
    with_data = Step("card", use, Use((output_of(model), output_of(ev))), licenses=OPEN)
    with pytest.raises(VoyageError, match=r"'raw/held' under .* reaches it via raw/held -> eval -> card"):
        Lineage(build_dag([with_data])).check()
    assert build_dag([card]).by_name["card"].digest == build_dag([with_data]).by_name["card"].digest


@dataclass(frozen=True)
class Split:
    parts: dict


@step_type(version="1", name="lineage_test_split", partitions=lambda config: config.parts)
def split(config: Split, ctx) -> None:
    """Keeps each input in a folder of its own (as dedup of several sources does)."""


def test_a_folder_of_a_partitioned_output_carries_only_its_own_inputs_licences():
    """Dedup of several sources keeps each source's documents in `SOURCE/`: a step reading
    `output_of(dedup, "web")` is reached by web's licence alone. The whole output, and a folder
    the step type does not name, carry every input's; a licence that arrives another way (a
    tokenizer trained on the other folder) still arrives, and the path names that way."""
    web = Step("raw/web", raw, Raw("w", NVIDIA))
    wiki = Step("raw/wiki", raw, Raw("k", License("cc-by-sa-4.0")))
    both = Step("dedup", split, Split({"web": output_of(web), "wiki": output_of(wiki)}))
    only_wiki = Step("wiki/clean", use, Use((output_of(both, "wiki"),)))
    deep = Step("wiki/deep", use, Use((output_of(both, "wiki/documents/00000.jsonl"),)))
    root = Step("report", use, Use((output_of(both),)))
    other = Step("other", use, Use((output_of(both, "duplicates.npy"),)))
    tok = Step("tokenizer", use, Use((output_of(both, "web"),)))
    via_tok = Step("wiki/tokens", use, Use((output_of(both, "wiki"), output_of(tok))))
    lin = Lineage(build_dag([web, wiki, both, only_wiki, deep, root, other, tok, via_tok]))
    assert lin.licenses_of("wiki/clean") == lin.licenses_of("wiki/deep") == ["CC-BY-SA-4.0"]
    assert lin.licenses_of("tokenizer") == ["NVIDIA data agreement"]
    assert lin.licenses_of("report") == lin.licenses_of("other") == lin.licenses_of("dedup") == \
        ["CC-BY-SA-4.0", "NVIDIA data agreement"]
    assert not lin.reaches("raw/web", "wiki/clean") and lin.reaches("raw/web", "wiki/tokens")
    assert lin.path("raw/web", "wiki/tokens") == ("raw/web", "dedup", "tokenizer", "wiki/tokens")

    # A policy that refuses web's licence: the wiki folder's reader passes; the whole output's
    # reader, and the one that also reads the tokenizer, are refused, each naming its path
    reads = {"wiki/clean": (output_of(both, "wiki"),), "report": (output_of(both),),
             "wiki/tokens": (output_of(both, "wiki"), output_of(tok))}
    paths = {"report": "raw/web -> dedup -> report", "wiki/tokens": "raw/web -> dedup -> tokenizer -> wiki/tokens"}
    for name, inputs in reads.items():
        lineage = Lineage(build_dag([web, wiki, both, tok, Step(name, use, Use(inputs), licenses=OPEN)]))
        if name not in paths:
            lineage.check()
            continue
        with pytest.raises(VoyageError, match=re.escape(f"source 'raw/web' under 'NVIDIA data agreement "
                                                        f"<https://example.org/nvidia>' reaches it via {paths[name]}")):
            lineage.check()


def test_a_partitions_function_that_fails_is_one_line_naming_the_step():
    @step_type(version="1", name="lineage_test_bad_split", partitions=lambda config: config.missing)
    def bad(config: Split, ctx) -> None:
        """partitions() reads a field the config does not have."""

    web = Step("raw/web", raw, Raw("w", NVIDIA))
    with pytest.raises(VoyageError, match=r"step 'b' \(.*\): its type's partitions\(\) failed: AttributeError"):
        Lineage(build_dag([web, Step("b", bad, Split({"web": output_of(web)}))]))

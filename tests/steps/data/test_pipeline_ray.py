"""The data steps end to end through the executor on a real local Ray: ingest -> tokenizer ->
dedup -> tokenize -> staged mixture, then everything cached on a second run."""

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from executor import Step, output_of  # noqa: E402
from executor.api import run_steps  # noqa: E402
from steps.dedup.dedup import DedupConfig, dedup  # noqa: E402
from steps.data.formats import TokenDataset  # noqa: E402
from steps.data.ingest import IngestConfig, ingest  # noqa: E402
from steps.data.mixture import MixtureConfig, MixtureSampler, MixtureStage, mixture  # noqa: E402
from steps.data.tokenize import TokenizeConfig, tokenize  # noqa: E402
from steps.data.tokenizer import TrainTokenizerConfig, train_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def local_ray(ray_local):
    """The session's embedded Ray (a process joins one Ray at a time)."""
    yield ray_local


def _voyage(corpus: str) -> list[Step]:
    kjv = Step("raw/kjv", ingest, IngestConfig(input=f"{corpus}/kjv.jsonl.zst", max_docs_per_shard=500))
    py = Step("raw/pydocs", ingest, IngestConfig(input=f"{corpus}/pydocs.jsonl.zst"))
    tok = Step("tokenizer", train_tokenizer, TrainTokenizerConfig(documents=output_of(kjv), vocab_size=512,
                                                                  max_documents=150))
    py_dedup = Step("dedup/pydocs", dedup, DedupConfig(documents=output_of(py)))
    tok_kjv = Step("tokens/kjv", tokenize, TokenizeConfig(documents=output_of(kjv), tokenizer=output_of(tok),
                                                          bos=None, eos="<|eos|>"))
    tok_py = Step("tokens/pydocs", tokenize, TokenizeConfig(documents=output_of(py_dedup), tokenizer=output_of(tok),
                                                            bos=None, eos="<|eos|>"))
    mix = Step("mixture", mixture, MixtureConfig(
        datasets={"kjv": output_of(tok_kjv), "pydocs": output_of(tok_py)}, token_budget=512 * 3000, seq_len=512,
        stages=(MixtureStage(0.8, {"kjv": 0.7, "pydocs": 0.3}), MixtureStage(0.2, {"pydocs": 1.0}))))
    return [mix]


def test_data_voyage_runs_on_ray_and_caches(local_ray, tmp_path):
    import pathlib

    corpus = str(pathlib.Path(__file__).resolve().parents[3] / "data/corpus")
    plan, summary = run_steps(_voyage(corpus), prefix=str(tmp_path / "prefix"))
    assert summary.exit_code == 0, [(o.name, o.error) for o in summary.failed]
    out = {d.name: plan.path(d.node) for d in plan.decisions}
    assert len(out) == 7
    sampler = MixtureSampler(out["mixture"])
    assert len(sampler) == 3000 and sampler.locate(2999).dataset == "pydocs"
    seq = sampler.sequence(123)
    assert seq.dtype == np.uint16 and seq.size == 512 and seq.max() < 512
    kjv = TokenDataset(out["tokens/kjv"])
    assert kjv.num_documents == 1189 and len(kjv.shards) == 3

    plan2, summary2 = run_steps(_voyage(corpus), prefix=str(tmp_path / "prefix"))
    assert not plan2.to_run() and summary2.exit_code == 0

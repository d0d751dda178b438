"""executor.testing: a step function called with a context of our making, and a plan carried out
in this process through the real runner and worker."""

import hashlib
import json
from dataclasses import dataclass

import pytest

from executor import Step, VoyageError, step_type
from executor.testing import build_context, run_inline


@dataclass(frozen=True)
class Shout:
    word: str


@step_type(version="1")
def shout(config: Shout, ctx) -> None:
    with ctx.open("out.txt", "w") as f:
        f.write(config.word.upper())


def test_build_context_gives_a_step_its_own_folder(tmp_path):
    ctx = build_context(tmp_path / "out", name="words/shout")
    assert ctx.digest == hashlib.sha256(b"words/shout").hexdigest() and len(ctx.digest) == 64
    shout.fn(Shout("ahoy"), ctx)
    assert (tmp_path / "out" / "out.txt").read_text() == "AHOY"
    with pytest.raises(VoyageError):  # still the real context: nothing may leave the folder
        ctx.path("..", "elsewhere.txt")


def test_build_context_takes_any_field_of_the_context(tmp_path):
    ctx = build_context(str(tmp_path / "out"), name="s", digest="0" * 64, attempt=3, resumable=True)
    assert (ctx.digest, ctx.attempt, ctx.resumable) == ("0" * 64, 3, True)


def test_run_inline_commits_through_the_real_worker_and_caches(tmp_path):
    steps = [Step("words/shout", shout, Shout("ahoy"))]
    plan, summary = run_inline(steps, str(tmp_path / "p"))
    assert [d.state for d in plan.decisions] == ["RUN"] and summary.exit_code == 0
    status = json.loads(next((tmp_path / "p").glob("words/shout-*/.status")).read_text())
    assert status["state"] == "SUCCESS"
    plan, summary = run_inline(steps, str(tmp_path / "p"))
    assert [d.state for d in plan.decisions] == ["CACHED"]

"""Store I/O of the per-shard data steps (steps/data/shard_io.py): the step's own store requests do
not grow with the shard count, transient errors are retried with bounded backoff, a shard that
keeps failing is quarantined up to a threshold and named, past it the step fails naming them.

The store is a real fsspec memory filesystem behind a wrapper that counts every request and can
fail chosen ones, as an object store's transient errors do."""

import json

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

import steps.data.shard_io as shard_io
from executor import VoyageError
from executor.testing import build_context
from steps.data.formats import read_json
from steps.data.ingest import IngestConfig, ingest
from steps.data.shard_io import Backoff, ShardsFailed, TransientStoreError, is_transient, retry


class CountingFS(MemoryFileSystem):
    """memory:// under another protocol, counting requests (method, path) and failing the
    `_open` of chosen paths a given number of times."""

    protocol = ("counted",)
    calls: list = []
    batches: list = []
    paused = False
    faults: dict = {}  # path substring -> times left to fail

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, str) and path.startswith("counted://"):
            path = path[len("counted://"):]
        return super()._strip_protocol(path)

    def _count(self, method, path):
        if not CountingFS.paused:
            CountingFS.calls.append((method, self._strip_protocol(path)))

    def ls(self, path, detail=True, **kw):
        self._count("ls", path)
        return super().ls(path, detail=detail, **kw)

    def info(self, path, **kw):
        self._count("info", path)
        return super().info(path, **kw)

    def find(self, path, *a, **kw):
        self._count("find", path)
        return super().find(path, *a, **kw)

    def cat_file(self, path, *a, **kw):
        self._count("cat_file", path)
        return super().cat_file(path, *a, **kw)

    def cat(self, path, *a, **kw):
        if isinstance(path, list) and not CountingFS.paused:
            CountingFS.batches.append(len(path))
        return super().cat(path, *a, **kw)

    def pipe_file(self, path, *a, **kw):
        self._count("pipe_file", path)
        return super().pipe_file(path, *a, **kw)

    def _open(self, path, mode="rb", *a, **kw):
        self._count("open", path)
        for part, left in CountingFS.faults.items():
            if part in path and left > 0 and "r" in mode:
                CountingFS.faults[part] = left - 1
                raise TransientStoreError(f"503 Service Unavailable: {path}")
        return super()._open(path, mode, *a, **kw)


fsspec.register_implementation("counted", CountingFS, clobber=True)


def quiet_map(fn, items, resources=None):
    """Run the tasks in this process without counting them: what is left is the step's own."""
    CountingFS.paused = True
    try:
        return [fn(item) for item in items]
    finally:
        CountingFS.paused = False


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    CountingFS.calls, CountingFS.batches, CountingFS.faults, CountingFS.paused = [], [], {}, False
    monkeypatch.setattr(shard_io, "DEFAULT_BACKOFF", Backoff(attempts=4, first_s=0.001, max_s=0.004))
    yield


def _corpus(name: str, files: int) -> str:
    fs = CountingFS()
    for k in range(files):
        fs.pipe_file(f"/{name}/raw/{k:02d}.jsonl",
                     "".join(json.dumps({"id": f"{k}-{i}", "text": f"file {k} doc {i}"}) + "\n" for i in range(3)).encode())
    CountingFS.calls.clear()
    return f"counted://{name}/raw"


def _run(name: str, files: int, **config):
    raw = _corpus(name, files)
    ctx = build_context(f"counted://{name}/out", name="raw", digest="0" * 64, mapper=quiet_map)
    ingest(IngestConfig(input=raw, **config), ctx)
    return ctx


def test_the_steps_own_requests_do_not_grow_with_the_shard_count():
    counts = {}
    for n in (4, 16):
        ctx = _run(f"grow{n}", n)
        assert ctx.results["documents"] == 3 * n
        counts[n] = len(CountingFS.calls)
        ledger_calls = [c for c in CountingFS.calls if "/ledger" in c[1]]
        assert ledger_calls == [("ls", f"/grow{n}/out/ledger")]  # one listing, no request per shard
    assert counts[4] == counts[16], counts


def test_a_resumed_step_reads_the_earlier_ledgers_in_one_batch():
    CountingFS.faults = {"/resume/raw/03.jsonl": 10**6}  # one input never opens: the run fails
    with pytest.raises(ShardsFailed):
        _run("resume", 8)
    CountingFS.faults = {}
    CountingFS.calls.clear()
    ctx = build_context("counted://resume/out", name="raw", digest="0" * 64, mapper=quiet_map)
    ingest(IngestConfig(input="counted://resume/raw"), ctx)
    assert ctx.results["documents"] == 24 and "quarantined" not in ctx.results
    ledger_calls = [c for c in CountingFS.calls if "/ledger" in c[1]]
    assert ledger_calls[0] == ("ls", "/resume/out/ledger")
    assert CountingFS.batches == [7]  # the 7 ledgers of the first run, in one batched read
    assert {m for m, _ in ledger_calls[1:]} == {"cat_file"} and len(ledger_calls) == 8


def test_transient_errors_are_retried_and_leave_no_trace():
    CountingFS.faults = {"/flaky/raw/01.jsonl": 2}
    ctx = _run("flaky", 4)
    assert ctx.results["documents"] == 12 and "quarantined" not in ctx.results
    assert CountingFS.faults["/flaky/raw/01.jsonl"] == 0
    assert "quarantined" not in read_json("counted://flaky/out/manifest.json")


def test_a_shard_that_keeps_failing_is_quarantined_and_named_then_redone():
    CountingFS.faults = {"/quar/raw/02.jsonl": 10**6}
    CountingFS.paused = False
    opens = []
    real_open = CountingFS._open

    def spy(self, path, mode="rb", *a, **kw):
        if "/quar/raw/02.jsonl" in path and "r" in mode:
            opens.append(path)
        return real_open(self, path, mode, *a, **kw)

    CountingFS._open = spy
    try:
        ctx = _run("quar", 4, max_quarantine_share=0.25)
    finally:
        CountingFS._open = real_open
    assert len(opens) == shard_io.DEFAULT_BACKOFF.attempts  # retried, boundedly
    [q] = ctx.results["quarantined"]
    assert q["shard"] == "counted:///quar/raw/02.jsonl" and q["index"] == 2 and "TransientStoreError: 503" in q["error"]
    manifest = read_json("counted://quar/out/manifest.json")
    assert manifest["quarantined"] == [q] and manifest["documents"] == 9 == ctx.results["documents"]
    assert not CountingFS().exists("/quar/out/ledger/00002.json")
    # the store heals: the next attempt does the quarantined shard and nothing else
    CountingFS.faults = {}
    ctx = build_context("counted://quar/out", name="raw", digest="0" * 64, mapper=quiet_map)
    ingest(IngestConfig(input="counted://quar/raw", max_quarantine_share=0.25), ctx)
    assert ctx.results["documents"] == 12 and "quarantined" not in ctx.results


def test_past_the_threshold_the_step_fails_naming_the_shards():
    CountingFS.faults = {"/many/raw/01.jsonl": 10**6, "/many/raw/03.jsonl": 10**6}
    with pytest.raises(ShardsFailed) as e:
        _run("many", 4, max_quarantine_share=0.25)
    text = str(e.value)
    assert "ingest: 2 of 4 shards failed, more than max_quarantine_share 0.25 allows (1)" in text
    assert "01.jsonl (TransientStoreError: 503" in text and "03.jsonl (TransientStoreError" in text
    assert not CountingFS().exists("/many/out/manifest.json")
    with pytest.raises(VoyageError, match="max_quarantine_share"):
        IngestConfig(input="x", max_quarantine_share=2.0)


def test_what_is_transient_and_that_backoff_is_bounded():
    from gcsfs.retry import HttpError

    assert is_transient(HttpError({"code": 503, "message": "backend error"}))
    assert is_transient(HttpError({"code": 429, "message": "rate"}))
    assert not is_transient(HttpError({"code": 403, "message": "forbidden"}))
    assert is_transient(ConnectionResetError()) and is_transient(TimeoutError())
    assert not is_transient(FileNotFoundError("x")) and not is_transient(ValueError("bad json"))
    delays = Backoff().delays()
    assert len(delays) == 4 and max(delays) <= 8.0 and sum(delays) <= 15.0
    tries = []

    def flaky():
        tries.append(1)
        raise ConnectionResetError("reset")

    with pytest.raises(ConnectionResetError):
        retry(flaky, backoff=Backoff(attempts=3, first_s=0.001), sleep=lambda s: None)
    assert len(tries) == 3
    tries.clear()
    with pytest.raises(ValueError):  # a permanent error is raised at once
        retry(lambda: (tries.append(1), int("x")), backoff=Backoff(attempts=3), sleep=lambda s: None)
    assert len(tries) == 1


def _docs_example(tmp_path):
    """The per-shard step of docs/writing-steps.md, exactly as written there, as a module."""
    import importlib.util
    import pathlib
    import re

    doc = (pathlib.Path(__file__).parents[3] / "docs/writing-steps.md").read_text()
    section = doc[doc.index("## A per-shard data step"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    path = tmp_path / "min_words_example.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("min_words_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_per_shard_step_resumes_quarantines_and_writes_its_manifest(tmp_path):
    """A new data step as docs/writing-steps.md writes it: a per-shard function and a manifest;
    map_shards resumes it (no shard done twice), quarantines a shard that keeps failing, and
    commit_manifest names it."""
    from steps.data.formats import iter_documents, write_documents

    example = _docs_example(tmp_path)
    folder = tmp_path / "docs"
    for k in range(4):
        write_documents(str(folder / f"documents/{k:05d}.jsonl.zst"),
                        [{"id": f"{k}-{i}", "text": " ".join(["w"] * (i * 20))} for i in range(5)])
    (folder / "documents/00002.jsonl.zst").write_bytes(b"not zstd")  # keeps failing
    ctx = build_context(str(tmp_path / "out"), name="filtered", digest="0" * 64)
    config = example.MinWordsConfig(documents=str(folder / "documents/*.jsonl.zst"), min_words=50,
                                    max_quarantine_share=0.25)
    example.min_words(config, ctx)
    manifest = read_json(ctx.path("manifest.json"))
    assert [s["documents"] for s in manifest["shards"]] == [2, 2, 2] and manifest["documents"] == 6
    assert [q["index"] for q in manifest["quarantined"]] == [2] and ctx.results["quarantined"]
    assert [d["id"] for d in iter_documents(ctx.path("documents/00003.jsonl.zst"))] == ["3-3", "3-4"]
    # resumed: the bad shard mended, only it is done again
    write_documents(str(folder / "documents/00002.jsonl.zst"), [{"id": "2-0", "text": " ".join(["w"] * 60)}])
    seen = []
    ctx = build_context(str(tmp_path / "out"), name="filtered", digest="0" * 64, mapper=lambda fn, items, res=None: [seen.extend(s.index for s in t.shards) or fn(t) for t in items])
    example.min_words(config, ctx)
    assert seen == [2] and read_json(ctx.path("manifest.json"))["documents"] == 7
    assert "quarantined" not in read_json(ctx.path("manifest.json")) and "quarantined" not in ctx.results
    with pytest.raises(ShardsFailed, match="min_words: 1 of 4 shards failed"):
        (folder / "documents/00001.jsonl.zst").write_bytes(b"broken")
        example.min_words(config.__class__(documents=config.documents, min_words=10), build_context(str(tmp_path / "out2"), name="filtered", digest="1" * 64))

"""The store on fsspec: status, record, manifest and output digest, on local, memory:// and gs://."""

import json
import logging
import posixpath

import pytest

from executor.storage.store import SUCCESS, Record, Status, Store, StoreError, output_digest


def _roundtrip(store: Store) -> None:
    d = "steps/a-0123456789"
    assert store.read_status(d) is None
    store.write_status(d, Status(state=SUCCESS, digest="f" * 64, output_digest="o", inputs={"x": "y"}))
    st = store.read_status(d)
    assert st.state == SUCCESS and st.inputs == {"x": "y"}
    rec = Record(name="steps/a", step_type="t", version="1", digest="f" * 64, scheme="s", output_path=store.url(d))
    store.write_record(d, rec)
    assert store.read_record(d).name == "steps/a"
    with store.fs.open(store.path(d, "data", "part-0.bin"), "wb") as f:
        f.write(b"hello" * 100)
    with store.fs.open(store.path(d, "top.txt"), "wb") as f:
        f.write(b"top")
    manifest = store.manifest(d)
    assert [m.path for m in manifest] == ["data/part-0.bin", "top.txt"]
    assert manifest[0].size == 500 and manifest[0].checksum.startswith("md5:")
    statuses = store.read_statuses([d, "steps/missing-0000000000"])
    assert statuses[d].state == SUCCESS and statuses["steps/missing-0000000000"] is None
    store.clear_partial(d)
    assert store.manifest(d) == [] and store.read_status(d) is not None and store.read_record(d) is not None


def test_local_store(tmp_path):
    _roundtrip(Store(str(tmp_path / "prefix")))


def test_memory_store():
    _roundtrip(Store("memory://marin-store-test"))


def test_gcs_store_on_the_emulator(gcs_emulator):
    store = Store("gs://marin-test/store-test")
    _roundtrip(store)
    # GCS keeps md5 of each object: the manifest uses it rather than reading the bytes back,
    # and the same bytes give the same checksum as on a local disk.
    local = Store("memory://marin-store-test-2")
    for s in (store, local):
        with s.fs.open(s.path("x-0000000000", "f.bin"), "wb") as f:
            f.write(b"same bytes")
    assert output_digest(store.manifest("x-0000000000")) == output_digest(local.manifest("x-0000000000"))


def test_output_digest_changes_with_bytes_not_with_time(tmp_path):
    store = Store(str(tmp_path))
    p = store.path("a-0000000000", "f.txt")
    store.fs.makedirs(store.path("a-0000000000"), exist_ok=True)
    store.fs.pipe_file(p, b"one")
    d1 = output_digest(store.manifest("a-0000000000"))
    store.fs.pipe_file(p, b"one")
    assert output_digest(store.manifest("a-0000000000")) == d1
    store.fs.pipe_file(p, b"two")
    assert output_digest(store.manifest("a-0000000000")) != d1


@pytest.mark.parametrize("content", [b"{not json", b"", b'{"state": 3}', b"\xff\xfe"])
def test_corrupt_status_is_not_done_with_a_warning(tmp_path, caplog, content):
    store = Store(str(tmp_path))
    d = "a-0000000000"
    store.fs.makedirs(store.path(d), exist_ok=True)
    store.fs.pipe_file(store.path(d, ".status"), content)
    with caplog.at_level(logging.WARNING):
        assert store.read_status(d) is None
    assert "corrupt status" in caplog.text


def test_corrupt_record_is_none_with_a_warning(tmp_path, caplog):
    store = Store(str(tmp_path))
    d = "a-0000000000"
    store.fs.makedirs(store.path(d), exist_ok=True)
    store.fs.pipe_file(store.path(d, ".step.json"), b'{"name": 1')
    with caplog.at_level(logging.WARNING):
        assert store.read_record_in(d) is None
    assert "corrupt record" in caplog.text


def test_local_json_writes_are_atomic(tmp_path):
    store = Store(str(tmp_path))
    path = store.path("a-0000000000", ".status")
    store.write_json(path, {"state": "RUNNING"})
    store.write_json(path, {"state": "SUCCESS"})
    assert json.loads(open(path).read())["state"] == "SUCCESS"
    assert [p.name for p in (tmp_path / "a-0000000000").iterdir()] == [".status"]  # no temp files left


def test_check_writable(tmp_path):
    Store(str(tmp_path / "new")).check_writable()
    assert list((tmp_path / "new").iterdir()) == []
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match="cannot write under .*: Not a directory"):  # unwritable even for root
        Store(str(blocker / "prefix")).check_writable()


def test_manifest_skips_links_to_folders(tmp_path):
    # W&B leaves `latest-run` pointing at its run folder inside a training step's output.
    import os

    store = Store(str(tmp_path))
    d = "a-0000000000"
    os.makedirs(tmp_path / d / "run")
    (tmp_path / d / "run" / "f.txt").write_text("x")
    os.symlink(tmp_path / d / "run", tmp_path / d / "latest-run")
    assert [m.path for m in store.manifest(d)] == ["run/f.txt"]


def test_clear_temporaries_removes_only_uncommitted_writes(tmp_path):
    """What a killed attempt of a resumable step leaves: `.tmp-*` files, at any depth. They go;
    committed files and the control files stay, and the manifest is as if nothing was killed."""
    from executor.storage.store import temp_path

    store = Store(str(tmp_path / "prefix"))
    d = "steps/r-0000000000"
    store.write_status(d, Status(state=SUCCESS, digest="0" * 64, output_digest="0" * 64))
    for rel, data in [("shards/00000.jsonl", b"done"), ("ledger/00000.json", b"{}")]:
        with store.fs.open(store.path(d, rel), "wb") as f:
            f.write(data)
    want = store.manifest(d)
    left = [temp_path(store.path(d, "shards/00001.jsonl")), temp_path(store.path(d, "top.bin"))]
    for path in left:
        with store.fs.open(path, "wb") as f:
            f.write(b"half")
    assert len(store.manifest(d)) == len(want) + 2
    assert sorted(store.clear_temporaries(d)) == sorted(left)
    assert store.manifest(d) == want and store.read_status(d) is not None
    assert store.clear_temporaries("steps/missing-0000000000") == []


def _pydantic_status():
    """The `.status` model as it was (pydantic) before Status was read by hand: the oracle."""
    import time as clock

    from pydantic import BaseModel, Field

    from executor.state import StepState

    class Old(BaseModel):
        state: StepState
        digest: str = ""
        output_digest: str | None = None
        inputs: dict[str, str | None] = Field(default_factory=dict)
        inputs_by: str = "digest"
        time: float = Field(default_factory=clock.time)
        attempt: int = 0
        token: int | None = None
        code: str = ""
        env: str = ""
        commit: str = ""
        dir: str = ""
        committed: "Old | None" = None

    Old.model_rebuild()
    return Old


GOOD = {"state": "SUCCESS", "digest": "d" * 64, "output_digest": "o" * 64, "inputs": {"a": "x", "b": None},
        "inputs_by": "name", "time": 1.5, "attempt": 2, "token": 7, "code": "fp1:ab", "env": "e", "commit": "c",
        "dir": ".attempts/0002-abc"}
BAD_FIELDS = [("state", "DONE"), ("state", None), ("state", 3), ("digest", 5), ("digest", None),
              ("output_digest", 1), ("inputs", []), ("inputs", {"a": 1}), ("inputs", None), ("time", "soon"),
              ("time", None), ("attempt", "two"), ("attempt", None), ("attempt", 2.5), ("token", "x"),
              ("committed", "yes"), ("committed", {"state": "SUCCESS", "attempt": "one"}), ("dir", ["x"])]


@pytest.mark.parametrize("key,value", BAD_FIELDS)
def test_a_status_field_of_the_wrong_type_is_refused_as_pydantic_refused_it(key, value):
    """Status is read by hand (a plan reads thousands and need not import pydantic): whatever it
    refuses, the pydantic model it replaced refused too, and it believes nothing that one refused."""
    from pydantic import ValidationError

    from executor.storage.store import parse_status

    data = json.dumps({**GOOD, key: value})
    status, problem = parse_status(data)
    assert status is None and key in problem, problem
    with pytest.raises(ValidationError):
        _pydantic_status().model_validate_json(data)


@pytest.mark.parametrize("extra", [{}, {"unknown": [1, 2]}, {"committed": dict(GOOD, dir="")},
                                   {"state": "RUNNING", "output_digest": None, "committed": dict(GOOD)},
                                   {"time": 3, "token": None, "inputs": {}}])
def test_a_good_status_reads_the_same_as_with_pydantic(extra):
    data = json.dumps({**GOOD, **extra})
    new, old = Status.model_validate_json(data), _pydantic_status().model_validate_json(data)
    assert new.model_dump() == old.model_dump() and new.model_dump(mode="json") == old.model_dump(mode="json")
    assert type(new.model_dump(mode="json")["state"]) is str
    assert Status.model_validate_json(new.model_dump_json()) == new  # and writes back what it read
    assert new.model_copy(update={"state": "FAILED"}).state == "FAILED" and new.state == json.loads(data)["state"]


def test_a_plan_reads_statuses_without_pydantic_and_records_with_it(tmp_path):
    import subprocess
    import sys

    store = Store(str(tmp_path))
    store.write_status("a-0000000000", Status(state=SUCCESS, digest="d", output_digest="o"))
    code = ("import sys; from executor.storage.store import Store; s = Store(sys.argv[1]); "
            "assert s.read_status('a-0000000000').output_digest == 'o'; assert 'pydantic' not in sys.modules; "
            "from executor.storage.store import Record; assert 'pydantic' in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("prefix", ["out", "./out", ".", "out/", "a/../b", "x y/z", "/", "/tmp//double/", "~",
                                    "~/x", "~no_such_user_zz/x", "file:///tmp/y", "file://rel/z", "file:rel"])
def test_a_local_prefix_has_the_root_fsspec_gives_it_without_fsspec(prefix, tmp_path, monkeypatch):
    """A local Store works out its root without fsspec (a dry-run need not import it) and makes
    its filesystem on first use: the root must be fsspec's, whatever the working folder is by then."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    monkeypatch.chdir(tmp_path)
    store = Store(prefix)
    want = fsspec.core.url_to_fs(prefix.rstrip("/") or "/")[1].rstrip("/")
    assert store.root == want and store.is_local
    monkeypatch.chdir("/")
    assert isinstance(store.fs, LocalFileSystem) and store.root == want
    assert store.to_url(store.path("a", ".status")) == posixpath.join(want, "a", ".status")


def test_any_other_prefix_makes_its_filesystem_at_once():
    from fsspec.implementations.memory import MemoryFileSystem

    from executor.storage.files import local_root

    for prefix in ("memory://bucket/x", "local:///tmp/x", "simplecache::file:///tmp/x", "gs://b/x", "data:x"):
        assert local_root(prefix) is None
    store = Store("memory://bucket/x")
    assert isinstance(store._fs, MemoryFileSystem) and not store.is_local and store.url("a") == "memory://bucket/x/a"


def test_a_status_nested_past_the_recursion_limit_is_corrupt_not_a_crash():
    from executor.storage.store import parse_status

    deep = '{"state": "SUCCESS", "digest": "d", "output_digest": "o", "committed": ' * 5000 + "null" + "}" * 5000
    status, problem = parse_status(deep)
    assert status is None and problem

"""Our streaming safetensors writer and byte-range reader against the `safetensors` package: each
reads what the other writes, bit for bit; shards are cut by size; a bad stream is refused."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from steps.export.safetensors_io import Entry, SafetensorsFile, plan_shards, write_file

TENSORS = {
    "a.f32": torch.randn(3, 5),
    "b.bf16": torch.randn(7, 2).bfloat16(),
    "c.i64": torch.arange(6).reshape(2, 3),
    "d.empty": torch.empty(0, 4),
    "e.scalar": torch.tensor(2.5),
    "f.f16": torch.randn(9).half(),
}


def test_the_package_reads_what_we_write(tmp_path):
    entries = [Entry(k, tuple(v.shape), v.dtype) for k, v in TENSORS.items()]
    n = write_file(str(tmp_path / "x.safetensors"), entries, iter(TENSORS.values()))
    assert n == (tmp_path / "x.safetensors").stat().st_size
    with safe_open(str(tmp_path / "x.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"} and set(f.keys()) == set(TENSORS)
        for k, v in TENSORS.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and torch.equal(got, v), k


def test_we_read_what_the_package_writes(tmp_path):
    save_file(TENSORS, str(tmp_path / "y.safetensors"), metadata={"format": "pt"})
    f = SafetensorsFile(str(tmp_path / "y.safetensors"))
    assert set(f.names()) == set(TENSORS)
    for k, v in TENSORS.items():
        assert f.dtype(k) == v.dtype and torch.equal(f.read(k), v), k


def test_shards_are_cut_by_size_and_big_tensors_stand_alone():
    e = [Entry(str(i), (n,), torch.float32) for i, n in enumerate([10, 10, 30, 5, 5, 5])]
    assert [[x.name for x in s] for s in plan_shards(e, 100)] == [["0", "1"], ["2"], ["3", "4", "5"]]
    assert [len(s) for s in plan_shards(e, 1)] == [1] * 6
    assert plan_shards([], 10) == []


def test_a_stream_that_does_not_match_its_plan_is_refused(tmp_path):
    e = [Entry("a", (2,), torch.float32), Entry("b", (2,), torch.float32)]
    with pytest.raises(ValueError, match="b is \\(3,\\) torch.float32, planned \\(2,\\)"):
        write_file(str(tmp_path / "z1"), e, iter([torch.zeros(2), torch.zeros(3)]))
    with pytest.raises(ValueError, match="no tensor for b"):
        write_file(str(tmp_path / "z2"), e, iter([torch.zeros(2)]))
    with pytest.raises(ValueError, match="more tensors than entries"):
        write_file(str(tmp_path / "z3"), e, iter([torch.zeros(2)] * 3))
    (tmp_path / "junk").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="not a safetensors file"):
        SafetensorsFile(str(tmp_path / "junk"))


def test_tensors_are_converted_to_their_entry_dtype_block_by_block(tmp_path, monkeypatch):
    import steps.export.safetensors_io as sio

    monkeypatch.setattr(sio, "CONVERT_BLOCK", 7)  # several blocks, the last one short
    x = torch.randn(5, 9)
    write_file(str(tmp_path / "c"), [Entry("x", (5, 9), torch.bfloat16)], iter([x]))
    with safe_open(str(tmp_path / "c"), framework="pt") as f:
        assert torch.equal(f.get_tensor("x"), x.bfloat16())
    with pytest.raises(ValueError, match="planned"):  # no silent float <-> int conversion
        write_file(str(tmp_path / "d"), [Entry("x", (2,), torch.float32)], iter([torch.arange(2)]))

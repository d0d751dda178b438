"""The live page's reading of a trainer's metrics (executor/views/viz/metrics.py): the health lists
become a heatmap and min/mean/max curves, spike events and the loss by tokens are kept, a
reference curve beside the metrics is read, and bad lines or values are skipped, not fatal."""

import json

from executor.storage.store import Store
from executor.views.viz.metrics import MAX_POINTS, MetricsReader, parse_reference


def _row(step, layers=4, **extra):
    return {"step": step, "loss": 5.0 - step / 100, "tokens": step * 2048, "time": 1.0 * step,
            "health": {"load_max_mean": [1.0 + 0.1 * layer + step / 1000 for layer in range(layers)],
                       "router_entropy": [2.0 - 0.01 * layer for layer in range(layers)],
                       "bias_spread": [0.001 * step] * layers},
            **extra}


def test_health_events_tokens_and_reference_are_read(tmp_path):
    store = Store(str(tmp_path))
    folder = tmp_path / "pretrain-abc"
    folder.mkdir()
    rows = [_row(s) for s in range(10, 110, 10)]
    rows[3]["events"] = [{"step": 38, "kind": "skip", "loss": 9.0}, {"step": 40, "kind": "rewind", "skipped": [30, 40]}]
    lines = [json.dumps(r) for r in rows] + ["not json", json.dumps({"step": 200, "health": {"load_max_mean": ["x"]}})]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "reference_curve.json").write_text(json.dumps({"tokens": [0, 1000, 2000], "loss": [6.0, 5.0, "bad"]}))
    reader = MetricsReader(store)
    assert reader.poll_many(["pretrain-abc"])
    c = reader.to_json("pretrain-abc")
    assert [x for x, _ in c["heat"]] == [float(s) for s in range(10, 110, 10)]
    assert c["heat"][0][1] == [1.01, 1.11, 1.21, 1.31]
    assert c["series"]["load_max_mean_max"][0] == [10.0, 1.31]
    assert c["series"]["router_entropy_min"][-1] == [100.0, 1.97]
    assert c["by_tokens"][0] == [20480.0, 4.9] and len(c["by_tokens"]) == 10
    assert [(e["step"], e["kind"]) for e in c["events"]] == [(38, "skip"), (40, "rewind")]
    assert c["reference"] == [[0.0, 6.0], [1000.0, 5.0]]  # the bad point left out
    # rows appended later are read from where the last poll stopped
    with open(folder / "metrics.jsonl", "a") as f:
        f.write(json.dumps(_row(110)) + "\n")
    assert reader.poll("pretrain-abc")
    assert reader.to_json("pretrain-abc")["heat"][-1][0] == 110.0


def test_a_long_run_keeps_the_heatmap_bounded():
    from executor.views.viz.metrics import Curves

    c = Curves()
    data = "".join(json.dumps(_row(s, layers=48)) + "\n" for s in range(1, 1201)).encode()
    c.feed(data)
    heat = c.to_json()["heat"]
    assert len(heat) <= MAX_POINTS + 1 and heat[-1][0] == 1200.0 and len(heat[0][1]) == 48


def test_reference_formats():
    assert parse_reference(b"[[1, 2.5], [2, 2.0]]") == [[1.0, 2.5], [2.0, 2.0]]
    assert parse_reference(b"{nope") is None
    assert parse_reference(b'{"tokens": [], "loss": []}') is None


def test_drop_shares_per_layer_and_the_run_max_are_read():
    """A capped run's drops (health's dropped_share per layer, the row's
    moe_dropped_share) become curves and the `drops` summary: the run's largest share, the worst
    layer's with its layer and step, and the last; a dropless run (no per-layer drops) has none."""
    from executor.views.viz.metrics import Curves

    shares = {10: ([0.0, 0.01, 0.002, 0.0], 0.003), 20: ([0.0, 0.004, 0.03, 0.0], 0.0085), 30: ([0.0, 0.0, 0.001, 0.0], 0.00025)}
    c = Curves()
    c.feed("".join(json.dumps(_row(s, moe_dropped=int(1e4 * t), moe_dropped_share=t,
                                   health={"load_max_mean": [1.0] * 4, "dropped": [int(1e4 * v) for v in per],
                                           "dropped_share": per})) + "\n"
                   for s, (per, t) in shares.items()).encode())
    out = c.to_json()
    assert out["drops"] == {"share_max": 0.0085, "last": 0.00025, "layer_max": 0.03, "layer": 2, "layer_step": 20.0}
    assert out["series"]["dropped_share_max"] == [[10.0, 0.01], [20.0, 0.03], [30.0, 0.001]]
    assert out["series"]["moe_dropped_share"][-1] == [30.0, 0.00025]
    dropless = Curves()
    dropless.feed((json.dumps(_row(10, moe_dropped=0, moe_dropped_share=0.0)) + "\n").encode())
    assert "drops" not in dropless.to_json() and "dropped_share_max" not in dropless.to_json()["series"]

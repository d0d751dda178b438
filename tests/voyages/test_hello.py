"""voyages/hello.py: fan-out and fan-in of real work, steps with different resources."""

import importlib.util
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(name):
    spec = importlib.util.spec_from_file_location(f"voyage_{name}_under_test", os.path.join(ROOT, "voyages", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_hello_counts_add_up(tmp_path, ray_local):
    from ray import cloudpickle

    from executor.api import run_steps
    from executor.storage.store import Store

    hello = load("hello")
    cloudpickle.register_pickle_by_value(hello)
    config = hello.HelloConfig(n_files=3, words_per_file=600)
    plan, summary = run_steps(hello.voyage(config), str(tmp_path))
    assert summary.exit_code == 0 and len(plan.decisions) == 8
    resources = {d.name: d.node.step.resources for d in plan.decisions}
    assert resources["hello/count/0"].cpus == 0.5 and resources["hello/report"].memory_gb == 0.25
    store = Store(str(tmp_path))
    merged = plan.dag["hello/merge"]
    total = json.loads(open(os.path.join(str(tmp_path), Store(str(tmp_path)).served_dir(merged.dirname), "total.json")).read())
    assert sum(total.values()) == 3 * 600
    assert store.read_record(merged.dirname).results == {"distinct_words": len(total), "words": 1800}
    report = open(os.path.join(str(tmp_path), Store(str(tmp_path)).served_dir(plan.dag["hello/report"].dirname), "report.md")).read()
    assert report.count("\n") == 2 + config.top_k

"""Node loss on a real multi-node Ray cluster (`ray.cluster_utils.Cluster`: a head and two nodes
with a `GB200` resource). A step asking for GB200 runs only on those nodes; its node removed under
it, Ray retries it on the other, the voyage completes, and the record keeps both attempts.

The cluster lives in a process of its own (`cluster_host.py`), since this test process stays
connected to the session's Ray; the executor is a real `marin-run --ray-address`.
"""

import os
import sys
import time

import pytest

from kits import faultkit  # noqa: E402



# the slower tier (`--tier slow`: fault injection on real processes, a node removed from a running
# Cluster), which .ci/run runs after the README's command (tests/conftest.py)
pytestmark = pytest.mark.slow_tier


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray_tmp = faultkit.RayTmp()
    host = faultkit.ClusterHost(str(tmp_path_factory.mktemp("cluster")), ray_tmp.path)
    yield host
    leftovers = host.close()
    ray_tmp.close()
    assert leftovers == [], leftovers


def test_gb200_step_runs_only_there_and_survives_losing_its_node(cluster, tmp_path):
    prefix = str(tmp_path / "p")
    gb200 = list(cluster.gb200)
    run = faultkit.Executor(faultkit.SLOW, [
        "--prefix", prefix, "--ray-address", cluster.address, "--accelerator", "GB200",
        "--shards", "1", "--files", "6", "--delay", "0.4"], str(tmp_path), name="run")
    deadline = time.time() + 120
    while not (node := faultkit.running_on(prefix, "slow/shard/0")) and run.running() and time.time() < deadline:
        time.sleep(0.05)
    assert node in gb200, (node, gb200, run.tail())
    cluster.remove(node)
    assert run.wait(180) == 0, run.tail()
    got = faultkit.audit(prefix)
    assert got.corrupt == [] and set(got.states.values()) == {"SUCCESS"}
    assert got.attempts["slow/shard/0"] == ["INTERRUPTED", "SUCCESS"]
    first, second = got.nodes["slow/shard/0"]
    assert first == node and second in gb200 and second != first
    # the retry came from Ray, under the lease the executor kept renewing: the same fencing token
    assert got.tokens["slow/shard/0"][0] == got.tokens["slow/shard/0"][1] is not None
    assert all(got.successes(name) == 1 for name in got.attempts)

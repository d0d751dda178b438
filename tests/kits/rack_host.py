"""A two-rack Ray cluster on this machine, and a pretrain step on it as HSDP with expert
parallelism, the way the 535B run spreads over racks.

    python tests/kits/rack_host.py MIXTURE OUTPUT

Starts a `ray.cluster_utils.Cluster` of two nodes of three CPUs each, labelled `marin.rack` = "r1"
(the head) and "r0"; connects to it and runs the `pretrain` step
function (tests/kits/meshkit.py's 20-step recipe, two micro-batches a step) on 4 Ray
Train workers (gloo, one CPU each) as dp_replicate 2 x dp_shard 2 with ep=2: a replica and an
expert-parallel group per rack. Prints one JSON line: {"mesh": the last checkpoint's mesh record,
"nodes": {node id: rack}}. A process of its own, since the test process may already be connected
to the session's Ray.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), os.path.join(HERE, "..")]


def started_cluster(Cluster, head: dict, node: dict, tries: int = 3):
    """The cluster with its head and one more node started: (cluster, that node). Ray gives a raylet
    a fixed 30 s to register; on a 2-core machine running the suite on 3 workers that can run out,
    so a start that timed out is made again, after what it left (this host's only children then)
    is killed."""
    import psutil

    for left in range(tries - 1, -1, -1):
        cluster = None
        try:
            cluster = Cluster(initialize_head=True, head_node_args=head)
            return cluster, cluster.add_node(**node)
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for the timeout
            if left == 0 or "timed out during startup" not in str(e):
                raise
            if cluster is not None:
                cluster.shutdown()
            for child in psutil.Process().children(recursive=True):
                child.kill()
            print(f"rack_host: a node timed out during startup; starting the cluster again ({left} more)",
                  file=sys.stderr)


def main() -> None:
    import ray
    from ray.cluster_utils import Cluster

    from executor import Resources

    from executor.testing import build_context
    from kits.meshkit import config
    from steps.train import checkpoint
    from steps.train.config import ParallelConfig
    from steps.train.pretrain import pretrain
    from steps.train.topology import RACK_LABEL

    mix, output = sys.argv[1], sys.argv[2]
    # The head is rack r1's node (one raylet fewer to start); r0's node joins after it. Three CPUs
    # a node: packed freely (Ray Train's PACK), 4 one-CPU workers would go 3 + 1 and an ep group
    # of 2 would cross the racks; placed in whole ep groups per rack they go 2 + 2.
    cluster, node = started_cluster(Cluster, dict(num_cpus=3, labels={RACK_LABEL: "r1"}, include_dashboard=False),
                                    dict(num_cpus=3, labels={RACK_LABEL: "r0"}))
    nodes = {cluster.head_node.node_id: "r1", node.node_id: "r0"}
    try:
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="WARNING", configure_logging=False)
        cfg = config(mix, ParallelConfig(dp_replicate=2, dp_shard=2, ep=2), microbatch=2)
        ctx = build_context(output, name="racks", digest="r" * 64, resources=Resources(cpus=1, workers=4))
        pretrain(cfg, ctx)
        run = checkpoint.read_run(checkpoint.list_checkpoints(output)[-1].url)
        print(json.dumps({"mesh": run["mesh"], "nodes": nodes}), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()

"""A multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`), driven over stdin.

    python tests/kits/cluster_host.py [--gb200-nodes 2]

Starts a head node (1 CPU, no accelerator) and worker nodes with one CPU and one `GB200` each,
prints one JSON line `{"address", "head", "gb200": [node ids]}`, then obeys one command per line:
`remove NODE_ID` (kill that node under whatever runs on it), `add` (one more GB200 node), `exit`.
Each command answers one JSON line. A process of its own, so that the test process can stay
connected to its own Ray; executors join with `marin-run --ray-address ADDRESS`.
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> None:
    from ray.cluster_utils import Cluster

    parser = argparse.ArgumentParser()
    parser.add_argument("--gb200-nodes", type=int, default=2)
    args = parser.parse_args()
    # Quick health checks: a removed node is declared dead, and its tasks retried, within seconds.
    cluster = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=1, include_dashboard=False,
        _system_config={"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                        "health_check_failure_threshold": 3}))
    nodes = {}

    def add() -> str:
        node = cluster.add_node(num_cpus=1, resources={"GB200": 1})
        nodes[node.node_id] = node
        return node.node_id

    for _ in range(args.gb200_nodes):
        add()
    cluster.wait_for_nodes()
    say({"address": cluster.address, "head": cluster.head_node.node_id, "gb200": list(nodes)})
    try:
        for line in sys.stdin:
            command, _, arg = line.strip().partition(" ")
            if command == "remove":
                cluster.remove_node(nodes.pop(arg))
                say({"removed": arg})
            elif command == "add":
                try:
                    node_id = add()
                    cluster.wait_for_nodes()
                except Exception as e:  # noqa: BLE001
                    # Ray gives a raylet a fixed 30 s to register, which a loaded machine can miss:
                    # one line back (the caller may try again), the cluster stays up
                    say({"error": f"add: {str(e).splitlines()[0]}"})
                    continue
                say({"added": node_id})
            elif command == "exit":
                break
            else:
                say({"error": f"unknown command {line.strip()!r}"})
    finally:
        cluster.shutdown()


def say(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


if __name__ == "__main__":
    main()

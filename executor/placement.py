"""Can the cluster ever run a step? Checked before anything runs (Ray would wait forever).

Pure functions over node resource dicts (Ray's names: CPU, GPU, memory in bytes, custom
resources such as GB200), so a dry-run can check a plan without starting Ray.
"""

from __future__ import annotations

import os

from executor.errors import VoyageError
from executor.step import Resources


def local_nodes() -> list[dict[str, float]]:
    """What an embedded local Ray on this machine would offer: its CPUs and most of its memory."""
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = 8 * 2**30
    return [{"CPU": float(os.cpu_count() or 1), "memory": mem * 0.7}]


def check_placement(demands: dict[str, Resources], nodes: list[dict[str, float]]) -> list[str]:
    """Problems, one line per step whose resources no node (or the cluster) can ever provide."""
    problems = []
    for name, res in demands.items():
        need = res.per_worker()
        fits = [n for n in nodes if all(n.get(k, 0.0) >= v for k, v in need.items())]
        if res.workers > 1 and fits:
            slots = sum(int(min(n.get(k, 0.0) // v for k, v in need.items() if v > 0) if need else res.workers)
                        for n in fits)
            if slots < res.workers:
                problems.append(f"step {name!r} needs {res.describe()}: the cluster has room for {slots} "
                                f"such worker(s) ({_cluster_text(nodes)})")
            continue
        if not fits:
            missing = sorted({k for k, v in need.items() if max((n.get(k, 0.0) for n in nodes), default=0.0) < v})
            detail = ", ".join(f"{k}={_fmt(k, need[k])} (largest node has {_fmt(k, max((n.get(k, 0.0) for n in nodes), default=0.0))})"
                               for k in missing) or "no single node has all of " + ", ".join(need)
            problems.append(f"step {name!r} needs {res.describe()} per worker; no node can ever run it: {detail}")
    return problems


def _fmt(key: str, value: float) -> str:
    return f"{value / 2**30:.1f}GiB" if key in ("memory", "object_store_memory") else f"{value:g}"


def _cluster_text(nodes: list[dict[str, float]]) -> str:
    total: dict[str, float] = {}
    for n in nodes:
        for k, v in n.items():
            if k.startswith("node:") or k == "object_store_memory":
                continue
            total[k] = total.get(k, 0.0) + v
    return f"{len(nodes)} node(s): " + ", ".join(f"{k}={_fmt(k, v)}" for k, v in sorted(total.items()))


def fail_if_unplaceable(demands: dict[str, Resources], nodes: list[dict[str, float]]) -> None:
    problems = check_placement(demands, nodes)
    if problems:
        raise VoyageError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))

"""`--gc` on a prefix of 10k steps: time to list, bytes found, and the sweep.

    .venv/bin/python -m bench.gc                       # 10k steps on a local disk
    .venv/bin/python -m bench.gc --steps 1000 --gcs    # ... and on the GCS emulator (started here)

The prefix holds what a voyage of N steps (layers of 100, each step reading two of the layer
before, as bench/plan.py) leaves after some history: every step's current output committed in
its second attempt, its first attempt abandoned beside it, and one old version of every step
(another digest, committed). Each attempt holds a record and one data file of `--data-bytes`.
So the collector must find exactly N old versions and N abandoned attempts, and their bytes are
known in advance: the figure is checked, not only timed.

Printed side by side: building the DAG (what `--gc` does before it lists), the bare listing
(`executor.gc.collect.list_prefix`: the walk every answer needs), the whole collection (listing, every
`.status` and `.lease`, deciding), and on a local disk GNU `du -sb` over the same tree as the
ceiling for "walk the tree and add up bytes". Then `--yes`: the sweep, each output under its lease.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

from bench import kit  # noqa: E402
from bench.plan import make_steps  # noqa: E402
from executor.gc import collect as gc  # noqa: E402
from executor.dag import build_dag  # noqa: E402
from executor.storage.store import SUCCESS, Status, Store  # noqa: E402
from executor.gc.sweep import sweep  # noqa: E402


def layout(steps, data_bytes: int) -> tuple[dict[str, bytes], int, int]:
    """Every file of the prefix (relative path -> bytes), the bytes of the old versions and of the
    abandoned attempts."""
    dag = build_dag(steps)
    files: dict[str, bytes] = {}
    old_bytes = abandoned_bytes = 0
    data = b"d" * data_bytes
    lease = json.dumps({"host": "h", "pid": 1, "run_id": "r", "token": 2, "acquired": 0.0, "expires": 0.0,
                        "released": True}).encode()
    for node in dag:
        served, abandoned = f".attempts/0002-{uuid.uuid4().hex[:8]}", f".attempts/0001-{uuid.uuid4().hex[:8]}"
        status = Status(state=SUCCESS, digest=node.digest, output_digest="0" * 64, attempt=2, token=2, dir=served,
                        inputs={d.name: "0" * 64 for d in node.deps}, inputs_by="name")
        record = json.dumps({"name": node.name, "digest": node.digest}).encode()
        d = node.dirname
        files.update({f"{d}/.status": status.model_dump_json().encode(), f"{d}/.lease": lease,
                      f"{d}/{served}/.step.json": record, f"{d}/{served}/data.bin": data,
                      f"{d}/{abandoned}/.step.json": record, f"{d}/{abandoned}/data.bin": data})
        abandoned_bytes += len(record) + len(data)
        old = f"{node.name}-{uuid.uuid4().hex[:10]}"
        old_status = status.model_copy(update={"digest": "f" * 64, "dir": abandoned}).model_dump_json().encode()
        old_files = {f"{old}/.status": old_status, f"{old}/.lease": lease, f"{old}/{abandoned}/.step.json": record,
                     f"{old}/{abandoned}/data.bin": data}
        files.update(old_files)
        old_bytes += sum(len(v) for v in old_files.values())
    return files, old_bytes, abandoned_bytes


def write_local(root: str, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def write_gcs(store: Store, files: dict[str, bytes]) -> None:
    items = list(files.items())
    for i in range(0, len(items), 2000):  # gcsfs uploads a dict concurrently
        store.fs.pipe({store.path(rel): data for rel, data in items[i:i + 2000]})


def measure(store: Store, steps_fn, n: int, data_bytes: int, local_root: str | None) -> None:
    files, old_bytes, abandoned_bytes = layout(steps_fn(), data_bytes)
    t = time.perf_counter()
    (write_local(local_root, files) if local_root else write_gcs(store, files))
    print(f"filled {len(files):,} files ({sum(map(len, files.values())):,} bytes) in {time.perf_counter() - t:.1f} s")

    timing = kit.timed(lambda: [build_dag(steps_fn())])
    dags, build = timing.value, (timing.wall_min, timing.cpu_min)
    timing = kit.timed(lambda: gc.list_prefix(store))
    (listed, _), listing = timing.value, (timing.wall_min, timing.cpu_min)
    assert len(listed) == len(files), (len(listed), len(files))
    timing = kit.timed(lambda: gc.collect(store, gc.reached_of(dags), grace=0))
    report, collect = timing.value, (timing.wall_min, timing.cpu_min)
    kinds = {k: sum(1 for i in report.items if i.kind == k) for k in (gc.OLD, gc.ABANDONED)}
    assert kinds == {gc.OLD: n, gc.ABANDONED: n} and len(report.items) == 2 * n, kinds
    assert report.bytes == old_bytes + abandoned_bytes, (report.bytes, old_bytes + abandoned_bytes)
    rows = [("build the DAG", build), ("list (executor.gc.collect.list_prefix)", listing),
            ("collect: list + every .status and .lease + decide", collect)]
    if local_root:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(["du", "-sb", local_root], check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows.append(("du -sb (the ceiling: walk and add up)",
                     (time.perf_counter() - t, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)))
    print(f"  {'steps ' + format(n, ','):<52} {'wall s':>7} {'CPU s':>7} {'CPU / du':>8}")
    for label, (wall, cpu_s) in rows:
        ratio = f"{cpu_s / rows[-1][1][1]:.1f}x" if local_root else ""
        print(f"  {label:<52} {wall:>7.2f} {cpu_s:>7.2f} {ratio:>8}")
        kit.emit(f"{n} steps: {label}", quiet=True, steps=n, store="local" if local_root else "gcs",
                 wall_s=round(wall, 3), cpu_s=round(cpu_s, 3))
    print(f"  found {len(report.items):,} items: {n:,} old versions + {n:,} abandoned attempts, "
          f"{gc.human(report.bytes)} ({report.bytes:,} bytes, as written) of {gc.human(report.listed_bytes)} listed; "
          f"load average {os.getloadavg()[0]:.1f}")
    # --yes: half the outputs one at a time, the other half 16 at a time (the same shape of work).
    halves: list[list] = [[], []]
    for i, output in enumerate(sorted({item.output for item in report.items})):
        halves[i % 2].extend(item for item in report.items if item.output == output)
    for workers, items in ((1, halves[0]), (16, halves[1])):
        t = time.perf_counter()
        outcome = sweep(store, dataclasses.replace(report, items=items), workers=workers)
        sweep_s = time.perf_counter() - t
        assert not outcome.skipped and outcome.bytes == sum(i.bytes for i in items), outcome.describe()
        print(f"  --yes, {workers:>2} output(s) at a time: {len(items):,} items in {sweep_s:.1f} s "
              f"({sweep_s / len(items) * 1e3:.1f} ms an item, each output under its lease)")
    again = gc.collect(store, gc.reached_of(dags), grace=0)
    assert not again.items and len(again.outputs) == n
    print("  a second --gc finds nothing")


def start_emulator() -> subprocess.Popen:
    import socket

    exe = shutil.which("gcp-storage-emulator") or os.path.join(os.path.dirname(sys.executable), "gcp-storage-emulator")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "start", f"--port={port}", "--in-memory"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    os.environ["FSSPEC_GS_TOKEN"] = "anon"
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()
    gcsfs.GCSFileSystem(endpoint_url=os.environ["STORAGE_EMULATOR_HOST"], token="anon").mkdir("marin-bench")
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--data-bytes", type=int, default=1024)
    ap.add_argument("--gcs", action="store_true", help="also on the GCS emulator")
    args = ap.parse_args()
    steps_fn = lambda: make_steps("layered", args.steps)  # noqa: E731
    root = tempfile.mkdtemp(prefix="marin-bench-gc-")
    try:
        print("local disk:")
        measure(Store(root), steps_fn, args.steps, args.data_bytes, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.gcs:
        proc = start_emulator()
        try:
            print("GCS emulator:")
            measure(Store(f"gs://marin-bench/gc-{time.time_ns()}"), steps_fn, args.steps, args.data_bytes, None)
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()

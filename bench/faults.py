"""Fault injection at scale: many more trials than the tests, and the figures.

    .venv/bin/python -m bench.faults               # 50 SIGKILLs and the rest: about 10 minutes on 2 cores
    .venv/bin/python -m bench.faults --trials 1    # the quick form: under 2 minutes

Everything is real: `marin-run` processes, a multi-node Ray cluster on this machine
(`tests/kits/cluster_host.py`: a head and two nodes with a `GB200` resource), a GCS emulator
behind `faultkit.FaultyProxy`. The cluster's workers reach the emulator through the proxy, which
relays faithfully at rate 0 (for the fault-free reference runs) and injects 429, 503 and dropped
connections at `--fault-rate` for the faulty ones. Sections:

- kills: `--trials` SIGKILLs of an executor's process group (its embedded Ray with it) at random
  moments (a quarter from its start, the rest from when it first holds a lease), one to three per
  voyage before a run finishes it; after each, no SUCCESS folder may disagree with its record.
- concurrent: `--executors` executors started together on one local prefix (each with its own
  embedded Ray; joined to the cluster in the quick form): every step exactly once.
- takeover: a lease holder SIGKILLed; the time until a waiting executor takes the lease over,
  against twice the ttl.
- node loss: the node under a running GB200 step removed; the voyage completes.
- proxy: voyages/hello.py on gs:// through the faulty proxy; identical outputs to a fault-free run.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from bench import kit  # noqa: E402

ROOT = str(kit.ROOT)
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # before gcsfs is imported

from kits import faultkit  # noqa: E402

SLOW = dict(shards=3, files=4, delay=0.3)  # about 4 s of steps on three levels
SLOW_SECONDS = 3 * SLOW["files"] * SLOW["delay"] + 1.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=50, help="SIGKILLs; the other sections scale with it")
    p.add_argument("--executors", type=int, default=8, help="executors started together")
    p.add_argument("--ttl", type=float, default=3.0, help="lease ttl of the takeover trials (seconds)")
    p.add_argument("--fault-rate", type=float, default=0.1, help="share of requests the proxy fails")
    p.add_argument("--seed", type=int, default=None, help="replay a run (printed at the start)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    quick = args.trials < 10
    work = tempfile.mkdtemp(prefix="marin-faults-")
    ray_tmp = faultkit.RayTmp()
    print(f"bench/faults.py --trials {args.trials} --seed {seed}  (work folder {work})", flush=True)
    emulator = start_emulator()
    proxy = faultkit.FaultyProxy(emulator.url, rate=0.0, seed=seed).start()
    # inherited by everything started below; no zonal buckets on an emulator (gcsfs would try gRPC)
    os.environ.update(STORAGE_EMULATOR_HOST=proxy.url, FSSPEC_GS_TOKEN="anon", GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")
    cluster = faultkit.ClusterHost(os.path.join(work, "cluster"), ray_tmp.path)
    bench = Bench(work, ray_tmp.path, cluster, rng)
    failed = False
    try:
        t0 = time.time()
        sections = [
            ("kills", lambda: bench.kills(args.trials)),
            ("concurrent", lambda: bench.concurrent(max(1, args.trials // 25), args.executors, embedded=not quick)),
            ("takeover", lambda: bench.takeover(max(1, args.trials // 10), args.ttl)),
            ("node loss", lambda: bench.node_loss(max(1, args.trials // 10))),
            ("proxy", lambda: bench.faulty_proxy(proxy, max(1, args.trials // 25), args.fault_rate)),
        ]
        for name, section in sections:
            t = time.time()
            figures = section()
            ok = figures.pop("ok")
            failed |= not ok
            print(f"\n== {name}: {'ok' if ok else 'FAILED'} ({time.time() - t:.0f}s)", flush=True)
            for key, value in figures.items():
                print(f"  {key}: {value}", flush=True)
        leftovers = faultkit.reap(bench.tags)
        print(f"\nprocesses left behind by killed executors: {len(leftovers)} {leftovers or ''}")
        failed |= bool(leftovers)
        print(f"total {time.time() - t0:.0f}s; {'all checks passed' if not failed else 'SOME CHECKS FAILED'}")
    finally:
        tear_down(cluster, proxy, emulator, ray_tmp, None if args.keep else work)
    return 1 if failed else 0


def tear_down(cluster, proxy, emulator, ray_tmp, work: str | None) -> None:
    """Stop what a fault bench started (the cluster, if any, saying which of its processes
    outlived it), and remove its work folder unless kept (`work` None)."""
    if cluster is not None:
        leftovers = cluster.close()
        if leftovers:
            print(f"cluster processes that outlived it: {leftovers}")
    proxy.stop()
    emulator.stop()
    ray_tmp.close()
    if work is not None:
        shutil.rmtree(work, ignore_errors=True)


class Bench:
    def __init__(self, work: str, ray_tmp: str, cluster: faultkit.ClusterHost, rng: random.Random) -> None:
        self.work, self.ray_tmp, self.cluster, self.rng = work, ray_tmp, cluster, rng
        self.tags: list[str] = []
        self.logs = os.path.join(work, "logs")
        self._n = 0

    def prefix(self, what: str) -> str:
        self._n += 1
        return os.path.join(self.work, f"{what}-{self._n}")

    def run(self, voyage: str, args: list[str], joined: bool = True, name: str = "run") -> faultkit.Executor:
        if joined:
            args = [*args, "--ray-address", self.cluster.address]
        self._n += 1
        ex = faultkit.Executor(voyage, args, self.logs, None if joined else self.ray_tmp, name=f"{name}-{self._n}")
        self.tags.append(ex.tag)
        return ex

    def reference(self, voyage: str, args: list[str]) -> faultkit.Audit:
        prefix = args[args.index("--prefix") + 1]
        ex = self.run(voyage, args, name="reference")
        if ex.wait(300) != 0:
            raise RuntimeError(f"the reference run failed:\n{ex.tail()}")
        return faultkit.audit(prefix)

    # -- SIGKILLs -------------------------------------------------------------------------------
    def kills(self, total: int) -> dict:
        voyages = {
            "slow": (faultkit.SLOW, [f"--{k}={v}" for k, v in SLOW.items()], SLOW_SECONDS),
            "hello": (faultkit.HELLO, ["--n_files", "4"], 1.5),
        }
        # delay is run-only: the reference shares every digest with the slow runs
        refs = {name: self.reference(path, ["--prefix", self.prefix(f"ref-{name}"),
                                            *[f for f in flags if not f.startswith("--delay")]])
                for name, (path, flags, _) in voyages.items()}
        kills = corrupt = ran_again = rounds = equal = completed = finished_first = 0
        in_steps = 0
        while kills < total:
            rounds += 1
            name = "hello" if rounds % 3 == 0 else "slow"
            path, flags, seconds = voyages[name]
            prefix = self.prefix(f"kills-{name}")
            args = ["--prefix", prefix, "--lease-ttl", "2", *flags]
            done_at: dict[str, int] = {}
            for _ in range(min(self.rng.randint(1, 3), total - kills)):
                ex = self.run(path, args, joined=False, name="killed")
                from_start = self.rng.random() < 0.25
                deadline = time.time() + 120
                while not from_start and ex.running() and not faultkit.holds_a_lease(prefix, ex.pid, live=False) \
                        and time.time() < deadline:
                    time.sleep(0.02)
                time.sleep(self.rng.uniform(0, 10.0) if from_start else self.rng.uniform(0, seconds))
                if not ex.running():
                    finished_first += 1
                    continue
                in_steps += faultkit.holds_a_lease(prefix, ex.pid) is not None
                ex.kill()
                kills += 1
                got = faultkit.audit(prefix)
                corrupt += len(got.corrupt)
                for step, state in got.states.items():
                    if state == "SUCCESS":
                        done_at.setdefault(step, len(got.attempts[step]))
            final = self.run(path, args, name="final")
            completed += final.wait(300) == 0
            got = faultkit.audit(prefix)
            corrupt += len(got.corrupt)
            ran_again += sum(len(got.attempts[s]) != n for s, n in done_at.items())
            ran_again += sum(got.successes(s) > 1 for s in got.attempts)
            equal += got.outputs == refs[name].outputs
            print(f"  round {rounds} ({name}): {kills}/{total} kills so far", flush=True)
        ok = corrupt == 0 and ran_again == 0 and equal == rounds and completed == rounds
        return dict(ok=ok, sigkills=kills, **{
            "kills that landed while the executor held a lease": in_steps,
            "voyages (each killed 1-3 times, then finished)": rounds,
            "corrupt SUCCESS folders": corrupt,
            "steps that had succeeded and ran again": ran_again,
            "voyages completed by the next run": f"{completed}/{rounds}",
            "final output digests equal to an uninterrupted run": f"{equal}/{rounds}",
            "runs that finished before their kill moment (not counted)": finished_first})

    # -- executors started together -------------------------------------------------------------
    def concurrent(self, rounds: int, n: int, embedded: bool) -> dict:
        steps = exactly_once = all_zero = waited = 0
        per_step, ran_by = [], []
        for _ in range(rounds):
            prefix = self.prefix("concurrent")
            args = ["--prefix", prefix, "--lease-ttl", "5", "--shards", "4", "--files", "3", "--delay", "0.3"]
            runs = [self.run(faultkit.SLOW, args, joined=not embedded, name="together") for _ in range(n)]
            codes = [r.wait(600) for r in runs]
            all_zero += codes == [0] * n
            got = faultkit.audit(prefix)
            steps += len(got.attempts)
            per_step += [got.successes(s) for s in got.attempts]
            exactly_once += all(states == ["SUCCESS"] for states in got.attempts.values()) and not got.corrupt
            waited += sum(": WAITING, leased by" in r.stderr and "done meanwhile by another executor" in r.stderr
                          for r in runs)
            ran_by.append(len({run_id for ids in got.run_ids.values() for run_id in ids}))
        return dict(ok=exactly_once == rounds and all_zero == rounds, **{
            "rounds": f"{rounds} x {n} executors ({'embedded Ray each' if embedded else 'joined to one cluster'})",
            "steps per round": steps // rounds,
            "SUCCESS attempts per step (min/max)": f"{min(per_step)}/{max(per_step)}",
            "rounds where every step ran exactly once": f"{exactly_once}/{rounds}",
            "rounds where every executor exited 0": f"{all_zero}/{rounds}",
            "executors that waited on a lease, then took the holder's result": waited,
            "executors that ran at least one step, per round": ran_by})

    # -- lease takeover -------------------------------------------------------------------------
    def takeover(self, trials: int, ttl: float) -> dict:
        took, shapes = [], []
        for _ in range(trials):
            prefix = self.prefix("takeover")
            common = ["--prefix", prefix, "--lease-ttl", str(ttl), "--shards", "1", "--files", "6"]
            holder = self.run(faultkit.SLOW, [*common, "--delay", "2"], name="holder")
            dirname = faultkit.wait_for(lambda: faultkit.holds_a_lease(prefix, holder.pid), 120)
            faultkit.wait_for(lambda: os.path.exists(os.path.join(prefix, dirname, "part-000.bin")), 60)
            waiter = self.run(faultkit.SLOW, [*common, "--delay", "0.05"], name="waiter")
            faultkit.wait_for(lambda: ": WAITING, leased by" in waiter.stderr or not waiter.running(), 120)
            lease_path = os.path.join(prefix, dirname, ".lease")
            token = json.load(open(lease_path))["token"]
            holder.kill()
            taken = faultkit.wait_for(lambda: _token(lease_path) > token and time.time(), 10 * ttl)
            took.append(taken - holder.killed_at if taken else float("inf"))
            waiter.wait(300)
            shapes.append(faultkit.audit(prefix).attempts.get("slow/shard/0"))
        ok = max(took) <= 2 * ttl and all(s == ["INTERRUPTED", "SUCCESS"] for s in shapes)
        return dict(ok=ok, **{
            "trials": trials, "lease ttl": f"{ttl:g}s (bound: 2 x ttl = {2 * ttl:g}s)",
            "takeover after the kill (min/median/max)":
                f"{min(took):.2f}s / {statistics.median(took):.2f}s / {max(took):.2f}s",
            "records showing INTERRUPTED then SUCCESS": f"{sum(s == ['INTERRUPTED', 'SUCCESS'] for s in shapes)}/{trials}"})

    # -- node loss ------------------------------------------------------------------------------
    def node_loss(self, trials: int) -> dict:
        completed = shaped = 0
        for _ in range(trials):
            prefix = self.prefix("nodes")
            gb200 = list(self.cluster.gb200)
            run = self.run(faultkit.SLOW, ["--prefix", prefix, "--accelerator", "GB200", "--shards", "1",
                                           "--files", "6", "--delay", "0.4"], name="gb200")
            node = faultkit.wait_for(lambda: faultkit.running_on(prefix, "slow/shard/0"), 120)
            if node:
                self.cluster.remove(node)
            completed += run.wait(300) == 0
            got = faultkit.audit(prefix)
            nodes = got.nodes.get("slow/shard/0", [])
            shaped += (got.attempts.get("slow/shard/0") == ["INTERRUPTED", "SUCCESS"] and nodes[0] == node
                       and nodes[1] in gb200 and nodes[1] != node and not got.corrupt)
            self.cluster.add()
        return dict(ok=completed == trials and shaped == trials, **{
            "trials": trials, "voyages completed": f"{completed}/{trials}",
            "records: INTERRUPTED on the removed GB200 node, then SUCCESS on another GB200 node":
                f"{shaped}/{trials}"})

    # -- GCS through the faulty proxy -------------------------------------------------------------
    def faulty_proxy(self, proxy: faultkit.FaultyProxy, runs: int, rate: float) -> dict:
        args = ["--n_files", "4"]
        proxy.rate = 0.0
        ref_prefix = f"gs://marin-test/ref-{uuid.uuid4().hex[:8]}"
        ref = self.reference(faultkit.HELLO, ["--prefix", ref_prefix, *args])
        completed = identical = 0
        stats = dict.fromkeys(("requests", *faultkit.KINDS), 0)
        for _ in range(runs):
            prefix = f"gs://marin-test/faulty-{uuid.uuid4().hex[:8]}"
            before = dict(proxy.stats)
            proxy.rate = rate
            run = self.run(faultkit.HELLO, ["--prefix", prefix, *args], name="faulty")
            completed += run.wait(600) == 0
            proxy.rate = 0.0  # the checks below read through the proxy too, faithfully
            for k in stats:
                stats[k] += proxy.stats[k] - before.get(k, 0)
            got = faultkit.audit(prefix)
            identical += got.outputs == ref.outputs and not got.corrupt and \
                faultkit.same_bytes(ref_prefix, prefix) == []
        faults = sum(stats[k] for k in faultkit.KINDS)
        return dict(ok=completed == runs and identical == runs, **{
            "runs": f"{runs} x voyages/hello.py --n_files 4 on gs:// (the emulator)",
            "requests of the faulty runs": stats["requests"],
            "faults injected": f"{faults} ({100 * faults / max(1, stats['requests']):.1f}%): " +
                               ", ".join(f"{k} {stats[k]}" for k in faultkit.KINDS),
            "voyages completed": f"{completed}/{runs}",
            "outputs identical to the fault-free run (digests and bytes)": f"{identical}/{runs}"})


def _token(path: str) -> int:
    try:
        return json.load(open(path))["token"]
    except (OSError, ValueError):
        return -1


class start_emulator:
    """gcp-storage-emulator on a free port with bucket `marin-test` (as the tests' fixture)."""

    def __init__(self) -> None:
        exe = shutil.which("gcp-storage-emulator") or os.path.join(os.path.dirname(sys.executable),
                                                                     "gcp-storage-emulator")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen([exe, "start", f"--port={port}", "--in-memory"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        import gcsfs

        gcsfs.GCSFileSystem(endpoint_url=self.url, token="anon", skip_instance_cache=True).mkdir("marin-test")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(10)


if __name__ == "__main__":
    raise SystemExit(main())

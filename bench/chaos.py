"""Chaos on one prefix: several executors, killed, paused and left without nodes, at once.

    .venv/bin/python bench/chaos.py                      # a laptop round (40 steps) and a hello round: 10-15 min here
    .venv/bin/python bench/chaos.py --voyage laptop --laptop-steps 0 --rounds 3   # the issue's target (400 steps)
    .venv/bin/python bench/chaos.py --rounds 0 --cost-repeats 4 --cost-laptop-repeats 1   # the protocol's cost

Everything is real: a 3-node `ray.cluster_utils.Cluster` (`tests/kits/cluster_host.py`: a head and
two worker nodes), the GCS emulator behind `faultkit.FaultyProxy` (which fails `--fault-rate` of the
requests with 429, 503 or a dropped connection), and `marin-run` processes joined to the cluster.

Chaos, per round: `--executors` executors start the same voyage on one fresh `gs://` prefix with a
short `--lease-ttl`. Every few seconds (seeded) one of: SIGKILL of an executor's process group (a new
executor takes its place, so that as many run at once), SIGSTOP of one for 0.5 to 3 ttl then SIGCONT
(half the time with the Ray workers running the steps it holds: a writer paused mid-step), or
removal of a worker node (`Cluster.remove_node`, under whatever runs on it), one added back a few
seconds later, or a Ray-retry zombie: a step's worker paused, then its node removed so
that Ray retries the task elsewhere under the same lease token, the paused worker resumed 1-3 ttl
later (counted when it is still alive then); or a stalled first write: the proxy holds the next
attempt's `.status` RUNNING upload (sent after its fence check) for 1.5-3 ttl while its executor
is paused past the ttl, then refuses it with 412 if the object changed meanwhile (the emulator
ignores `ifGenerationMatch`; GCS would refuse it the same way). The chaos stops when an executor exits 0 (the voyage is done) or after `--events`
events; paused ones are resumed and every executor left runs to its end; then a final clean
executor runs the voyage on the prefix (it must find everything done, or finish it).

Checks, per round:
- every committed output's artifacts are what its record lists (`faultkit.audit_artifacts`);
- no step has more than one SUCCESS attempt in its record, and no attempt of a step started after
  the step's first success ended (`faultkit.attempt_starts` reads every attempt's own record);
- every output digest, and every artifact's bytes, equal a clean run's on another prefix;
- the final executor exits 0 and has nothing to run;
- every line an executor wrote about a failure is explained by one rule of `EXPLAINED`; an executor
  that exited other than 0 without being killed, and any line no rule explains, is a finding.

Cost of the commit protocol: plan (`marin-run --dry-run` on a finished prefix, the whole process) and
run (a fresh prefix, embedded Ray; the voyage's own "finished in" time and the whole process) of
voyages/hello.py and the laptop voyage, with this tree against the commit before the attempts protocol
(the parent of the first commit of executor/storage/attempts.py, checked out with `git worktree add` under
/tmp), alternating, medians side by side with ratios.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # before gcsfs is imported
sys.path.insert(0, os.path.join(ROOT, "tests"))  # kits/
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, ROOT)

from kits import faultkit  # noqa: E402
from faults import start_emulator, tear_down  # noqa: E402

def voyage_args(name: str, args: argparse.Namespace) -> tuple[str, list[str]]:
    """The voyage file (relative to a tree's root) and its flags."""
    if name == "hello":
        return "voyages/hello.py", ["--n_files", str(args.hello_files), "--words_per_file", str(args.hello_words)]
    if name == "laptop":
        return "voyages/535b.py", ["--laptop", "--laptop_steps", str(args.laptop_steps)]
    raise SystemExit(f"--voyage: hello or laptop, got {name!r}")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--voyage", action="append", default=None,
                   help="hello or laptop; repeat for both (default: laptop, then hello)")
    p.add_argument("--rounds", type=int, default=1, help="chaos rounds per voyage, each on a fresh prefix")
    p.add_argument("--laptop-steps", type=int, default=40, help="--laptop_steps of the laptop voyage (0: 400)")
    p.add_argument("--hello-files", type=int, default=8)
    p.add_argument("--hello-words", type=int, default=400_000, help="words per file: about a second a step")
    p.add_argument("--executors", type=int, default=3, help="executors at once")
    p.add_argument("--ttl", type=float, default=4.0, help="--lease-ttl of the executors (seconds)")
    p.add_argument("--every", type=float, default=4.0, help="mean seconds between two chaos events")
    p.add_argument("--events", type=int, default=24,
                   help="chaos events per round at most; then the executors left finish the voyage undisturbed "
                        "(at a ttl of seconds, pauses past the ttl every few seconds can keep a long step from "
                        "ever committing)")
    p.add_argument("--weights", default="3,3,2,1,1",
                   help="relative odds of a kill, a pause, a node loss, a Ray-retry zombie, a stalled first write")
    p.add_argument("--fault-rate", type=float, default=0.01, help="share of GCS requests the proxy fails")
    p.add_argument("--max-executors", type=int, default=40, help="executors started per round at most")
    p.add_argument("--round-seconds", type=float, default=900, help="chaos stops after this, done or not")
    p.add_argument("--cost-repeats", type=int, default=0, help="hello runs per version and store (cost section)")
    p.add_argument("--cost-laptop-repeats", type=int, default=0, help="laptop runs (400 steps) per version")
    p.add_argument("--before", default=None, help="commit to compare with (default: the one before attempts)")
    p.add_argument("--seed", type=int, default=None, help="replay a run (printed at the start)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs of every executor)")
    p.add_argument("--classify", metavar="LOGS", default=None,
                   help="only classify the failure lines of the executor logs in a kept work folder's logs/")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.classify:
        return classify_folder(args.classify)
    args.voyage = args.voyage or ["laptop", "hello"]
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="marin-chaos-")
    given = sys.argv[1:] if argv is None else argv
    print(f"bench/chaos.py {' '.join(given)}{'' if args.seed is not None else f' --seed {seed}'}  (work folder {work})")
    print(machine_state(), flush=True)
    ray_tmp = faultkit.RayTmp()
    emulator = start_emulator()
    proxy = faultkit.FaultyProxy(emulator.url, rate=0.0, seed=seed).start()
    # inherited by everything started below, the cluster's workers included
    os.environ.update(STORAGE_EMULATOR_HOST=proxy.url, FSSPEC_GS_TOKEN="anon",
                      GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")
    failed = False
    cluster = None
    tags: list[str] = []
    try:
        t0 = time.time()
        if args.rounds:
            cluster = faultkit.ClusterHost(os.path.join(work, "cluster"), ray_tmp.path, gb200_nodes=2)
            chaos = Chaos(args, rng, work, cluster, proxy, tags)
            totals: collections.Counter = collections.Counter()
            for name in args.voyage:
                ref = chaos.reference(name)
                for r in range(args.rounds):
                    ok, figures = chaos.round(name, r + 1, ref)
                    failed |= not ok
                    totals.update({k: v if isinstance(v, int) else len(v) for k, v in figures.items()
                                   if isinstance(v, (int, list))})
                    totals.update({f"failure lines: {k}": v for k, v in figures["failure lines explained"].items()}
                                  if isinstance(figures["failure lines explained"], dict) else {})
                    print(f"\n== chaos {name}, round {r + 1}: {'ok' if ok else 'FAILED'}", flush=True)
                    for key, value in figures.items():
                        print(f"  {key}: {value}", flush=True)
            print("\n== chaos, all rounds", flush=True)
            for key, value in totals.items():
                print(f"  {key}: {value}")
            leftovers = faultkit.reap(tags)
            print(f"  processes left behind by the executors: {len(leftovers)} {leftovers or ''}", flush=True)
            failed |= bool(leftovers)
        if args.cost_repeats or args.cost_laptop_repeats:
            cost(args, work, ray_tmp.path, proxy, tags)
        print(f"\ntotal {time.time() - t0:.0f}s; {'all checks passed' if not failed else 'SOME CHECKS FAILED'}")
    finally:
        faultkit.reap(tags, timeout=0.5)  # an interrupted bench leaves no executor
        tear_down(cluster, proxy, emulator, ray_tmp, None if args.keep else work)
    return 1 if failed else 0


def machine_state() -> str:
    load = os.getloadavg()
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    return (f"machine: {os.cpu_count()} cores, load {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}, "
            f"Python {platform.python_version()}, tree {rev}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


# -- what an executor wrote about failures ----------------------------------------------------------
# Each rule: a pattern over one line, and the one-line explanation it stands for. Lines that are
# plainly progress (plans, WAITING, takeovers) are not failure lines and are not listed.
EXPLAINED = [
    (r"Exception ignored in atexit callback: <function _start_and_connect_service",
     "W&B (offline): a training worker leaving could not tear down W&B's service process, whose "
     "connection was already gone (ConnectionResetError)"),
    (r"lease lost to another executor; SUCCESS not written; waiting for the new holder",
     "runner: the attempt of a paused executor (its lease taken over meanwhile) failed its fence at "
     "the commit, or its stalled first write was refused (412): nothing written; it waits for the new "
     "holder's result"),
    (r"LeaseLost: step \S+, attempt \d+ \(token \d+\): the lease (was taken over|was not renewed)",
     "a superseded attempt of a resumable step (training) stopped before writing into the folder it "
     "shares with its successor (ctx.fenced)"),
    (r"marin\.lease: lease of \S+ was lost to another executor",
     "heartbeat: a paused executor found, on waking, its lease taken over by another"),
    (r"Task \w+ failed\. There are \d+ retries remaining, so the task will be retried\. Error: Task "
     r"failed because the node it was running on is dead",
     "Ray: the node under the step was removed; Ray retries the task on another node"),
    (r"\(lost_node\) (LocalRayletDiedError|NodeDiedError|WorkerCrashedError|OwnerDiedError|ObjectLostError)",
     "summary: a step whose node was removed under it failed after its lost_node retries"),
    (r"renewing the lease of \S+ failed",
     "heartbeat: one renewal failed on a GCS request (a fault of the proxy past gcsfs's retries); the next "
     "renewal tries again, and a lease that lapsed meanwhile fails the attempt's fence"),
    (r"node_manager\.cc:\d+: +An unexpected system state has occurred",
     "Ray: a raylet aborted on an internal check while the bench removed or added nodes (Ray's bug, "
     "not ours); Ray retries its tasks"),
    (r"Failed to push error to driver for task",
     "Ray: a task's error could not reach its driver, which the bench had killed"),
    (r"^(\(raylet\) )?\[\d{4}-\d\d-\d\d [\d:,]+ [IWD] \d+ \d+\]",
     "Ray: a removed node's raylet log (info and warning lines), forwarded to the driver"),
    (r"failed \(lost_node",
     "the step's node was removed (or its worker stopped): Ray's error, classed lost_node, retried"),
    (r"failed \(\w+: .*(NodeDiedError|WorkerCrashedError|OwnerDiedError|ObjectLostError|ActorDiedError)",
     "the step's node was removed: Ray's error, retried"),
    (r"(The node with node id|A worker died or was killed while executing|node .* has been marked dead|"
     r"Node .* is dead|raylet (died|is terminated)|The worker died unexpectedly|was killed: the node)",
     "Ray reporting the node the bench removed, or a worker on it"),
    (r"(Failed to (connect|register)|Lost connection|GCS (client|server).*(reconnect|disconnect)|"
     r"Connection to the GCS|gcs_rpc_client)",
     "Ray's own connection warnings while a node was being removed or added"),
    (r"(Retry|retry|Retrying).*(429|503|Too Many Requests|Service Unavailable|Connection|Disconnected|timed out)",
     "gcsfs retrying a request the fault proxy failed"),
    (r"(ServerDisconnectedError|ClientOSError|ConnectionResetError|Connection reset|ClientPayloadError)",
     "a connection the fault proxy dropped"),
    (r"(_request out of retries on exception: , 501|HttpError: , 501|moveTo API: , 501)",
     "gcsfs: the emulator has no moveTo API (501); gcsfs logs that, with its traceback, and renames "
     "the checkpoint by copy and delete instead"),
    (r"marin\.ray: reading the heartbeats failed: (Get timed out|The actor \w+ is unavailable: .*restarting)",
     "watchdog: the executor's heartbeat board (a Ray actor beside the driver, restarted by Ray when "
     "lost) did not answer within 10 s or was restarting (its worker starting, the node busy under the "
     "chaos, or its node removed); nothing is judged on a missed read (executor/ray_backend.py), so no "
     "step is called hung for it"),
    (r"took over the lease", None),
    (r"WAITING, leased by", None),
    (r"done meanwhile by another executor", None),
]
RAY_PREFIX = re.compile(r"^\((?:step:)?[^()]*pid=\d+(?:, ip=[\d.]+)?\) ")
LOST_SUMMARY = next(i for i, (pattern, _) in enumerate(EXPLAINED) if pattern.startswith(r"\(lost_node\)"))
FAILURE_WORDS = re.compile(r"(?i)(error|fail|traceback|exception|lost|killed|died|dead|warning|interrupted|corrupt)")
NOT_FAILURES = re.compile(r"(Token authentication is enabled|^plan of \d+ steps|^SUCCESS\s|^CACHED\s|"
                          r"^\[state-dump\]|^- (objects|bytes) errored: 0|"
                          r"^(During handling of the above exception|The above exception was the direct cause)|"
                          r"^BLOCKED\s.*dependency failed|"  # a consequence: the FAILED line is the failure
                          r"voyage finished in|^\s*(RUN|CACHED|WAITING|RETRY|STALE)\s+\d+\s|failure_class|"
                          r"^\S+\s+\d+(\.\d+)? cpu)")


def classify_lines(text: str) -> tuple[collections.Counter, list[str]]:
    """(explanation -> count, unexplained lines) of the failure lines in an executor's output. A
    traceback counts once, by the line logged before it and its exception line."""
    explained: collections.Counter = collections.Counter()
    unexplained = []
    # without colours and without the prefix Ray puts on a worker's lines, indentation kept
    lines = [RAY_PREFIX.sub("", re.sub(r"\x1b\[[0-9;]*m", "", raw)).rstrip() for raw in text.splitlines()]
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if line.startswith("Traceback (most recent call last)"):
            before = lines[i - 2].strip() if i >= 2 else ""
            while i < len(lines) and (lines[i].startswith(" ") or not lines[i].strip()):
                i += 1  # the frames, down to the exception's own line
            exception = lines[i].strip() if i < len(lines) else "(cut short)"
            i += 1
            line = f"traceback after {before!r}: {exception}"
        if not line or NOT_FAILURES.search(line):
            continue
        if re.match(r"FAILED\s", line):  # a step's summary line: explained only as a node lost under it
            if re.search(EXPLAINED[LOST_SUMMARY][0], line):
                explained[EXPLAINED[LOST_SUMMARY][1]] += 1
            else:
                unexplained.append(line)
            continue
        for pattern, why in EXPLAINED:
            if re.search(pattern, line):
                if why:
                    explained[why] += 1
                break
        else:
            if FAILURE_WORDS.search(line):
                unexplained.append(line)
    return explained, unexplained


def classify_folder(logs: str) -> int:
    """Print the classification of every executor log under `logs` (exit 1 if a line is unexplained)."""
    explained: collections.Counter = collections.Counter()
    unexplained = []
    for name in sorted(os.listdir(logs)):
        with open(os.path.join(logs, name), errors="replace") as f:
            why, lines = classify_lines(f.read())
        explained.update(why)
        unexplained += [f"{name}: {line}" for line in lines]
    for why, n in explained.most_common():
        print(f"{n:5d}  {why}")
    print(f"unexplained: {len(unexplained)}")
    for line in unexplained:
        print(f"  {line[:400]}")
    return 1 if unexplained else 0


# -- chaos ------------------------------------------------------------------------------------------
class Chaos:
    def __init__(self, args: argparse.Namespace, rng: random.Random, work: str, cluster: faultkit.ClusterHost,
                 proxy: faultkit.FaultyProxy, tags: list[str]) -> None:
        self.args, self.rng, self.work, self.cluster, self.proxy, self.tags = args, rng, work, cluster, proxy, tags
        self.logs = os.path.join(work, "logs")
        self.workers = len(cluster.gb200)
        self.weights = [float(w) for w in args.weights.split(",")]
        self._n = 0

    def start(self, voyage: str, args: list[str], name: str) -> faultkit.Executor:
        self._n += 1
        ex = faultkit.Executor(os.path.join(ROOT, voyage), [*args, "--ray-address", self.cluster.address],
                               self.logs, name=f"{name}-{self._n}")
        self.tags.append(ex.tag)
        return ex

    def reference(self, name: str) -> str:
        """A clean run of the voyage on a prefix of its own (no faults, no chaos): its prefix."""
        voyage, flags = voyage_args(name, self.args)
        prefix = f"gs://marin-test/reference-{name}-{uuid.uuid4().hex[:8]}"
        t = time.time()
        ex = self.start(voyage, ["--prefix", prefix, *flags], "reference")
        if ex.wait(1800) != 0:
            raise RuntimeError(f"the clean reference run failed:\n{ex.tail()}")
        print(f"\nreference: {voyage} {' '.join(flags)} on {prefix}: {time.time() - t:.0f}s alone on the cluster",
              flush=True)
        return prefix

    def round(self, name: str, number: int, ref_prefix: str) -> tuple[bool, dict]:
        args, rng = self.args, self.rng
        voyage, flags = voyage_args(name, args)
        prefix = f"gs://marin-test/chaos-{name}-{number}-{uuid.uuid4().hex[:8]}"
        common = ["--prefix", prefix, "--lease-ttl", f"{args.ttl:g}", *flags]
        self.proxy.rate = args.fault_rate
        before = dict(self.proxy.stats)
        t0 = time.time()
        live = [self.start(voyage, common, "chaos") for _ in range(args.executors)]
        everyone = list(live)
        killed: set[str] = set()
        paused: dict[faultkit.Executor, float] = {}
        paused_workers: dict[int, float] = {}  # a paused executor's step workers, paused with it
        zombies: dict[int, float] = {}  # paused step workers whose node was removed: when they resume
        stalls_seen = len(self.proxy.stalled)
        add_back: list[float] = []
        ev: collections.Counter = collections.Counter()
        next_event = t0 + rng.uniform(0.5, 2 * args.every)
        done_by = None
        while time.time() - t0 < args.round_seconds:
            now = time.time()
            for ex, at in list(paused.items()):
                if now >= at:
                    _signal(ex, signal.SIGCONT)
                    del paused[ex]
            for pid, at in list(paused_workers.items()):
                if now >= at:
                    _signal_pid(pid, signal.SIGCONT)
                    del paused_workers[pid]
            for pid, at in list(zombies.items()):
                if now >= at:
                    if _alive(pid):
                        ev["Ray-retry zombies alive when resumed"] += 1
                    _signal_pid(pid, signal.SIGCONT)
                    del zombies[pid]
            while len(self.proxy.stalled) > stalls_seen:  # a first write is being held: pause its executor
                name = self.proxy.stalled[stalls_seen]
                stalls_seen += 1
                holder = self.lease_holder(name)
                for ex in live:
                    if ex.pid == holder and ex not in paused:
                        _signal(ex, signal.SIGSTOP)
                        paused[ex] = now + 1.5 * args.ttl
                        ev["stalled first writes whose executor was paused past the ttl"] += 1
            if add_back and now >= add_back[0]:
                add_back.pop(0)
                if not self.add_node():
                    ev["node additions that missed Ray's 30 s (tried again 5 s later)"] += 1
                    add_back.append(time.time() + 5)
            for ex in list(live):
                if ex.running():
                    continue
                live.remove(ex)
                if ex.proc.returncode == 0:
                    done_by = done_by or ex
                elif len(everyone) < args.max_executors:
                    ev["executors that exited early (not killed), replaced"] += 1
                    live.append(self.start(voyage, common, "chaos"))
                    everyone.append(live[-1])
            if done_by is not None:
                break
            if now >= next_event and live and sum(ev[k] for k in EVENTS) < args.events:
                kind = rng.choices(("kill", "pause", "node", "zombie", "stall")[:len(self.weights)],
                                   weights=self.weights)[0]
                ex = rng.choice(live)
                if kind == "kill" and len(everyone) < args.max_executors:
                    paused.pop(ex, None)
                    ex.kill()
                    killed.add(ex.tag)
                    live.remove(ex)
                    ev["SIGKILLs of an executor (its process group)"] += 1
                    live.append(self.start(voyage, common, "chaos"))
                    everyone.append(live[-1])
                elif kind == "pause" and ex not in paused:
                    _signal(ex, signal.SIGSTOP)
                    paused[ex] = now + rng.uniform(0.5, 3.0) * args.ttl
                    ev["SIGSTOPs of an executor (0.5-3 ttl, then SIGCONT)"] += 1
                    if paused[ex] - now > args.ttl:
                        ev["pauses longer than the ttl"] += 1
                    # Half the time its steps' Ray workers too (on the cluster, not in its process
                    # group): a writer paused mid-step that wakes after another executor took over
                    # and committed, the first case the chaos round found.
                    if rng.random() < 0.5:
                        for pid in self.workers_of(prefix, ex.pid):
                            _signal_pid(pid, signal.SIGSTOP)
                            paused_workers[pid] = paused[ex]
                            ev["step workers paused with their executor"] += 1
                elif kind == "zombie" and len(self.cluster.gb200) == self.workers:
                    # The Ray-retry zombie: a step's worker paused, its node removed under it: Ray
                    # retries the task elsewhere with the same spec (the same lease token) while the
                    # first try is stopped, not dead; it is resumed 1-3 ttl later.
                    found = self.step_workers()
                    if found:
                        pid, node = rng.choice(found)
                        _signal_pid(pid, signal.SIGSTOP)
                        self.cluster.remove(node)
                        add_back.append(time.time() + rng.uniform(2.0, 6.0))
                        zombies[pid] = time.time() + rng.uniform(1.0, 3.0) * args.ttl
                        print(f"  {time.strftime('%H:%M:%S')} zombie: worker pid {pid} paused, node {node[:12]} "
                              "removed", flush=True)  # to match against lines Ray forwards as (pid=N)
                        ev["Ray-retry zombies (a step worker paused, its node removed, resumed 1-3 ttl later)"] += 1
                elif kind == "stall" and self.proxy.stall is None:
                    # The stalled first write: the next attempt's first write (.status RUNNING, after its
                    # fence check) held 1.5-3 ttl by the proxy, its executor paused as long (below)
                    self.proxy.stall_first_write(rng.uniform(1.5, 3.0) * args.ttl)
                    ev["first writes stalled past the ttl (armed)"] += 1
                elif kind == "node" and len(self.cluster.gb200) == self.workers:
                    self.cluster.remove(rng.choice(self.cluster.gb200))
                    add_back.append(time.time() + rng.uniform(2.0, 6.0))
                    ev["worker nodes removed (one added back 2-6 s later)"] += 1
                next_event = time.time() + rng.uniform(0.5, 2 * args.every)
            time.sleep(0.05)
        chaos_s = time.time() - t0
        # the chaos is over: resume, let everyone finish, give the nodes back
        for ex in paused:
            _signal(ex, signal.SIGCONT)
        ev["Ray-retry zombies alive when resumed"] += sum(_alive(pid) for pid in zombies)
        for pid in [*paused_workers, *zombies]:
            _signal_pid(pid, signal.SIGCONT)
        self.proxy.stall = None
        for _ in add_back:
            any(self.add_node() for _ in range(3))
        for ex in live:
            try:
                ex.wait(10 * args.ttl + 300)
            except AssertionError as e:
                ev["executors that did not end after the chaos (killed)"] += 1
                print(f"  {e}", flush=True)
        self.proxy.rate = 0.0
        faults = sum(self.proxy.stats[k] - before.get(k, 0) for k in faultkit.KINDS)
        requests = self.proxy.stats["requests"] - before.get("requests", 0)
        final = self.start(voyage, common, "final")
        final_code = final.wait(1800)
        final_plan = final.stdout.splitlines()[0] if final.stdout else ""
        final_ran = re.findall(r"voyage finished in .*", final.stdout)

        got = faultkit.audit_artifacts(prefix)
        ref = faultkit.audit_artifacts(ref_prefix)
        starts = faultkit.attempt_starts(prefix)
        twice = [s for s in got.attempts if got.successes(s) > 1]
        after = []
        for step, states in got.attempts.items():
            store_record = faultkit.Store(prefix).read_record(got.folders[step])
            first = min((a.ended for a in store_record.attempts if a.state == "SUCCESS" and a.ended), default=None) \
                if store_record else None
            if first is not None:
                after += [f"{step} (attempt started {t - first:.1f}s after its success, {state})"
                          for t, state in starts.get(step, []) if t > first]
        differ = faultkit.same_artifacts(ref_prefix, prefix)
        digests_equal = got.outputs == ref.outputs
        explained: collections.Counter = collections.Counter()
        unexplained: list[str] = []
        exits: collections.Counter = collections.Counter()
        # The emulator ignores ifGenerationMatch (docs/leases.md): two executors can take one lease with
        # one token. Real GCS refuses the second; here both run, and a resumable step's two attempts
        # share their lineage's folder. Counted, and a step's failure after one is explained by it.
        takers: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
        for ex in everyone:
            for step, token in re.findall(r"(\S+): took over the lease \(token (\d+)\)", ex.stderr):
                takers[(step, token)].add(ex.name)
        doubles = {step for (step, _), names in takers.items() if len(names) > 1}
        for ex in [*everyone, final]:
            code = ex.proc.returncode
            exits["killed by the bench" if ex.tag in killed else f"exit {code}"] += 1
            why, lines = classify_lines(ex.stdout + "\n" + ex.stderr)
            double = [line for line in lines if re.match(r"FAILED\s+(\S+)", line)
                      and re.match(r"FAILED\s+(\S+)", line).group(1) in doubles]
            if double:
                lines = [line for line in lines if line not in double]
                why["a step's attempt failed beside a second holder of its lease (the emulator ignores "
                    "ifGenerationMatch: both took one lease, and both resumed one lineage folder)"] += len(double)
            if ex.tag not in killed and code != 0:
                if code == 1 and not lines and (why.get(EXPLAINED[LOST_SUMMARY][1]) or double):
                    explained["exit 1: an executor whose step failed as above (another executor finished the "
                              "voyage)"] += 1
                else:
                    unexplained.append(f"{ex.name} exited {code}, not killed: {ex.tail(3)!r}")
            explained.update(why)
            unexplained += [f"{ex.name}: {line}" for line in lines]
        attempts = sum(len(v) for v in starts.values())
        ok = (final_code == 0 and not got.corrupt and not twice and not after and not differ and digests_equal
              and not unexplained)
        figures = {
            "voyage": f"{voyage} {' '.join(flags)}, {args.executors} executors at once, ttl {args.ttl:g}s, "
                      f"fault rate {args.fault_rate:g}",
            "chaos": f"{chaos_s:.0f}s, {sum(ev[k] for k in EVENTS)} events ("
                     + (f"the voyage done meanwhile by {done_by.name})" if done_by else
                        "then the executors left finished)"),
            **{k: v for k, v in sorted(ev.items())},
            "executors started": len(everyone),
            "exits": dict(exits),
            "GCS requests / faults injected": f"{requests} / {faults}",
            **{f"proxy: {k}": self.proxy.stats[k] - before.get(k, 0)
               for k in ("first writes stalled", "first writes refused after the stall (412)",
                         "first writes landed after the stall")},
            "steps / attempts in their records / attempt folders": f"{len(got.attempts)} / "
                f"{sum(len(v) for v in got.attempts.values())} / {attempts}",
            "leases taken twice with one token (the emulator ignores ifGenerationMatch)":
                sorted(f"{step} token {token}" for (step, token), names in takers.items() if len(names) > 1) or 0,
            "steps with more than one SUCCESS attempt": len(twice) if not twice else twice,
            "attempts started after their step had succeeded": len(after) if not after else after,
            "corrupt committed outputs": len(got.corrupt) if not got.corrupt else got.corrupt,
            "output digests equal to the clean run's": f"{sum(got.outputs.get(k) == v for k, v in ref.outputs.items())}"
                                                       f"/{len(ref.outputs)}",
            "artifact files whose bytes differ from the clean run's": len(differ) if not differ else differ[:10],
            "final executor": f"exit {final_code}; {final_plan}; {final_ran[-1] if final_ran else ''}",
            "failure lines explained": dict(explained) or 0,
            "failure lines unexplained (findings)": len(unexplained) if not unexplained else unexplained[:40],
        }
        return ok, figures


    def add_node(self) -> bool:
        """One worker node added back; False when its raylet missed Ray's 30 s to register."""
        try:
            self.cluster.add()
            return True
        except RuntimeError as e:
            if "timed out during startup" not in str(e):
                raise
            return False

    def step_workers(self) -> list[tuple[int, str]]:
        """(pid, node id) of the cluster's Ray workers now running a step on a worker node."""
        found = []
        for pid in faultkit.tagged_pids(self.cluster.tag):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    title = f.read().split(b"\0")[0].decode(errors="replace")
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
                with open(f"/proc/{ppid}/cmdline", "rb") as f:
                    parent = f.read().decode(errors="replace")
            except (OSError, ValueError):
                continue
            node = re.search(r"--node_id=([0-9a-f]+)", parent)
            if title.startswith("ray::step:") and node and node.group(1) in self.cluster.gb200:
                found.append((pid, node.group(1)))
        return found

    def lease_holder(self, status_name: str) -> int | None:
        """The pid the `.lease` beside a `.status` object (bucket-relative name) names."""
        import json

        store = faultkit.Store("gs://marin-test")
        try:
            return json.loads(store.fs.cat_file(f"marin-test/{status_name.rpartition('/')[0]}/.lease")).get("pid")
        except (OSError, ValueError):
            return None

    def workers_of(self, prefix: str, holder: int) -> list[int]:
        """The cluster's Ray workers now running a step whose lease process `holder` holds."""
        import json

        store = faultkit.Store(prefix)
        store.fs.invalidate_cache()
        found = []
        for pid in faultkit.tagged_pids(self.cluster.tag):  # only the processes of our own cluster
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    title = f.read().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if not title.startswith("ray::step:"):
                continue
            try:
                for path in store.fs.glob(f"{store.root}/{title[len('ray::step:'):]}-*/.lease"):
                    lease = json.loads(store.fs.cat_file(path))
                    if lease.get("pid") == holder and not lease.get("released"):
                        found.append(pid)
            except (OSError, ValueError):  # a read the fault proxy failed: this one is not paused
                continue
        return found


EVENTS = ("SIGKILLs of an executor (its process group)", "SIGSTOPs of an executor (0.5-3 ttl, then SIGCONT)",
          "worker nodes removed (one added back 2-6 s later)",
          "Ray-retry zombies (a step worker paused, its node removed, resumed 1-3 ttl later)",
          "first writes stalled past the ttl (armed)")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _signal(ex: faultkit.Executor, sig: int) -> None:
    try:
        os.killpg(ex.pid, sig)
    except ProcessLookupError:
        pass


# -- the cost of the commit protocol --------------------------------------------------------------
def checkout(commit: str) -> tuple[str, str]:
    """A checkout of `commit` under /tmp (`git worktree add --detach`, made once, reused after):
    its path and short id."""
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", commit], capture_output=True, text=True,
                         check=True).stdout.strip()
    path = f"/tmp/marin-voyage-{sha}"
    if not os.path.exists(os.path.join(path, "executor")):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", path, sha], check=True,
                       capture_output=True)
    return path, sha


def trees(before: str | None) -> list[tuple[str, str]]:
    """(label, tree) of the versions compared: the commit before the attempts protocol (the parent
    of the first commit of executor/storage/attempts.py, or `before`), that first commit (the protocol
    alone: the voyage files are the same), and this tree (main now)."""
    first = subprocess.run(["git", "-C", ROOT, "log", "--format=%H", "--reverse", "--", "executor/storage/attempts.py"],
                           capture_output=True, text=True, check=True).stdout.split()[0]
    old, old_sha = checkout(before or f"{first}^")
    new, new_sha = checkout(first)
    now = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    return [(f"before ({old_sha})", old), (f"attempts ({new_sha})", new), (f"now ({now})", ROOT)]


def cost(args: argparse.Namespace, work: str, ray_tmp: str, proxy: faultkit.FaultyProxy, tags: list[str]) -> None:
    versions = trees(args.before)
    proxy.rate = 0.0  # relays faithfully; it counts the GCS requests of each run (load-independent)
    hello: list[str] = []  # the README's hello: 10 steps of small files, the protocol's share at its largest
    # the commit before the protocol has no --laptop_steps: the README's laptop recipe (400 steps) for all
    cases = [("voyages/hello.py", hello, "local", args.cost_repeats),
             ("voyages/hello.py", hello, "gs", args.cost_repeats),
             ("voyages/535b.py", ["--laptop"], "local", args.cost_laptop_repeats)]
    logs = os.path.join(work, "cost")
    rows: dict[tuple, dict[str, list]] = collections.defaultdict(lambda: collections.defaultdict(list))
    steps: dict[tuple, dict[str, str]] = collections.defaultdict(dict)
    print(f"\n== cost of the commit protocol: embedded Ray, versions alternating; gs:// is the emulator behind"
          f" the proxy at fault rate 0, which counts requests", flush=True)
    for voyage, flags, store, repeats in cases:
        key = (voyage, " ".join(flags), store)
        for rep in range(repeats):
            for label, tree in (versions if rep % 2 == 0 else versions[::-1]):
                prefix = (os.path.join(work, f"cost-{uuid.uuid4().hex[:8]}") if store == "local"
                          else f"gs://marin-test/cost-{uuid.uuid4().hex[:8]}")
                env = {"PYTHONPATH": tree}
                before = proxy.stats["requests"]
                run, run_s = _run(tree, voyage, ["--prefix", prefix, *flags], logs, ray_tmp, env, tags)
                inner = re.findall(r"voyage finished in ([0-9.]+)s", run.stdout)
                middle = proxy.stats["requests"]
                plan, plan_s = _run(tree, voyage, ["--prefix", prefix, *flags, "--dry-run"], logs, ray_tmp, env, tags)
                if store == "gs":
                    rows[key][f"{label} run requests"].append(middle - before)
                    rows[key][f"{label} plan requests"].append(proxy.stats["requests"] - middle)
                head = plan.stdout.splitlines()[0] if plan.stdout else ""
                if not inner or "CACHED" not in head or re.search(r"\b(RUN|STALE|RETRY)\b", head):
                    raise RuntimeError(f"cost run of {label} {voyage} went wrong:\n{run.tail()}\n{plan.tail()}")
                steps[key][label] = re.search(r"plan of (\d+) steps", head).group(1)
                rows[key][f"{label} run"].append(float(inner[-1]))
                rows[key][f"{label} process"].append(run_s)
                rows[key][f"{label} plan"].append(plan_s)
                print(f"  {label} {voyage} {' '.join(flags)} on {store}: run {inner[-1]}s ({run_s:.1f}s process),"
                      f" plan {plan_s:.1f}s", flush=True)
    labels = [label for label, _ in versions]
    print(f"\nmedians; ratios against {labels[0]}")
    print(f"\n| voyage | store | what | {labels[0]} | {labels[1]} | ratio | {labels[2]} | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for (voyage, flags, store), r in rows.items():
        n = "/".join(dict.fromkeys(steps[(voyage, flags, store)].values()))
        for what, desc in (("plan", "plan: `--dry-run`, finished prefix, whole process"),
                           ("plan requests", "plan: GCS requests"),
                           ("run", "run: `voyage finished in`"),
                           ("process", "run: whole process (Ray's start too)"),
                           ("run requests", "run: GCS requests")):
            if f"{labels[0]} {what}" not in r:
                continue
            m = [statistics.median(r[f"{label} {what}"]) for label in labels]
            unit = (lambda v: f"{v:.0f}") if "requests" in what else (lambda v: f"{v:.2f}s")
            print(f"| {os.path.basename(voyage)} {flags} ({n} steps, {len(r[f'{labels[0]} {what}'])} runs) | {store} | "
                  f"{desc} | {unit(m[0])} | {unit(m[1])} | {m[1] / m[0]:.2f}x | {unit(m[2])} | {m[2] / m[0]:.2f}x |",
                  flush=True)


def _run(tree: str, voyage: str, args: list[str], logs: str, ray_tmp: str, env: dict,
         tags: list[str]) -> tuple[faultkit.Executor, float]:
    """One `marin-run` of `tree` to its end: the executor and its seconds. A run whose local Ray did
    not start (Ray gives its raylet a fixed 30 s, which a loaded machine can miss; the commits
    compared here predate marin-run's own retry of it) is run again, up to 3 times."""
    for _ in range(3):
        ex = faultkit.Executor(os.path.join(tree, voyage), args, logs, ray_tmp, env=env, cwd=tree)
        tags.append(ex.tag)
        t = time.time()
        code = ex.wait(1800)
        seconds = time.time() - t
        if code == 0:
            return ex, seconds
        if "timed out during startup" not in ex.stderr:
            break
    raise RuntimeError(f"{voyage} {args} under {tree} exited {code}:\n{ex.tail()}")


if __name__ == "__main__":
    raise SystemExit(main())

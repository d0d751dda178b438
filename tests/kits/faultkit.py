"""Fault-injection tools shared by the fault tests and `bench/faults.py`.

- `Executor`: one real `marin-run` process in a session (process group) of its own, tagged
  through its environment so that every process it starts, its embedded Ray included, can be
  found again and, after a SIGKILL of the group, checked to be gone (never `ray stop`, which
  would kill every other Ray on the machine).
- `audit`: what a prefix holds: corrupt SUCCESS folders (a record or manifest that does not
  match), the attempts of every record, the output digest of every step.
- `FaultyProxy`: an HTTP proxy in front of the GCS emulator that answers a share of requests with
  429 or 503, or drops the connection before or after the emulator handled the request.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import quote

from executor.storage.store import SUCCESS, Store, output_digest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARIN_RUN = os.path.join(os.path.dirname(sys.executable), "marin-run")
SLOW = os.path.join(ROOT, "tests", "kits", "slow_voyage.py")
HELLO = os.path.join(ROOT, "voyages", "hello.py")
TAG = "MARIN_FAULT_TAG"


# -- processes ------------------------------------------------------------------------------------
def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment carries `MARIN_FAULT_TAG=tag` (zombies excluded)."""
    needle = f"{TAG}={tag}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read() + b"\0"
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            found.append(int(entry))
    return found


def reap(tags: list[str], timeout: float = 30.0) -> list[str]:
    """Wait until no process carries any of `tags`; SIGKILL (by pid) whatever outlives `timeout`
    and return a description of each such leftover (empty: everything went by itself)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(tagged_pids(t) for t in tags):
            return []
        time.sleep(0.2)
    leftovers = []
    for t in tags:
        for pid in tagged_pids(t):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
                leftovers.append(f"{pid} {cmdline[:100]}")
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return leftovers


class RayTmp:
    """A short temporary root for the Ray sessions of spawned executors (RAY_TMPDIR), removed at
    the end, so that killed runs leave nothing under /tmp/ray."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="mr", dir="/tmp")

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class Executor:
    """One `marin-run VOYAGE ARGS` in its own process group, output to files under `logs`."""

    def __init__(self, voyage: str, args: list[str], logs: str, ray_tmp: str | None = None,
                 env: dict[str, str] | None = None, name: str | None = None, cwd: str = ROOT) -> None:
        self.tag = uuid.uuid4().hex
        self.name = name or self.tag[:8]
        os.makedirs(logs, exist_ok=True)
        self.out_path = os.path.join(logs, f"{self.name}.out")
        self.err_path = os.path.join(logs, f"{self.name}.err")
        full_env = {**os.environ, **(env or {}), TAG: self.tag}
        if ray_tmp:
            full_env["RAY_TMPDIR"] = ray_tmp
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            # cwd: Ray puts the driver's working directory first on its workers' sys.path
            self.proc = subprocess.Popen([MARIN_RUN, voyage, *args], stdout=out, stderr=err, cwd=cwd,
                                         env=full_env, start_new_session=True)
        self.started = time.time()
        self.killed_at: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL the whole process group: the executor and the Ray it started."""
        self.killed_at = time.time()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} still running after {timeout}s:\n{self.tail()}") from None

    def running(self) -> bool:
        return self.proc.poll() is None

    @property
    def stdout(self) -> str:
        with open(self.out_path, errors="replace") as f:
            return f.read()

    @property
    def stderr(self) -> str:
        with open(self.err_path, errors="replace") as f:
            return f.read()

    def tail(self, n: int = 30) -> str:
        return "\n".join((self.stdout + self.stderr).splitlines()[-n:])


class ClusterHost:
    """`cluster_host.py` in a process group of its own: a head node and GB200 worker nodes."""

    def __init__(self, logs: str, ray_tmp: str | None = None, gb200_nodes: int = 2, timeout: float = 120) -> None:
        self.tag = uuid.uuid4().hex
        env = {**os.environ, TAG: self.tag}
        if ray_tmp:
            env["RAY_TMPDIR"] = ray_tmp
        os.makedirs(logs, exist_ok=True)
        self.err_path = os.path.join(logs, "cluster.err")
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "tests", "kits", "cluster_host.py"),
                 "--gb200-nodes", str(gb200_nodes)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT, env=env,
                start_new_session=True)
        info = self._answer(timeout)
        self.address: str = info["address"]
        self.head: str = info["head"]
        self.gb200: list[str] = info["gb200"]

    def remove(self, node_id: str) -> None:
        """Kill a node under whatever runs on it."""
        self._ask(f"remove {node_id}")
        self.gb200.remove(node_id)

    def add(self) -> str:
        """One more GB200 node; its id."""
        node_id = self._ask("add")["added"]
        self.gb200.append(node_id)
        return node_id

    def close(self) -> list[str]:
        """Shut the cluster down; leftover processes (killed), as `reap` reports them."""
        try:
            self.proc.communicate("exit\n", timeout=60)
        except (subprocess.TimeoutExpired, OSError, ValueError):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        return reap([self.tag])

    def _ask(self, command: str, timeout: float = 60) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer(timeout)

    def _answer(self, timeout: float) -> dict:
        import select

        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            with open(self.err_path, errors="replace") as f:
                raise RuntimeError("the cluster host did not answer:\n" + f.read()[-3000:])
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer


def holds_a_lease(prefix: str, pid: int, live: bool = True) -> str | None:
    """The output folder (relative) of a lease held by process `pid` under a local prefix: a live
    one, or with `live=False` any it took (a fast step's lease may be released already)."""
    for dirpath, _, files in os.walk(prefix):
        if ".lease" not in files:
            continue
        try:
            with open(os.path.join(dirpath, ".lease")) as f:
                lease = json.load(f)
        except (OSError, ValueError):
            continue
        held = not lease.get("released") and lease.get("expires", 0) > time.time()
        if lease.get("pid") == pid and (held or not live):
            return os.path.relpath(dirpath, prefix)
    return None


# -- what a prefix holds --------------------------------------------------------------------------
@dataclass
class Audit:
    corrupt: list[str] = field(default_factory=list)  # SUCCESS folders whose record or files do not match
    attempts: dict[str, list[str]] = field(default_factory=dict)  # step name -> states of its attempts
    nodes: dict[str, list[str | None]] = field(default_factory=dict)  # step name -> node of each attempt
    tokens: dict[str, list[int | None]] = field(default_factory=dict)
    run_ids: dict[str, list[str]] = field(default_factory=dict)  # the executor (run) of each attempt
    outputs: dict[str, str] = field(default_factory=dict)  # step name -> output digest, SUCCESS only
    states: dict[str, str] = field(default_factory=dict)  # step name -> status
    folders: dict[str, str] = field(default_factory=dict)  # step name -> output folder (relative)

    def successes(self, name: str) -> int:
        return self.attempts.get(name, []).count(SUCCESS)


def audit(prefix: str, verify: bool = True) -> Audit:
    """Read every output folder under `prefix`; a SUCCESS folder must have a SUCCESS record whose
    manifest is what the folder holds now and whose output digest the status repeats. `verify=False`
    reads states and attempts only (no file is hashed): cheap enough to poll for a short moment."""
    store = Store(prefix)
    result = Audit()
    try:
        found = store.fs.find(store.root)
    except FileNotFoundError:
        found = []
    folders = sorted(p.rpartition("/")[0] for p in found if p.endswith("/.status"))
    for folder in dict.fromkeys(folders):
        dirname = folder[len(store.root):].strip("/")
        status, record = store.read_status(dirname), store.read_record(dirname)
        name = record.name if record is not None else dirname
        result.states[name] = status.state if status is not None else "NONE"
        result.folders[name] = dirname
        if record is not None:
            result.attempts[name] = [a.state for a in record.attempts]
            result.nodes[name] = [a.node for a in record.attempts]
            result.tokens[name] = [a.token for a in record.attempts]
            result.run_ids[name] = [a.run_id for a in record.attempts]
        if status is None or status.state != SUCCESS or not verify:
            continue
        def files(record):
            now = store.manifest(store.served_dir(dirname))  # the attempt its .status commits
            return ["files differ from the record's manifest"] if now != record.manifest else []

        problems = _record_problems(status, record, files)
        if problems:
            result.corrupt.append(f"{dirname}: {', '.join(problems)}")
        else:
            result.outputs[name] = status.output_digest
    return result


def _record_problems(status, record, files) -> list[str]:
    """Why a SUCCESS output is not to be trusted: no SUCCESS record, what `files(record)` finds
    comparing the files with the record's manifest, digests of manifest, record and status that
    disagree (audit and audit_artifacts, which compare the files differently)."""
    if record is None or record.state != SUCCESS or record.manifest is None:
        return ["no SUCCESS record"]
    problems = files(record)
    if output_digest(record.manifest) != record.output_digest or record.output_digest != status.output_digest:
        problems.append("output digests disagree")
    return problems


def same_bytes(a: str, b: str) -> list[str]:
    """The files of the SUCCESS outputs under prefix `a` whose bytes differ under prefix `b` (or
    are missing there): the same voyage run twice must write the same bytes."""
    left, right = Store(a), Store(b)
    ours, theirs = audit(a), audit(b)
    differ = []
    for name, folder in ours.folders.items():
        record = left.read_record(folder)
        # each side in the attempt its .status commits (attempt folders are named at random)
        mine, other = left.served_dir(folder), right.served_dir(theirs.folders.get(name, folder))
        for entry in (record.manifest or []) if record else []:
            try:
                same = left.fs.cat_file(left.path(mine, entry.path)) == right.fs.cat_file(right.path(other, entry.path))
            except FileNotFoundError:
                same = False
            if not same:
                differ.append(f"{folder}/{entry.path}")
    return differ


def load_voyage(path: str, **config: object) -> list:
    """The steps of a voyage file, its module shipped to Ray workers by value."""
    from ray import cloudpickle

    from executor import voyage as voyage_mod

    vf = voyage_mod.load(path)
    cloudpickle.register_pickle_by_value(vf.module)
    return voyage_mod.build_steps(vf, vf.config_class(**config) if vf.config_class else None)


# -- a faulty proxy in front of the GCS emulator ---------------------------------------------------
KINDS = ("429", "503", "drop_before", "drop_after")
Rule = Callable[[str, str, int], "str | None"]  # (method, target, request number) -> a fault or None
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "te", "upgrade"}


class FaultyProxy:
    """An HTTP/1.1 proxy for one upstream (the emulator) that injects faults on the wire.

    Each request, with probability `rate`, gets one of `kinds`: `429`/`503` (answered here, the
    upstream never sees it), `drop_before` (connection closed before forwarding), `drop_after`
    (forwarded and handled upstream, then the connection is closed halfway through the
    response). `rule`, if given, is asked first and may name a fault (or `412`) for a request.
    Runs its own event loop on a thread; `stats` counts requests and faults.
    """

    def __init__(self, upstream: str, rate: float = 0.0, seed: int = 0, kinds: tuple[str, ...] = KINDS,
                 rule: Rule | None = None) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port or 80))
        self.rate, self.kinds, self.rule = rate, kinds, rule
        self.rng = random.Random(seed)
        self.stats: collections.Counter = collections.Counter()
        # `stall_first_write(seconds)` arms it: the next conditional upload of a `.status` saying
        # RUNNING (an attempt's first write, after its fence check) is held that long, then checked
        # against the object's generation *now* (the emulator ignores ifGenerationMatch; the proxy
        # answers 412 itself when the object changed meanwhile, as GCS would); `stalled` names it.
        self.stall: float | None = None
        self.stalled: list[str] = []
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="faulty-proxy", daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FaultyProxy":
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def __enter__(self) -> "FaultyProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def faults(self) -> int:
        return sum(self.stats[k] for k in (*KINDS, "412"))

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    def stall_first_write(self, seconds: float) -> None:
        self.stall = seconds

    def _first_write(self, method: str, target: str, body: bytes) -> tuple[str, str, int] | None:
        """(bucket, object name, generation expected) of an attempt's first write, else None."""
        if method != "POST" or "/upload/storage/v1/b/" not in target or "ifGenerationMatch=" not in target:
            return None
        m = re.search(rb'\{"name": "([^"]+/\.status)"\}', body)
        if not m or b'"state": "RUNNING"' not in body:
            return None
        bucket = target.split("/upload/storage/v1/b/", 1)[1].split("/", 1)[0]
        generation = int(re.search(r"ifGenerationMatch=(\d+)", target).group(1))
        return bucket, m.group(1).decode(), generation

    async def _stalled(self, writer, method: str, target: str, headers, body: bytes,
                       first: tuple[str, str, int], seconds: float) -> None:
        bucket, name, expected = first
        self.stalled.append(name)
        self.stats["first writes stalled"] += 1
        await asyncio.sleep(seconds)
        status, _, meta = await self._forward("GET", f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}",
                                              [("Host", "%s:%d" % self.upstream)], b"")
        now = int(json.loads(meta)["generation"]) if status == 200 else 0
        if now != expected:
            self.stats["first writes refused after the stall (412)"] += 1
            await _respond(writer, 412, [("Content-Type", "application/json")],
                           json.dumps({"error": {"code": 412, "message": "conditionNotMet"}}).encode())
            return
        self.stats["first writes landed after the stall"] += 1
        await _respond(writer, *await self._forward(method, target, headers, body), method)

    def _choose(self, method: str, target: str) -> str | None:
        n = self.stats["requests"]
        if self.rule is not None:
            fault = self.rule(method, target, n)
            if fault is not None:
                return fault
        if self.rate and self.rng.random() < self.rate:
            return self.rng.choice(self.kinds)
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = [tuple(h.split(":", 1)) for h in lines[1:] if ":" in h]
                lower = {k.strip().lower(): v.strip() for k, v in headers}
                body = await _read_body(reader, lower)
                self.stats["requests"] += 1
                first = self._first_write(method, target, body) if self.stall else None
                if first is not None:
                    seconds, self.stall = self.stall, None
                    await self._stalled(writer, method, target, headers, body, first, seconds)
                    if lower.get("connection", "").lower() == "close":
                        return
                    continue
                fault = self._choose(method, target)
                if fault:
                    self.stats[fault] += 1
                if fault == "drop_before":
                    writer.transport.abort()
                    return
                if fault in ("429", "503", "412"):
                    await _respond(writer, int(fault), [("Content-Type", "application/json")],
                                   json.dumps({"error": {"code": int(fault), "message": f"injected {fault}"}}).encode())
                    continue
                status, out_headers, out_body = await self._forward(method, target, headers, body)
                if fault == "drop_after":
                    head_bytes = _head(status, out_headers, len(out_body), method)
                    writer.write(head_bytes + out_body[: len(out_body) // 2])
                    await writer.drain()
                    writer.transport.abort()
                    return
                await _respond(writer, status, out_headers, out_body, method)
                if lower.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, OSError, asyncio.CancelledError):  # cancelled: the proxy stops
            return
        finally:
            writer.close()

    async def _forward(self, method: str, target: str, headers: list[tuple[str, str]],
                       body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        reader, writer = await asyncio.open_connection(*self.upstream)
        try:
            keep = [(k.strip(), v.strip()) for k, v in headers if k.strip().lower() not in HOP]
            keep += [("Content-Length", str(len(body))), ("Connection", "close")]
            writer.write(f"{method} {target} HTTP/1.1\r\n".encode("latin-1") +
                         "".join(f"{k}: {v}\r\n" for k, v in keep).encode("latin-1") + b"\r\n" + body)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            out = [tuple(x.strip() for x in h.split(":", 1)) for h in lines[1:] if ":" in h]
            lower = {k.lower(): v for k, v in out}
            if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
                data = b""
            elif "chunked" in lower.get("transfer-encoding", "").lower() or "content-length" in lower:
                data = await _read_body(reader, lower)
            else:
                data = await reader.read()
            if method == "HEAD":
                return status, [(k, v) for k, v in out if k.lower() not in HOP - {"content-length"}], data
            return status, [(k, v) for k, v in out if k.lower() not in HOP], data
        finally:
            writer.close()


async def _read_body(reader: asyncio.StreamReader, lower: dict[str, str]) -> bytes:
    if "chunked" in lower.get("transfer-encoding", "").lower():
        data = b""
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()).strip():  # trailers
                    pass
                return data
            data += await reader.readexactly(size)
            await reader.readline()
    length = int(lower.get("content-length") or 0)
    return await reader.readexactly(length) if length else b""


def _head(status: int, headers: list[tuple[str, str]], length: int, method: str = "GET") -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if method != "HEAD":
        lines.append(f"Content-Length: {length}")
    lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _respond(writer: asyncio.StreamWriter, status: int, headers: list[tuple[str, str]], body: bytes,
                   method: str = "GET") -> None:
    writer.write(_head(status, headers, len(body), method) + (b"" if method == "HEAD" else body))
    await writer.drain()


_REASONS = {200: "OK", 204: "No Content", 206: "Partial Content", 308: "Resume Incomplete", 404: "Not Found",
            412: "Precondition Failed", 429: "Too Many Requests", 503: "Service Unavailable"}


def running_on(prefix: str, name: str) -> str | None:
    """The node of the RUNNING attempt of step `name` once it has written a file, else None."""
    import glob

    from executor.storage.store import Store

    for folder in glob.glob(os.path.join(prefix, f"{name}-*")):
        store = Store(prefix)
        dirname = os.path.relpath(folder, prefix)
        status = store.read_status(dirname)  # the newest attempt writes in its own folder
        record = store.read_record(dirname, status, latest=True) if status is not None else None
        if record and record.attempts and record.attempts[-1].state == "RUNNING" and \
                os.path.exists(os.path.join(prefix, status.data_dir(dirname), "part-000.bin")):
            return record.attempts[-1].node
    return None


def wait_for(check: Callable[[], object], timeout: float) -> object:
    """Poll `check` until it returns something truthy (returned) or `timeout` passes (None)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    return None


# -- committed artifacts, logs aside (steps with `logs=`: training's W&B files and metrics) --------
def audit_artifacts(prefix: str) -> Audit:
    """As `audit`, judged on artifacts only: a committed output is corrupt when an artifact of its
    record's manifest is missing or changed, or a file the record does not list appeared outside
    the folders of its logs. A log (listed `log`, no checksum) may grow after the commit: W&B's own
    processes finish writing after the step returns, and logs are not in the output digest."""
    store = Store(prefix)
    result = audit(prefix, verify=False)
    for name, dirname in result.folders.items():
        status = store.read_status(dirname)
        if status is None or status.state != SUCCESS:
            continue
        record = store.read_record(dirname, status)

        def files(record):
            logs = {e.path for e in record.manifest if e.log}
            log_dirs = {p.rpartition("/")[0] for p in logs}
            listed = {e.path: e for e in record.manifest}
            now = {e.path: e for e in store.manifest(store.served_dir(dirname), is_log=logs.__contains__)}
            changed = [p for p, e in listed.items() if not e.log and now.get(p) != e]
            extra = [p for p in now if p not in listed and p.rpartition("/")[0] not in log_dirs]
            return ([f"artifacts missing or changed since the commit: {', '.join(changed[:3])}"] if changed else []) + \
                ([f"files added since the commit: {', '.join(extra[:3])}"] if extra else [])

        problems = _record_problems(status, record, files)
        if problems:
            result.corrupt.append(f"{dirname}: {'; '.join(problems)}")
        else:
            result.outputs[name] = status.output_digest
    return result


def same_artifacts(a: str, b: str) -> list[str]:
    """As `same_bytes`, for artifacts only (logs, which hold times and run ids, are left out)."""
    left, right = Store(a), Store(b)
    ours, theirs = audit(a, verify=False), audit(b, verify=False)
    differ = []
    for name, folder in ours.folders.items():
        status = left.read_status(folder)
        if status is None or status.state != SUCCESS:
            continue
        record = left.read_record(folder, status)
        other_folder = theirs.folders.get(name, folder)
        mine, other = left.served_dir(folder), right.served_dir(other_folder)
        for entry in (record.manifest or []) if record else []:
            if entry.log:
                continue
            try:
                same = left.fs.cat_file(left.path(mine, entry.path)) == right.fs.cat_file(right.path(other, entry.path))
            except FileNotFoundError:
                same = False
            if not same:
                differ.append(f"{name}/{entry.path}")
    return differ


def attempt_starts(prefix: str) -> dict[str, list[tuple[float, str]]]:
    """Every attempt folder's own record, read whether or not it was committed: step name ->
    [(when the attempt started, its state in its own record)], oldest first. An attempt killed
    before it wrote its record is not listed."""
    import re

    store = Store(prefix)
    try:
        found = store.fs.find(store.root)
    except FileNotFoundError:
        return {}
    own = re.compile(r"/\.attempts/[^/]+/\.step\.json$")
    starts: dict[str, list[tuple[float, str]]] = {}
    for path in found:
        if not own.search(path):
            continue
        folder = path[len(store.root):].strip("/").rpartition("/")[0]
        record = store.read_record_in(folder)
        if record is not None and record.attempts:
            starts.setdefault(record.name, []).append((record.attempts[-1].started, record.attempts[-1].state))
    return {name: sorted(v) for name, v in starts.items()}

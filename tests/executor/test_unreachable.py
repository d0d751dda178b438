"""Item 13: a store that cannot be read is never "not done". Planning stops with one line naming
the store and the error, within a bounded time, exit 2, and no library retry logs in the terminal.

Real failing endpoints: a closed local port, an unresolvable host name, a local HTTP server that
answers the GCS JSON API with 403 or 500, one that accepts and never answers, and a local
`.status` that cannot be read as a file."""

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from executor.storage.access import StoreError
from executor.storage.store import Store

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARIN_RUN = os.path.join(os.path.dirname(sys.executable), "marin-run")
HELLO = os.path.join(ROOT, "voyages", "hello.py")
DIRS = ["hello/a-0123456789", "hello/b-0123456789"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


class _Answer(http.server.BaseHTTPRequestHandler):
    """Answers every request with `server.rule(path) -> (status, message)` as GCS would."""

    def _answer(self) -> None:
        status, message = self.server.rule(self.path)  # type: ignore[attr-defined]
        body = json.dumps({"error": {"code": status, "message": message}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gcs_server():
    """A real HTTP server on a free port standing in for GCS; yields a function setting its rule."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    server.rule = lambda path: (404, "No such object")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_server():
    """Accepts connections and never answers (a black hole past the TCP handshake)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture
def gcs_at(monkeypatch):
    """Point gcsfs, in this process, at an endpoint (as STORAGE_EMULATOR_HOST does)."""
    import gcsfs

    def point(endpoint: str) -> Store:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        monkeypatch.setenv("FSSPEC_GS_TOKEN", "anon")
        gcsfs.GCSFileSystem.clear_instance_cache()
        return Store("gs://marin-test/unreachable")

    yield point
    gcsfs.GCSFileSystem.clear_instance_cache()


def _fails(store: Store, match: str, within: float) -> StoreError:
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=match) as caught:
        store.read_statuses(DIRS)
    assert time.monotonic() - t0 < within
    assert "\n" not in str(caught.value)
    return caught.value


def test_a_closed_port_is_an_error_not_a_missing_status(gcs_at):
    err = _fails(gcs_at(f"http://127.0.0.1:{closed_port()}"), r"cannot reach the store gs://marin-test/unreachable: "
                 r"cannot connect to 127\.0\.0\.1:\d+ \(Connection refused\)", within=5)
    assert "gs://marin-test/unreachable" in str(err)


def test_an_unresolvable_host_is_a_dns_error(gcs_at):
    _fails(gcs_at("http://marin-no-such-host.invalid:4443"), r"DNS lookup of marin-no-such-host\.invalid failed",
           within=10)


def test_403_and_500_are_errors_and_500_is_tried_again_within_the_timeout(gcs_at, gcs_server, monkeypatch):
    store = gcs_at(f"http://127.0.0.1:{gcs_server.server_port}")
    gcs_server.rule = lambda path: (403, "anon does not have storage.objects.get access")
    _fails(store, r"HTTP 403 Forbidden \(anon does not have storage.objects.get access\): check the credentials",
           within=5)
    monkeypatch.setenv("MARIN_STORE_TIMEOUT", "2")
    asked = []
    gcs_server.rule = lambda path: (asked.append(path), (500, "backend error"))[1]
    _fails(gcs_at(f"http://127.0.0.1:{gcs_server.server_port}"), r"HTTP 500 \(backend error\)", within=6)
    assert len(asked) >= 2  # transient: asked again before giving up


def test_a_403_after_a_good_probe_is_an_error_too(gcs_at, gcs_server):
    """The probe answers 404 (reachable); the status objects themselves are forbidden."""
    gcs_server.rule = lambda path: (404, "No such object") if ".marin-probe" in path else (403, "no access")
    _fails(gcs_at(f"http://127.0.0.1:{gcs_server.server_port}"), r"cannot read gs://marin-test/unreachable/hello/"
           r"[ab]-0123456789/\.status: HTTP 403 Forbidden \(no access\)", within=5)


def test_no_answer_is_a_timeout(gcs_at, silent_server, monkeypatch):
    monkeypatch.setenv("MARIN_STORE_TIMEOUT", "2")
    _fails(gcs_at(silent_server), r"no usable answer within 2 s", within=6)


def test_a_local_status_that_cannot_be_read_is_an_error(tmp_path):
    store = Store(str(tmp_path))
    os.makedirs(store.path(DIRS[0], ".status"))  # a folder where the file should be (root reads anything)
    _fails(store, r"cannot read .*/hello/a-0123456789/\.status: a folder where a file should be", within=1)
    os.makedirs(store.path(DIRS[1], ".step.json"))
    with pytest.raises(StoreError, match=r"\.step\.json"):
        store.read_record_in(DIRS[1])


def _marin_run(args: list[str], endpoint: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "STORAGE_EMULATOR_HOST": endpoint, "FSSPEC_GS_TOKEN": "anon", **env}
    env = {k: v for k, v in env.items() if v}
    return subprocess.run([MARIN_RUN, HELLO, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_marin_run_says_one_line_and_exits_2(gcs_server, tmp_path):
    """The issue's case from the command line: a dry-run against a store that cannot be reached
    (DNS), and a run whose status reads are forbidden after the probe went through (gcsfs logs
    that 403 with a traceback, which stays out of the terminal)."""
    t0 = time.monotonic()
    # As on a machine without network or credentials: google-auth looks for some and gcsfs
    # falls back to anonymous access, both with warnings of their own.
    dns = _marin_run(["--dry-run", "--prefix", "gs://marin-test/v"], "http://marin-no-such-host.invalid:4443",
                     FSSPEC_GS_TOKEN="")
    assert time.monotonic() - t0 < 30
    assert dns.returncode == 2, dns.stderr
    assert dns.stderr.strip().splitlines() == [dns.stderr.strip()], dns.stderr
    assert dns.stderr.startswith("marin-run: error: cannot reach the store gs://marin-test/v: DNS lookup of "
                                 "marin-no-such-host.invalid failed"), dns.stderr

    gcs_server.rule = lambda path: (404, "No such object") if ".marin-probe" in path else (403, "no access")
    forbidden = _marin_run(["--dry-run", "--prefix", "gs://marin-test/v"], f"http://127.0.0.1:{gcs_server.server_port}")
    assert forbidden.returncode == 2, forbidden.stderr
    assert len(forbidden.stderr.strip().splitlines()) == 1 and "Traceback" not in forbidden.stderr, forbidden.stderr
    assert "HTTP 403 Forbidden (no access)" in forbidden.stderr and "/.status" in forbidden.stderr
    assert forbidden.stdout == ""

    gcs_server.rule = lambda path: (404, "No such object") if ".marin-probe" in path else (503, "try later")
    failing = _marin_run(["--prefix", "gs://marin-test/v"], f"http://127.0.0.1:{gcs_server.server_port}",
                         MARIN_STORE_TIMEOUT="2")
    assert failing.returncode == 2 and len(failing.stderr.strip().splitlines()) == 1, failing.stderr
    assert "no usable answer within 2 s" in failing.stderr and "Traceback" not in failing.stderr

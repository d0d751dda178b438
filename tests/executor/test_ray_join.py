"""Joining Ray (items 13 and 15).

- A Ray cluster with token authentication on (as Ray 2.60 sets up every new cluster, `ray start
  --head` and an embedded `ray.init()` alike; the session's Ray here) joined without the token:
  one line naming the setting that fixes it, exit 2, within seconds (Ray itself retries for 20 s
  and ends in a traceback).
- A dead cluster's address file left behind (a `ray start` cluster that went away without `ray
  stop`): `marin-run` with no address starts a Ray of its own at once instead of waiting for it;
  an address naming the dead cluster is one line.

Spawned executors get a RAY_TMPDIR of their own, so nothing here touches /tmp/ray."""

import os
import socket
import subprocess
import sys
import time

import pytest

from kits import faultkit  # noqa: E402

from executor.ray_backend import ClusterError, check_cluster  # noqa: E402


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_tmp():
    tmp = faultkit.RayTmp()
    yield tmp.path
    tmp.close()


def _marin_run(args: list[str], ray_tmp: str, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    return subprocess.run([faultkit.MARIN_RUN, faultkit.HELLO, *args], env={**env, "RAY_TMPDIR": ray_tmp},
                          capture_output=True, text=True, timeout=timeout, cwd=faultkit.ROOT)


def test_a_cluster_with_token_authentication_joined_without_the_token(ray_local, ray_tmp, tmp_path):
    address = ray_local.get_runtime_context().gcs_address
    t0 = time.monotonic()
    joined = _marin_run(["--dry-run", "--prefix", str(tmp_path / "p"), "--ray-address", address], ray_tmp, 60)
    assert time.monotonic() - t0 < 15, joined.stderr
    assert joined.returncode == 2, joined.stderr
    assert joined.stderr.strip().splitlines() == [
        f"marin-run: error: the Ray cluster at {address} requires token authentication: set RAY_AUTH_MODE=token "
        f"(the token is read from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"], joined.stderr
    assert not (tmp_path / "p").exists()
    # This process joined it with RAY_AUTH_MODE=token (Ray set it when it started the cluster):
    # the same check lets that join through.
    assert os.environ.get("RAY_AUTH_MODE") == "token"
    assert check_cluster(address) == address


def test_a_dead_clusters_address_file_neither_hangs_nor_is_joined(ray_tmp, tmp_path):
    dead = f"127.0.0.1:{closed_port()}"
    os.makedirs(os.path.join(ray_tmp, "ray"))
    with open(os.path.join(ray_tmp, "ray", "ray_current_cluster"), "w") as f:
        f.write(dead)  # what `ray start` leaves when its cluster dies without `ray stop`
    t0 = time.monotonic()
    given = _marin_run(["--dry-run", "--prefix", str(tmp_path / "p"), "--ray-address", dead], ray_tmp, 60)
    assert given.returncode == 2 and time.monotonic() - t0 < 15, given.stderr
    (line,) = given.stderr.strip().splitlines()
    assert line.startswith(f"marin-run: error: no Ray cluster answers at {dead}") and \
        line.endswith(": Connection refused"), line

    t0 = time.monotonic()
    own = _marin_run(["--only", "hello/text/0", "--prefix", str(tmp_path / "q"), "--no-live-page"], ray_tmp, 120)
    assert own.returncode == 0, own.stdout + own.stderr
    assert time.monotonic() - t0 < 60
    assert "SUCCESS  hello/text/0" in own.stdout


def test_an_unreachable_address_is_one_line():
    with pytest.raises(ClusterError, match=r"^no Ray cluster answers at marin-no-such-host\.invalid:6379: "):
        check_cluster("marin-no-such-host.invalid:6379", timeout=5)
    with pytest.raises(ClusterError, match=r"^nothing answers at ray://127\.0\.0\.1:\d+: .*Connection refused"):
        check_cluster(f"ray://127.0.0.1:{closed_port()}", timeout=5)


START_TWICE = r"""
import ray, sys
from executor import ray_backend

real, calls = ray.init, []


def init(*args, **kwargs):  # the first start misses Ray's 30 s, as on a busy machine
    calls.append(kwargs.get("address"))
    if len(calls) == 1:
        raise Exception("The current node timed out during startup. This could happen because ...")
    return real(*args, **kwargs)


ray.init = init
assert ray_backend.start(num_cpus=1) is True
print(calls, ray.cluster_resources().get("CPU"))
ray.shutdown()
"""


def test_a_local_ray_that_missed_its_start_time_is_started_again(ray_tmp):
    """Ray gives a new raylet a fixed 30 s to register; on a busy 2-core machine a local Ray can
    miss it. marin-run starts it again (another error, e.g. no room in /tmp, is one line: exit 2)."""
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "RAY_TMPDIR": ray_tmp}
    out = subprocess.run([sys.executable, "-c", START_TWICE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "['local', 'local'] 1.0"
    assert "did not start within Ray's 30 s; starting it again (2 more)" in out.stderr

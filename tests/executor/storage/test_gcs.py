"""GCS for real: voyages/hello.py through `marin-run --prefix gs://...` on the emulator, with
faults injected on the wire by a proxy (429, 503, connections dropped before or after the
emulator handled a request), and the one retry gcsfs cannot get right by itself."""

import os
import sys
import uuid

import pytest

from kits import faultkit  # noqa: E402

from executor.storage import gcs  # noqa: E402
from executor.api import run_steps  # noqa: E402


def gcsfs_through(url):
    import gcsfs

    return gcsfs.GCSFileSystem(endpoint_url=url, token="anon", skip_instance_cache=True)


def conditional_upload(method, target):
    return method == "POST" and "uploadType=multipart" in target and "ifGenerationMatch" in target


def test_a_retried_conditional_write_that_had_landed_is_not_a_lost_race(gcs_emulator):
    seen = []

    def rule(method, target, n):  # the first try lands but its answer is lost; GCS answers the retry 412
        if not conditional_upload(method, target):
            return None
        seen.append(target)
        return "drop_after" if len(seen) == 1 else "412" if len(seen) == 2 else None

    path = f"marin-test/cas-{uuid.uuid4().hex}/.lease"
    with faultkit.FaultyProxy(gcs_emulator, rule=rule) as proxy:
        fs = gcsfs_through(proxy.url)
        assert gcs.write_if_generation(fs, path, b"ours", 0)
        assert proxy.stats["drop_after"] == 1 and proxy.stats["412"] == 1
        assert gcs.read_with_generation(fs, path)[1] == b"ours"
        seen.clear()
        seen.append("skip the drop")  # now a plain 412: someone else's bytes are there, a lost race
        assert not gcs.write_if_generation(fs, path, b"theirs", 0)
        assert fs.cat_file(path) == b"ours"


def test_lease_generation_is_read_past_the_listing_cache(gcs_emulator):
    fs = gcsfs_through(gcs_emulator)
    folder = f"marin-test/gen-{uuid.uuid4().hex}"
    fs.pipe_file(f"{folder}/.lease", b"one")
    fs.ls(folder)  # fills the listing cache with generation 1
    other = gcsfs_through(gcs_emulator)
    other.pipe_file(f"{folder}/.lease", b"two")  # another process replaces it
    generation, data = gcs.read_with_generation(fs, f"{folder}/.lease")
    assert data == b"two" and generation == int(other.info(f"{folder}/.lease")["generation"])


def test_the_chaos_proxys_stalled_first_write_is_refused_only_if_the_status_changed(gcs_emulator):
    """bench/chaos.py's stalled first write: the proxy holds an attempt's RUNNING `.status` upload,
    then checks ifGenerationMatch itself (the emulator ignores it): 412 if another executor wrote
    meanwhile, the write forwarded otherwise. Other writes are never held."""
    import threading

    status = lambda state: ('{\n "state": "%s"\n}' % state).encode()  # noqa: E731 - as Store writes it
    path = f"marin-test/stall-{uuid.uuid4().hex}/.status"
    with faultkit.FaultyProxy(gcs_emulator) as proxy:
        fs = gcsfs_through(proxy.url)
        other = gcsfs_through(gcs_emulator)
        fs.pipe_file(path, status("FAILED"))
        generation = gcs.read_with_generation(fs, path)[0]
        proxy.stall_first_write(1.0)
        assert gcs.write_if_generation(fs, path, status("SUCCESS"), generation)  # not a first write: not held
        assert proxy.stall == 1.0 and proxy.stats["first writes stalled"] == 0
        generation = gcs.read_with_generation(fs, path)[0]
        got = []
        held = threading.Thread(target=lambda: got.append(gcs.write_if_generation(fs, path, status("RUNNING"),
                                                                                 generation)))
        held.start()
        while not proxy.stalled:
            assert held.is_alive()
            threading.Event().wait(0.01)
        other.pipe_file(path, status("SUCCESS") + b" ")  # another executor commits during the hold
        held.join(30)
        assert got == [False] and proxy.stats["first writes refused after the stall (412)"] == 1
        assert other.cat_file(path) == status("SUCCESS") + b" "
        # held again, nobody writes meanwhile: it lands
        proxy.stall_first_write(0.2)
        generation = gcs.read_with_generation(fs, path)[0]
        assert gcs.write_if_generation(fs, path, status("RUNNING"), generation)
        assert proxy.stats["first writes landed after the stall"] == 1 and other.cat_file(path) == status("RUNNING")


@pytest.fixture(scope="module")
def hello_reference(tmp_path_factory, ray_local):
    """hello.py run once, uninterrupted, on a local prefix: the output digests to match."""
    prefix = str(tmp_path_factory.mktemp("hello-ref"))
    _, summary = run_steps(faultkit.load_voyage(faultkit.HELLO, n_files=3), prefix)
    assert summary.exit_code == 0
    return prefix, faultkit.audit(prefix)


@pytest.fixture(scope="module")
def ray_tmp():
    tmp = faultkit.RayTmp()
    yield tmp.path
    tmp.close()


@pytest.mark.slow_tier  # fault injection on real processes: `--tier slow` (tests/conftest.py)
def test_hello_on_gcs_through_a_faulty_proxy(gcs_emulator, hello_reference, tmp_path, ray_tmp):
    ref_prefix, ref = hello_reference
    prefix = f"gs://marin-test/hello-{uuid.uuid4().hex[:8]}"

    def every_20th(method, target, n):  # 5%, every kind in turn, so that each one shows up
        if "upload_id=" in target:
            # The chunks of a step's own resumable uploads (gcsfs, inside `ctx.open`) are left
            # alone: when the answer to the last chunk is dropped, gcsfs sends it again and the
            # emulator, whose session is closed, answers 404, a FileNotFoundError in the step.
            # That retry is gcsfs's, not the executor's; which request a fault lands on depends on
            # how many requests come before it, so without this the test hit it now and then.
            return None
        return faultkit.KINDS[(n // 20) % len(faultkit.KINDS)] if n % 20 == 7 else None

    with faultkit.FaultyProxy(gcs_emulator, rule=every_20th) as proxy:
        run = faultkit.Executor(faultkit.HELLO, ["--prefix", prefix, "--n_files", "3"], str(tmp_path), ray_tmp,
                                env={"STORAGE_EMULATOR_HOST": proxy.url}, name="gcs")
        assert run.wait(240) == 0, run.tail()
        stats = dict(proxy.stats)
        # once more through the faults: everything is cached, nothing runs again
        again = faultkit.Executor(faultkit.HELLO, ["--prefix", prefix, "--n_files", "3"], str(tmp_path), ray_tmp,
                                  env={"STORAGE_EMULATOR_HOST": proxy.url}, name="gcs-again")
        assert again.wait(120) == 0, again.tail()
    assert faultkit.reap([run.tag, again.tag]) == []
    assert stats["requests"] > 100 and all(stats[k] > 0 for k in faultkit.KINDS), stats
    got = faultkit.audit(prefix)
    assert got.corrupt == [] and got.outputs == ref.outputs and len(got.outputs) == 8
    assert all(states == ["SUCCESS"] for states in got.attempts.values()), got.attempts
    assert faultkit.same_bytes(ref_prefix, prefix) == []  # the bytes themselves, not only their digests

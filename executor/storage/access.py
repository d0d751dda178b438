"""Can the store be read? Any answer but "not found" that is not the file stops the plan.

A step whose `.status` cannot be read is not "not done": on a machine that cannot reach the
bucket, or with credentials the bucket refuses, reading it as not done would plan to redo a
finished three-month training. So every read of a control file (status, record, lease, the
listing behind a reason) has three outcomes: the bytes, "not found", or a `StoreError` naming
the store and what went wrong in one line (DNS, connection refused, 403, a timeout); planning
stops there and `marin-run` exits 2.

Bounded time: before the first read of a GCS prefix, one request without gcsfs's retries
(`probe`) finds a store that cannot be reached at all in about a second; transient answers
(408, 429, 5xx, no answer) are tried again until `MARIN_STORE_TIMEOUT` seconds (default 20) have
passed. After a good probe, the reads themselves keep gcsfs's retries (about 30 s of backoff) and
are cut off at the same timeout; other object stores rely on their own library's retries.
"""

from __future__ import annotations

import os
import posixpath
import time
from typing import Any

from executor.errors import VoyageError

DEFAULT_TIMEOUT = 20.0


class StoreError(VoyageError):
    """The store under the prefix cannot be read or written; one line naming it and why. Exit 2."""


def store_timeout() -> float:
    """Seconds a store may take to answer before planning gives up (env MARIN_STORE_TIMEOUT)."""
    raw = os.environ.get("MARIN_STORE_TIMEOUT", "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT
    except ValueError:
        raise VoyageError(f"MARIN_STORE_TIMEOUT={raw!r}: not a number of seconds") from None
    if not value > 0:
        raise VoyageError(f"MARIN_STORE_TIMEOUT={raw!r}: must be more than 0 seconds")
    return value


def error(action: str, where: str, e: BaseException, timeout: float | None = None) -> StoreError:
    """`cannot ACTION WHERE: WHY` as a StoreError."""
    return StoreError(f"cannot {action} {where}: {explain(e, timeout)}")


def explain(e: BaseException, timeout: float | None = None) -> str:
    """What went wrong, in one line, from the exceptions of aiohttp, gcsfs, google-auth and the OS."""
    names = {k.__name__ for k in type(e).__mro__}
    first = (str(e).strip().splitlines() or [""])[0]
    if "ClientConnectorDNSError" in names:
        return f"DNS lookup of {getattr(e, 'host', '?')} failed ({_os_reason(e)})"
    if "ClientConnectorError" in names:
        return f"cannot connect to {getattr(e, 'host', '?')}:{getattr(e, 'port', '?')} ({_os_reason(e)})"
    if names & {"FSTimeoutError", "TimeoutError", "ServerTimeoutError", "ConnectionTimeoutError"}:
        return (f"no usable answer within {timeout:g} s (MARIN_STORE_TIMEOUT)" if timeout
                else f"timed out ({first or type(e).__name__})")
    if "HttpError" in names:
        code, message = getattr(e, "code", "?"), str(getattr(e, "message", "") or first)
        message = (message.splitlines() or [""])[0].removesuffix(f", {code}")  # gcsfs appends the code
        return f"HTTP {code}" + (f" ({message})" if message else "")
    if names & {"DefaultCredentialsError", "RefreshError", "GoogleAuthError"}:
        return f"no usable credentials ({first})"
    if "ProxyError" in names:  # gcsfs turns a 502 into requests' ProxyError
        return "HTTP 502 (bad gateway)"
    if isinstance(e, OSError) and first.startswith("Forbidden"):
        lines = [line for line in str(e).splitlines()[1:] if line.strip()]
        return "HTTP 403 Forbidden" + (f" ({lines[0].strip()})" if lines else "") + \
            ": check the credentials and the bucket's permissions"
    if isinstance(e, PermissionError):
        return f"permission denied ({e.filename or first})"
    if isinstance(e, IsADirectoryError):
        return f"a folder where a file should be ({e.filename or first})"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}" + (f" ({e.filename})" if e.filename else "")
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _os_reason(e: BaseException) -> str:
    inner = getattr(e, "os_error", None) or e
    errno = getattr(inner, "errno", None)
    if isinstance(errno, int) and errno > 0:  # asyncio puts the address, not the reason, in strerror
        return os.strerror(errno)
    return (getattr(inner, "strerror", None) or str(inner)).strip()


def _transient(e: BaseException) -> bool:
    names = {k.__name__ for k in type(e).__mro__}
    if names & {"FSTimeoutError", "TimeoutError", "ServerTimeoutError", "ServerDisconnectedError", "ProxyError"}:
        return True
    code = getattr(e, "code", None)
    return "HttpError" in names and str(code) in {"408", "429", "500", "502", "503", "504"}


def probe(fs: Any, root: str, timeout: float) -> None:
    """One metadata request for an object under `root` on GCS, without gcsfs's retries: returns if
    the store answers (a 404 is an answer), raises the library's exception otherwise. Transient
    failures are tried again, with backoff, until `timeout` seconds have passed."""
    import gcsfs
    from fsspec.asyn import sync

    bucket, key, _ = fs.split_path(posixpath.join(root, ".marin-probe"))
    once = getattr(gcsfs.GCSFileSystem._request, "__wrapped__", None)

    async def ask() -> None:
        if once is not None:  # the request without the retry decorator gcsfs puts around it
            await once(fs, "GET", "b/{}/o/{}", bucket, key)
        else:
            await fs._call("GET", "b/{}/o/{}", bucket, key)

    deadline = time.monotonic() + timeout
    pause = 0.5
    while True:
        left = deadline - time.monotonic()
        try:
            sync(fs.loop, ask, timeout=max(1.0, left))
            return
        except FileNotFoundError:
            return
        except Exception as e:
            if not _transient(e) or deadline - time.monotonic() < pause:
                raise
        time.sleep(pause)
        pause *= 2

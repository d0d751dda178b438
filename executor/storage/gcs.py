"""Conditional reads and writes on GCS through gcsfs's own HTTP session (and its retries).

gcsfs exposes create-if-absent (`mode="create"` sends `ifGenerationMatch=0`) but no
replace-if-generation; the lease's compare-and-swap needs both, so the replace is one JSON-API
multipart upload with `ifGenerationMatch=<generation>` sent through `GCSFileSystem._call`.

gcsfs retries every request that fails transiently (408, 429, 5xx, dropped connections) with
backoff. What it cannot know is that a conditional upload whose response was lost may have
landed: its retry then fails the precondition (412) against our own write. So a 412 is only a
lost race if the object does not hold exactly the bytes we sent (a lease's bytes name its owner
and times, so no one else writes the same ones).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NamedTuple
from urllib.parse import quote

from fsspec.asyn import sync


class GcsObject(NamedTuple):
    """An object's generation, bytes and last-write time (seconds since the epoch, GCS's clock)."""

    generation: int
    data: bytes
    updated: float | None


def read_object(fs: Any, path: str) -> GcsObject | None:
    """The object at `path` with its generation, or None if it does not exist.

    The generation comes from a metadata request of its own, not `fs.info`, which may answer
    from gcsfs's listing cache: a stale generation would make every compare-and-swap fail. The
    bytes are read after it, so they are of that generation or a newer one, and a newer one only
    makes the compare-and-swap fail and read again.
    """
    bucket, key, _ = fs.split_path(path)

    async def metadata() -> dict:
        return await fs._call("GET", "b/{}/o/{}", bucket, key, json_out=True)

    try:
        meta = sync(fs.loop, metadata)
        data = fs.cat_file(path)
    except FileNotFoundError:
        return None
    updated = meta.get("updated")
    return GcsObject(int(meta.get("generation") or 0), data,
                     datetime.fromisoformat(updated).timestamp() if updated else None)


def read_with_generation(fs: Any, path: str) -> tuple[int | None, bytes | None]:
    """(generation, bytes) of an object, or (None, None) if it does not exist (see `read_object`)."""
    found = read_object(fs, path)
    return (None, None) if found is None else (found.generation, found.data)


def write_if_generation(fs: Any, path: str, data: bytes, generation: int) -> bool:
    """Write `data` only if the object's generation is `generation` (0: only if absent)."""
    bucket, key, _ = fs.split_path(path)
    meta = json.dumps({"name": key})
    body = (
        "--==0==\nContent-Type: application/json; charset=UTF-8\n\n" + meta +
        "\n--==0==\nContent-Type: application/octet-stream\n\n"
    ).encode() + data + b"\n--==0==--"

    async def upload() -> None:
        await fs._call(
            "POST", f"{fs._location}/upload/storage/v1/b/{quote(bucket)}/o",
            uploadType="multipart", ifGenerationMatch=str(generation),
            headers={"Content-Type": 'multipart/related; boundary="==0=="'},
            data=body, json_out=True,
        )

    try:
        sync(fs.loop, upload)
    except Exception as e:
        if not _is_precondition_failure(e):
            raise
        # Someone wrote first, or gcsfs retried an upload of ours that had landed.
        fs.invalidate_cache(path)
        try:
            return fs.cat_file(path) == data
        except FileNotFoundError:
            return False
    fs.invalidate_cache(path)
    return True


def _is_precondition_failure(e: Exception) -> bool:
    # gcsfs turns 412 Precondition Failed into FileExistsError.
    return isinstance(e, FileExistsError) or getattr(e, "code", None) == 412 or getattr(e, "status", None) == 412

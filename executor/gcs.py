"""Conditional reads and writes on GCS through gcsfs's own HTTP session (and its retries).

gcsfs exposes create-if-absent (`mode="create"` sends `ifGenerationMatch=0`) but no
replace-if-generation; the lease's compare-and-swap needs both, so the replace is one JSON-API
multipart upload with `ifGenerationMatch=<generation>` sent through `GCSFileSystem._call`.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from fsspec.asyn import sync


def read_with_generation(fs: Any, path: str) -> tuple[int | None, bytes | None]:
    """(generation, bytes) of an object, or (None, None) if it does not exist."""
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return None, None
    generation = int(info.get("generation") or 0)
    try:
        data = fs.cat_file(path)
    except FileNotFoundError:
        return None, None
    return generation, data


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
    except Exception as e:  # 412 Precondition Failed: someone else wrote first
        if _is_precondition_failure(e):
            return False
        raise
    fs.invalidate_cache(path)
    return True


def _is_precondition_failure(e: Exception) -> bool:
    code = getattr(e, "code", None) or getattr(e, "status", None)
    return code == 412 or "412" in str(e) or "precondition" in str(e).lower() or isinstance(e, FileExistsError)

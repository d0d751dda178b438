"""The record of an output, `{output}/.step.json` (pydantic): how it was made, for anyone auditing it.

Read by people and by the plan's explanations (what changed since the newest record of a step
name, what code drifted); written by the worker when an attempt starts and when it ends. Its own
module so that pydantic is imported only where a record is read or written: a plan that finds
every step cached reads `.status` files only (executor.storage.store)."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from executor.state import StepState

RUNNING = StepState.RUNNING


class InputInfo(BaseModel):
    """What a step read from one of its inputs."""

    name: str
    digest: str
    output_digest: str | None = None
    path: str


class Attempt(BaseModel):
    """One try at running a step."""

    number: int
    state: str
    started: float
    ended: float | None = None
    host: str = ""
    pid: int = 0
    node: str | None = None
    run_id: str = ""
    token: int | None = None
    reason: str = ""
    error: str | None = None
    traceback: str | None = None
    failure: str | None = None  # its failure class (executor.failures), when it failed


class ManifestEntry(BaseModel):
    path: str
    size: int
    checksum: str
    log: bool = False  # one of the step type's declared logs: listed, not in the output digest


class Record(BaseModel):
    """`{output}/.step.json`: how an output was made, for anyone auditing it."""

    record_version: int = 1
    name: str
    step_type: str
    version: str
    digest: str
    scheme: str
    output_path: str
    config: Any = None
    code_fingerprint: str = ""
    code_parts: dict[str, str] = Field(default_factory=dict)  # executor.fingerprint: unit -> hash
    resources: dict[str, Any] = Field(default_factory=dict)
    inputs: list[InputInfo] = Field(default_factory=list)
    state: str = RUNNING
    output_digest: str | None = None
    manifest: list[ManifestEntry] | None = None
    results: dict[str, Any] = Field(default_factory=dict)
    # Where its data came from (docs/provenance.md): `sources` ({source step: licence}) and
    # `licenses` from the DAG, and what the step itself adds (`tokens` consumed per source and
    # per licence, for the mixture and training). Empty in records written before it existed.
    provenance: dict[str, Any] = Field(default_factory=dict)
    # The git commit (and dirty flag) and key package versions of the process that made it
    # (executor.environment); recorded, not keyed. Empty in older records.
    environment: dict[str, Any] = Field(default_factory=dict)
    attempts: list[Attempt] = Field(default_factory=list)
    created: float = Field(default_factory=time.time)
    updated: float = Field(default_factory=time.time)

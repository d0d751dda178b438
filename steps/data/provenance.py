"""Licences through the data steps (docs/provenance.md).

Every data output names the licences of what it holds, keyed by source step name, under
`licenses` in its manifest (documents: ingest, dedup; tokens: tokenize; `mixture.json`: per
dataset). The executor starts each step's record with the sources the DAG says reach it
(`ctx.provenance["sources"]`); `note_sources` adds those a step found in the manifests it read (an
input given by URL has no step upstream), so the record names every licence it consumed.

What a mixture range consumes per source and licence is the sampler's (`steps.data.mixture.consumption`).
"""

from __future__ import annotations

from typing import Any, Mapping

from executor import License, StepContext
from executor.licenses import NOASSERTION, from_json_map, licenses_json

LICENSES_KEY = "licenses"  # in documents, tokens and mixture manifests


def manifest_licenses(manifest: Mapping[str, Any]) -> dict[str, License]:
    """{source step: licence} of a documents or tokens manifest ({} if made before licences were
    kept: unknown)."""
    return from_json_map(manifest.get(LICENSES_KEY))


def folder_licenses(spec: Any) -> dict[str, License]:
    """{source step: licence} of a documents or tokens folder (its manifest), of several (their
    union), or {} for a glob or shard URL, which carries no manifest."""
    from steps.data.formats import MANIFEST, join, read_json

    if isinstance(spec, (list, tuple)):
        return union(*(folder_licenses(s) for s in spec))
    if not isinstance(spec, str) or any(c in spec for c in "*?["):
        return {}
    try:
        manifest = read_json(join(spec, MANIFEST))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return {}
    return manifest_licenses(manifest) if isinstance(manifest, dict) else {}


def note_sources(ctx: StepContext, sources: Mapping[str, License]) -> None:
    """Add sources found in the data a step read to its record's provenance (those the DAG
    already named keep the DAG's licence: the same declaration, read back)."""
    if not sources:
        return
    known = ctx.provenance.setdefault("sources", {})
    for name, lic in sources.items():
        known.setdefault(name, lic.to_json())
    ctx.provenance["licenses"] = sorted({str(v.get("id")) for v in known.values()})


def source_licenses(ctx: StepContext, declared: License | None) -> dict[str, License]:
    """The licence map a source step writes into its manifest: itself, under its declared licence
    (NOASSERTION when it declared none)."""
    return {ctx.name: declared or NOASSERTION}


def union(*maps: Mapping[str, License]) -> dict[str, License]:
    out: dict[str, License] = {}
    for m in maps:
        out.update(m)
    return out


def to_manifest(sources: Mapping[str, License]) -> dict[str, dict[str, Any]]:
    return licenses_json(dict(sources))

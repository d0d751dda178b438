"""Licences through the data steps, and the exact tokens a mixture range consumes per source and
per licence (docs/provenance.md).

Every data output names the licences of what it holds, keyed by source step name, under
`licenses` in its manifest (documents: ingest, dedup; tokens: tokenize; `mixture.json`: per
dataset). The executor starts each step's record with the sources the DAG says reach it
(`ctx.provenance["sources"]`); `note_sources` adds those a step found in the manifests it read (an
input given by URL has no step upstream), so the record names every licence it consumed.

`consumption(manifest, first, end)` counts, for global sequences `[first, end)` of a mixture, the
sequences and tokens drawn from each dataset, source and licence. It uses the sampler's closed
forms (per-block integer quotas), not the declared weights, so the counts are exact: the
pretrain step's figures are what its optimizer steps read.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

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


# -- tokens consumed --------------------------------------------------------------------------

def _source_key(sources: Mapping[str, License], dataset: str) -> tuple[str, str]:
    """(source key, licence key) a dataset's draws are counted under: its one source and licence;
    several joined (`a + b`, `X AND Y`, SPDX's word for both at once); unknown if none."""
    if not sources:
        return f"unknown:{dataset}", NOASSERTION.id
    names = sorted(sources)
    ids = sorted({sources[n].id for n in names})
    return " + ".join(names), " AND ".join(ids)


def consumption(manifest: Mapping[str, Any], first: int, end: int) -> dict[str, Any]:
    """Sequences and tokens of global sequences [first, end) of a mixture, per dataset, per source
    and per licence (tokens = sequences x seq_len: the windows read)."""
    from steps.data.mixture import MixtureSampler

    sampler = MixtureSampler(dict(manifest), datasets={})
    first, end = max(0, int(first)), min(int(end), len(sampler))
    counts = sampler.draws_until(end) - sampler.draws_until(first) if end > first else \
        np.zeros(len(sampler.names), dtype=np.int64)
    return tally(manifest, {n: int(c) for n, c in zip(sampler.names, counts)}, first, end)


def tally(manifest: Mapping[str, Any], sequences: Mapping[str, int], first: int, end: int) -> dict[str, Any]:
    """The per-dataset, per-source and per-licence record of `sequences` drawn per dataset."""
    seq_len = int(manifest["seq_len"])
    by_dataset: dict[str, Any] = {}
    by_source: dict[str, Any] = {}
    by_license: dict[str, Any] = {}
    for name in sorted(sequences):
        n = int(sequences[name])
        info = manifest["datasets"].get(name, {})
        sources = from_json_map(info.get(LICENSES_KEY))
        source, lic = _source_key(sources, name)
        by_dataset[name] = {"sequences": n, "tokens": n * seq_len, "sources": sorted(sources)}
        if not n:
            continue
        s = by_source.setdefault(source, {"sequences": 0, "tokens": 0, "license": lic})
        s["sequences"] += n
        s["tokens"] += n * seq_len
        lc = by_license.setdefault(lic, {"sequences": 0, "tokens": 0})
        lc["sequences"] += n
        lc["tokens"] += n * seq_len
    total = sum(int(v) for v in sequences.values())
    return {"seq_len": seq_len, "sequences": [first, end], "total": {"sequences": total, "tokens": total * seq_len},
            "by_dataset": by_dataset, "by_source": dict(sorted(by_source.items())),
            "by_license": dict(sorted(by_license.items()))}

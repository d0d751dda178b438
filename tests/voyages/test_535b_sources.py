"""Item 14: every source of the full 535B voyage declares the field that holds its text in its
format, and its ingest step reads that field (code corpora keep it under `content`; a wrong
field rejects every record, which now fails the step instead of dropping the source)."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The text field of each source as its publisher documents it.
TEXT_FIELDS = {"nemotron-cc": "text", "dclm-baseline": "text", "starcoder2-data": "content", "proof-pile-2": "text",
               "finemath-3plus": "text", "arxiv": "text", "wikipedia": "text", "stackexchange": "text"}


def test_full_sources_read_their_text_field():
    spec = importlib.util.spec_from_file_location("voyage_535b_sources", os.path.join(ROOT, "voyages", "535b.py"))
    v535 = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = v535
    spec.loader.exec_module(v535)
    from executor.dag import build_dag

    dag = build_dag(v535.voyage(v535.VoyageConfig()))
    fields = {src.name: dag[f"raw/{src.name}"].step.config.text_field for src in v535.FULL_SOURCES}
    assert fields == TEXT_FIELDS
    assert all(dag[f"raw/{s.name}"].step.config.max_reject_share == 0.01 for s in v535.FULL_SOURCES)

"""The step tests' shared data: the bundled corpus ingested, a 512-id byte-level BPE trained
on it and both sources tokenized, once per session, by the data step functions in-process."""

import os
import sys

import pytest

from kits.trainkit import build_tokens  # noqa: E402


@pytest.fixture(scope="session")
def tokens(tmp_path_factory):
    """{'kjv': url, 'pydocs': url, 'tokenizer': url} of the tokenized corpora (vocab 512)."""
    return build_tokens(tmp_path_factory.mktemp("train-data"))

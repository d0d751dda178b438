"""Rebuild the bundled corpus from two Debian packages (see SOURCE.md).

    apt-get download bible-kjv bible-kjv-text python3.11-doc
    for f in *.deb; do dpkg -x "$f" x; done
    python data/corpus/make_corpus.py x

Writes `kjv.jsonl.zst` (one document per chapter of the King James Version) and
`pydocs.jsonl.zst` (one document per section of the Python 3.11 tutorial, HOWTOs, FAQ,
language reference and glossary). Deterministic: the same packages give the same bytes.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import zstandard

HERE = pathlib.Path(__file__).parent
PYDOC_PARTS = ("tutorial", "howto", "faq", "reference")
HEADING = re.compile(r"^(=+|-+|\*+|~+|\^+|#+)\s*$")


def kjv_documents(root: pathlib.Path) -> list[dict]:
    """Every verse from the `bible` program, grouped into one document per chapter."""
    out = subprocess.run([str(root / "usr/bin/bible"), "-f", "-p", str(root / "usr/lib"), "gen1:1-rev22:21"],
                         check=True, capture_output=True, text=True).stdout
    chapters: dict[str, list[str]] = {}
    for line in out.splitlines():
        ref, _, verse = line.partition(" ")
        book_chapter = ref.split(":")[0]
        chapters.setdefault(book_chapter, []).append(verse.strip())
    return [{"id": f"kjv/{key}", "text": " ".join(verses), "source": "kjv"} for key, verses in chapters.items()]


def pydoc_documents(root: pathlib.Path) -> list[dict]:
    """The reStructuredText sources split at headings: one document per section."""
    src = next(root.glob("usr/share/doc/python3.11/html/_sources"))
    files = sorted(p for part in PYDOC_PARTS for p in (src / part).glob("*.rst.txt")) + [src / "glossary.rst.txt"]
    docs = []
    for path in files:
        lines = path.read_text(encoding="utf-8").splitlines()
        sections: list[list[str]] = [[]]
        for i, line in enumerate(lines):
            # a title line followed by an underline starts a new section
            if i + 1 < len(lines) and HEADING.match(lines[i + 1]) and line.strip() and not HEADING.match(line):
                sections.append([])
            sections[-1].append(line)
        rel = path.relative_to(src).as_posix().removesuffix(".rst.txt")
        for k, section in enumerate(sections):
            text = "\n".join(section).strip()
            if len(text) >= 200:
                docs.append({"id": f"pydocs/{rel}/{k}", "text": text, "source": "python-3.11-docs"})
    return docs


def write(name: str, docs: list[dict]) -> None:
    data = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode()
    (HERE / name).write_bytes(zstandard.ZstdCompressor(level=19).compress(data))
    print(f"{name}: {len(docs)} documents, {len(data) / 1e6:.2f} MB of JSONL", file=sys.stderr)


if __name__ == "__main__":
    root = pathlib.Path(sys.argv[1])
    write("kjv.jsonl.zst", kjv_documents(root))
    write("pydocs.jsonl.zst", pydoc_documents(root))

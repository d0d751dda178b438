"""Small voyages driven through the real `marin-run` (in process, on the session's embedded Ray),
for the trust tests ("a cache you can trust").

Every voyage file is written to the same path of the test session (`voyage_path`), so the step
types it defines are re-registered from the same file rather than clashing with another file's
(two files defining a step type of one name is an error, see executor.step).
"""

from __future__ import annotations

import glob
import json
import os
import textwrap

from executor.cli import main

HEAD = """
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import fsspec

from executor import InputPath, Step, output_of, run_only, step_type

# Step type names are global to a process: these are the tests' own.


@dataclass(frozen=True)
class Text:
    text: str


@step_type(version="1")
def trust_write(config: Text, ctx):
    with ctx.open("out.txt", "w") as f:
        f.write(config.text)


@dataclass(frozen=True)
class Pair:
    left: InputPath
    right: InputPath


@step_type(version="1")
def trust_join(config: Pair, ctx):
    parts = []
    for url in (config.left, config.right):
        try:
            with fsspec.open(url, "r") as f:
                parts.append(f.read())
        except FileNotFoundError:  # what a reader sees of an input that has no output
            parts.append("<missing>")
    with ctx.open("joined.txt", "w") as f:
        f.write("+".join(parts))


write, join = trust_write, trust_join
"""


def write_voyage(folder, body: str) -> str:
    """The voyage file `folder/v.py`: HEAD, then `body`."""
    path = os.path.join(str(folder), "v.py")
    with open(path, "w") as f:
        f.write(HEAD + textwrap.dedent(body))
    return path


def cli(args, capsys):
    """`marin-run ARGS` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip() and not line[:8].count(":") == 2]
    lines = [line for line in lines if line.startswith("marin-run: ")] or lines
    assert len(lines) == 1, err
    assert lines[0].startswith("marin-run: error: "), err
    return lines[0]


def folder(prefix, name: str) -> str:
    """The one output folder of step `name` under `prefix`."""
    found = [p for p in glob.glob(os.path.join(str(prefix), f"{name}-*")) if os.path.isdir(p)]
    assert len(found) == 1, found
    return found[0]


def read(prefix, name: str, file: str) -> str:
    """A file of step `name`'s output as a reader sees it: in the attempt its `.status` commits
    (the output folder's own `.status`/`.lease`, and old-layout folders, directly)."""
    where = folder(prefix, name)
    if file not in (".status", ".lease"):
        from executor.storage.store import Store

        where = os.path.join(str(prefix), Store(str(prefix)).served_dir(os.path.relpath(where, str(prefix))))
    with open(os.path.join(where, file)) as f:
        return f.read()


def status(prefix, name: str) -> dict:
    return json.loads(read(prefix, name, ".status"))


def files_under(prefix) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), prefix)
                  for d, _, fs in os.walk(prefix) for f in fs) if os.path.exists(prefix) else []

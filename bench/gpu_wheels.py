"""Prepare and check, on this CPU machine, the folder of wheels (.whl/) that travels with
bench/gpu_all.sh to the GPU device (the device tool's `carry`), which has Python 3.12 on x86-64
and its own packages (bench/device_h200_packages.txt) but no registry to install from.

What is needed: every distribution the GPU scripts import (bench/gpu_block_memory.py,
bench/train_gpu.py, bench/router.py and the modules they load, found by importing them in a
fresh interpreter), plus EXTRA, minus what the device has; with their requirements, the same
rule, recursively. Each at the version installed here (the one the tests ran with).

    python -m bench.gpu_wheels --download   # pip download what is missing into .whl/, then check
    python -m bench.gpu_wheels              # check only: exit 0, or 2 with one line per problem

The check: every needed distribution has exactly one wheel in .whl/, at the version installed
here, whose tags install on CPython 3.12 / manylinux x86-64 (or are pure Python); nothing else
is in the folder (two versions of one package stop the device's install); the folder is under
the device's 64 MiB limit for what travels; and pip, asked for a dry-run install for CPython 3.12
on manylinux x86-64 from the folder alone, resolves them all. `.whl/` is ignored by git (.gitignore).
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import importlib.metadata as md
import json
import pathlib
import re
import subprocess
import sys

from bench import kit  # noqa: E402

ROOT = kit.ROOT
SCRIPTS = ("bench/gpu_block_memory.py", "bench/train_gpu.py", "bench/router.py")
# Imported by the project's records and configs (executor/storage/records.py) on paths the scan above
# may not take; the device lacks them (KINDS.md), so they travel too.
EXTRA = ("pydantic",)
LIMIT = 64 * 2**20  # what one device call may carry, the working tree included
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")

_SCAN = r"""
import importlib.util, json, sys
import importlib.metadata as md
before = set(sys.modules)
for path in SCRIPTS:
    spec = importlib.util.spec_from_file_location("scan_" + path.rsplit("/", 1)[-1][:-3], ROOT + "/" + path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
import steps.moe.expert_parallel, steps.moe.router_kernel, steps.train.recompute  # loaded inside functions
tops = {n.split(".")[0] for n in sys.modules if n not in before}
dists = md.packages_distributions()
print(json.dumps(sorted({d for t in tops for d in dists.get(t, [])})))
"""


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def device_packages() -> set[str]:
    lines = (ROOT / "bench" / "device_h200_packages.txt").read_text().splitlines()
    return {norm(x) for x in lines if x.strip() and not x.startswith("#")}


def imported() -> list[str]:
    """Distributions the GPU scripts load, read in a fresh interpreter."""
    code = f"ROOT = {str(ROOT)!r}; SCRIPTS = {list(SCRIPTS)!r}\n" + _SCAN
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"gpu_wheels: importing the GPU scripts failed: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def requirements(name: str) -> list[str]:
    """A distribution's unconditional requirements (no extras, no markers that exclude Linux)."""
    out = []
    for req in md.requires(name) or []:
        if "extra ==" in req or "extra==" in req or "sys_platform == \"win32\"" in req:
            continue
        out.append(re.split(r"[ ;<>=!~\[(]", req.strip(), maxsplit=1)[0])
    return out


def needed(device: set[str]) -> dict[str, str]:
    """{normalized name: version installed here} of what the device lacks, requirements included."""
    todo = [*imported(), *EXTRA]
    have: dict[str, str] = {}
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        key = norm(name)
        if key in seen:
            continue
        seen.add(key)
        if key in device or key == "marin-voyage":
            continue
        try:
            have[key] = md.version(name)
        except md.PackageNotFoundError:
            raise SystemExit(f"gpu_wheels: {name} is needed but not installed here") from None
        todo.extend(requirements(name))
    # pydantic asks for a newer typing-extensions than older images hold: carry it with pydantic
    if "pydantic" in have:
        have.setdefault("typing-extensions", md.version("typing_extensions"))
    return dict(sorted(have.items()))


def wheel_tags(filename: str) -> tuple[str, str, list[str], list[str], list[str]]:
    """(name, version, python tags, abi tags, platform tags) of a wheel's file name."""
    parts = filename[:-4].split("-")
    if len(parts) not in (5, 6):
        raise ValueError(f"not a wheel name: {filename}")
    name, version = parts[0], parts[1]
    py, abi, plat = parts[-3:]
    return name, version, py.split("."), abi.split("."), plat.split(".")


def installs_on_device(filename: str) -> bool:
    _, _, py, abi, plat = wheel_tags(filename)
    pure = "any" in plat and any(t in ("py3", "py2.py3") or t.startswith("py3") for t in py)
    binary = ("cp312" in py or "cp32" in py or any(t in ("py3",) for t in py)) and \
        any(a in ("cp312", "abi3", "none") for a in abi) and \
        any(p.startswith("manylinux") and p.endswith("x86_64") for p in plat)
    return pure or binary


def check(folder: pathlib.Path, want: dict[str, str]) -> list[str]:
    """The problems of `folder` for `want`, one line each (none: ready to carry)."""
    problems = []
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    by_name: dict[str, list[pathlib.Path]] = {}
    for w in wheels:
        by_name.setdefault(norm(wheel_tags(w.name)[0]), []).append(w)
    for name, version in want.items():
        got = by_name.get(name, [])
        if not got:
            problems.append(f"{name}=={version}: no wheel in {folder}")
            continue
        if len(got) > 1:
            problems.append(f"{name}: {len(got)} wheels ({', '.join(w.name for w in got)}); the install takes one")
        for w in got:
            if wheel_tags(w.name)[1] != version:
                problems.append(f"{w.name}: version {wheel_tags(w.name)[1]}, installed here {version}")
            if not installs_on_device(w.name):
                problems.append(f"{w.name}: its tags do not install on CPython 3.12, manylinux x86-64")
    for name in sorted(set(by_name) - set(want)):
        problems.append(f"{', '.join(w.name for w in by_name[name])}: not needed (remove it)")
    extra = [p for p in folder.iterdir() if p.suffix != ".whl"] if folder.is_dir() else []
    problems += [f"{p.name}: not a wheel" for p in extra]
    size = sum(w.stat().st_size for w in wheels)
    if size > LIMIT:
        problems.append(f"{folder}: {size / 2**20:.1f} MiB, over the {LIMIT / 2**20:.0f} MiB a device call carries")
    return problems


def download(folder: pathlib.Path, want: dict[str, str]) -> None:
    present = {norm(wheel_tags(w.name)[0]) for w in folder.glob("*.whl")} if folder.is_dir() else set()
    missing = [f"{n}=={v}" for n, v in want.items() if n not in present]
    if not missing:
        return
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(folder),
           *missing]
    subprocess.run(cmd, check=True)


def resolve(folder: pathlib.Path, want: dict[str, str]) -> list[str]:
    """pip's own answer for the device: the wanted versions resolve, requirements included, from
    the folder alone, for CPython 3.12 on manylinux x86-64 (a dry run: nothing is installed)."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--no-index",
           "--find-links", str(folder), "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
           *[a for p in PLATFORMS for a in ("--platform", p)], "--target", str(folder / "_resolve"),
           *[f"{n}=={v}" for n, v in want.items()]]
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = [x for x in out.stderr.splitlines() if x.startswith("ERROR")]
    return [f"pip cannot install them on the device: {lines[0] if lines else out.stderr.strip()[-300:]}"] \
        if out.returncode else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--download", action="store_true", help="pip download what is missing first")
    ap.add_argument("--dir", default=str(ROOT / ".whl"))
    args = ap.parse_args(argv)
    folder = pathlib.Path(args.dir)
    want = needed(device_packages())
    if args.download:
        download(folder, want)
    problems = check(folder, want)
    problems = problems or resolve(folder, want)
    for p in problems:
        print(f"gpu_wheels: {p}", file=sys.stderr)
    if problems:
        return 2
    size = sum(w.stat().st_size for w in folder.glob("*.whl"))
    print(f"{folder}: {len(want)} wheels, {size / 2**20:.1f} MiB, for what the device lacks: "
          + ", ".join(f"{n} {v}" for n, v in want.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

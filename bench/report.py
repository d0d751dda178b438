"""A markdown table from the JSON lines that bench.kit.emit appends (bench/results/*.jsonl).

    .venv/bin/python -m bench.report bench/results/cli_startup.jsonl [--latest] [--columns name,wall_min_s]

One row per line (with --latest, the newest line for each (bench, name)); the columns are the
figures in the order they first appear, or those named by --columns."""

from __future__ import annotations

if not __package__:  # run as `python -m bench.report`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import json
import pathlib
import sys

META = ("bench", "at", "host")


def read_rows(paths: list[pathlib.Path]) -> list[dict]:
    """Every JSON line of `paths` in order; a line that is not a JSON object raises ValueError naming it."""
    rows = []
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
            if not isinstance(row, dict) or "name" not in row:
                raise ValueError(f"{path}:{n}: not an emitted row (a JSON object with a 'name')")
            rows.append(row)
    return rows


def latest(rows: list[dict]) -> list[dict]:
    """The last row for each (bench, name), in the order the names first appear."""
    keep: dict[tuple, dict] = {}
    for row in rows:
        keep[(row.get("bench"), row["name"])] = row
    return list(keep.values())


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) >= 0.01 or value == 0 else f"{value:.3g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value).replace("|", "\\|")


def table(rows: list[dict], columns: list[str] | None = None) -> str:
    if columns is None:
        columns = ["name"]
        for row in rows:
            columns += [k for k in row if k not in META and k not in columns]
    numeric = {c for c in columns if any(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool)
                                         for r in rows)}
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join("---:" if c in numeric else "---" for c in columns) + "|"]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=pathlib.Path, help="JSON-lines files written by bench.kit.emit")
    ap.add_argument("--latest", action="store_true", help="only the newest row for each (bench, name)")
    ap.add_argument("--columns", help="comma-separated columns, in order (default: every figure)")
    args = ap.parse_args(argv)
    try:
        missing = [str(p) for p in args.files if not p.is_file()]
        if missing:
            raise ValueError(f"no such results file: {', '.join(missing)}")
        rows = read_rows(args.files)
    except ValueError as e:
        print(f"bench.report: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("bench.report: no rows in " + ", ".join(map(str, args.files)), file=sys.stderr)
        return 2
    if args.latest:
        rows = latest(rows)
    print(table(rows, args.columns.split(",") if args.columns else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())

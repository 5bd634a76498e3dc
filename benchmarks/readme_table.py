"""README's performance table from a bench_mla.py results JSON (issue 4: the table comes from one run).

    python benchmarks/readme_table.py benchmarks/results/bench_mla-<date>-<commit>.json [--write]

The table's first four columns (B, kv, H, q_len) describe the shapes and stay as written; the
last four are replaced row by row, in the JSON's row order (its `index`): ours "µs (% of
roofline)", FlashMLA's and FlashInfer's likewise (or a short note where one has no such path),
and the median SM clock of each that ran, "ours / FM / FI". Without --write it prints the new
table; with it, it rewrites README.md in place. The prose around the table quotes numbers of the
run too: edit those by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
HEADER = "| B | kv | H | q_len | jit_mla µs (%) | FlashMLA µs (%) | FlashInfer fa3 µs (%) | SM MHz (ours / FM / FI) |"


def no_flashmla(row: dict) -> str:
    """The FlashMLA cell of a row it did not run: which of its limits, or 'not run'."""
    na = (row.get("flashmla") or {}).get("na", "")
    if "bf16" in na:
        return "n/a (bf16 cache only)"
    if "q_len" in na:
        return "n/a (one q_len only)"
    return "not run"


def no_flashinfer(row: dict) -> str:
    """The FlashInfer cell of a row it did not time: no e4m3 query path, a failure, or 'not run'."""
    fi = row.get("flashinfer") or {}
    if "e4m3 query" in fi.get("na", ""):
        return "n/a (no e4m3 query)"
    if fi.get("error") or "failed" in fi.get("na", ""):
        return "failed (see the JSON)"
    return "not run"


def cell(result: dict | None) -> str | None:
    """'µs (% of roofline)' of one kernel's result, None when that kernel did not run."""
    if not result or result.get("us") is None:
        return None
    return f"{result['us']:.1f} ({result['pct_roofline']:.1f})"


def clock(*results: dict | None) -> str:
    """The median SM clock of each kernel, '-' for one that did not run."""
    ran = [r is not None and r.get("us") is not None for r in results]
    return " / ".join(("n/a" if r.get("sm_mhz") is None else f"{r['sm_mhz']:.0f}") if ok else "-"
                      for r, ok in zip(results, ran))


def table_rows(lines: list[str]) -> list[int]:
    """Line numbers of the table's data rows (after HEADER and its rule), in order."""
    start = lines.index(HEADER) + 2
    end = start
    while end < len(lines) and lines[end].startswith("| "):
        end += 1
    return list(range(start, end))


def new_row(line: str, row: dict) -> str:
    shape = [c.strip() for c in line.strip().strip("|").split("|")][:4]
    ours = cell(row["ours"])
    if ours is None:
        raise ValueError(f"row {row['index']} ({row['name']}): no result of ours")
    fm = cell(row.get("flashmla")) or no_flashmla(row)
    fi = cell(row.get("flashinfer")) or no_flashinfer(row)
    clocks = clock(row["ours"], row.get("flashmla"), row.get("flashinfer"))
    return "| " + " | ".join(shape + [ours, fm, fi, clocks]) + " |"


def render(readme: str, results: dict) -> str:
    lines = readme.split("\n")
    at = table_rows(lines)
    rows = sorted(results["rows"], key=lambda r: r["index"])
    if len(rows) != len(at):
        raise ValueError(f"results: {len(rows)} rows, README table: {len(at)} rows; expected equal")
    for i, row in zip(at, rows):
        lines[i] = new_row(lines[i], row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path, help="a bench_mla.py results JSON")
    ap.add_argument("--write", action="store_true", help="rewrite README.md in place")
    args = ap.parse_args(argv)
    text = render(README.read_text(), json.loads(args.results.read_text()))
    if args.write:
        README.write_text(text)
    else:
        print("\n".join(l for l in text.split("\n") if re.match(r"\| (B|---|\d)", l)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

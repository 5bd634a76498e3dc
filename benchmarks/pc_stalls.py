"""Where a kernel's warps stall, by source: ncu's PC samples joined to the cubin's line info.

On the H200 (warm caches: the default cache control flushes them before every pass, so its
"no instruction" stalls are cold-code fetch, perf-notes Session 23):

    ncu --kernel-name regex:mla_sm90_attention --launch-skip 2 --launch-count 1 \\
        --clock-control none --cache-control none --section SourceCounters -o rep \\
        python3 benchmarks/profile_one.py --shape 8,1,128,4096 --calls 4
    ncu -i rep.ncu-rep --page source --csv --print-source sass > src.csv

Here (or there), with the cubin that ran:

    nvdisasm -gi -c cubins/sm_90a/mla_sm90.cubin > kernels.sass
    python benchmarks/pc_stalls.py src.csv kernels.sass --by file
    python benchmarks/pc_stalls.py src.csv kernels.sass --by site --line tma.cuh:39
    python benchmarks/pc_stalls.py src.csv kernels.sass --by region --cuts 2000,6000,6850

The CSV lists the profiled kernel's instructions in address order, as nvdisasm does: they are
joined by position (the counts must agree). --by file: the innermost source line; --by site: a line of
the inline chain inside --site-file, by default the outermost (e.g. which wait of the kernel's
loop a barrier wait is);
--by region: instruction-index ranges split at --cuts.

The table sums the CSV's stall_* columns. Samples with no reason among them (ncu 2025.3: a
WARPGROUP.ARRIVE's, 14% of the fp8 narrow kernel's samples in Session 25) are not counted: check
a kernel's top instructions in the CSV's "Warp Stall Sampling (All Samples)" column too.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys
from pathlib import Path
from typing import Iterable, Optional, Sequence

_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
_INSTR = re.compile(r"\s+/\*[0-9a-f]{4,}\*/\s")
_KERNEL = re.compile(r"^\.text\.(\w+):")

Frame = tuple[str, int]  # (file name without directories, line)


def sass_chains(lines: Iterable[str], kernel: str) -> list[tuple[Frame, ...]]:
    """Per instruction of `kernel` in `nvdisasm -gi` text: its inline chain, innermost first."""
    chains: list[tuple[Frame, ...]] = []
    inside, chain, fresh = False, [], True
    for line in lines:
        m = _KERNEL.match(line)
        if m:
            if inside:
                break
            inside = m.group(1) == kernel
            continue
        if not inside:
            continue
        m = _LINE.search(line)
        if m:
            if fresh:  # the first annotation after an instruction starts a new chain
                chain, fresh = [], False
            chain.append((Path(m.group(1)).name, int(m.group(2))))
        elif _INSTR.match(line):
            chains.append(tuple(chain))
            fresh = True
    return chains


def read_samples(rows: Iterable[Sequence[str]]) -> tuple[str, list[dict[str, int]]]:
    """The kernel's name and, per instruction, its stall samples by reason (ncu's source CSV)."""
    name, header, out = "", None, []
    for row in rows:
        if not row:
            continue
        if row[0] == "Kernel Name" and len(row) > 1:
            name = row[1]
        elif row[0] == "Address":
            header = row
        elif header is not None:
            out.append({col[len("stall_"):]: int(val) for col, val in zip(header, row)
                        if col.startswith("stall_") and "Not Issued" not in col and val.isdigit()})
    if header is None:
        raise ValueError("no 'Address' header: not the output of `ncu --page source --csv`")
    return name, out


def group_key(chain: tuple[Frame, ...], index: int, by: str, cuts: Sequence[int], site_file: str,
              depth: int = -1) -> str:
    """The group of one instruction. --by site: the depth-th frame of the chain (past the
    innermost) inside site_file, -1 the outermost (the line of the kernel's own body)."""
    if by == "region":
        return f"region {sum(index >= c for c in cuts)}"
    if not chain:
        return "(no line info)"
    if by == "site":
        frames = [f"{f}:{line}" for f, line in chain[1:] if f == site_file]
        if not frames:
            return "(not inlined from " + site_file + ")"
        return frames[depth] if -len(frames) <= depth < len(frames) else frames[-1]
    return f"{chain[0][0]}:{chain[0][1]}"


def tabulate(samples: Sequence[dict[str, int]], chains: Sequence[tuple[Frame, ...]], by: str,
             cuts: Sequence[int] = (), site_file: str = "", only_line: Optional[Frame] = None,
             top: int = 20, depth: int = -1) -> list[str]:
    """Table lines: per group its samples, share of all and three largest stall reasons."""
    if len(samples) != len(chains):
        raise ValueError(f"{len(samples)} instructions in the CSV, {len(chains)} in the SASS: not the same cubin")
    groups: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for i, (s, chain) in enumerate(zip(samples, chains)):
        if only_line is not None and (not chain or chain[0] != only_line):
            continue
        groups[group_key(chain, i, by, cuts, site_file, depth)].update(s)
    total = sum(sum(c.values()) for c in groups.values()) or 1
    if by == "region":  # in code order
        order = sorted(groups.items(), key=lambda kv: int(kv[0].split()[1]))
    else:
        order = sorted(groups.items(), key=lambda kv: -sum(kv[1].values()))
    lines = [f"| {by} | samples | % | top reasons |", "|---|---|---|---|"]
    for key, c in order[:top]:
        n = sum(c.values())
        reasons = ", ".join(f"{r} {v}" for r, v in c.most_common(3) if v)
        lines.append(f"| {key} | {n} | {100 * n / total:.1f} | {reasons} |")
    return lines


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("sass", help="nvdisasm -gi -c output of the cubin that ran")
    ap.add_argument("--kernel", help="kernel symbol (default: the CSV's kernel name)")
    ap.add_argument("--by", choices=("file", "site", "region"), default="file")
    ap.add_argument("--cuts", default="", help="--by region: comma-separated instruction indices")
    ap.add_argument("--site-file", default="attention_seesaw.cuh", help="--by site: the caller's file")
    ap.add_argument("--depth", type=int, default=-1,
                    help="--by site: which frame inside --site-file (0: nearest the instruction, -1: outermost)")
    ap.add_argument("--line", help="only instructions whose innermost line is FILE:LINE")
    ap.add_argument("--top", type=int, default=20)
    return ap.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    with open(args.csv, newline="") as f:
        name, samples = read_samples(csv.reader(f))
    kernel = args.kernel or name
    with open(args.sass) as f:
        chains = sass_chains(f, kernel)
    if not chains:
        print(f"kernel {kernel!r} not found in {args.sass}", file=sys.stderr)
        return 1
    only = None
    if args.line:
        file, _, line = args.line.rpartition(":")
        only = (file, int(line))
    cuts = [int(x) for x in args.cuts.split(",") if x]
    try:
        lines = tabulate(samples, chains, args.by, cuts, args.site_file, only, args.top, args.depth)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"{kernel}: {len(chains)} instructions")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Code size of the kernels in a cubin, on the host (no GPU): what a code-size experiment counts
before it spends device time (docs/perf-notes.md, Next 00: instructions out of the cold plan and
merge paths gave the small rows ~1% per ~500).

    python benchmarks/cubin_stats.py sizes cubins/sm_90a/mla_sm90.cubin [.ab/NAME/cubins/sm_90a/mla_sm90.cubin]
    python benchmarks/cubin_stats.py spills CUBIN [OTHER]
    python benchmarks/cubin_stats.py lines CUBIN mla_sm90_attention_short [--top 30]
    python benchmarks/cubin_stats.py same-code CUBIN OTHER

sizes: instructions per kernel (its ELF .text section / 16 bytes), and the change to OTHER.
spills: STL / LDL instructions per kernel. lines: a kernel's instructions per source file and per
source line (`nvdisasm -gi`, innermost frame; the cubin build passes -lineinfo). spills and lines need nvdisasm
($JIT_MLA_NVDISASM, the toolkit's, or the `nvidia-cuda-nvdisasm` wheel's). same-code: the
sections that differ, and exit 1 unless only debug info does (code, relocations, kernel info and
constants byte-identical: a comment or an address-space cast that moves source lines but not
SASS; Session 46's grid-word patch was such an edit).
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from jit_mla import cubins, sass  # noqa: E402  (the ELF reader, the disassembler lookup)
from pc_stalls import sass_chains  # noqa: E402  (nvdisasm -gi text -> per-instruction inline chains)

_TEXT = ".text."
_SECTION = re.compile(r"\s*\.section\s+\.text\.([^,\s]+)")


def kernel_sizes(data: bytes) -> dict[str, int]:
    """Instructions per kernel of a cubin: its .text.<kernel> section size / 16 (SASS
    instructions are 16 bytes on sm_90). ValueError when `data` is no ELF64 file."""
    return {name[len(_TEXT):]: size // 16 for name, _, _, size, _, _ in cubins.elf_sections(data)
            if name.startswith(_TEXT)}


def _nvdisasm(args: list[str], cubin: str) -> str:
    cmd = sass.disassembler()
    if cmd is None or "nvdisasm" not in Path(cmd[0]).name:
        raise SystemExit("needs nvdisasm: set JIT_MLA_NVDISASM (e.g. from the nvidia-cuda-nvdisasm wheel)")
    return subprocess.run([cmd[0], *args, cubin], check=True, capture_output=True, text=True).stdout


def spill_counts(cubin: str) -> dict[str, int]:
    """STL / LDL instructions per kernel."""
    counts: dict[str, int] = collections.Counter()
    kernel = None
    for line in _nvdisasm([], cubin).splitlines():
        m = _SECTION.match(line)
        if m:
            kernel = m.group(1)
        elif kernel and re.search(r"\b(STL|LDL)\b", line):
            counts[kernel] += 1
    return counts


_DEBUG_SECTION = re.compile(r"^\.(rela?\.)?(debug_|nv_debug_)")


def differing_sections(data: bytes, other: bytes) -> list[tuple[str, bool]]:
    """(name, is_debug_info) of each section present in only one cubin or whose bytes differ
    (SHT_NOBITS sections by size)."""

    def contents(d: bytes) -> dict[str, bytes | int]:
        return {name: size if sh_type == 8 else d[offset : offset + size]
                for name, sh_type, offset, size, _, _ in cubins.elf_sections(d)}

    a, b = contents(data), contents(other)
    return [(name, bool(_DEBUG_SECTION.match(name))) for name in sorted(set(a) | set(b))
            if a.get(name) != b.get(name)]


def line_counts(cubin: str, kernel: str) -> collections.Counter:
    """One kernel's instructions per innermost (source file name, line)."""
    chains = sass_chains(_nvdisasm(["-gi", "-c"], cubin).splitlines(), kernel)
    return collections.Counter(chain[0] if chain else ("?", 0) for chain in chains)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for cmd in ("sizes", "spills"):
        p = sub.add_parser(cmd)
        p.add_argument("cubin")
        p.add_argument("other", nargs="?")
    p = sub.add_parser("lines")
    p.add_argument("cubin")
    p.add_argument("kernel")
    p.add_argument("--top", type=int, default=30)
    p = sub.add_parser("same-code")
    p.add_argument("cubin")
    p.add_argument("other")
    args = ap.parse_args()
    if args.cmd == "same-code":
        diff = differing_sections(Path(args.cubin).read_bytes(), Path(args.other).read_bytes())
        for name, debug in diff:
            print(f"differs{' (debug info)' if debug else ''}: {name}")
        same = all(debug for _, debug in diff)
        print("same code" if same else "different code")
        sys.exit(0 if same else 1)
    if args.cmd == "lines":
        counts = line_counts(args.cubin, args.kernel)
        files: collections.Counter = collections.Counter()
        for (f, _), n in counts.items():
            files[f] += n
        print(f"{args.kernel}: {sum(counts.values())} instructions")
        for f, n in files.most_common():
            print(f"{n:7d}  {f}")
        print()
        for (f, ln), n in counts.most_common(args.top):
            print(f"{n:7d}  {f}:{ln}")
        return
    count = (lambda c: kernel_sizes(Path(c).read_bytes())) if args.cmd == "sizes" else spill_counts
    a = count(args.cubin)
    b = count(args.other) if args.other else None
    for k in sorted(set(a) | set(b or {})):
        row = f"{a.get(k, 0):7d}"
        if b is not None:
            row += f" {b.get(k, 0):7d} {b.get(k, 0) - a.get(k, 0):+6d}"
        print(f"{row}  {k}")


if __name__ == "__main__":
    main()

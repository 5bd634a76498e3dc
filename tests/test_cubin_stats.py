"""benchmarks/cubin_stats.py's ELF reading on the shipped cubin (no GPU, no disassembler)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stats():
    return load_benchmark("cubin_stats")


def test_every_kernel_has_its_code_counted(stats):
    sizes = stats.kernel_sizes((ROOT / "cubins" / "sm_90a" / "mla_sm90.cubin").read_bytes())
    assert "mla_sm90_attention" in sizes and "mla_sm90_attention_short" in sizes
    # Each kernel carries the plan, its attention loop and the merge: thousands of instructions.
    assert all(n > 1000 for n in sizes.values()), sizes


def test_not_a_cubin_is_refused(stats):
    with pytest.raises(ValueError, match="ELF64"):
        stats.kernel_sizes(b"not an elf file at all, just text")

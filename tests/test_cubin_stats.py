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


def _section(stats, data: bytes, name: str) -> tuple[int, int]:
    (offset, size), = [(o, n) for s, _, o, n, _, _ in stats.cubins.elf_sections(data) if s == name]
    return offset, size


def test_same_code_tells_debug_info_from_code(stats):
    data = (ROOT / "cubins" / "sm_90a" / "mla_sm90.cubin").read_bytes()
    assert stats.differing_sections(data, data) == []

    def flipped(name: str) -> bytes:  # one byte of the section changed
        offset, size = _section(stats, data, name)
        assert size > 0
        return data[:offset] + bytes([data[offset] ^ 0xFF]) + data[offset + 1 :]

    assert stats.differing_sections(data, flipped(".debug_line")) == [(".debug_line", True)]
    text = ".text.mla_sm90_attention_short"
    assert stats.differing_sections(data, flipped(text)) == [(text, False)]

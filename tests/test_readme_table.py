"""README's performance table is the run it names (benchmarks/readme_table.py, no GPU)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from bench_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def table():
    return load_benchmark("readme_table")


def named_results(readme: str) -> Path:
    """The results JSON the README's performance section names."""
    m = re.search(r"`benchmarks/results/(bench_mla-[\w-]+)\.\{json,png\}`", readme)
    assert m, "README names no benchmarks/results/bench_mla-*.{json,png}"
    return ROOT / "benchmarks" / "results" / f"{m.group(1)}.json"


def test_readme_table_matches_its_named_run(table):
    readme = (ROOT / "README.md").read_text()
    results = named_results(readme)
    assert results.is_file(), f"README names {results.name}, not in benchmarks/results"
    assert table.render(readme, json.loads(results.read_text())) == readme


def test_row_count_mismatch_is_refused(table):
    readme = (ROOT / "README.md").read_text()
    results = json.loads(named_results(readme).read_text())
    results["rows"] = results["rows"][:-1]
    with pytest.raises(ValueError, match="README table"):
        table.render(readme, results)


def test_rows_without_a_competitor(table):
    # FlashMLA's n/a reasons map to short cells; a kernel that did not run shows "-" as its clock
    ours = {"us": 10.0, "pct_roofline": 50.0, "sm_mhz": 1980.0}
    row = {"index": 0, "name": "b64_kv8192_h16_q1_fp8", "ours": ours,
           "flashmla": {"na": "FlashMLA's dense sm90 decode takes a bf16 cache only"},
           "flashinfer": {"us": 20.0, "pct_roofline": 25.0, "sm_mhz": 1965.0}}
    line = table.new_row("| 64 | 8192 | 16 | 1, fp8 KV | x | x | x | x |", row)
    assert line == "| 64 | 8192 | 16 | 1, fp8 KV | 10.0 (50.0) | n/a (bf16 cache only) | 20.0 (25.0) | 1980 / - / 1965 |"
    row = {"index": 0, "name": "spec_b64_q1to4_kv4096_h128", "ours": ours,
           "flashmla": {"na": "FlashMLA takes one q_len for every request"},
           "flashinfer": {"us": 20.0, "pct_roofline": 25.0, "sm_mhz": None}}
    line = table.new_row("| 64 | 4096 | 128 | 1..4 ragged | x | x | x | x |", row)
    assert line.endswith("| n/a (one q_len only) | 20.0 (25.0) | 1980 / - / n/a |")
    row = {"index": 0, "name": "b1_kv8192_h16_q1", "ours": ours}  # a run without the library
    assert "| not run |" in table.new_row("| 1 | 8192 | 16 | 1 | x | x | x | x |", row)


def test_flashinfer_cells_say_why(table):
    # only an e4m3-query row is "no e4m3 query"; a failed plan or a run without FlashInfer says so
    ours = {"us": 10.0, "pct_roofline": 50.0, "sm_mhz": 1980.0}
    cells = {}
    for fi in ({"na": "FlashInfer's fa3 MLA takes no e4m3 query"}, {"na": "plan failed: RuntimeError: x"},
               {"error": "RuntimeError: y"}, {"na": "--no-flashinfer"}, None):
        row = {"index": 0, "name": "r", "ours": ours, "flashmla": {"na": "--no-flashmla"}, "flashinfer": fi}
        cells[str(fi)] = table.new_row("| 1 | 8192 | 16 | 1 | x | x | x | x |", row).split(" | ")[6]
    assert list(cells.values()) == ["n/a (no e4m3 query)", "failed (see the JSON)", "failed (see the JSON)",
                                    "not run", "not run"]

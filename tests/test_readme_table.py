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

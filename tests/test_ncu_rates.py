"""benchmarks/ncu_rates.py without a GPU: its parse of ncu's CSV and its rows' shapes."""

from __future__ import annotations

import pytest
from bench_scripts import load_benchmark


@pytest.fixture(scope="module")
def rates():
    return load_benchmark("ncu_rates")


HEADER = '"ID","Process ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"'


def test_parse_metrics_reads_values_with_thousands_separators(rates):
    lines = ["==PROF== Connected to process 1", "program output", HEADER]
    lines += [f'"0","1","k","Command line profiler metrics","{metric}","unit","{value}"'
              for metric, value in [(rates.METRICS["ns"], "426,460"), (rates.METRICS["cycles"], "740,841.5"),
                                    (rates.METRICS["tensor %"], "73.91")]]
    m = rates.parse_metrics("\n".join(lines))
    assert m["ns"] == 426460 and m["cycles"] == 740841.5 and m["tensor %"] == 73.91
    assert m["dram %"] is None  # asked for, not reported


def test_parse_metrics_without_a_profiled_launch_is_none(rates):
    assert rates.parse_metrics("==PROF== Connected\n==WARNING== No kernels were profiled.\n") is None


def test_rows_are_the_benchmark_shapes(rates):
    assert rates.row_flops(0) == ("128,1,128,4096", 128 * 1 * 128 * 4096 * 2 * 1088)
    assert rates.row_flops(1)[0] == "128,2,128,4096"


def test_table_rates_per_sm_and_clock(rates, monkeypatch, capsys, tmp_path):
    # Session 47's B128 kv4096 H128 q2 launch of ours: 711,980 cycles, 3,108 FLOP / SM / clk.
    got = {"ns": 530_100.0, "cycles": 711_980.0, "tensor %": 75.9, "smem wavefronts": 0.65 * 132 * 711_980,
           "gmma wavefronts": None, "gmma conflicts": 0.0, "dram %": 32.3}
    monkeypatch.setattr(rates, "ncu_metrics", lambda name, *a: None if name == "FlashMLA" else got)
    monkeypatch.setattr("sys.argv", ["ncu_rates.py", "--row", "1", "--out", str(tmp_path)])
    rates.main()
    rows = {ln.split(" | ")[0].strip("| "): ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")}
    assert rows["jit_mla"].startswith("| jit_mla | 530.1 | 711,980 | 3,108 | 75.9 | 0.650 | n/a | 0 | 32.3 |")
    assert "n/a (see" in rows["FlashMLA"]
    assert rows["cuBLAS mm"].split(" | ")[3] == f"{2 * 8192 ** 3 / 132 / 711_980:,.0f}"

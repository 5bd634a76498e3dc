"""benchmarks/bench_mla.py without a GPU: its dry run, and its byte/FLOP formulas checked by hand."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from bench_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_mla.py"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_mla")


def _by_name(bench, name):
    (shape,) = [s for s in bench.shape_table() if s.name == name]
    return shape


def test_bytes_and_flops_by_hand_tp1_decode(bench):
    # B 128, kv 4096, H 128, q_len 1
    s = _by_name(bench, "b128_kv4096_h128_q1")
    assert s.kv_bytes == 128 * 4096 * 576 * 2 == 603_979_776
    assert s.q_bytes == 128 * 128 * 576 * 2 == 18_874_368
    assert s.out_bytes == 128 * 128 * 512 * 2 == 16_777_216
    assert s.bytes == 639_631_360
    assert s.flops == 128 * 1 * 128 * 4096 * 2 * 1088 == 146_028_888_064
    assert s.flops_visible == s.flops  # q_len 1 sees the whole sequence
    assert not s.causal and not s.ragged
    # roofline at 4 TB/s and 800 TFLOP/s: compute-bound, 146.03e9 / 800e12 s
    row = bench.shape_row(0, s)
    bench.add_roofline(row, {"copy_tbps": 4.0, "matmul_tflops": 800.0})
    assert row["bound"] == "compute"
    assert row["roofline_us"] == pytest.approx(182.536110080, rel=1e-9)
    perf = bench.perf_fields(row, 200.0)
    assert perf["pct_roofline"] == pytest.approx(100 * 182.536110080 / 200.0)
    assert perf["tbps"] == pytest.approx(639_631_360 / 200e-6 / 1e12)
    assert perf["tflops"] == pytest.approx(146_028_888_064 / 200e-6 / 1e12)


def test_bytes_and_flops_by_hand_tp8_mtp4(bench):
    # B 64, kv 8192, H 16, q_len 4: total_q 256
    s = _by_name(bench, "b64_kv8192_h16_q4")
    assert s.total_q == 256 and s.causal
    assert s.kv_bytes == 64 * 8192 * 576 * 2 == 603_979_776
    assert s.q_bytes == 256 * 16 * 576 * 2 == 4_718_592
    assert s.out_bytes == 256 * 16 * 512 * 2 == 4_194_304
    assert s.bytes == 612_892_672
    assert s.flops == 64 * 4 * 16 * 8192 * 2 * 1088 == 73_014_444_032
    row = bench.shape_row(6, s)
    bench.add_roofline(row, {"copy_tbps": 4.0, "matmul_tflops": 800.0})
    assert row["bound"] == "memory"
    assert row["roofline_us"] == pytest.approx(612_892_672 / 4e12 * 1e6)


def test_roofline_at_the_rows_clock(bench):
    """The compute term at the row's SM clock from the sustained matmul's rate per GHz; the copy
    term as it is."""
    s = _by_name(bench, "b128_kv4096_h128_q1")
    row = bench.shape_row(0, s)
    ceilings = {"copy_tbps": 4.0, "matmul_tflops": 800.0, "matmul_sustained": {"tflops_per_ghz": 400.0}}
    bench.add_roofline(row, ceilings)
    assert row["matmul_tflops_per_ghz"] == 400.0
    clock = {"sm_mhz": 1650.0, "clock_samples": 5}
    perf = bench.perf_fields(row, 200.0, clock)
    compute_us = 146_028_888_064 / (400e12 * 1.65) * 1e6
    assert perf["roofline_at_clock_us"] == pytest.approx(compute_us)
    assert perf["pct_roofline_at_clock"] == pytest.approx(100 * compute_us / 200.0)
    assert "pct_roofline_at_clock" not in bench.perf_fields(row, 200.0)  # no clock for the row
    # too few samples: a window that began on an idle card reads the boost clock
    assert "pct_roofline_at_clock" not in bench.perf_fields(row, 200.0, {"sm_mhz": 1980.0, "clock_samples": 3})
    # memory-bound at the row's clock: the copy term stays
    s = _by_name(bench, "b64_kv8192_h16_q1")
    row = bench.shape_row(4, s)
    bench.add_roofline(row, ceilings)
    perf = bench.perf_fields(row, 200.0, clock)
    assert perf["roofline_at_clock_us"] == pytest.approx(row["roofline_us"])


def test_smi_sampler_lines_and_windows():
    smi = load_benchmark("smi_sampler")
    assert smi.parse_line("1755, 690.21\n") == (1755.0, 690.21)
    assert smi.parse_line("[N/A], 80.5") is None and smi.parse_line("garbage") is None
    samples = [(0.0, 1980.0, 300.0), (1.0, 1700.0, 690.0), (1.1, 1720.0, 700.0), (1.2, 1740.0, 695.0),
               (3.0, 1980.0, 200.0)]
    assert smi.window_stats(samples, 0.95, 1.25) == {"sm_mhz": 1720.0, "power_w": 695.0, "clock_samples": 3}
    assert smi.window_stats(samples, 1.5, 2.5) == {}
    # a sampler started with reasons=True: clock and power as before, the reasons beside them
    proc = type("Proc", (), {"stdout": io.StringIO("1755, 690.2, 0x0000000000000004\n[N/A], 1, 0x1\n"),
                             "poll": lambda self: 0})()
    sampler = smi.SmiSampler(proc)
    sampler.thread.join(timeout=10)
    assert [s[1:] for s in sampler.samples] == [(1755.0, 690.2)]
    assert sampler.reasons_in(0.0, time.monotonic()) == ["0x0000000000000004"]


def test_smi_sampler_asks_for_the_instant_power_first(monkeypatch):
    smi = load_benchmark("smi_sampler")
    asked = []

    def popen(cmd, **kw):  # a driver that knows every field: the first query is the one kept
        asked.append(cmd)
        return type("Proc", (), {"stdout": io.StringIO("1470, 741.6\n"), "poll": lambda self: None,
                                 "terminate": lambda self: None, "wait": lambda self, timeout=None: 0})()

    monkeypatch.setattr(smi.subprocess, "Popen", popen)
    sampler = smi.SmiSampler.start(None)
    sampler.thread.join(timeout=10)
    assert asked[0][1] == "--query-gpu=clocks.sm,power.draw.instant" and len(asked) == 1
    assert [s[1:] for s in sampler.samples] == [(1470.0, 741.6)]


def test_visible_flops_follow_the_bottom_right_causal_mask(bench):
    # q_len 2 on kv 5: token 0 sees keys 0..3 (4), token 1 sees 0..4 (5): 9 keys per head
    s = bench.Shape("t", 16, (2,), (5,))
    assert s.flops_visible == 9 * 16 * 2176
    assert s.flops == 2 * 5 * 16 * 2176


def test_table_and_calls_per_replay(bench):
    shapes = bench.shape_table()
    assert len(shapes) == 55 and len({s.name for s in shapes}) == 55
    spec = _by_name(bench, "spec_b64_q1to4_kv4096_h128")
    assert spec.ragged and spec.batch == 64 and set(spec.q_lens) <= {1, 2, 3, 4} and len(set(spec.q_lens)) > 1
    for ragged, twin in bench.RAGGED_TWINS:  # the uniform twin has as many tokens, same kv and H
        a, b = _by_name(bench, ragged), _by_name(bench, twin)
        assert (a.total_q, a.kv_lens[0], a.num_heads) == (b.total_q, b.kv_lens[0], b.num_heads)
    assert spec.q_lens == bench.shape_table()[11].q_lens  # seeded: the same every run
    prefill = _by_name(bench, "prefill_4x2048_kv8192_h128")
    assert prefill.total_q == 8192 and prefill.n_sets == 1
    for s in shapes:
        if s.name.startswith("prefill_"):  # query and output alone pass 512 MiB: one set
            assert s.n_sets == 1, s.name
        else:  # each graph replay streams >= 512 MiB of KV, past L2
            assert s.n_sets * s.kv_bytes_per_set >= 512 * 2**20, s.name
    # one 8192-token request (9.44 MB of KV): ceil(512 MiB / 9,437,184 B) = 57 calls per replay
    assert _by_name(bench, "b1_kv8192_h16_q1").n_sets == 57
    assert _by_name(bench, "b128_kv8192_h128_q1").n_sets == 1
    for name, lo, hi in (("mixed_b64_kv1k_16k_h16", 1024, 16384), ("mixed_b128_kv512_8k_h128", 512, 8192)):
        mixed = _by_name(bench, name)  # seeded lengths of one decode step each, spread over [lo, hi]
        assert set(mixed.q_lens) == {1} and not mixed.ragged and mixed.kv_lens == _by_name(bench, name).kv_lens
        assert lo <= min(mixed.kv_lens) < max(mixed.kv_lens) <= hi and len(set(mixed.kv_lens)) > len(mixed.kv_lens) // 2


def test_shape_selection(bench):
    shapes = bench.shape_table()
    picked = bench.select_shapes(shapes, "0,spec_*,b1_kv65536_h128_q1")
    assert [s.name for s in picked] == ["b128_kv4096_h128_q1", "b1_kv65536_h128_q1", "spec_b64_q1to4_kv4096_h128",
                                        "spec_b64_q1to4_kv4096_h128_fp8", "spec_b64_q1to4_kv4096_h128_fp8q"]
    assert bench.select_shapes(shapes, None) == shapes
    with pytest.raises(ValueError, match="matches no shape"):
        bench.select_shapes(shapes, "nope")
    with pytest.raises(ValueError, match="out of range"):
        bench.select_shapes(shapes, "55")


def test_dry_run_prints_the_table_without_a_gpu():
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    for name in ("b128_kv4096_h128_q1", "spec_b64_q1to4_kv4096_h128", "prefill_4x2048_kv8192_h128"):
        assert name in out
    assert "| 639631360 | 146028888064 |" in out  # shape 0: bytes, FLOPs
    assert "| 612892672 | 73014444032 |" in out  # shape 6
    bad = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--shapes", "nope"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "matches no shape" in bad.stderr


def test_report_from_json_without_a_gpu(bench, tmp_path, capsys):
    s = _by_name(bench, "b64_kv8192_h16_q1")
    ceilings = {"copy_tbps": 4.0, "read_tbps": 4.2, "matmul_tflops": 700.0, "assumed": False}
    row = bench.shape_row(4, s)
    bench.add_roofline(row, ceilings)
    row["ours"] = bench.perf_fields(row, 200.0)
    row["flashinfer"] = {"na": "plan failed: test"}
    result = {"gpu": {"name": "test"}, "git_commit": "0" * 40, "ceilings": ceilings, "rows": [row]}
    table = bench.markdown_table(result)
    assert table.splitlines()[-1].startswith("| 4 | b64_kv8192_h16_q1 | mem | 200.0 |")
    # FlashMLA and FlashInfer columns: µs, % roof, ratio each; then the clocks and % at clock
    assert table.splitlines()[-1].endswith("| n/a | n/a | n/a | n/a | n/a | n/a | n/a / n/a / n/a | n/a / n/a / n/a |")
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    assert bench.main(["--replot", str(path), "--out-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith(table.splitlines()[-1])  # the table comes last
    assert "flashinfer n/a: plan failed: test" in printed
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "r.png").stat().st_size > 0


def test_host_median_syncs_after_each_burst(bench):
    calls, syncs = [], []
    us = bench.host_median_us(lambda: calls.append(1), lambda: syncs.append(len(calls)), samples=30, burst=10)
    assert len(calls) == 30 and syncs == [10, 20, 30]  # the queue is drained every `burst` calls
    assert us >= 0.0


def test_probe_script_without_a_gpu(monkeypatch):
    """benchmarks/probe_seesaw.py: its pair count by hand, and --help without a GPU."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # its imports of sibling scripts
    probe = ROOT / "benchmarks" / "probe_seesaw.py"
    module = load_benchmark("probe_seesaw")
    # B128 q1 H128 kv4096: 2 units per request, 32 pairs each, 8192 pairs over 132 SMs.
    assert module.pairs_per_cta(128, 1, 128, 4096, 132) == pytest.approx(8192 / 132)
    # H16 q1: one 64-row unit per request holds the 16 rows.
    assert module.pairs_per_cta(64, 1, 16, 8192, 132) == pytest.approx(64 * 64 / 132)
    # 140 GFLOP in 200 µs is 700 TFLOP/s; at 700 W that is 1 pJ per FLOP.
    line = module.energy_line({"us": 200.0, "mhz": 1500.0, "w": 700.0, "samples": 12, "reasons": ["0x4"]}, 140e9)
    assert "700 TFLOP/s" in line and "1.000 pJ/FLOP" in line and "reasons 0x4 (12 samples)" in line, line
    run = subprocess.run([sys.executable, str(probe), "--help"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "--shape" in run.stdout, run.stderr


def test_trace_script_without_a_gpu(monkeypatch):
    """benchmarks/trace_phases.py: the probe's printf lines parsed and summed up by hand."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    trace = load_benchmark("trace_phases")
    text = (
        "noise\n"
        "jit_mla-trace cta=1 sm=7 t=1000,3000,5000,45000,47000,52000\n"
        "jit_mla-trace cta=0 sm=3 t=2000,3000,6000,41000,47000,50000\n"
    )
    rows = trace.parse(text)
    assert [r["cta"] for r in rows] == [1, 0] and rows[0]["sm"] == 7 and rows[1]["attended"] == 41000
    s = trace.summarize(rows)
    assert s["ctas"] == 2 and s["split"]
    assert s["start spread"] == pytest.approx(1.0)  # entries 1000 and 2000 ns
    assert s["attention end spread"] == pytest.approx(4.0)
    assert s["first entry to last done"] == pytest.approx(51.0)
    assert s["attention"] == {"median": pytest.approx(37.5), "max": pytest.approx(40.0)}
    assert s["barrier wait"]["max"] == pytest.approx(6.0) and s["merge"]["max"] == pytest.approx(5.0)
    assert s["slowest attention cta"] == 1
    # the planned ranges (probe builds since session 17): pieces = the groups a range holds a part of
    ranged = trace.parse(
        "jit_mla-trace cta=0 sm=0 t=0,10,1000,41000,47000,50000 r=0,0,0,40\n"
        "jit_mla-trace cta=1 sm=1 t=0,10,1000,45000,47000,50000 r=0,40,1,20\n"
        "jit_mla-trace cta=2 sm=2 t=0,10,1000,43000,47000,50000 r=1,20,3,0\n"
        "jit_mla-trace cta=3 sm=3 t=0,10,1000,1000,47000,50000 r=3,0,3,0\n")
    assert ranged[1]["range"] == (0, 40, 1, 20) and "range" not in rows[0]
    assert [trace.pieces(r["range"]) for r in ranged] == [1, 2, 2, 0]
    by = trace.attention_by_pieces(ranged)
    assert by[1] == {"ctas": 1, "median": pytest.approx(40.0), "max": pytest.approx(40.0)}
    assert by[2]["ctas"] == 2 and by[2]["median"] == pytest.approx(43.0) and by[2]["max"] == pytest.approx(44.0)
    # the attention ends of the CTAs with work (CTA 3's range is empty), µs from the first entry
    s = trace.summarize(ranged)
    assert s["planned at"] == pytest.approx(1.0)
    assert s["attention ends"] == {"ctas": 3, "p10": pytest.approx(41.0), "p50": pytest.approx(43.0),
                                   "p90": pytest.approx(45.0), "max": pytest.approx(45.0)}
    assert trace.rank_value([3.0, 1.0, 2.0, 4.0], 0.5) == 3.0 and trace.rank_value([1.0], 0.9) == 1.0
    # no barrier (nothing split): synced is 0 on every CTA, and the merge phases read 0
    unsplit = trace.summarize(trace.parse("jit_mla-trace cta=0 sm=0 t=0,10,20,30,0,40\n"))
    assert not unsplit["split"] and unsplit["merge"]["max"] == 0
    with pytest.raises(ValueError, match="JIT_MLA_PROBE"):
        trace.summarize([])
    # the wait probe: per warpgroup, sums over the CTAs that ran pairs, divided by their pairs
    waits = trace.parse_waits(
        "jit_mla-waits cta=0 wg=0 c=100,200,300,400,2000,50,60,4\n"
        "jit_mla-waits cta=1 wg=0 c=300,0,100,0,2000,50,60,4\n"
        "jit_mla-waits cta=2 wg=0 c=0,0,0,0,0,0,0,0\n"
        "jit_mla-waits cta=0 wg=1 c=8,8,8,8,80,8,8,8\n")
    w = trace.summarize_waits(waits)
    assert w["wg0"]["ctas"] == 2 and w["wg0"]["pairs"] == 8
    assert w["wg0"]["qk box"]["per_pair"] == pytest.approx(50.0)  # (100 + 300) / 8
    assert w["wg0"]["qk box"]["of_loop"] == pytest.approx(0.1)    # 400 / 4000
    assert w["wg1"]["loop"]["per_pair"] == pytest.approx(10.0)
    # the timeline probe: both warpgroups merged in time, relative to wg0's first mark, 24-bit wrap
    tl = trace.parse_timeline(
        "jit_mla-tl wg=1 i=0 ev=5 t=16777200\n"
        "jit_mla-tl wg=0 i=0 ev=0 t=16777210\n"
        "jit_mla-tl wg=0 i=1 ev=1 t=20\n")
    assert [(r["wg"], r["event"], r["t"]) for r in tl] == [
        (1, "scale in", -10), (0, "pair start", 0), (0, "max published", 26)]
    assert trace.format_timeline(tl)[2].split() == ["26", "+26", "max", "published"]
    assert trace.parse_timeline("noise\n") == []
    # the merge timeline probe: marks in record order, relative to the first, 24-bit wrap, gaps
    mtl = trace.parse_merge_timeline(
        "jit_mla-mtl i=1 ev=1 t=16777210\n"
        "jit_mla-mtl i=0 ev=0 t=16777200\n"
        "jit_mla-mtl i=2 ev=3 t=40\n")
    assert [(r["event"], r["t"], r["gap"]) for r in mtl] == [
        ("synced", 0, 0), ("unit lookup", 10, 10), ("slots scanned", 56, 46)]
    assert trace.parse_merge_timeline("noise\n") == []
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trace_phases.py"), "--help"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "--shape" in run.stdout, run.stderr


def test_ab_script_without_a_gpu(tmp_path, monkeypatch):
    """benchmarks/ab.py: the same-run table (medians, ratio to main) and its command line."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    ab = load_benchmark("ab")
    # run() unpacks .ab/variants.tar.xz for a variant it does not find: not the checkout's
    monkeypatch.setattr(ab, "AB_DIR", tmp_path)
    times = {"main": [{"s0": 10.0, "s1": 20.0}, {"s0": 12.0, "s1": 20.0}],
             "v": [{"s0": 9.0, "s1": 22.0}, {"s0": 9.0, "s1": 23.0}]}
    lines = ab.summarize(times)
    assert lines[0] == "| shape | main µs | v µs | v / main |" and lines[1] == "|---|---|---|---|"
    assert lines[2] == "| s0 | 11.0 | 9.0 | 0.818 |"   # medians 11 and 9
    assert lines[3] == "| s1 | 20.0 | 22.5 | 1.125 |"
    with pytest.raises(SystemExit, match="not a prepared variant"):
        ab.run(["no-such-variant"], "", 1, False)
    # each tree's clock and power per shape, "?" where the sampler had nothing
    assert ab.clock_cell({"sm_mhz": 1755.0, "power_w": 688.4, "clock_samples": 5}) == "1755 / 688 (5)"
    assert ab.clock_cell({"us": 3.0}) == "?"
    table = ab.clock_table({"main": {"s0": "1755 / 688 (5)"}, "v": {}})
    assert table == ["| shape | main | v |", "|---|---|---|", "| s0 | 1755 / 688 (5) | ? |"]
    for cmd in ("prepare", "pack", "run", "trace"):
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ab.py"), cmd, "--help"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "usage" in r.stdout, r.stderr


def test_ab_trace_without_a_gpu(tmp_path, monkeypatch, capsys):
    """ab.py trace: trace_phases.py run in each variant's tree per shape and run, one summary line
    each, the runs' files packed with names the device tool returns (no commas)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    ab = load_benchmark("ab")
    monkeypatch.setattr(ab, "AB_DIR", tmp_path / "ab")
    tree = tmp_path / "ab" / "v"
    (tree / "cubins").mkdir(parents=True)
    (tree / "benchmarks").mkdir()
    # a stand-in for the tree's trace_phases.py: its --json file with a summary as summarize() makes
    summary = {"ctas": 2, "split": False, "planned at": 1.5, "attention": {"median": 140.0, "max": 145.0},
               "attention ends": {"ctas": 2, "p10": 141.0, "p50": 143.0, "p90": 146.0, "max": 147.0},
               "first entry to last done": 147.5}
    (tree / "benchmarks" / "trace_phases.py").write_text(
        "import json, sys\n"
        "args = sys.argv[1:]\n"
        "print('traced', args[args.index('--shape') + 1])\n"
        f"json.dump({{'summary': {summary!r}}}, open(args[args.index('--json') + 1], 'w'))\n")
    archive = ab.trace(["v"], ["128,2,16,4096"], 2, tmp_path / "out")
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "v-128x2x16x4096-1: planned 1.50, attention median 140.0 / max 145.0, ends 10/50/90/100% 141.0 / 143.0 /"
        " 146.0 / 147.0 (2 CTAs), last done 147.5",
        lines[0].replace("-1:", "-2:")]
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["traces", "traces/v-128x2x16x4096-1.json", "traces/v-128x2x16x4096-1.txt",
                                          "traces/v-128x2x16x4096-2.json", "traces/v-128x2x16x4096-2.txt"]
    assert (tmp_path / "out" / "traces" / "v-128x2x16x4096-1.txt").read_text() == "traced 128,2,16,4096\n"
    with pytest.raises(SystemExit, match="not a prepared variant"):
        ab.trace(["no-such-variant"], ["8,1,128,4096"], 1, tmp_path / "out")


def test_ab_pack_round_trip(tmp_path, monkeypatch):
    """ab.py pack / unpack: the prepared trees into one archive and back, as the device host
    unpacks it before a run."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    ab = load_benchmark("ab")
    monkeypatch.setattr(ab, "AB_DIR", tmp_path)
    with pytest.raises(SystemExit, match="no prepared variants"):
        ab.pack()
    for name in ("a", "b"):
        (tmp_path / name / "cubins").mkdir(parents=True)
        (tmp_path / name / "cubins" / "k.cubin").write_bytes(name.encode() * 1000)
    archive = ab.pack()
    assert archive == tmp_path / "variants.tar.xz" and archive.is_file()
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # a tree prepared after a pack joins the archive; a re-prepared one replaces its old copy
    (tmp_path / "a" / "cubins").mkdir(parents=True)
    (tmp_path / "a" / "cubins" / "new.cubin").write_bytes(b"A" * 1000)
    (tmp_path / "c").mkdir()
    ab.pack()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["variants.tar.xz"]
    ab.unpack_if_packed(["a"])
    assert [p.name for p in (tmp_path / "a" / "cubins").iterdir()] == ["new.cubin"]
    assert (tmp_path / "b" / "cubins" / "k.cubin").read_bytes() == b"b" * 1000
    assert (tmp_path / "c").is_dir()


def test_validate_script_parses():
    # benchmarks/validate_gpu.sh runs only on the GPU host; here at least bash must accept it.
    script = SCRIPT.parent / "validate_gpu.sh"
    run = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr


def test_fp8_rows_count_one_byte_per_kv_element(bench):
    shapes = {s.name: s for s in bench.shape_table()}
    bf16, fp8 = shapes["b64_kv8192_h16_q1"], shapes["b64_kv8192_h16_q1_fp8"]
    assert fp8.kv_fp8 and not bf16.kv_fp8
    assert fp8.kv_bytes * 2 == bf16.kv_bytes == 64 * 8192 * 576 * 2
    assert fp8.q_bytes == bf16.q_bytes and fp8.out_bytes == bf16.out_bytes
    assert fp8.flops == bf16.flops
    assert fp8.kv_bytes_per_set * 2 == bf16.kv_bytes_per_set


def test_flashmla_column_without_its_library(bench, monkeypatch, tmp_path):
    side = load_benchmark("flashmla_side")
    monkeypatch.setenv("JIT_MLA_FLASHMLA_LIB", str(tmp_path / "absent.so"))
    lib, why = side.load()
    assert lib is None and "absent.so" in why and "build.sh" in why
    # its dense decode: bf16 cache, one q_len for all requests; mixed KV lengths are fine
    assert side.not_applicable(_by_name(bench, "b128_kv4096_h128_q2")) is None
    assert side.not_applicable(_by_name(bench, "mixed_b64_kv1k_16k_h16")) is None
    assert side.not_applicable(_by_name(bench, "prefill_4x2048_kv8192_h128")) is None  # one q_len
    assert "q_len" in side.not_applicable(_by_name(bench, "spec_b64_q1to4_kv4096_h128"))
    assert "bf16" in side.not_applicable(_by_name(bench, "b64_kv8192_h16_q1_fp8"))
    # CTAs per 64-row tile: 132 SMs over 2 tiles at H 128, 1 tile at H 16 (q_len 4: 64 rows)
    assert side.num_sm_parts(132, 1, 128) == 66
    assert side.num_sm_parts(132, 4, 16) == 132
    assert side.num_sm_parts(132, 2, 128) == 33


def test_competitor_results_and_checks_without_a_gpu(bench):
    """Bench.time_competitor: a competitor's time, its ratio to ours and its output check under
    the JSON keys the readers use; a timing failure is that row's error. CPU tensors, no graphs."""
    import torch

    b = object.__new__(bench.Bench)  # no device: time_graph is replaced below
    shape = _by_name(bench, "b64_kv8192_h16_q1")
    ours = torch.randn(shape.total_q, shape.num_heads, bench.D_V).to(torch.bfloat16)
    data = {"outs": [ours]}
    row = {"bytes": 1e9, "flops": 1e12, "roofline_us": 100.0, "ours": {"us": 200.0}}
    b.time_graph = lambda calls: {"us": 250.0}
    b.time_competitor(row, shape, data, "flashmla", [], ours.clone())
    b.time_competitor(row, shape, data, "flashinfer", [], ours.float().add(0.5).to(torch.bfloat16))
    assert row["flashmla"]["us"] == 250.0 and row["flashmla"]["pct_roofline"] == 40.0
    assert row["ratio_fm_over_ours"] == row["ratio_fi_over_ours"] == 1.25
    assert row["check_flashmla"]["against"] == "FlashMLA" and row["check_flashmla"]["max_abs_diff"] == 0.0
    assert "against" not in row["check"] and row["check"]["suspect"]  # 0.5 off: past 0.02 + 0.02 x peak
    b.time_graph = lambda calls: 1 / 0
    failed = {"ours": {"us": 200.0}}
    b.time_competitor(failed, shape, data, "flashinfer", [], ours)
    assert failed == {"ours": {"us": 200.0}, "flashinfer": {"error": "ZeroDivisionError: division by zero"}}

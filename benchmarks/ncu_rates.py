"""Tensor-pipe and shared-memory use per clock: ours, FlashMLA, FlashInfer and cuBLAS under ncu.

The benchmark's % of roofline mixes two things: how much of the tensor pipe a kernel keeps busy
per clock, and the clock the 700 W limit leaves it. ncu at a locked clock (`--clock-control
base`) separates them: every kernel here runs at the same SM clock, one launch each, so the
rows compare per-clock rates only. On the H200 (after `source .gpu-wheels/activate.sh`; carry
`.flashmla` for FlashMLA's row):

    python3 benchmarks/ncu_rates.py --row 1 --out /tmp/rates

--row: a bench_mla.py row index (0: B128 kv4096 H128 q1, 1: the same at q_len 2). Ours runs on
profile_one.py's data for the row's shape, the competitors on bench_mla.py's data for the row
(both random pages, one page set); the matmul is cuBLAS's 8192^3 bf16 (torch.mm). Prints, per
kernel: duration and cycles, the useful bf16 FLOPs per SM per clock (the row's formula, or
2 n^3, over the SMs and the elapsed cycles), the tensor pipe's active share, and shared-memory
wavefronts per SM per clock (all, and those of GMMA operand reads). (ncu's "shared pipe" is the
FP16 + tensor pipe, not shared memory: on these kernels it reads as the tensor pipe does.) A
kernel that ncu could not profile reads n/a (its log is under --out).
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
METRICS = {
    "ns": "gpu__time_duration.sum",
    "cycles": "sm__cycles_elapsed.avg",
    "tensor %": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "smem wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "gmma wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_gmma.sum",
    "gmma conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_gmma.sum",
    "dram %": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
}
MATMUL_N = 8192
MATMUL = ("import torch; a = torch.randn({n}, {n}, device='cuda', dtype=torch.bfloat16); "
          "b = torch.randn_like(a); [torch.mm(a, b) for _ in range(3)]; torch.cuda.synchronize()")


def ncu_metrics(name: str, kernel_regex: str, skip: int, cmd: list[str], out: Path) -> Optional[dict]:
    """One launch of the kernel matching kernel_regex (after `skip` of them) at the base clock;
    the metrics by METRICS' keys, or None (ncu's output in out/<name>.log)."""
    args = ["ncu", "--clock-control", "base", "--csv", "--print-units", "base",
            "--kernel-name-base", "demangled", "--kernel-name", f"regex:{kernel_regex}",
            "--launch-skip", str(skip), "--launch-count", "1", "--metrics", ",".join(METRICS.values()), *cmd]
    res = subprocess.run(args, capture_output=True, text=True, timeout=300)
    (out / f"{name}.log").write_text(res.stdout + res.stderr)
    return parse_metrics(res.stdout)


def parse_metrics(stdout: str) -> Optional[dict]:
    """ncu --csv output of one launch -> the metrics by METRICS' keys (None where absent), or None
    when it holds no metric line (ncu's own lines start with ==, the program's anything else)."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith('"')]
    if len(lines) < 2:
        return None
    by_metric = {rec["Metric Name"]: float(rec["Metric Value"].replace(",", ""))
                 for rec in csv.DictReader(io.StringIO("\n".join(lines)))}
    return {key: by_metric.get(metric) for key, metric in METRICS.items()}


def _fmt(v: Optional[float], spec: str = "{:.1f}") -> str:
    return "n/a" if v is None else spec.format(v)


def row_flops(index: int) -> tuple[str, float]:
    """bench_mla.py row `index`: its B,Q_LEN,H,KV string and its FLOPs (the benchmark's formula)."""
    sys.path.insert(0, str(HERE))
    import bench_mla  # noqa: E402  (needs torch; imported on the GPU machine)

    shape = bench_mla.shape_table()[index]
    assert len(set(shape.q_lens)) == 1 and len(set(shape.kv_lens)) == 1, "a uniform row"
    return f"{shape.batch},{shape.q_lens[0]},{shape.num_heads},{shape.kv_lens[0]}", float(shape.flops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", type=int, default=1, help="bench_mla.py row index (uniform, bf16)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/ncu_rates"), help="ncu logs")
    ap.add_argument("--sms", type=int, default=132, help="the GPU's SM count (H200: 132)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shape, flops = row_flops(args.row)
    one = [sys.executable, str(HERE / "profile_one.py")]
    runs = [  # name, kernel regex, launches to skip, command, useful FLOPs
        ("jit_mla", "mla_sm90_attention", 1, [*one, "--shape", shape], flops),
        ("FlashMLA", "flash_fwd_splitkv_mla", 1, [*one, "--flashmla-row", str(args.row), "--calls", "3"], flops),
        ("FlashInfer fa3", "flashinfer", 2, [*one, "--flashinfer-row", str(args.row), "--calls", "4"], flops),
        ("cuBLAS mm", "gemm|nvjet|xmma|cutlass", 1, [sys.executable, "-c", MATMUL.format(n=MATMUL_N)],
         2.0 * MATMUL_N ** 3),
    ]
    print(f"row {args.row} (B,Q_LEN,H,KV {shape}), ncu at the base clock, one launch each")
    print("| kernel | µs | cycles | FLOP / SM / clk | tensor % | smem wf / clk | gmma wf / clk | gmma conflicts | dram % |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, regex, skip, cmd, useful in runs:
        log = name.split()[0]
        m = ncu_metrics(log, regex, skip, cmd, args.out)
        if m is None or not m["cycles"]:
            print(f"| {name} | n/a (see {args.out}/{log}.log) |")
            continue
        per_sm_clk = m["cycles"] * args.sms  # SM-cycles of the launch
        wf = [None if m[k] is None else m[k] / per_sm_clk for k in ("smem wavefronts", "gmma wavefronts")]
        print(f"| {name} | {_fmt(m['ns'] and m['ns'] / 1e3)} | {m['cycles']:,.0f} | {useful / per_sm_clk:,.0f} | "
              f"{_fmt(m['tensor %'])} | {_fmt(wf[0], '{:.3f}')} | {_fmt(wf[1], '{:.3f}')} | "
              f"{_fmt(m['gmma conflicts'], '{:,.0f}')} | {_fmt(m['dram %'])} |")


if __name__ == "__main__":
    main()

"""Timing probes of the attention kernel: where a block pair's time goes (issue 4).

    python benchmarks/probe_seesaw.py [--shape B,Q_LEN,H,KV_LEN] [--label NAME]

Times one shape twice, with CUDA events over back-to-back calls (median of 7 runs of 20 calls):
    dram   every request has its own random pages (the KV streams from DRAM, as in the benchmark)
    l2     every request's block table points into the same 64 pages (4.7 MB: the KV stays in L2)
and prints µs and the cycles per 64-token block pair per CTA at the SM clock nvidia-smi reports.
With --seconds S each layout instead runs back to back for S seconds (the card settles at its
power-limited clock, as in bench_mla.py's full runs) while nvidia-smi samples the SM clock, the
power and the active clock event reasons (e.g. 0x4 SW power cap) every 20 ms; the line then gives
the median µs of the second half and that half's median clock, power and reasons seen, and
the TFLOP/s and picojoules per FLOP (W / TFLOP/s). --matmul adds the bf16 8192^3 matmul run the
same way: the roofline's ceiling at the same power cap, its energy per FLOP beside the kernel's.
The kernel variants that drop a stage are cubins built with JIT_MLA_PROBE (csrc/common/probe.h):
    sed -i 's/define JIT_MLA_PROBE 0/define JIT_MLA_PROBE 1/' csrc/common/probe.h
    python -m jit_mla build --cubins && python benchmarks/probe_seesaw.py --label no-loads
Their outputs are garbage; only the times mean something.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from bench_mla import FLOP_PER_KEY_ROW  # benchmarks/ is on sys.path: this script's folder
from profile_one import uniform_call
from smi_sampler import SmiSampler, query

_L2_PAGES = 64
_MATMUL_N = 8192  # bench_mla.py's ceiling


def sm_clock_mhz() -> float:
    """The SM clock under load is not observable from here; the max clock bounds cycles from above."""
    max_sm = query(None).get("clocks.max.sm", "")  # e.g. "1980 MHz"
    return float(max_sm.split()[0]) if max_sm[:1].isdigit() else float("nan")


def pairs_per_cta(b: int, q_len: int, h: int, kv: int, sms: int) -> float:
    """64-token KV block pairs per CTA: ceil(q_len H / 64) units of 64 rows per request, kv / 128
    pairs each, spread over one CTA per SM."""
    return b * math.ceil(q_len * h / 64) * (kv / 128) / sms


def batch_us(fn, calls: int = 20) -> float:
    """µs per call of `calls` back-to-back calls between two events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def time_calls(fn, calls: int = 20, runs: int = 7) -> float:
    """Median µs of one call, from runs of `calls` back-to-back calls between two events."""
    fn()
    torch.cuda.synchronize()
    return statistics.median(batch_us(fn, calls) for _ in range(runs))


def energy_line(r: dict, flops: float) -> str:
    """A sustained run's TFLOP/s and picojoules per FLOP (W / TFLOP/s) for `flops` per call."""
    tflops = flops / (r["us"] * 1e-6) / 1e12
    return (f"{r['us']:8.1f} µs sustained, {tflops:5.0f} TFLOP/s, {r['mhz']:.0f} MHz, {r['w']:.0f} W, "
            f"{r['w'] / tflops:.3f} pJ/FLOP, reasons {' '.join(r['reasons'])} ({r['samples']} samples)")


def sustained(fn, seconds: float, sampler) -> dict:
    """Back-to-back calls of fn for `seconds` (batches of 20 between events) while `sampler`
    (smi_sampler.SmiSampler with reasons) samples; medians over the second half, when the clock
    has settled."""
    times = []
    t_mid = time.monotonic() + seconds / 2
    t_end = t_mid + seconds / 2
    while time.monotonic() < t_end:
        times.append(batch_us(fn))
    clock = sampler.window(t_mid, t_end) if sampler else {}
    return {"us": statistics.median(times[len(times) // 2:]), "mhz": clock.get("sm_mhz", float("nan")),
            "w": clock.get("power_w", float("nan")), "samples": clock.get("clock_samples", 0),
            "reasons": sampler.reasons_in(t_mid, t_end) if sampler else []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="128,1,128,4096", help="B,Q_LEN,H,KV_LEN")
    ap.add_argument("--label", default="shipped")
    ap.add_argument("--seconds", type=float, default=0.0, help="sustained runs of this many seconds per layout")
    ap.add_argument("--matmul", action="store_true", help="with --seconds: the 8192^3 bf16 matmul too")
    args = ap.parse_args()
    if args.matmul and args.seconds <= 0:
        ap.error("--matmul needs --seconds S > 0 (the matmul runs only sustained)")
    b, q_len, h, kv = (int(x) for x in args.shape.split(","))
    data = uniform_call(b, q_len, h, kv)  # page 64
    l2 = torch.arange(data.table.numel(), device="cuda", dtype=torch.int32).remainder(_L2_PAGES)
    tables = {"dram": data.table, "l2": l2.view_as(data.table)}
    out = torch.empty(b, q_len, h, 512, device="cuda", dtype=torch.bfloat16)
    flops = b * q_len * h * kv * FLOP_PER_KEY_ROW
    pairs = pairs_per_cta(b, q_len, h, kv, torch.cuda.get_device_properties(0).multi_processor_count)
    mhz = sm_clock_mhz()
    sampler = SmiSampler.start(None, reasons=True) if args.seconds > 0 else None
    for name, table in tables.items():
        if args.seconds > 0:
            r = sustained(lambda table=table: data.run(table, out=out), args.seconds, sampler)
            print(f"{args.label:12s} {name:5s} B{b} q{q_len} H{h} kv{kv}: {energy_line(r, flops)}, "
                  f"{r['us'] * r['mhz'] / pairs:7.0f} cycles/pair", flush=True)
            continue
        us = time_calls(lambda table=table: data.run(table, out=out))
        cyc = us * mhz / pairs
        print(f"{args.label:12s} {name:5s} B{b} q{q_len} H{h} kv{kv}: {us:8.1f} µs, "
              f"{cyc:7.0f} cycles/pair at {mhz:.0f} MHz ({pairs:.1f} pairs per CTA)", flush=True)
    if args.matmul:
        # N(0, 1) data: zeros would draw less power and flatter the clock.
        a, w = (torch.randn(_MATMUL_N, _MATMUL_N, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        c = torch.empty_like(a)
        r = sustained(lambda: torch.mm(a, w, out=c), args.seconds, sampler)
        print(f"{'matmul':12s} bf16 {_MATMUL_N}^3: {energy_line(r, 2 * _MATMUL_N**3)}", flush=True)
    if sampler:
        sampler.close()


if __name__ == "__main__":
    main()

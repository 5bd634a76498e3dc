"""Where one call's time goes, CTA by CTA: the trace probes' phase marks and wait cycles (issue 4).

    sed -i 's/define JIT_MLA_PROBE 0/define JIT_MLA_PROBE 24/' csrc/common/probe.h
    python -m jit_mla build --cubins
    python benchmarks/trace_phases.py --shape 8,1,128,4096 [--json out.json]
    git checkout csrc/common/probe.h && python -m jit_mla build --cubins   # restore

Bits 4 and 5 together (e.g. 56) do not fit: their static shared memory pushes the seesaw kernel
over the 227 KiB limit and the launcher's shared-memory attribute call fails; use 24 or 40.

With bit 3 (8) of JIT_MLA_PROBE set, thread 0 of every CTA records its %globaltimer marks (ns)
at the end of the kernel into global memory (csrc/common/probe.h), printed after the call by the
cubin's mla_probe_dump (the launcher's probe_dump; the attention kernels never printf, which made
ptxas serialize their wgmmas, C7510, up to session 7): entry, past the PDL wait, planned, attention done,
past the grid barrier (0 when nothing was split; since 1ad80d7 the barrier wait includes the
merge's first unit lookup, done between the barrier's arrival and its wait), merge done; with its
planned range, so that the attention times are also printed by the ranges' piece counts. With bit 4 (16), thread 0 of each
seesaw warpgroup prints the cycles it spent waiting for QK^T's KV boxes, for V boxes, for the
other warpgroup's hand-offs and for its own wgmma, and in its units' prologues, pair loops and
epilogues, with the pair count. This script runs the call once to warm up, then once traced,
captures the device printf output (it goes to file descriptor 1) and prints per phase the median
and the largest duration over the CTAs, the spreads of the CTAs' starts and attention ends (the
barrier waits for the last one), and per warpgroup the wait cycles per block pair. With bit 5
(32), thread 0 of each warpgroup of CTA 0 records a clock() timeline of a few block pairs
(TimelineEvent in probe.h), printed here as one merged list: cycles since the first mark, which
warpgroup, which event. With bit 6 (64; with bit 3: 72), lane 0 of warp 0 of CTA 0 records a clock()
mark at each step of its merge (MergeEvent: unit lookup, request search, slot scan, weights,
each round of partial loads, store; the first unit's lookup comes before "synced"), printed in
order with the gaps.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import statistics
import tempfile
from typing import Callable

import torch

from profile_one import uniform_call  # benchmarks/ is on sys.path: this script's folder

_LINE = re.compile(r"jit_mla-trace cta=(\d+) sm=(\d+) t=(\d+),(\d+),(\d+),(\d+),(\d+),(\d+)"
                   r"(?: r=(\d+),(\d+),(\d+),(\d+))?")
_WAITS = re.compile(r"jit_mla-waits cta=(\d+) wg=(\d+) c=((?:\d+,){7}\d+)")
_TL = re.compile(r"jit_mla-tl wg=(\d+) i=(\d+) ev=(\d+) t=(\d+)")
_MTL = re.compile(r"jit_mla-mtl i=(\d+) ev=(\d+) t=(\d+)")
# MergeEvent (csrc/common/probe.h), in its order.
MERGE_EVENTS = ("synced", "unit lookup", "request found", "slots scanned", "weights done", "load round done",
                "stored")
# TimelineEvent (csrc/common/probe.h), in its order.
TL_EVENTS = ("pair start", "max published", "exps done", "own PV issued", "own PV done", "scale in",
             "P0' stored", "V landed", "other P in", "other PV issued", "QK 0-3 issued",
             "other PV done", "QK issued", "QK done", "V_L refill issued",
             # the narrow kernels, per warpgroup block
             "N block start", "N QK done", "N max shared", "N P shared", "N PV issued", "N PV done",
             # the narrow kernels' unit change
             "N epilogue", "N unit done", "N unit found", "N first TMA issued", "N Q landed")
SITES = ("qk box", "v box", "hand-off", "wgmma", "loop", "prologue", "epilogue", "pairs")
_MARK = b"--jit_mla-trace-call--\n"
MARKS = ("entry", "ready", "planned", "attended", "synced", "done")


def parse(text: str) -> list[dict]:
    """One record per CTA line: cta, sm, the six marks (ns; synced 0 when there was no barrier)
    and, where the line has it, the CTA's planned range ("range": begin group, block, end group,
    block; [begin, end))."""
    rows = []
    for m in _LINE.finditer(text):
        t = [int(x) for x in m.groups()[2:8]]
        row = {"cta": int(m.group(1)), "sm": int(m.group(2)), **dict(zip(MARKS, t))}
        if m.group(9) is not None:
            row["range"] = tuple(int(x) for x in m.groups()[8:12])
        rows.append(row)
    return rows


def pieces(rng: tuple[int, int, int, int]) -> int:
    """Pieces of a planned range [(g0, b0), (g1, b1)): the groups it holds a part of (each its own
    unit start, end and, when split, partial store)."""
    g0, b0, g1, b1 = rng
    if (g0, b0) == (g1, b1):
        return 0
    return g1 - g0 + (1 if b1 > 0 else 0)


def attention_by_pieces(rows: list[dict]) -> dict[int, dict]:
    """Attention phase (µs) of the CTAs grouped by their ranges' piece counts: how many, median,
    max. Whether the CTAs that finish late are the ones with more pieces (the plan's cost model
    charges a group's overhead once, a piece pays it again) or any (bandwidth, placement)."""
    by: dict[int, list[float]] = {}
    for r in rows:
        if "range" in r:
            by.setdefault(pieces(r["range"]), []).append((r["attended"] - r["planned"]) / 1e3)
    return {k: {"ctas": len(v), "median": statistics.median(v), "max": max(v)} for k, v in sorted(by.items())}


def parse_waits(text: str) -> list[dict]:
    """One record per warpgroup line of the wait probe: cta, wg and the eight sums of SITES."""
    rows = []
    for m in _WAITS.finditer(text):
        c = [int(x) for x in m.group(3).split(",")]
        rows.append({"cta": int(m.group(1)), "wg": int(m.group(2)), **dict(zip(SITES, c))})
    return rows


def clock_diff(t: int, t0: int) -> int:
    """t - t0 for the probes' 24-bit clock() values (signed, taken mod 2^24)."""
    return ((t - t0 + (1 << 23)) % (1 << 24)) - (1 << 23)


def parse_timeline(text: str) -> list[dict]:
    """The timeline probe's marks, both warpgroups merged in time order: wg, event name, t (cycles
    since the first mark; the probe keeps 24 bits of clock(), so differences are taken mod 2^24)."""
    raw = [(int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4))) for m in _TL.finditer(text)]
    if not raw:
        return []
    t0 = min(raw, key=lambda r: (r[0], r[1]))[3]  # wg0's first mark
    rows = [{"wg": wg, "event": TL_EVENTS[ev] if ev < len(TL_EVENTS) else str(ev),
             "t": clock_diff(t, t0)} for wg, _, ev, t in raw]
    return sorted(rows, key=lambda r: (r["t"], r["wg"]))


def parse_merge_timeline(text: str) -> list[dict]:
    """The merge timeline probe's marks (lane 0 of warp 0 of CTA 0), in order: event name, t
    (cycles since the first mark, 24-bit clock differences) and the gap to the previous mark."""
    raw = sorted((int(m.group(1)), int(m.group(2)), int(m.group(3))) for m in _MTL.finditer(text))
    rows, prev = [], None
    for _, ev, t in raw:
        rel = clock_diff(t, raw[0][2])
        rows.append({"event": MERGE_EVENTS[ev] if ev < len(MERGE_EVENTS) else str(ev), "t": rel,
                     "gap": 0 if prev is None else rel - prev})
        prev = rel
    return rows


def format_timeline(rows: list[dict]) -> list[str]:
    """One line per mark: cycles, the gap to the previous mark, the event in its warpgroup's column."""
    lines, prev = [], None
    for r in rows:
        gap = "" if prev is None else f"+{r['t'] - prev}"
        cols = [f"{r['event']:16s}", ""] if r["wg"] == 0 else ["", r["event"]]
        lines.append(f"  {r['t']:8d} {gap:>7s}  {cols[0]:16s}  {cols[1]}")
        prev = r["t"]
    return lines


def summarize_waits(rows: list[dict]) -> dict:
    """Per warpgroup, over the CTAs that ran block pairs: cycles per pair of each site (sums over
    those CTAs divided by their pairs) and each site's share of the pair-loop cycles."""
    out = {}
    for wg in sorted({r["wg"] for r in rows}):
        mine = [r for r in rows if r["wg"] == wg and r["pairs"] > 0]
        pairs = sum(r["pairs"] for r in mine)
        loop = sum(r["loop"] for r in mine)
        if not pairs:
            continue
        out[f"wg{wg}"] = {
            "ctas": len(mine),
            "pairs": pairs,
            **{site: {"per_pair": sum(r[site] for r in mine) / pairs,
                      "of_loop": sum(r[site] for r in mine) / loop if loop else 0.0}
               for site in SITES[:-1]},
        }
    return out


def rank_value(values: list[float], q: float) -> float:
    """The value at rank q (0..1) of the sorted values, nearest rank below (q = 1: the largest)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(rows: list[dict]) -> dict:
    """Phase durations (µs) over the CTAs: median and max; spreads of start and attention end;
    when the CTAs were planned (median) and when the ones with work ended their attention (10th,
    50th, 90th percentile and last; µs from the first entry): how much of a call is its tail."""
    if not rows:
        raise ValueError("no trace lines: was the cubin built with JIT_MLA_PROBE bit 3 (8) set?")
    t0 = min(r["entry"] for r in rows)
    us = lambda ns: ns / 1e3  # noqa: E731
    split = all(r["synced"] for r in rows)
    phases = {
        "pdl wait": [r["ready"] - r["entry"] for r in rows],
        "plan": [r["planned"] - r["ready"] for r in rows],
        "attention": [r["attended"] - r["planned"] for r in rows],
        "barrier wait": [r["synced"] - r["attended"] for r in rows] if split else [0] * len(rows),
        "merge": [r["done"] - r["synced"] for r in rows] if split else [0] * len(rows),
    }
    out = {
        "ctas": len(rows),
        "split": split,
        "start spread": us(max(r["entry"] for r in rows) - t0),
        "attention end spread": us(max(r["attended"] for r in rows) - min(r["attended"] for r in rows)),
        "first entry to last done": us(max(r["done"] for r in rows) - t0),
        "slowest attention cta": max(rows, key=lambda r: r["attended"] - r["planned"])["cta"],
        "planned at": us(statistics.median(r["planned"] - t0 for r in rows)),
    }
    # CTAs with work: a non-empty planned range (probe builds since session 17), else all
    working = [r for r in rows if "range" not in r or pieces(r["range"]) > 0] or rows
    ends = [us(r["attended"] - t0) for r in working]
    out["attention ends"] = {"ctas": len(working), **{k: rank_value(ends, q) for k, q in
                                                      (("p10", 0.1), ("p50", 0.5), ("p90", 0.9), ("max", 1.0))}}
    for name, d in phases.items():
        out[name] = {"median": us(statistics.median(d)), "max": us(max(d))}
    return out


def traced_output(call: Callable[[], None]) -> str:
    """Runs call() twice with fd 1 redirected to a file, then the launcher's probe_dump (the
    kernels record into global memory; mla_probe_dump prints the last launch's records); returns
    what was printed after the second run."""
    from jit_mla.launcher import get_launcher

    libc = ctypes.CDLL(None)
    torch.cuda.synchronize()
    libc.fflush(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            # Device printf reaches the C stdout buffer at synchronization; fflush moves it to fd 1.
            call()
            torch.cuda.synchronize()
            libc.fflush(None)
            os.write(1, _MARK)
            call()
            torch.cuda.synchronize()
            get_launcher().probe_dump()
            libc.fflush(None)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read()
    return text.split(_MARK)[-1].decode(errors="replace")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8,1,128,4096", help="B,Q_LEN,H,KV_LEN")
    ap.add_argument("--json", default=None, help="also write the records and the summary here")
    ap.add_argument("--fp8", action="store_true", help="a float8_e4m3fn KV cache (the fp8 kernels)")
    ap.add_argument("--fp8-query", action="store_true", help="the query in float8_e4m3fn too (implies --fp8)")
    args = ap.parse_args()
    b, q_len, h, kv = (int(x) for x in args.shape.split(","))
    data = uniform_call(b, q_len, h, kv, fp8=args.fp8 or args.fp8_query, fp8_query=args.fp8_query)
    text = traced_output(data.run)
    rows, waits, timeline = parse(text), parse_waits(text), parse_timeline(text)
    merge_tl = parse_merge_timeline(text)
    if not rows:  # the wait or a timeline probe alone (bit 4, 5 or 6 without bit 3)
        summary = {"ctas": 0, "split": None}
    else:
        summary = summarize(rows)
    print(f"B{b} q{q_len} H{h} kv{kv}: {summary['ctas']} CTAs, split: {summary['split']}")
    if rows:
        for key in ("start spread", "attention end spread", "first entry to last done"):
            print(f"  {key:26s} {summary[key]:8.2f} µs")
        for key in ("pdl wait", "plan", "attention", "barrier wait", "merge"):
            print(f"  {key:26s} median {summary[key]['median']:8.2f} µs, max {summary[key]['max']:8.2f} µs")
        print(f"  slowest attention CTA: {summary['slowest attention cta']}")
        e = summary["attention ends"]
        print(f"  planned at {summary['planned at']:.2f} µs (median); attention ends of the {e['ctas']} CTAs with"
              f" work at 10 / 50 / 90 / 100%: {e['p10']:.1f} / {e['p50']:.1f} / {e['p90']:.1f} / {e['max']:.1f} µs")
        for k, v in attention_by_pieces(rows).items():
            print(f"  attention of CTAs with {k} piece(s): {v['ctas']:4d} CTAs, median {v['median']:8.2f} µs,"
                  f" max {v['max']:8.2f} µs")
    wait_summary = summarize_waits(waits)
    for wg, w in wait_summary.items():
        print(f"  {wg} ({w['ctas']} CTAs, {w['pairs']} pairs), cycles per pair (share of the loop):")
        for site in SITES[:-1]:
            print(f"    {site:12s} {w[site]['per_pair']:9.0f}  ({100 * w[site]['of_loop']:5.1f}%)")
    if timeline:
        clock = re.search(r"jit_mla-clock cycles=(\d+) ns=(\d+)", text)
        mhz = f", SM clock {1e3 * int(clock.group(1)) / max(1, int(clock.group(2))):.0f} MHz" if clock else ""
        print(f"  timeline of CTA 0 (clock cycles{mhz}; {'wg0':16s}  wg1):")
        print("\n".join(format_timeline(timeline)))
    if merge_tl:
        print("  merge timeline of warp 0 of CTA 0 (clock cycles, gap to the previous mark):")
        for r in merge_tl:
            print(f"  {r['t']:8d} {'+' + str(r['gap']):>7s}  {r['event']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": [b, q_len, h, kv], "summary": summary, "ctas": rows,
                       "waits": wait_summary, "wait_lines": waits, "timeline": timeline,
                       "merge_timeline": merge_tl}, f, indent=1)


if __name__ == "__main__":
    main()

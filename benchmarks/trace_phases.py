"""Where one call's time goes, CTA by CTA: the trace probe's phase marks (issue 4).

    sed -i 's/define JIT_MLA_PROBE 0/define JIT_MLA_PROBE 8/' csrc/common/probe.h
    python -m jit_mla build --cubins
    python benchmarks/trace_phases.py --shape 8,1,128,4096 [--json out.json]
    git checkout csrc/common/probe.h && python -m jit_mla build --cubins   # restore

With bit 3 of JIT_MLA_PROBE set, thread 0 of every CTA prints its %globaltimer marks (ns) at the
end of the kernel (csrc/common/probe.h): entry, past the PDL wait, planned, attention done, past
the grid barrier (0 when nothing was split), merge done. This script runs the call once to warm
up, then once traced, captures the device printf output (it goes to file descriptor 1) and
prints per phase the median and the largest duration over the CTAs, plus the spread of the CTAs'
starts and of their attention ends (the barrier waits for the last one).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
from typing import Callable

import torch

from profile_one import uniform_call  # benchmarks/ is on sys.path: this script's folder

_LINE = re.compile(r"jit_mla-trace cta=(\d+) sm=(\d+) t=(\d+),(\d+),(\d+),(\d+),(\d+),(\d+)")
_MARK = b"--jit_mla-trace-call--\n"
MARKS = ("entry", "ready", "planned", "attended", "synced", "done")


def parse(text: str) -> list[dict]:
    """One record per CTA line: cta, sm, and the six marks (ns; synced 0 when there was no barrier)."""
    rows = []
    for m in _LINE.finditer(text):
        t = [int(x) for x in m.groups()[2:]]
        rows.append({"cta": int(m.group(1)), "sm": int(m.group(2)), **dict(zip(MARKS, t))})
    return rows


def summarize(rows: list[dict]) -> dict:
    """Phase durations (µs) over the CTAs: median and max; spreads of start and attention end."""
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
    }
    for name, d in phases.items():
        out[name] = {"median": us(statistics.median(d)), "max": us(max(d))}
    return out


def traced_output(call: Callable[[], None]) -> str:
    """Runs call() twice with fd 1 redirected to a file; returns what the second run printed."""
    torch.cuda.synchronize()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            call()
            torch.cuda.synchronize()  # the device printf buffer is flushed at synchronization
            os.write(1, _MARK)
            call()
            torch.cuda.synchronize()
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
    args = ap.parse_args()
    b, q_len, h, kv = (int(x) for x in args.shape.split(","))
    data = uniform_call(b, q_len, h, kv)
    rows = parse(traced_output(data.run))
    summary = summarize(rows)
    print(f"B{b} q{q_len} H{h} kv{kv}: {summary['ctas']} CTAs, split: {summary['split']}")
    for key in ("start spread", "attention end spread", "first entry to last done"):
        print(f"  {key:26s} {summary[key]:8.2f} µs")
    for key in ("pdl wait", "plan", "attention", "barrier wait", "merge"):
        print(f"  {key:26s} median {summary[key]['median']:8.2f} µs, max {summary[key]['max']:8.2f} µs")
    print(f"  slowest attention CTA: {summary['slowest attention cta']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": [b, q_len, h, kv], "summary": summary, "ctas": rows}, f, indent=1)


if __name__ == "__main__":
    main()

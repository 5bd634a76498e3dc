#!/usr/bin/env python3
"""MLA attention benchmark: jit_mla beside FlashMLA's and FlashInfer's Hopper MLA, against this card's ceilings.

One run measures, on the same GPU and in this order:

1. the card's ceilings: device-to-device copy bandwidth (``Tensor.copy_`` of a 4 GiB bf16 buffer,
   bytes read + written), read-only streaming bandwidth (``Tensor.sum`` over 8 GiB of bf16, bytes
   read) and the bf16 matmul rate (8192^3, N(0, 1) data, not zeros);
2. the host overhead of one eager call of our Python wrapper + TVM-FFI launch (and of the
   launcher call alone, and of FlashInfer's ``run()``), on a one-page shape;
3. every shape of the table below, ours, FlashMLA's sm90 dense decode (``flashmla_side.py``: its
   own kernels built from source by ``flashmla/build.sh``; bf16 cache and one q_len per batch)
   and FlashInfer's ``BatchMLAPagedAttentionWrapper(..., backend="fa3")`` on the same data, each
   timed with CUDA graphs. A column whose library is missing reads n/a.

Timing. For each shape the KV pool holds ``n_sets`` disjoint page sets (slabs), each with its own
query and output, so one graph replay streams at least 512 MiB of KV (more than L2 can flatter).
The N calls are captured into one graph; a replay runs them back to back; the per-call time is
the median replay time / N. Inside a slab the pages of a request are scattered (a seeded
permutation), and every slab uses the same page-table *structure*, so FlashInfer needs one plan
per shape: its plan depends on lengths only, and each call passes its own slab as the cache.
Only chunked prefill, whose query and output alone are over 512 MiB per call, runs one set.

Formulas (bf16, ``D_qk = 576``, ``D_v = 512``; an fp8 KV row is 576 bytes):

    bytes    = sum_b seq_len_b * 576 * 2       (KV read once; * 1 for an fp8 cache)
             + total_q * H * 576 * 2           (q; * 1 for an e4m3 query)
             + total_q * H * 512 * 2           (out)
    FLOPs    = sum_b q_len_b * H * seq_len_b * 2 * (576 + 512)
    roofline = max(bytes / copy_bandwidth, FLOPs / matmul_rate)   (the bf16 rate, e4m3 rows too)
    % of roofline = roofline / measured time

FLOPs count every query token against the whole sequence, as the project's roofline does; with a
causal mask, chunked prefill's visible work is about 12% smaller (``flops_visible`` in the JSON).

FlashInfer semantics checked in its 0.7.2.post1 sources: the fa3 kernel masks ``kv_idx + qo_len >
kv_len + q_idx`` (mla_hopper.cuh), i.e. bottom-right causal, the same as ours, so multi-token
shapes are planned with ``causal=True``. Its plan needs host-side lengths and runs outside the
graph; a shape its planner refuses is shown as n/a with the reason. FlashMLA's schedule
(get_decoding_sched_meta) likewise runs once per shape outside the graph, as in its own benchmark;
its causal mask for q_len > 1 is the same bottom-right one.

Usage:
    python benchmarks/bench_mla.py                    # everything; JSON + PNG in benchmarks/results
    python benchmarks/bench_mla.py --quick --shapes 0,spec_*
    python benchmarks/bench_mla.py --dry-run          # shape table with bytes and FLOPs, no GPU
    python benchmarks/bench_mla.py --replot RESULT.json   # PNG and table again from a JSON
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import math
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]

# ---- model dimensions (DeepSeek-V3/R1, Kimi-K2: one latent head, a row = [ckv 512 | kpe 64]) ----
KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
QK_NOPE_HEAD_DIM = 128  # pre-absorption: only the softmax scale depends on it
D_QK = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576: K is the whole cache row
D_V = KV_LORA_RANK  # 512: V is its first 512 columns
PAGE_SIZE = 64
ELEM_BYTES = 2  # bf16
FLOP_PER_KEY_ROW = 2 * (D_QK + D_V)  # QK^T + PV for one KV token and one (token, head) row: 2176
SM_SCALE = 1.0 / math.sqrt(QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM)  # 1/sqrt(192), not 1/sqrt(576)

MIB = 2**20
GIB = 2**30
MIN_BYTES_PER_REPLAY = 512 * MIB  # KV streamed per graph replay: well past the 50 MB L2
SPEC_SEED = 0  # the ragged spec-decode draft lengths
MIXED_SEED = 1  # the mixed-length decode rows' KV lengths
DATA_SEED = 1234
FLASHINFER_WORKSPACE_BYTES = 256 * MIB
# H200 figures from the kernel notes; used only by --dry-run and --assume-ceilings.
NOMINAL_CEILINGS = {"copy_tbps": 4.3, "read_tbps": 4.4, "matmul_tflops": 740.0}


# =================================================================================================
# Shapes and formulas (no torch needed: --dry-run and the CPU test use only this part)
# =================================================================================================


def host_median_us(fn: Callable[[], object], sync: Callable[[], object], samples: int, burst: int = 100) -> float:
    """Median host time of one call of ``fn`` in µs, over ``samples`` calls.

    Bursts of ``burst`` calls, then ``sync``: the launch queue never fills, so a call's host time
    is its wrapper + FFI + launch cost, never a wait for the GPU. ``burst=1`` syncs before every
    call: the GPU is idle, the queue empty (a one-page call takes about as long on the GPU as on
    the host, so in bursts of 100 the queue grows).
    """
    times = []
    while len(times) < samples:
        for _ in range(burst):
            t = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - t)
        sync()
    return statistics.median(times) / 1e3


@dataclass(frozen=True)
class Shape:
    """One benchmark case: per-request query and KV lengths, and the head count."""

    name: str
    num_heads: int
    q_lens: tuple[int, ...]  # query tokens per request
    kv_lens: tuple[int, ...]  # seq_lens per request (this step's query tokens included)
    ragged: bool = False  # query as [total_q, H, 576] + cum_seq_lens_q (else [B, q_len, H, 576])
    role: str = ""
    kv_fp8: bool = False  # KV cache in float8_e4m3fn (1 byte per element), query and out bf16
    q_fp8: bool = False  # the query in float8_e4m3fn too (needs kv_fp8; the _fp8q kernels)

    @property
    def batch(self) -> int:
        return len(self.kv_lens)

    @property
    def total_q(self) -> int:
        return sum(self.q_lens)

    @property
    def max_q_len(self) -> int:
        return max(self.q_lens)

    @property
    def max_kv_len(self) -> int:
        return max(self.kv_lens)

    @property
    def causal(self) -> bool:
        """FlashInfer's plan flag: ours is always bottom-right causal, a no-op at q_len 1."""
        return self.max_q_len > 1

    @property
    def kv_elem_bytes(self) -> int:
        return 1 if self.kv_fp8 else ELEM_BYTES

    @property
    def kv_bytes(self) -> int:
        return sum(self.kv_lens) * D_QK * self.kv_elem_bytes

    @property
    def q_bytes(self) -> int:
        return self.total_q * self.num_heads * D_QK * (1 if self.q_fp8 else ELEM_BYTES)

    @property
    def out_bytes(self) -> int:
        return self.total_q * self.num_heads * D_V * ELEM_BYTES

    @property
    def bytes(self) -> int:
        return self.kv_bytes + self.q_bytes + self.out_bytes

    @property
    def flops(self) -> int:
        return sum(q * self.num_heads * kv * FLOP_PER_KEY_ROW for q, kv in zip(self.q_lens, self.kv_lens))

    @property
    def flops_visible(self) -> int:
        """FLOPs over the keys the causal mask lets through: token t of n sees L - n + t + 1 keys."""
        total = 0
        for n, kv in zip(self.q_lens, self.kv_lens):
            keys = sum(max(0, min(kv, kv - n + t + 1)) for t in range(n))
            total += keys * self.num_heads * FLOP_PER_KEY_ROW
        return total

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def pages_per_set(self) -> int:
        return sum(-(-kv // PAGE_SIZE) for kv in self.kv_lens)

    @property
    def kv_bytes_per_set(self) -> int:
        """KV bytes of one page set in whole pages (what the pool holds for one call)."""
        return self.pages_per_set * PAGE_SIZE * D_QK * self.kv_elem_bytes

    @property
    def n_sets(self) -> int:
        """Calls per graph replay, each on its own page set, so a replay streams >= 512 MiB of KV.

        A call whose query and output alone pass 512 MiB (chunked prefill) runs one set: its
        KV (38 MB) is re-read from L2 by every query tile anyway, as in a real prefill.
        """
        if self.q_bytes + self.out_bytes >= MIN_BYTES_PER_REPLAY:
            return 1
        return max(1, -(-MIN_BYTES_PER_REPLAY // self.kv_bytes_per_set))

    @property
    def kv_label(self) -> str:
        """The requests' seq_len, or min..max (mean) when they differ."""
        if len(set(self.kv_lens)) == 1:
            return str(self.kv_lens[0])
        return f"{min(self.kv_lens)}..{self.max_kv_len} (mean {sum(self.kv_lens) / self.batch:.0f})"

    def describe(self) -> str:
        q = f"q={self.q_lens[0]}" if len(set(self.q_lens)) == 1 else f"q={min(self.q_lens)}..{self.max_q_len}"
        return f"B={self.batch} {q} (total {self.total_q}) kv={self.kv_label} H={self.num_heads}"


def dtype_suffix(kv_fp8: bool, q_fp8: bool) -> str:
    """A row name's dtype tag: none (bf16), _fp8 (e4m3 cache), _fp8q (e4m3 query and cache)."""
    return "_fp8q" if q_fp8 else "_fp8" if kv_fp8 else ""


def typed_shape(name: str, num_heads: int, q_lens: tuple, kv_lens: tuple, role: str, kv_fp8: bool = False,
                q_fp8: bool = False, ragged: bool = False) -> Shape:
    """A row in one of the three dtypes: its name tagged (dtype_suffix); an e4m3 query implies an fp8 cache."""
    return Shape(name + dtype_suffix(kv_fp8, q_fp8), num_heads, q_lens, kv_lens, ragged=ragged, role=role,
                 kv_fp8=kv_fp8 or q_fp8, q_fp8=q_fp8)


def uniform_shape(batch: int, kv_len: int, num_heads: int, q_len: int, role: str = "", kv_fp8: bool = False,
                  q_fp8: bool = False) -> Shape:
    return typed_shape(f"b{batch}_kv{kv_len}_h{num_heads}_q{q_len}", num_heads, (q_len,) * batch, (kv_len,) * batch,
                       role, kv_fp8, q_fp8)


def shape_table() -> list[Shape]:
    """The fixed table: DeepSeek-V3 at TP1 (H 128) and TP8 (H 16), MTP, spec decode, prefill."""
    rng = random.Random(SPEC_SEED)
    spec_q = tuple(rng.randint(1, 4) for _ in range(64))

    def spec(role: str, **dt: bool) -> Shape:  # ragged spec decode rows
        return typed_shape("spec_b64_q1to4_kv4096_h128", 128, spec_q, (4096,) * 64, role, ragged=True, **dt)

    # A serving batch's requests differ in length: every row above has equal ones, which the
    # planner splits in equal pieces (no CTA ends one request and starts another); these run the
    # general cuts. Uniform in [lo, hi], seeded.
    mixed = random.Random(MIXED_SEED)
    mixed_h16 = tuple(mixed.randint(1024, 16384) for _ in range(64))
    mixed_h128 = tuple(mixed.randint(512, 8192) for _ in range(128))

    def prefill(role: str, **dt: bool) -> Shape:
        return typed_shape("prefill_4x2048_kv8192_h128", 128, (2048,) * 4, (8192,) * 4, role, ragged=True, **dt)

    def mixed_rows(tag: str, **dt: bool) -> list[Shape]:
        return [typed_shape("mixed_b64_kv1k_16k_h16", 16, (1,) * 64, mixed_h16, "TP8 decode, mixed lengths" + tag,
                            **dt),
                typed_shape("mixed_b128_kv512_8k_h128", 128, (1,) * 128, mixed_h128, "TP1 decode, mixed lengths" + tag,
                            **dt)]

    # Issue 5's "fp8 rows for its shapes": the bf16 rows above that the first fp8 rows (14-26)
    # left out, appended so that every index above stays as the notes cite it.
    def fp8_rest(tag: str, **dt: bool) -> list[Shape]:
        return [
            uniform_shape(128, 4096, 128, 2, "TP1 MTP 2" + tag, **dt),
            uniform_shape(128, 8192, 128, 1, "TP1 decode, long" + tag, **dt),
            uniform_shape(32, 32768, 128, 1, "TP1 decode, 32k" + tag, **dt),
            uniform_shape(32, 4096, 128, 1, "TP1 small batch" + tag, **dt),
            *([uniform_shape(1, 8192, 16, 1, "TP8 one request" + tag, **dt)] if dt.get("q_fp8") else []),
            uniform_shape(1, 65536, 128, 1, "TP1 one 64k request" + tag, **dt),
            uniform_shape(81, 4096, 128, 2, "uniform twin of the ragged row" + tag, **dt),
            prefill("chunked prefill" + tag, **dt),
            *mixed_rows(tag, **dt),
        ]

    return [
        uniform_shape(128, 4096, 128, 1, "TP1 decode"),
        uniform_shape(128, 4096, 128, 2, "TP1 MTP 2"),
        uniform_shape(128, 8192, 128, 1, "TP1 decode, long"),
        uniform_shape(32, 32768, 128, 1, "TP1 decode, 32k"),
        uniform_shape(64, 8192, 16, 1, "TP8 decode"),
        uniform_shape(128, 4096, 16, 2, "TP8 MTP 2"),
        uniform_shape(64, 8192, 16, 4, "TP8 MTP 4"),
        uniform_shape(32, 4096, 128, 1, "TP1 small batch"),
        uniform_shape(8, 4096, 128, 1, "TP1 batch 8"),
        uniform_shape(1, 8192, 16, 1, "TP8 one request"),
        uniform_shape(1, 65536, 128, 1, "TP1 one 64k request"),
        spec("ragged spec decode (q_len 1..4, seeded)"),
        # Issue 4's "ragged within 10% of the uniform shape with the same number of tokens": the
        # seeded draft lengths above sum to 162 = 81 requests x 2 tokens (asserted in the tests).
        uniform_shape(81, 4096, 128, 2, "uniform twin of the ragged row (162 tokens)"),
        prefill("chunked prefill"),
        # fp8 e4m3 KV cache, bf16 query (issue 5)
        uniform_shape(64, 8192, 16, 1, "TP8 decode, fp8 KV", kv_fp8=True),
        uniform_shape(128, 4096, 16, 2, "TP8 MTP 2, fp8 KV", kv_fp8=True),
        uniform_shape(1, 8192, 16, 1, "TP8 one request, fp8 KV", kv_fp8=True),
        uniform_shape(64, 8192, 16, 4, "TP8 MTP 4, fp8 KV", kv_fp8=True),
        uniform_shape(128, 4096, 128, 1, "TP1 decode, fp8 KV", kv_fp8=True),
        uniform_shape(8, 4096, 128, 1, "TP1 batch 8, fp8 KV", kv_fp8=True),
        spec("ragged spec decode, fp8 KV", kv_fp8=True),
        # e4m3 query and KV cache (issue 5, mode 2; FlashInfer's fa3 takes no e4m3 query)
        uniform_shape(64, 8192, 16, 1, "TP8 decode, fp8 q + KV", q_fp8=True),
        uniform_shape(128, 4096, 16, 2, "TP8 MTP 2, fp8 q + KV", q_fp8=True),
        uniform_shape(128, 4096, 128, 1, "TP1 decode, fp8 q + KV", q_fp8=True),
        uniform_shape(64, 8192, 16, 4, "TP8 MTP 4, fp8 q + KV", q_fp8=True),
        uniform_shape(8, 4096, 128, 1, "TP1 batch 8, fp8 q + KV", q_fp8=True),
        spec("ragged spec decode, fp8 q + KV", q_fp8=True),
        # mixed KV lengths (appended: the indices above stay as the notes cite them)
        *mixed_rows(""),
        # the other shapes with an fp8 cache (29-37), then with an e4m3 query too (38-47)
        *fp8_rest(", fp8 KV", kv_fp8=True),
        *fp8_rest(", fp8 q + KV", q_fp8=True),
        # Short contexts at small batch (48-51): calls with little work, where the planner's
        # least work per CTA set decides how many SMs run (perf-notes, Session 37).
        uniform_shape(1, 4096, 128, 1, "TP1 one short request"),
        uniform_shape(4, 2048, 128, 1, "TP1 batch 4, short"),
        uniform_shape(2, 4096, 16, 1, "TP8 batch 2, short"),
        uniform_shape(4, 4096, 16, 1, "TP8 batch 4, short"),
        # TP8 MTP 2 below B128 (52-54): 32 query rows per request, where the 64-row seesaw
        # replaced the 32-row narrow kernel (1-9% faster; perf-notes, Session 44).
        uniform_shape(1, 8192, 16, 2, "TP8 MTP 2, one request"),
        uniform_shape(8, 4096, 16, 2, "TP8 MTP 2, batch 8"),
        uniform_shape(32, 8192, 16, 2, "TP8 MTP 2, batch 32"),
    ]


def select_shapes(shapes: Sequence[Shape], spec: Optional[str]) -> list[Shape]:
    """``--shapes``: comma-separated indices, names or glob patterns; None = all, in table order."""
    if not spec:
        return list(shapes)
    picked: set[int] = set()
    for token in (t.strip() for t in spec.split(",")):
        if not token:
            continue
        if token.lstrip("-").isdigit():
            i = int(token)
            if not 0 <= i < len(shapes):
                raise ValueError(f"--shapes index {i} out of range 0..{len(shapes) - 1}")
            picked.add(i)
            continue
        hits = [i for i, s in enumerate(shapes) if fnmatch.fnmatchcase(s.name, token)]
        if not hits:
            names = ", ".join(s.name for s in shapes)
            raise ValueError(f"--shapes {token!r} matches no shape; shapes are: {names}")
        picked.update(hits)
    return [shapes[i] for i in sorted(picked)]


def roofline_seconds(nbytes: float, flops: float, copy_bytes_per_s: float, matmul_flops_per_s: float) -> float:
    return max(nbytes / copy_bytes_per_s, flops / matmul_flops_per_s)


def shape_row(index: int, shape: Shape) -> dict:
    """The JSON row of a shape before any timing: its sizes and formulas."""
    return {
        "index": index,
        "name": shape.name,
        "role": shape.role,
        "batch": shape.batch,
        "num_heads": shape.num_heads,
        "q_lens": sorted(set(shape.q_lens)) if len(set(shape.q_lens)) > 1 else shape.q_lens[0],
        "kv_len": shape.kv_lens[0] if len(set(shape.kv_lens)) == 1 else list(shape.kv_lens),
        "total_q": shape.total_q,
        "ragged": shape.ragged,
        "causal": shape.causal,
        "kv_bytes": shape.kv_bytes,
        "q_bytes": shape.q_bytes,
        "out_bytes": shape.out_bytes,
        "bytes": shape.bytes,
        "flops": shape.flops,
        "flops_visible": shape.flops_visible,
        "intensity_flop_per_byte": shape.intensity,
        "n_sets": shape.n_sets,
        "kv_bytes_per_replay": shape.n_sets * shape.kv_bytes_per_set,
    }


def add_roofline(row: dict, ceilings: dict) -> None:
    copy = ceilings["copy_tbps"] * 1e12
    mm = ceilings["matmul_tflops"] * 1e12
    row["roofline_us"] = roofline_seconds(row["bytes"], row["flops"], copy, mm) * 1e6
    row["bound"] = "memory" if row["bytes"] / copy >= row["flops"] / mm else "compute"
    # The memory term apart, and the sustained matmul's rate per GHz of SM clock (smi_sampler),
    # so that perf_fields can put the compute term at the clock a row ran at.
    row["roofline_memory_us"] = row["bytes"] / copy * 1e6
    per_ghz = (ceilings.get("matmul_sustained") or {}).get("tflops_per_ghz")
    if per_ghz:
        row["matmul_tflops_per_ghz"] = per_ghz


# Fewer nvidia-smi samples than this in a timed window (smi_sampler.PERIOD_MS apart) give no % at clock: a
# window that starts on an idle card reads its boost clock in the first samples (B128 kv4096
# H128, 3 samples: 1,980 MHz, 164 W, while the matmul beside it settles at 1,545 MHz, 632 W).
MIN_CLOCK_SAMPLES = 5


def perf_fields(row: dict, us: float, clock: Optional[dict] = None) -> dict:
    """TB/s, TFLOP/s and % of roofline for a per-call time in microseconds. With the SM clock the
    row ran at (clock: smi_sampler's window, >= MIN_CLOCK_SAMPLES samples) and the sustained
    matmul's rate per GHz in the row, also % of the roofline at that clock: the matmul rate at
    that clock, the copy bandwidth as it is (HBM has its own clock)."""
    s = us * 1e-6
    out = {"us": us, "tbps": row["bytes"] / s / 1e12, "tflops": row["flops"] / s / 1e12}
    if "roofline_us" in row:
        out["pct_roofline"] = 100.0 * row["roofline_us"] / us
    per_ghz = row.get("matmul_tflops_per_ghz")
    clock = clock or {}
    sm_mhz = clock.get("sm_mhz") if clock.get("clock_samples", 0) >= MIN_CLOCK_SAMPLES else None
    if sm_mhz and per_ghz and "roofline_memory_us" in row:
        at_clock = max(row["roofline_memory_us"], row["flops"] / (per_ghz * sm_mhz * 1e-3 * 1e12) * 1e6)
        out["roofline_at_clock_us"] = at_clock
        out["pct_roofline_at_clock"] = 100.0 * at_clock / us
    return out


def print_dry_run(shapes: Sequence[Shape], all_shapes: Sequence[Shape], ceilings: dict) -> None:
    print(f"# MLA benchmark shapes (page {PAGE_SIZE}, bf16, D_qk {D_QK}, D_v {D_V}); roofline at "
          f"assumed ceilings: copy {ceilings['copy_tbps']} TB/s, bf16 matmul {ceilings['matmul_tflops']} TFLOP/s")
    print("bytes = KV (sum seq_len*576*2) + q (total_q*H*576*2) + out (total_q*H*512*2); "
          "FLOPs = sum q_len*H*seq_len*2*(576+512)")
    print()
    head = ("| # | shape | B | H | total_q | kv | KV MB | q MB | out MB | bytes | FLOPs | FLOP/B | "
            "bound | roofline µs | sets | KV MB/replay |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for s in shapes:
        row = shape_row(all_shapes.index(s), s)
        add_roofline(row, ceilings)
        print(f"| {row['index']} | {s.name} | {s.batch} | {s.num_heads} | {s.total_q} | {s.kv_label} | "
              f"{s.kv_bytes / 1e6:.1f} | {s.q_bytes / 1e6:.2f} | {s.out_bytes / 1e6:.2f} | {s.bytes} | "
              f"{s.flops} | {s.intensity:.1f} | {row['bound']} | {row['roofline_us']:.1f} | {s.n_sets} | "
              f"{row['kv_bytes_per_replay'] / 1e6:.0f} |")


# =================================================================================================
# Reporting (from the JSON dict, so --replot needs no GPU)
# =================================================================================================


def _fmt(x: Optional[float], spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def markdown_table(result: dict) -> str:
    lines = [
        "| # | shape | bound | ours µs | TB/s | TFLOP/s | % roof | FlashMLA µs | FM % roof | FM/ours | "
        "FI µs | FI % roof | FI/ours | MHz ours / FM / FI | % roof at clock ours / FM / FI |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result.get("rows", []):
        ours = row.get("ours") or {}
        fm = row.get("flashmla") or {}
        fi = row.get("flashinfer") or {}
        lines.append(
            f"| {row['index']} | {row['name']} | {row.get('bound', '?')[:3]} | {_fmt(ours.get('us'), '.1f')} | "
            f"{_fmt(ours.get('tbps'), '.2f')} | {_fmt(ours.get('tflops'), '.0f')} | "
            f"{_fmt(ours.get('pct_roofline'), '.1f')} | {_fmt(fm.get('us'), '.1f')} | "
            f"{_fmt(fm.get('pct_roofline'), '.1f')} | {_fmt(row.get('ratio_fm_over_ours'), '.2f')} | "
            f"{_fmt(fi.get('us'), '.1f')} | "
            f"{_fmt(fi.get('pct_roofline'), '.1f')} | {_fmt(row.get('ratio_fi_over_ours'), '.2f')} | "
            f"{_fmt(ours.get('sm_mhz'), '.0f')} / {_fmt(fm.get('sm_mhz'), '.0f')} / {_fmt(fi.get('sm_mhz'), '.0f')} | "
            f"{_fmt(ours.get('pct_roofline_at_clock'), '.1f')} / {_fmt(fm.get('pct_roofline_at_clock'), '.1f')} / "
            f"{_fmt(fi.get('pct_roofline_at_clock'), '.1f')} |"
        )
    return "\n".join(lines)


RAGGED_TWINS = tuple((f"spec_b64_q1to4_kv4096_h128{t}", f"b81_kv4096_h128_q2{t}") for t in ("", "_fp8", "_fp8q"))


def ragged_twin_lines(rows: Sequence[dict]) -> list[str]:
    """The ragged row against the uniform one with as many query tokens (same kv, H): its share of
    roofline as a ratio (the two rooflines differ only by the KV bytes of 64 against 81 requests)."""
    by_name = {r["name"]: r for r in rows}
    lines = []
    for ragged, twin in RAGGED_TWINS:
        a, b = by_name.get(ragged), by_name.get(twin)
        for who in ("ours", "flashinfer"):
            ra, rb = (a or {}).get(who) or {}, (b or {}).get(who) or {}
            if ra.get("pct_roofline") and rb.get("pct_roofline"):
                lines.append(f"ragged vs uniform ({who}): {ragged} {ra['pct_roofline']:.1f}% of roofline, "
                             f"{twin} {rb['pct_roofline']:.1f}%: ratio {ra['pct_roofline'] / rb['pct_roofline']:.3f}")
    return lines


def summary_lines(result: dict) -> list[str]:
    lines = []
    gpu = result.get("gpu", {})
    c = result.get("ceilings", {})
    lines.append(
        f"GPU {gpu.get('name', '?')} ({gpu.get('sm_count', '?')} SMs); commit {result.get('git_commit', '?')[:12]}; "
        f"{result.get('date', '?')}"
    )
    if c:
        lines.append(
            f"ceilings{' (assumed)' if c.get('assumed') else ''}: copy {c['copy_tbps']:.2f} TB/s, "
            f"read {c['read_tbps']:.2f} TB/s, bf16 matmul {c['matmul_tflops']:.0f} TFLOP/s"
        )
        mm = c.get("matmul_sustained") or {}
        if mm.get("tflops_per_ghz"):
            lines.append(f"sustained matmul ({mm['seconds']:.1f} s of back-to-back 8192^3): {mm['tflops']:.0f} TFLOP/s "
                         f"at {mm['sm_mhz']:.0f} MHz ({mm['power_w']:.0f} W; median of {mm['clock_samples']} "
                         f"nvidia-smi samples) = {mm['tflops_per_ghz']:.0f} TFLOP/s per GHz; each row's SM clock "
                         f"in the table, and % of the roofline with the matmul at that clock")
    h = result.get("host_overhead") or {}
    if "api_median_us" in h:
        parts = [f"api {h['api_median_us']:.1f} µs/call (median host time)"]
        if h.get("api_idle_median_us") is not None:
            parts.append(f"api on an idle GPU (sync before each call) {h['api_idle_median_us']:.1f} µs")
        if h.get("api_loop_us") is not None:
            parts.append(f"{h.get('calls', '?')}-call loop with one final sync {h['api_loop_us']:.1f} µs/call")
        if h.get("launcher_median_us") is not None:
            parts.append(f"launcher alone {h['launcher_median_us']:.1f} µs")
        if h.get("launcher_idle_median_us") is not None:
            parts.append(f"launcher alone, idle GPU {h['launcher_idle_median_us']:.1f} µs")
        if h.get("gpu_graph_us") is not None:
            parts.append(f"GPU time {h['gpu_graph_us']:.1f} µs")
        if h.get("flashinfer_run_median_us") is not None:
            parts.append(f"FlashInfer run() {h['flashinfer_run_median_us']:.1f} µs")
        if h.get("flashinfer_run_idle_median_us") is not None:
            parts.append(f"FlashInfer run(), idle GPU {h['flashinfer_run_idle_median_us']:.1f} µs")
        lines.append("host overhead (one-page call, eager): " + "; ".join(parts))
    elif h.get("error"):
        lines.append(f"host overhead: error {h['error']}")
    lines += ragged_twin_lines(result.get("rows", []))
    for row in result.get("rows", []):
        for who in ("ours", "flashmla", "flashinfer"):
            r = row.get(who) or {}
            if r.get("error") or (r.get("na") and not r["na"].startswith(("--no-", "no FlashMLA library"))):
                lines.append(f"note: {row['name']}: {who} {'n/a: ' + r['na'] if r.get('na') else 'error: ' + r['error']}")
        for key, default in (("check", "FlashInfer"), ("check_flashmla", "FlashMLA")):
            chk = row.get(key) or {}
            if chk.get("suspect"):
                lines.append(f"note: {row['name']}: ours and {chk.get('against', default)} differ: max |diff| "
                             f"{chk['max_abs_diff']:.3g} (max |out| {chk['max_abs_out']:.3g})")
            elif chk.get("error"):
                lines.append(f"note: {row['name']}: check failed: {chk['error']}")
    return lines


def write_plot(result: dict, path: Path) -> Optional[Path]:
    """Bar chart of % of roofline per shape, ours beside FlashMLA's (when it ran) and FlashInfer's.
    None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = result.get("rows", [])
    names = [r["name"] for r in rows]
    pct = lambda r, who: (r.get(who) or {}).get("pct_roofline") or 0.0  # noqa: E731
    series = [("ours", "jit_mla", "#1f77b4"), ("flashinfer", "FlashInfer fa3", "#ff7f0e")]
    if any(pct(r, "flashmla") for r in rows):  # a run without the FlashMLA library keeps two bars
        series.insert(1, ("flashmla", "FlashMLA", "#2ca02c"))
    x = range(len(rows))
    w = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.75 * len(rows) + 2), 5.0))
    for k, (who, label, color) in enumerate(series):
        at = [i + (k - (len(series) - 1) / 2) * w for i in x]
        ax.bar(at, [pct(r, who) for r in rows], w, label=label, color=color)
        for i, r in zip(at, rows):
            if not pct(r, who):
                ax.text(i, 1.0, "err" if who == "ours" else "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.axhline(100.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("% of roofline")
    c = result.get("ceilings", {})
    gpu = result.get("gpu", {}).get("name", "?")
    ax.set_title(
        f"MLA, page {PAGE_SIZE} (bf16; _fp8: fp8 KV, _fp8q: fp8 query and KV) on {gpu}: "
        f"copy {c.get('copy_tbps', 0):.2f} TB/s, "
        f"matmul {c.get('matmul_tflops', 0):.0f} TFLOP/s; commit {str(result.get('git_commit', '?'))[:10]}",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    ax.set_ylim(0, max([105.0] + [pct(r, who) * 1.1 for r in rows for who, _, _ in series]))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# =================================================================================================
# GPU part
# =================================================================================================


def git_commit() -> tuple[str, Optional[bool]]:
    try:
        sha = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip() != ""
        return sha or "unknown", dirty
    except (OSError, subprocess.SubprocessError):
        return "unknown", None


class Bench:
    """Holds torch, the device and the timing settings."""

    def __init__(self, quick: bool, replan: bool = False):
        import torch

        self.torch = torch
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.quick = quick
        # --replan: consecutive calls on other lengths, so that none could reuse a plan the call
        # before it left in the workspace (docs/experiments/plan-cache.patch keeps one there): a
        # serving step's first layer. Without plan reuse every call plans, and --replan times the same.
        self.replan = replan
        # graph replays per measurement: enough for about target_s of replays, within [lo, hi]
        self.target_s, self.min_replays, self.max_replays = (0.1, 5, 60) if quick else (1.0, 20, 1000)
        self.sampler = None  # smi_sampler.SmiSampler, set by run_gpu when nvidia-smi is there
        self.last_window: Optional[tuple[float, float]] = None  # time.monotonic() of the last timing

    # ---- timing ---------------------------------------------------------------------------------

    def time_events(self, fn: Callable[[], object], warmup: int, reps: int) -> list[float]:
        """Per-run milliseconds of fn, each bracketed by CUDA events."""
        torch = self.torch
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        t0 = time.monotonic()
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        self.last_window = (t0, time.monotonic())
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def clock_fields(self) -> dict:
        """The SM clock and power inside the last timed window ({} without a sampler)."""
        return self.sampler.window(*self.last_window) if self.sampler and self.last_window else {}

    def time_graph(self, calls: Sequence[Callable[[], object]]) -> dict:
        """Capture the calls into one graph, replay it; per-call µs = median replay / len(calls)."""
        torch = self.torch
        for c in calls:  # eager warm-up: JIT builds, lazy init, nothing allocated during capture
            c()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in calls:
                c()
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        est = max((time.perf_counter() - t0) / 3, 1e-6)
        replays = int(min(self.max_replays, max(self.min_replays, math.ceil(self.target_s / est))))
        ms = sorted(self.time_events(graph.replay, warmup=0, reps=replays))
        del graph
        n = len(calls)
        q = lambda p: ms[min(len(ms) - 1, int(p * (len(ms) - 1) + 0.5))] * 1e3 / n  # noqa: E731
        return {"us": statistics.median(ms) * 1e3 / n, "p10_us": q(0.1), "p90_us": q(0.9),
                "replays": replays, "calls_per_replay": n, **self.clock_fields()}

    def free(self) -> None:
        import gc

        gc.collect()
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def randn(self, shape, dtype=None):
        """N(0, 1) bf16 on the device, filled in chunks (no 2^31-element kernel)."""
        torch = self.torch
        t = torch.empty(shape, dtype=dtype or torch.bfloat16, device=self.dev)
        flat = t.view(-1)
        for chunk in flat.split(1 << 28):
            chunk.normal_()
        return t

    # ---- ceilings -------------------------------------------------------------------------------

    def ceilings(self) -> dict:
        reps = 10 if self.quick else 50
        res: dict = {"assumed": False}
        res["copy"] = self._copy_ceiling(4 * GIB, reps)
        res["read"] = self._read_ceiling(8 * GIB, reps)
        res["matmul"] = self._matmul_ceiling(8192, 30 if self.quick else 100)
        res["matmul_sustained"] = self._matmul_sustained(8192, 0.3 if self.quick else 1.5)
        res["copy_tbps"] = res["copy"]["tbps"]
        res["read_tbps"] = res["read"]["tbps"]
        res["matmul_tflops"] = res["matmul"]["tflops"]
        return res

    def _copy_ceiling(self, nbytes: int, reps: int) -> dict:
        """dst.copy_(src) of nbytes: bytes read + bytes written."""
        src = self.randn((nbytes // ELEM_BYTES,))
        dst = self.torch.empty_like(src)
        ms = self.time_events(lambda: dst.copy_(src), warmup=3, reps=reps)
        src = dst = None
        self.free()
        return {"op": "dst.copy_(src), bf16", "buffer_bytes": nbytes, "bytes_counted": 2 * nbytes,
                "median_ms": statistics.median(ms), "tbps": 2 * nbytes / (statistics.median(ms) * 1e-3) / 1e12,
                "best_tbps": 2 * nbytes / (min(ms) * 1e-3) / 1e12}

    def _read_ceiling(self, nbytes: int, reps: int) -> dict:
        """x.sum() over nbytes of bf16: bytes read."""
        x = self.randn((nbytes // ELEM_BYTES,))
        ms = self.time_events(lambda: x.sum(), warmup=3, reps=reps)
        x = None
        self.free()
        return {"op": "x.sum(), bf16", "buffer_bytes": nbytes, "median_ms": statistics.median(ms),
                "tbps": nbytes / (statistics.median(ms) * 1e-3) / 1e12, "best_tbps": nbytes / (min(ms) * 1e-3) / 1e12}

    def _matmul_ceiling(self, n: int, reps: int) -> dict:
        """bf16 n x n x n matmul on N(0, 1) data (zeros would flatter the power-limited clock)."""
        torch = self.torch
        a, b = self.randn((n, n)), self.randn((n, n))
        c = torch.empty((n, n), dtype=torch.bfloat16, device=self.dev)
        ms = self.time_events(lambda: torch.mm(a, b, out=c), warmup=10, reps=reps)
        clock = self.clock_fields()
        a = b = c = None
        self.free()
        flops = 2 * n**3
        return {"op": "torch.mm bf16, N(0,1) data", "m=n=k": n, "median_ms": statistics.median(ms),
                "tflops": flops / (statistics.median(ms) * 1e-3) / 1e12, "best_tflops": flops / (min(ms) * 1e-3) / 1e12,
                "seconds": sum(ms) * 1e-3, **clock}

    def _matmul_sustained(self, n: int, seconds: float) -> dict:
        """The bf16 matmul run back to back for `seconds` (a full run times each shape for about
        1 s, in which a compute-bound kernel settles at the clock the 700 W limit allows), with the
        SM clock inside that window: TFLOP/s per GHz, for the rows' % of roofline at their clock.
        The headline ceiling stays the 100-matmul median above (the issue's anchors used it)."""
        reps = max(10, math.ceil(seconds / 1.6e-3))  # ~1.6 ms per 8192^3 on an H200
        out = {**self._matmul_ceiling(n, reps), "op": "torch.mm bf16, N(0,1) data, back to back", "reps": reps}
        if out.get("sm_mhz"):
            out["tflops_per_ghz"] = out["tflops"] / (out["sm_mhz"] * 1e-3)
        return out

    # ---- data -----------------------------------------------------------------------------------

    def shape_data(self, shape: Shape, n_sets: int) -> dict:
        """KV pool of n_sets slabs, per-set q/out, the shared page table and FlashInfer's CSR."""
        torch = self.torch
        torch.manual_seed(DATA_SEED)
        P = shape.pages_per_set
        pool = self.randn((n_sets * P, PAGE_SIZE, D_QK))  # [pages, 64, 576] bf16
        if shape.kv_fp8:
            pool = pool.to(torch.float8_e4m3fn)  # N(0, 1) values: inside e4m3's range
        gen = torch.Generator().manual_seed(DATA_SEED)
        perm = torch.randperm(P, generator=gen).to(torch.int32)  # a slab's pages, scattered
        pages = [-(-kv // PAGE_SIZE) for kv in shape.kv_lens]
        block_tables = torch.zeros((shape.batch, max(pages)), dtype=torch.int32)  # [B, max_pages]
        kv_indptr = [0]
        for b, n in enumerate(pages):
            block_tables[b, :n] = perm[kv_indptr[-1]: kv_indptr[-1] + n]
            kv_indptr.append(kv_indptr[-1] + n)
        qo_indptr = [0]
        for n in shape.q_lens:
            qo_indptr.append(qo_indptr[-1] + n)
        H = shape.num_heads
        q_shape = (shape.total_q, H, D_QK) if shape.ragged else (shape.batch, shape.max_q_len, H, D_QK)
        queries = [self.randn(q_shape) for _ in range(n_sets)]
        if shape.q_fp8:
            queries = [q.to(torch.float8_e4m3fn) for q in queries]
        return {
            "pool": pool,
            "slabs": [pool[i * P:(i + 1) * P] for i in range(n_sets)],  # each [P, 64, 576]
            "queries": queries,
            "outs": [torch.empty(q_shape[:-1] + (D_V,), dtype=torch.bfloat16, device=self.dev) for _ in range(n_sets)],
            "block_tables": block_tables.to(self.dev),
            "seq_lens": torch.tensor(shape.kv_lens, dtype=torch.int32, device=self.dev),
            "cum_seq_lens_q": torch.tensor(qo_indptr, dtype=torch.int32, device=self.dev) if shape.ragged else None,
            # FlashInfer's CSR metadata, on the host (its plan reads lengths on the CPU)
            "qo_indptr": torch.tensor(qo_indptr, dtype=torch.int32),
            "kv_indptr": torch.tensor(kv_indptr, dtype=torch.int32),
            "kv_indices": perm.clone(),  # requests' pages in order: the table rows concatenated
            "kv_len_arr": torch.tensor(shape.kv_lens, dtype=torch.int32),
        }

    # ---- ours -----------------------------------------------------------------------------------

    def our_calls(self, shape: Shape, data: dict) -> list[Callable[[], object]]:
        import jit_mla

        torch = self.torch
        ws_bytes = jit_mla.get_workspace_size(shape.batch, shape.num_heads, total_q=shape.total_q, device=self.dev)
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device=self.dev)
        ragged = {"cum_seq_lens_q": data["cum_seq_lens_q"], "max_q_len": shape.max_q_len} if shape.ragged else {}
        # --replan's other lengths: the last request one token shorter (the same work, to one token)
        alt_lens = data["seq_lens"].clone() if self.replan else None
        if alt_lens is not None:
            alt_lens[-1] -= 1

        def make(i: int) -> Callable[[], object]:
            q, kv, out = data["queries"][i], data["slabs"][i], data["outs"][i]
            seq_lens = alt_lens if self.replan and i % 2 else data["seq_lens"]

            def call():
                return jit_mla.trtllm_batch_decode_with_kv_cache_mla(
                    q, kv, ws, QK_NOPE_HEAD_DIM, KV_LORA_RANK, QK_ROPE_HEAD_DIM,
                    data["block_tables"], seq_lens, shape.max_kv_len,
                    out=out, bmm1_scale=SM_SCALE, **ragged)

            return call

        return [make(i) for i in range(len(data["slabs"]))]

    def check_fp8_query(self, shape: Shape, data: dict) -> dict:
        """An e4m3-query row has no FlashInfer output to compare with: compare slab 0's output with
        our bf16-query fp8 kernel on the same query upcast (exact), whose P is finer (bf16's
        precision against e4m3's), so a few percent of |out| apart is expected; more is suspect."""
        torch = self.torch
        try:
            ref = torch.empty_like(data["outs"][0])
            slab0 = {**data, "queries": [data["queries"][0].to(torch.bfloat16)], "slabs": data["slabs"][:1],
                     "outs": [ref]}
            self.our_calls(shape, slab0)[0]()
            diff = float((data["outs"][0].float() - ref.float()).abs().max())
            peak = float(ref.float().abs().max())
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            return {"against": "our bf16-query fp8 kernel", "error": f"{type(e).__name__}: {str(e)[:300]}"}
        return {"against": "our bf16-query fp8 kernel", "max_abs_diff": diff, "max_abs_out": peak,
                "suspect": diff > 0.05 + 0.05 * peak}

    # ---- FlashInfer -----------------------------------------------------------------------------

    def flashinfer_calls(self, fi_mla, shape: Shape, data: dict, fi_ws) -> tuple[list[Callable[[], object]], list]:
        """One fa3 wrapper planned once (all slabs share the page-table structure); a call per slab."""
        torch = self.torch
        wrapper = fi_mla.BatchMLAPagedAttentionWrapper(fi_ws, backend="fa3")
        common = dict(num_heads=shape.num_heads, head_dim_ckv=KV_LORA_RANK, head_dim_kpe=QK_ROPE_HEAD_DIM,
                      page_size=PAGE_SIZE, causal=shape.causal, sm_scale=SM_SCALE,
                      q_data_type=torch.bfloat16,
                      kv_data_type=torch.float8_e4m3fn if shape.kv_fp8 else torch.bfloat16)
        csr = (data["qo_indptr"], data["kv_indptr"], data["kv_indices"], data["kv_len_arr"])
        structural = hasattr(fi_mla, "MLAPlanMetadata")  # 0.7: metadata object + query=/kv_cache=
        if structural:
            wrapper.plan(metadata=fi_mla.MLAPlanMetadata.csr(*csr), query_layout="split",
                         kv_cache_layout="split", **common)
        else:  # older releases (flashinfer/mla.py): flat CSR keywords
            wrapper.plan(qo_indptr=csr[0], kv_indptr=csr[1], kv_indices=csr[2], kv_len_arr=csr[3], **common)
        outs = []

        def make(i: int) -> Callable[[], object]:
            q = data["queries"][i].view(shape.total_q, shape.num_heads, D_QK)
            kv = data["slabs"][i]
            q_nope, q_pe = q[..., :KV_LORA_RANK], q[..., KV_LORA_RANK:]  # strided views, no copy
            ckv, kpe = kv[..., :KV_LORA_RANK], kv[..., KV_LORA_RANK:]
            out = torch.empty((shape.total_q, shape.num_heads, D_V), dtype=torch.bfloat16, device=self.dev)
            outs.append(out)
            # An fp8 cache needs its per-tensor scales named (1.0: the data is the dequantized value).
            scales = dict(ckv_scale=1.0, kpe_scale=1.0) if shape.kv_fp8 else {}
            if structural:
                return lambda: wrapper.run(query=(q_nope, q_pe), kv_cache=(ckv, kpe), out=out, **scales)
            return lambda: wrapper.run(q_nope=q_nope, q_pe=q_pe, ckv_cache=ckv, kpe_cache=kpe, out=out, **scales)

        return [make(i) for i in range(len(data["slabs"]))], outs

    # ---- host overhead --------------------------------------------------------------------------

    def host_overhead(self, fi_mla, fi_ws) -> dict:
        """Per-call host time of one eager call on a one-page shape (B 1, kv 64, H 16, q_len 1)."""
        import jit_mla.api as api_mod

        torch = self.torch
        shape = uniform_shape(1, PAGE_SIZE, 16, 1)
        data = self.shape_data(shape, 1)
        call = self.our_calls(shape, data)[0]
        n_loop = 500 if self.quick else 2000
        bursts = 5 if self.quick else 20
        res: dict = {"shape": shape.describe(), "calls": n_loop}

        def host_median(fn: Callable[[], object], burst: int = 100) -> float:
            return host_median_us(fn, torch.cuda.synchronize, bursts * 100, burst)

        for _ in range(50):
            call()
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(n_loop):
            call()
        torch.cuda.synchronize()
        res["api_loop_us"] = (time.perf_counter_ns() - t0) / 1e3 / n_loop  # max(host, GPU) per call
        res["api_median_us"] = host_median(call)
        res["api_idle_median_us"] = host_median(call, burst=1)

        # The launcher call alone: record the arguments the wrapper hands it, then call it directly.
        recorded: dict = {}

        class _Recorder:
            def __getattr__(self, name):
                def record(*args, **kwargs):
                    recorded.update(name=name, args=args, kwargs=kwargs)

                return record

        real_get = api_mod.get_launcher
        try:
            launcher = real_get()
            api_mod.get_launcher = lambda: _Recorder()
            call()
        finally:
            api_mod.get_launcher = real_get
        if recorded:
            fn = getattr(launcher, recorded["name"])
            args, kwargs = recorded["args"], recorded["kwargs"]
            res["launcher_median_us"] = host_median(lambda: fn(*args, **kwargs))
            res["launcher_idle_median_us"] = host_median(lambda: fn(*args, **kwargs), burst=1)
        else:
            res["launcher_median_us"] = None

        res["gpu_graph_us"] = self.time_graph([call] * 100)["us"]

        if fi_mla is not None:
            try:
                fi_calls, _ = self.flashinfer_calls(fi_mla, shape, data, fi_ws)
                for _ in range(50):
                    fi_calls[0]()
                torch.cuda.synchronize()
                res["flashinfer_run_median_us"] = host_median(fi_calls[0])
                res["flashinfer_run_idle_median_us"] = host_median(fi_calls[0], burst=1)
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                res["flashinfer_run_error"] = f"{type(e).__name__}: {e}"
        del data
        self.free()
        return res

    # ---- one shape ------------------------------------------------------------------------------

    def run_shape(self, row: dict, shape: Shape, fi_mla, fi_ws, fi_reason: Optional[str],
                  fm_lib=None, fm_reason: Optional[str] = None) -> None:
        torch = self.torch
        # --replan: an even number of calls per replay, alternating lengths, also across replays
        n_sets = max(2, shape.n_sets + shape.n_sets % 2) if self.replan else shape.n_sets
        data = self.shape_data(shape, n_sets)
        try:
            ours_calls = self.our_calls(shape, data)
            try:
                t = self.time_graph(ours_calls)
                row["ours"] = {**perf_fields(row, t["us"], t), **t}
                if not bool(torch.isfinite(data["outs"][0]).all()):
                    row["ours"]["error"] = "non-finite values in the output"
            except Exception as e:  # noqa: BLE001 - one shape's failure must not end the run
                row["ours"] = {"error": f"{type(e).__name__}: {e}"}
            self.free()
            self.run_flashmla(row, shape, data, fm_lib, fm_reason)
            self.free()
            self.run_flashinfer(row, shape, data, fi_mla, fi_ws, fi_reason)
        finally:
            del data
            self.free()

    def compare(self, shape: Shape, data: dict, other, tol: float) -> dict:
        """Max |ours - other| over set 0's output, 512 tokens at a time (no large fp32 copy)."""
        ours0 = data["outs"][0].view(shape.total_q, shape.num_heads, D_V)
        other = other.view(shape.total_q, shape.num_heads, D_V)
        diff = peak = 0.0
        for a, b in zip(ours0.split(512), other.split(512)):
            diff = max(diff, float((a.float() - b.float()).abs().max()))
            peak = max(peak, float(a.float().abs().max()))
        return {"max_abs_diff": diff, "max_abs_out": peak, "suspect": diff > tol + tol * peak}

    def flashmla_calls(self, fm_lib, shape: Shape, data: dict) -> tuple[list[Callable[[], object]], list]:
        """FlashMLA's schedule for the shape on this GPU's SMs, then a call per slab (flashmla_side.py)."""
        import flashmla_side

        sms = self.torch.cuda.get_device_properties(self.dev).multi_processor_count
        return flashmla_side.calls(fm_lib, shape, data, sms, SM_SCALE)

    def run_flashmla(self, row: dict, shape: Shape, data: dict, fm_lib, fm_reason: Optional[str]) -> None:
        """FlashMLA's column (flashmla_side.py): bf16 cache, uniform q_len."""
        import flashmla_side

        if fm_lib is None:
            row["flashmla"] = {"na": fm_reason or "not run"}
            return
        why = flashmla_side.not_applicable(shape)
        if why:
            row["flashmla"] = {"na": why}
            return
        try:
            fm_calls, fm_outs = self.flashmla_calls(fm_lib, shape, data)
        except Exception as e:  # noqa: BLE001 - a failure is this row's result, not the run's
            row["flashmla"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            return
        self.time_competitor(row, shape, data, "flashmla", fm_calls, fm_outs[0])

    def run_flashinfer(self, row: dict, shape: Shape, data: dict, fi_mla, fi_ws, fi_reason: Optional[str]) -> None:
        if fi_mla is None:
            row["flashinfer"] = {"na": fi_reason or "not run"}
            return
        if shape.q_fp8:
            row["flashinfer"] = {"na": "FlashInfer's fa3 MLA takes no e4m3 query"}
            if "us" in row.get("ours", {}):
                row["check"] = self.check_fp8_query(shape, data)
            return
        try:
            fi_calls, fi_outs = self.flashinfer_calls(fi_mla, shape, data, fi_ws)
        except Exception as e:  # noqa: BLE001 - its planner refusing a shape is a result
            row["flashinfer"] = {"na": f"plan failed: {type(e).__name__}: {str(e)[:300]}"}
            return
        self.time_competitor(row, shape, data, "flashinfer", fi_calls, fi_outs[0])

    # row keys of a competitor's ratio to ours and of its output check (the JSON's, as readers know
    # them), and the "against" name its check carries when it is not the default FlashInfer
    COMPETITOR_KEYS = {"flashmla": ("ratio_fm_over_ours", "check_flashmla", {"against": "FlashMLA"}),
                       "flashinfer": ("ratio_fi_over_ours", "check", {})}

    def time_competitor(self, row: dict, shape: Shape, data: dict, who: str, calls, out0) -> None:
        """row[who]: its timed calls (or the error); with ours timed, its ratio and output check."""
        try:
            t = self.time_graph(calls)
            row[who] = {**perf_fields(row, t["us"], t), **t}
        except Exception as e:  # noqa: BLE001 - a failure is this row's result, not the run's
            row[who] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            return
        if "us" in row.get("ours", {}):
            ratio_key, check_key, against = self.COMPETITOR_KEYS[who]
            row[ratio_key] = row[who]["us"] / row["ours"]["us"]
            row[check_key] = {**against, **self.compare(shape, data, out0, 0.02)}


def save(result: dict, json_path: Path) -> None:
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(json_path)


def run_gpu(args, shapes: list[Shape], all_shapes: list[Shape]) -> int:
    import torch

    from smi_sampler import SmiSampler  # benchmarks/ is on sys.path: this script's folder

    if not torch.cuda.is_available():
        print("no CUDA device: use --dry-run on a CPU-only machine", file=sys.stderr)
        return 2
    bench = Bench(args.quick, args.replan)
    props = torch.cuda.get_device_properties(bench.dev)
    uuid = str(getattr(props, "uuid", "") or "") or None
    bench.sampler = SmiSampler.start(uuid)
    try:
        return run_all(args, shapes, all_shapes, bench, props, uuid)
    finally:
        if bench.sampler:
            bench.sampler.close()


def run_all(args, shapes: list[Shape], all_shapes: list[Shape], bench: Bench, props, uuid: Optional[str]) -> int:
    """Ceilings, host overhead and every shape, into the JSON and PNG (run_gpu's body)."""
    import torch
    from smi_sampler import query as nvidia_smi

    sha, dirty = (args.commit, None) if args.commit else git_commit()
    now = datetime.datetime.now(datetime.timezone.utc)
    result: dict = {
        "benchmark": "jit_mla benchmarks/bench_mla.py",
        "date": now.isoformat(timespec="seconds"),
        "git_commit": sha,
        "git_dirty": dirty,
        "gpu": {"name": torch.cuda.get_device_name(bench.dev), "sm_count": props.multi_processor_count,
                "capability": f"{props.major}.{props.minor}", "memory_bytes": props.total_memory,
                "nvidia_smi_start": nvidia_smi(uuid)},
        "software": {"python": platform.python_version(), "torch": torch.__version__,
                     "cuda": torch.version.cuda},
        "options": {"quick": args.quick, "replan": args.replan, "shapes": [s.name for s in shapes],
                    "min_bytes_per_replay": MIN_BYTES_PER_REPLAY, "page_size": PAGE_SIZE,
                    "bmm1_scale": SM_SCALE},
        "rows": [],
    }
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"bench_mla-{now.strftime('%Y%m%d-%H%M%S')}-{sha[:8]}"
    json_path = out_dir / f"{stem}.json"
    print(f"# {result['gpu']['name']}, {props.multi_processor_count} SMs; commit {sha[:12]}; "
          f"nvidia-smi: {result['gpu']['nvidia_smi_start']}")

    try:
        import jit_mla

        result["software"]["jit_mla"] = jit_mla.__version__
    except Exception as e:  # noqa: BLE001
        print(f"cannot import jit_mla: {e}", file=sys.stderr)
        return 1

    fi_mla, fi_ws, fi_reason = None, None, None
    if args.no_flashinfer:
        fi_reason = "--no-flashinfer"
    else:
        try:
            import flashinfer
            import flashinfer.mla as fi_mla

            result["software"]["flashinfer"] = getattr(flashinfer, "__version__", "?")
            fi_ws = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=bench.dev)
        except Exception as e:  # noqa: BLE001 - FlashInfer is optional
            fi_mla, fi_reason = None, f"flashinfer not importable: {type(e).__name__}: {e}"
            result["software"]["flashinfer"] = None
            print(f"# {fi_reason}")

    fm_lib, fm_reason = None, "--no-flashmla"
    if not args.no_flashmla:
        import flashmla_side

        fm_lib, fm_info = flashmla_side.load()
        fm_reason = None if fm_lib is not None else fm_info
        result["software"]["flashmla"] = fm_info if fm_lib is not None else None
        print(f"# FlashMLA: {fm_info if fm_lib is not None else 'n/a: ' + fm_info}")

    if args.assume_ceilings:
        result["ceilings"] = {**NOMINAL_CEILINGS, "assumed": True}
    else:
        t0 = time.perf_counter()
        result["ceilings"] = bench.ceilings()
        print(f"# ceilings ({time.perf_counter() - t0:.1f} s): copy {result['ceilings']['copy_tbps']:.2f} TB/s, "
              f"read {result['ceilings']['read_tbps']:.2f} TB/s, matmul {result['ceilings']['matmul_tflops']:.0f} TFLOP/s")
    result["gpu"]["nvidia_smi_after_ceilings"] = nvidia_smi(uuid)
    save(result, json_path)

    t0 = time.perf_counter()
    try:
        result["host_overhead"] = bench.host_overhead(fi_mla, fi_ws)
    except Exception as e:  # noqa: BLE001
        result["host_overhead"] = {"error": f"{type(e).__name__}: {e}"}
    print(f"# host overhead ({time.perf_counter() - t0:.1f} s): {result['host_overhead']}")
    if fi_mla is not None and result["host_overhead"].get("flashinfer_run_error"):
        # Its module did not build or run on a one-page shape: do not retry the build per shape.
        fi_mla, fi_reason = None, "FlashInfer failed on the one-page shape: " + result["host_overhead"]["flashinfer_run_error"]
        print(f"# {fi_reason}")
    save(result, json_path)

    for s in shapes:
        row = shape_row(all_shapes.index(s), s)
        add_roofline(row, result["ceilings"])
        t0 = time.perf_counter()
        try:
            bench.run_shape(row, s, fi_mla, fi_ws, fi_reason, fm_lib, fm_reason)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory building the data
            row["error"] = f"{type(e).__name__}: {e}"
            row.setdefault("ours", {"error": row["error"]})
            bench.free()
        result["rows"].append(row)
        save(result, json_path)
        ours, fi, fm = row.get("ours", {}), row.get("flashinfer", {}), row.get("flashmla", {})
        print(f"# [{row['index']}] {s.name} ({s.describe()}, {s.n_sets} sets, {time.perf_counter() - t0:.1f} s): "
              f"ours {_fmt(ours.get('us'), '.1f')} µs {_fmt(ours.get('pct_roofline'), '.1f')}% | "
              f"FlashMLA {_fmt(fm.get('us'), '.1f')} µs {_fmt(fm.get('pct_roofline'), '.1f')}% | "
              f"FI {_fmt(fi.get('us'), '.1f')} µs {_fmt(fi.get('pct_roofline'), '.1f')}%"
              + (f" | ours error: {ours['error']}" if ours.get("error") else "")
              + (f" | FI: {fi.get('na') or fi.get('error')}" if (fi.get("na") or fi.get("error")) else ""))

    result["gpu"]["nvidia_smi_end"] = nvidia_smi(uuid)
    save(result, json_path)
    finish(result, json_path, json_path.with_suffix(".png"))
    return 0


def finish(result: dict, json_path: Path, png_path: Path) -> None:
    png = write_plot(result, png_path)
    print()
    for line in summary_lines(result):
        print(line)
    print(f"results: {json_path}" + (f", plot: {png}" if png else " (no plot: matplotlib is not installed; "
                                                                     f"--replot {json_path} where it is)"))
    print()
    print(markdown_table(result))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Shapes: " + ", ".join(f"{i}={s.name}" for i, s in enumerate(shape_table())))
    p.add_argument("--out-dir", default=str(REPO_ROOT / "benchmarks" / "results"),
                   help="where the JSON and PNG go (default: benchmarks/results)")
    p.add_argument("--shapes", default=None,
                   help="subset: comma-separated indices, names or glob patterns (e.g. 0,3,'spec_*')")
    p.add_argument("--quick", action="store_true", help="fewer replays and ceiling repetitions")
    p.add_argument("--dry-run", action="store_true", help="print the shape table with bytes and FLOPs; no GPU")
    p.add_argument("--no-flashinfer", action="store_true", help="no FlashInfer column")
    p.add_argument("--no-flashmla", action="store_true",
                   help="no FlashMLA column (it needs .flashmla/libflashmla_side.so: benchmarks/flashmla/build.sh)")
    p.add_argument("--replan", action="store_true",
                   help="every call plans: consecutive calls on other lengths (no plan reuse; "
                        "a step's first layer); rows then run an even number of calls per replay")
    p.add_argument("--assume-ceilings", action="store_true",
                   help=f"skip measuring the ceilings; use nominal H200 figures {NOMINAL_CEILINGS}")
    p.add_argument("--commit", default=None,
                   help="git commit to record (default: git rev-parse HEAD, or 'unknown' without .git)")
    p.add_argument("--replot", metavar="JSON", default=None,
                   help="redraw the PNG (into --out-dir) and print the table from an earlier result; no GPU")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    args = parse_args(argv)
    if args.replot:
        path = Path(args.replot)
        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        finish(json.loads(path.read_text()), path, out_dir / (path.stem + ".png"))
        return 0
    all_shapes = shape_table()
    try:
        shapes = select_shapes(all_shapes, args.shapes)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print_dry_run(shapes, all_shapes, NOMINAL_CEILINGS)
        return 0
    return run_gpu(args, shapes, all_shapes)


if __name__ == "__main__":
    sys.exit(main())

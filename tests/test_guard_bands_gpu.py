"""Guard bands: the kernels write inside out, lse and the workspace, and nowhere else (sm_90a).

out, lse and the workspace are carved out of larger buffers whose bands before and after hold a
sentinel bit pattern (a NaN payload no kernel computes); after the call every band bit must be
unchanged, and the inputs (query, the whole KV pool) untouched. The workspace is exactly
``get_workspace_size`` bytes and also starts at misaligned offsets, so the launcher's align-up
slack is used up to its last byte. Each case is checked against the float32 reference too.

``check_case`` is shared with tests/test_fuzz_gpu.py.
"""

from __future__ import annotations

import random

import pytest
import torch

import error_log
from mla_data import assert_close_fa3, lse_tolerance, make_case

pytestmark = pytest.mark.requires_sm90a

DEV = "cuda"
BAND_BYTES = 64 * 1024  # wider than any vector store or TMA box row could overshoot by
# Sentinel bits per element size: quiet-NaN payloads (never produced by arithmetic, which gives
# the canonical NaN), so an overwrite with NaN shows as well.
SENTINEL = {1: 0xA5, 2: 0x7FA5, 4: 0x7FA5A5A5}
BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32}


def check_case(case, out, lse, *, bmm1=None, bmm2=1.0, sinks=False, label="", p_dtype=torch.bfloat16):
    """``out`` (and ``lse`` when not None), in the case's query layout, against the reference.
    p_dtype: how the kernel rounds P (e4m3 for an e4m3 query), for the low-precision reference."""
    kw = dict(bmm1_scale=case.bmm1_scale if bmm1 is None else bmm1, bmm2_scale=bmm2)
    kw["sinks"] = case.sinks if sinks else None
    ref, ref_lse = case.reference(**kw)
    ref_lowp, _ = case.reference(low_precision=True, p_dtype=p_dtype, **kw)
    stats = assert_close_fa3(out.float(), ref, ref_lowp, name=f"out {label}")
    lse_err = 0.0
    if lse is not None:
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite), f"lse finiteness differs {label}"
        assert torch.equal(lse[~finite], ref_lse[~finite]), f"lse -inf rows differ {label}"
        if bool(finite.any()):
            lse_err = float((lse[finite] - ref_lse[finite]).abs().max())
        tol = lse_tolerance(case, kw["bmm1_scale"])
        assert lse_err < tol, f"lse error {lse_err} (bound {tol:.4f}) {label}"
    error_log.record(label, stats, lse_err)


class Banded:
    """A tensor of ``shape`` inside a larger buffer, with sentinel bands of ``BAND_BYTES`` around.

    ``shift`` extra bytes of band before the tensor (a misaligned start for byte buffers).
    """

    def __init__(self, shape, dtype, *, fill: float | None = float("nan"), shift: int = 0):
        size = dtype.itemsize
        assert shift % size == 0
        numel = 1
        for n in shape:
            numel *= n
        self.lead = (BAND_BYTES + shift) // size
        self.numel = numel
        self.trail = BAND_BYTES // size
        self.buf = torch.empty(self.lead + numel + self.trail, dtype=dtype, device=DEV)
        self.buf.view(BITS[size]).fill_(_signed(SENTINEL[size], size))
        self.tensor = self.buf[self.lead : self.lead + numel].view(shape)
        if fill is not None:
            self.tensor.fill_(fill)

    def assert_bands_intact(self, name: str) -> None:
        bits = self.buf.view(BITS[self.buf.element_size()])
        expected = _signed(SENTINEL[self.buf.element_size()], self.buf.element_size())
        for band, lo, hi in (
            ("before", 0, self.lead),
            ("after", self.lead + self.numel, self.lead + self.numel + self.trail),
        ):
            changed = (bits[lo:hi] != expected).nonzero()
            if changed.numel():
                first, last = int(changed[0]) + lo, int(changed[-1]) + lo
                start = self.lead if band == "before" else self.lead + self.numel
                raise AssertionError(
                    f"{name}: {changed.numel()} elements of the guard band {band} it were written "
                    f"(elements {first - start:+d} .. {last - start:+d} from its "
                    f"{'start' if band == 'before' else 'end'}; first value bits "
                    f"{int(bits[first]) & ((1 << 8 * self.buf.element_size()) - 1):#x})"
                )


def _signed(value: int, size: int) -> int:
    bits = 8 * size
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(BITS[t.element_size()]).clone()


def _run_banded(case, *, sinks=False, ws_shift=0, label=""):
    import jit_mla

    B, H = case.batch, case.num_heads
    total_q = case.query.shape[0] if case.ragged else B * case.query.shape[1]
    ws_bytes = jit_mla.get_workspace_size(B, H, total_q=total_q)
    # The workspace starts as garbage (never zeros): a kernel must not rely on its contents.
    ws = Banded((ws_bytes,), torch.uint8, fill=None, shift=ws_shift)
    ws.tensor.fill_(0xFF)
    out = Banded(tuple(case.query.shape[:-1]) + (512,), torch.bfloat16)
    lse = Banded(tuple(case.query.shape[:-1]), torch.float32)
    query_before, pool_before = _bits(case.query), _bits(case.pool)

    jit_mla.trtllm_batch_decode_with_kv_cache_mla(
        case.query, case.kv_cache, ws.tensor, 128, 512, 64, case.block_tables, case.seq_lens,
        max(case.kv_lens), out=out.tensor, bmm1_scale=case.bmm1_scale,
        sinks=case.sinks if sinks else None, lse=lse.tensor, cum_seq_lens_q=case.cum_seq_lens_q,
        max_q_len=case.max_q_len if case.ragged else None,
    )
    torch.cuda.synchronize()

    out.assert_bands_intact(f"out {label}")
    lse.assert_bands_intact(f"lse {label}")
    ws.assert_bands_intact(f"workspace ({ws_bytes} bytes at +{ws_shift}) {label}")
    assert torch.equal(_bits(case.query), query_before), f"query was written {label}"
    assert torch.equal(_bits(case.pool), pool_before), f"the KV pool was written {label}"
    check_case(case, out.tensor, lse.tensor, sinks=sinks, label=label)


# (label, B, q_lens (int: uniform, list: ragged), H, page, kv_lens, extras)
CASES = [
    ("uniform", 8, 2, 128, 64, [1, 64, 65, 300, 1000, 2, 129, 4000], {}),
    ("uniform-page1", 6, 1, 64, 1, [1, 7, 300, 999, 2, 64], {"sinks": True}),
    ("uniform-q8-H3", 5, 8, 3, 32, [8, 9, 100, 700, 31], {"pool_padding": 8}),
    ("ragged", 16, [0, 3, 1, 4, 0, 2, 4, 1, 1, 0, 3, 2, 4, 4, 1, 2], 16, 32, None, {"sinks": True}),
    ("ragged-page24", 6, [2, 0, 5, 1, 8, 3], 128, 24, [2, 0, 500, 1, 2000, 3], {"cache_4d": True}),
    ("split-long1", 1, 1, 16, 64, [60000], {}),
    ("split-long1-H128", 1, 1, 128, 64, [32768], {}),
    ("split-ragged", 2, [1, 4], 128, 64, [20000, 40000], {}),
]


@pytest.mark.parametrize("ws_shift", [0, 16, 255])
@pytest.mark.parametrize("label,B,q_lens,H,page,kv_lens,extra", CASES, ids=[c[0] for c in CASES])
def test_writes_stay_inside_out_lse_and_workspace(
    label, B, q_lens, H, page, kv_lens, extra, ws_shift
):
    rng = random.Random(f"{label}-{ws_shift}")
    ragged = isinstance(q_lens, list)
    if kv_lens is None:
        kv_lens = [q + rng.randint(0, 3000) for q in q_lens]
    case = make_case(
        B, q_lens, H, page, kv_lens, ragged=ragged, cache_4d=extra.get("cache_4d", False),
        pool_padding=extra.get("pool_padding", 0), device=DEV, seed=rng.randint(0, 1 << 30),
    )
    sinks = extra.get("sinks", False)
    _run_banded(case, sinks=sinks, ws_shift=ws_shift, label=f"{label} +{ws_shift}")

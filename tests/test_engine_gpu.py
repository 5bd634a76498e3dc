"""Engine integration on an sm_90a GPU: torch.compile, CUDA graphs, drop-in call patterns, FlashInfer
beside us, and DLPack producers other than torch (CuPy).

Every result is checked against the float32 reference (``jit_mla.reference.mla_reference``) with
FlashAttention-3's rule (tests/mla_data.py), on seeded random data whose out-of-bounds parts are
NaN; outputs start NaN. Compiled calls must equal eager calls bitwise (same kernels, same inputs).
"""

from __future__ import annotations

import ctypes
import inspect
import random
import struct
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import error_log
import jit_mla
from mla_data import assert_close_fa3, make_case, poisoned_lse, poisoned_out
from test_guard_bands_gpu import check_case
from test_launcher_args import _capsule_pointer

pytestmark = pytest.mark.requires_sm90a

DEV = "cuda"
MAX_SEQ_LEN = 4096  # a constant host hint, as engines pass it (a changing one recompiles once)


def _workspace(case, sm_count: int | None = None) -> torch.Tensor:
    """The call's workspace, for the device's SMs or (sm_count) a launcher call's own count."""
    total_q = case.query.shape[0] if case.ragged else case.batch * case.query.shape[1]
    size = jit_mla.get_workspace_size(case.batch, case.num_heads, total_q=total_q, sm_count=sm_count)
    return torch.empty(size, dtype=torch.uint8, device=DEV)


def _mixed_case(num_heads: int, seed: int, ragged: bool = True):
    """Eight requests of mixed KV lengths (3 to 4096, page 64); ragged q_len 0-4, else q_len 2."""
    return make_case(8, [1, 3, 0, 2, 4, 1, 2, 3] if ragged else 2, num_heads, 64,
                     [900, 17, 4096, 3, 1200, 64, 65, 2000], ragged=ragged, device=DEV, seed=seed)


def _buffers(case):
    rows = case.query.shape[:-1]
    return poisoned_out(rows + (512,), DEV), poisoned_lse(rows, DEV)


def _call(case, ws, out=None, lse=None, s1=None, s2=1.0, **kw):
    """The public function with FlashInfer's positional arguments, as an engine calls it."""
    return jit_mla.trtllm_batch_decode_with_kv_cache_mla(
        case.query, case.kv_cache, ws, 128, 512, 64, case.block_tables, case.seq_lens, MAX_SEQ_LEN,
        out=out, lse=lse, bmm1_scale=case.bmm1_scale if s1 is None else s1, bmm2_scale=s2,
        cum_seq_lens_q=case.cum_seq_lens_q, max_q_len=case.max_q_len if case.ragged else None,
        return_lse=True, **kw,
    )  # fmt: skip


def _check(case, out, lse, *, bmm2=1.0, sinks=None, label=""):
    torch.cuda.synchronize()
    ref, ref_lse = case.reference(bmm2_scale=bmm2, sinks=sinks)
    ref_lowp, _ = case.reference(bmm2_scale=bmm2, sinks=sinks, low_precision=True)
    stats = assert_close_fa3(out.float(), ref, ref_lowp, name=f"out {label}")
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), f"lse finiteness differs {label}"
    lse_err = float((lse[finite] - ref_lse[finite]).abs().max()) if bool(finite.any()) else 0.0
    assert lse_err < 2e-2, f"lse error {lse_err} {label}"
    error_log.record(label, stats, lse_err)


def _set_lengths(case, new_lens: list[int]) -> None:
    """New seq_lens values in place (never above the case's: pages past them are NaN)."""
    assert all(n <= old for n, old in zip(new_lens, case.kv_lens))
    case.seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
    case.kv_lens = list(new_lens)


def decode_step(query, kv_cache, ws, block_tables, seq_lens, s1, s2, out, lse, cum, max_q_len):
    """A small decode step as an engine compiles it: attention, then a consumer of its output."""
    o, l = jit_mla.trtllm_batch_decode_with_kv_cache_mla(
        query, kv_cache, ws, 128, 512, 64, block_tables, seq_lens, MAX_SEQ_LEN, out=out, lse=lse,
        bmm1_scale=s1, bmm2_scale=s2, cum_seq_lens_q=cum, max_q_len=max_q_len, return_lse=True,
    )  # fmt: skip
    return o, l, o.float() * 2.0  # the consumer must read out after the op wrote it


def _step_args(case, ws, out, lse, s1, s2):
    return (case.query, case.kv_cache, ws, case.block_tables, case.seq_lens, s1, s2, out, lse,
            case.cum_seq_lens_q, case.max_q_len if case.ragged else None)  # fmt: skip


def _scales(case, bmm2=1.0):
    return (torch.tensor([case.bmm1_scale], dtype=torch.float32, device=DEV),
            torch.tensor([bmm2], dtype=torch.float32, device=DEV))  # fmt: skip


# --------------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["uniform", "ragged"])
def test_compiled_step_equals_eager(layout):
    from torch._dynamo.testing import CompileCounterWithBackend

    ragged = layout == "ragged"
    case = _mixed_case(128, seed=11, ragged=ragged)
    ws = _workspace(case)
    s1, s2 = _scales(case, 0.75)
    out_e, lse_e = _buffers(case)
    decode_step(*_step_args(case, ws, out_e, lse_e, s1, s2))

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    step = torch.compile(decode_step, backend=counter, fullgraph=True)
    out_c, lse_c = _buffers(case)
    o, l, doubled = step(*_step_args(case, ws, out_c, lse_c, s1, s2))
    torch.cuda.synchronize()
    assert counter.frame_count == 1
    assert torch.equal(out_c, out_e) and torch.equal(lse_c, lse_e)
    assert torch.equal(o, out_e) and torch.equal(doubled, out_e.float() * 2.0)
    _check(case, out_c, lse_c, bmm2=0.75, label=f"compiled {layout}")


def test_no_recompiles_across_steps_with_new_lengths():
    from torch._dynamo.testing import CompileCounterWithBackend

    case = make_case(16, 1, 64, 64, 2048, device=DEV, seed=12)
    ws = _workspace(case)
    s1, s2 = _scales(case)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    step = torch.compile(decode_step, backend=counter, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i in range(3):
            _set_lengths(case, [2048 - 97 * i - 13 * b for b in range(16)])
            if i == 2:  # a new seq_lens tensor (same shape), as some engines pass
                case.seq_lens = case.seq_lens.clone()
            out, lse = _buffers(case)
            step(*_step_args(case, ws, out, lse, s1, s2))
            _check(case, out, lse, label=f"no-recompile step {i}")
    assert counter.frame_count == 1


def test_reduce_overhead_mode_captures_with_static_workspace():
    # torch.compile's own CUDA graphs: the workspace is a mutated input, so it is marked static
    # (the README's advice); out is allocated inside the graph. No cudagraph skip over 4 steps.
    from torch._dynamo.utils import counters

    case = make_case(8, 1, 128, 64, 1024, device=DEV, seed=13)
    ws = _workspace(case)
    torch._dynamo.mark_static_address(ws)
    s1, s2 = _scales(case)

    def step(query, kv_cache, ws, block_tables, seq_lens, s1, s2):
        return jit_mla.trtllm_batch_decode_with_kv_cache_mla(
            query, kv_cache, ws, 128, 512, 64, block_tables, seq_lens, MAX_SEQ_LEN,
            bmm1_scale=s1, bmm2_scale=s2, return_lse=True)  # fmt: skip

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for i in range(4):
        _set_lengths(case, [1024 - 51 * i - b for b in range(8)])
        out, lse = compiled(case.query, case.kv_cache, ws, case.block_tables, case.seq_lens, s1, s2)
        out, lse = out.clone(), lse.clone()  # cudagraph-owned outputs are reused by the next replay
        _check(case, out, lse, label=f"reduce-overhead step {i}")
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


# --------------------------------------------------------------------------------------------
# CUDA graph capture of a step, replayed with new lengths and scale values
# --------------------------------------------------------------------------------------------


def _replay_with_new_lengths_and_scales(case, fn, label, p_dtype=torch.bfloat16):
    """Capture one call of ``fn`` (decode_step's signature) in a CUDA graph, then replay it twice
    with new seq_lens and new values in the scale tensors; each replay against the reference."""
    ws = _workspace(case)
    s1, s2 = _scales(case)
    out, lse = _buffers(case)
    args = _step_args(case, ws, out, lse, s1, s2)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up outside capture: compile, JIT build, cubin load
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*args)

    base_scale, kv_max = case.bmm1_scale, max(case.kv_lens)
    for i, (scale1, scale2) in enumerate([(1.7, 0.5), (0.6, 2.0)]):
        _set_lengths(case, [kv_max - (41 * (i + 1) * b) % (kv_max - 36) for b in range(case.batch)])
        s1.fill_(base_scale * scale1)
        s2.fill_(scale2)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_case(case, out, lse, bmm1=base_scale * scale1, bmm2=scale2, label=f"{label} {i}", p_dtype=p_dtype)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_cuda_graph_replay_reads_new_lengths_and_tensor_scales(mode):
    case = make_case(16, 2, 128, 64, 1536, device=DEV, seed=14)
    torch._dynamo.reset()
    fn = decode_step if mode == "eager" else torch.compile(decode_step, fullgraph=True)
    _replay_with_new_lengths_and_scales(case, fn, f"graph replay {mode}")


# An fp8 cache (issue 5): the fp8 kernels read the scale tensors at run time too (the dequant
# scales folded into them). H 16 q_len 2 runs the narrow fp8 kernels (32-row units), H 128 the
# wide ones (64-row units); both query types.
@pytest.mark.parametrize("q8", [False, True], ids=["q-bf16", "q-e4m3"])
@pytest.mark.parametrize("H", [16, 128])
def test_fp8_cuda_graph_replay_reads_new_lengths_and_tensor_scales(H, q8):
    q_dtype = torch.float8_e4m3fn if q8 else torch.bfloat16
    case = make_case(16, 2, H, 64, 1536, dtype=torch.float8_e4m3fn, q_dtype=q_dtype, device=DEV, seed=15 + H)
    _replay_with_new_lengths_and_scales(case, decode_step, f"fp8 graph replay H{H} q8={q8}",
                                        p_dtype=torch.float8_e4m3fn if q8 else torch.bfloat16)


# --------------------------------------------------------------------------------------------
# Drop-in call patterns
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compiled", [False, True])
def test_4d_pool_view_into_a_preallocated_out(compiled):
    # vLLM/SGLang: the layer's cache is [pages, 1, page, 576], a strided view into the whole
    # pool; the output buffer is the engine's; float scales (graph constants when compiled).
    rng = random.Random(15)
    case = make_case(32, 1, 128, 64, [rng.randint(1, 3000) for _ in range(32)],
                     cache_4d=True, pool_padding=8, device=DEV, seed=15)  # fmt: skip
    assert case.kv_cache.dim() == 4 and case.kv_cache.data_ptr() != case.pool.data_ptr()
    ws = _workspace(case)
    out, lse = _buffers(case)
    torch._dynamo.reset()
    fn = torch.compile(decode_step, fullgraph=True) if compiled else decode_step
    o, l, _ = fn(*_step_args(case, ws, out, lse, case.bmm1_scale, 1.0))
    if not compiled:
        assert o is out and l is lse
    _check(case, out, lse, label=f"4-D pool view, compiled={compiled}")


@pytest.mark.parametrize("q_len", [2, 4])
def test_mtp_verify_uniform_q_len(q_len):
    case = make_case(24, q_len, 128, 64, [q_len + 37 * b for b in range(24)], device=DEV, seed=16)
    ws = _workspace(case)
    out, lse = _buffers(case)
    _call(case, ws, out, lse)
    _check(case, out, lse, label=f"MTP q_len {q_len}")


def test_ragged_draft_lengths_with_max_q_len_do_not_sync():
    q_lens = [1, 4, 0, 2, 3, 1, 4, 2]
    case = make_case(8, q_lens, 128, 64, [500, 1000, 7, 64, 65, 3000, 4, 1500], ragged=True, device=DEV, seed=17)
    ws = _workspace(case)
    out, lse = _buffers(case)
    _call(case, ws, out, lse)  # warm-up (launcher, cubin, SM count)
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    torch.cuda.set_sync_debug_mode("error")
    try:
        _call(case, ws, out, lse)  # max_q_len given: no device-to-host copy
        with pytest.raises(RuntimeError, match="synchroniz"):
            # the detector works: without max_q_len the prefix sums are copied to the host
            jit_mla.trtllm_batch_decode_with_kv_cache_mla(
                case.query, case.kv_cache, ws, 128, 512, 64, case.block_tables, case.seq_lens,
                MAX_SEQ_LEN, bmm1_scale=case.bmm1_scale, cum_seq_lens_q=case.cum_seq_lens_q)  # fmt: skip
    finally:
        torch.cuda.set_sync_debug_mode(0)
    _check(case, out, lse, label="ragged drafts, no sync")


# --------------------------------------------------------------------------------------------
# FlashInfer beside us (where it is installed)
# --------------------------------------------------------------------------------------------


def test_signature_is_flashinfers():
    # An engine switches its import: FlashInfer's positional parameters and, up to the first
    # keyword we lack, its parameter order must be ours. Keywords newer FlashInfers added
    # (e.g. cute_dsl_impl, kv_scale_format) are listed as a warning, not a failure.
    flashinfer = pytest.importorskip("flashinfer")
    fi_fn = None
    for module in ("flashinfer.decode", "flashinfer.mla"):
        fi_fn = fi_fn or getattr(pytest.importorskip(module), "trtllm_batch_decode_with_kv_cache_mla", None)
    if fi_fn is None:
        pytest.skip("this FlashInfer has no trtllm_batch_decode_with_kv_cache_mla")
    theirs = list(inspect.signature(fi_fn).parameters)
    ours = list(inspect.signature(jit_mla.trtllm_batch_decode_with_kv_cache_mla).parameters)
    missing = [n for n in theirs if n not in ours]
    shared = len(theirs) if not missing else theirs.index(missing[0])
    assert ours[:shared] == theirs[:shared], f"parameter order differs from FlashInfer's: {theirs}"
    if missing:
        version = getattr(flashinfer, "__version__", "?")
        warnings.warn(f"FlashInfer {version} keywords jit_mla does not accept: {missing}")


def _flashinfer_run(fi_mla, case, sm_scale: float) -> torch.Tensor:
    """FlashInfer's BatchMLAPagedAttentionWrapper(backend="fa3") on the case (as bench_mla.py)."""
    page = case.page_size
    pages = [-(-L // page) for L in case.kv_lens]
    kv_indptr = torch.tensor([0] + pages, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    table = case.block_tables.cpu()
    kv_indices = torch.cat([table[b, :n] for b, n in enumerate(pages)]).to(torch.int32)
    qo_indptr = torch.tensor([0] + case.q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    kv_len_arr = torch.tensor(case.kv_lens, dtype=torch.int32)
    fi_ws = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
    wrapper = fi_mla.BatchMLAPagedAttentionWrapper(fi_ws, backend="fa3")
    common = dict(num_heads=case.num_heads, head_dim_ckv=512, head_dim_kpe=64, page_size=page,
                  causal=case.max_q_len > 1, sm_scale=sm_scale, q_data_type=torch.bfloat16,
                  kv_data_type=torch.bfloat16)  # fmt: skip
    csr = (qo_indptr, kv_indptr, kv_indices, kv_len_arr)  # host tensors, as bench_mla.py plans
    structural = hasattr(fi_mla, "MLAPlanMetadata")  # 0.7: metadata object + query=/kv_cache=
    if structural:
        wrapper.plan(metadata=fi_mla.MLAPlanMetadata.csr(*csr), query_layout="split",
                     kv_cache_layout="split", **common)  # fmt: skip
    else:
        wrapper.plan(qo_indptr=csr[0], kv_indptr=csr[1], kv_indices=csr[2], kv_len_arr=csr[3], **common)
    q = case.query.reshape(-1, case.num_heads, 576)
    kv = case.kv_cache.reshape(case.kv_cache.shape[0], page, 576) if case.kv_cache.dim() == 4 else case.kv_cache
    out = poisoned_out((q.shape[0], case.num_heads, 512), DEV)
    if structural:
        wrapper.run(query=(q[..., :512], q[..., 512:]), kv_cache=(kv[..., :512], kv[..., 512:]), out=out)
    else:
        wrapper.run(q_nope=q[..., :512], q_pe=q[..., 512:], ckv_cache=kv[..., :512], kpe_cache=kv[..., 512:], out=out)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize(
    "batch,q_lens,heads",
    [(16, 1, 128), (16, 2, 128), (8, [1, 3, 2, 4, 1, 1, 2, 3], 64)],
    ids=["decode", "mtp2", "ragged"],
)
def test_matches_flashinfer_fa3_wrapper(batch, q_lens, heads):
    fi_mla = pytest.importorskip("flashinfer.mla")
    ragged = not isinstance(q_lens, int)
    kv_lens = [max(q_lens if isinstance(q_lens, int) else q_lens[b], 1) + 173 * b for b in range(batch)]
    case = make_case(batch, q_lens, heads, 64, kv_lens, ragged=ragged, device=DEV, seed=18)
    ws = _workspace(case)
    out, lse = _buffers(case)
    _call(case, ws, out, lse)
    _check(case, out, lse, label=f"vs FlashInfer {q_lens}")
    try:
        fi_out = _flashinfer_run(fi_mla, case, case.bmm1_scale)
    except Exception as e:  # a planner or build refusal on this card: nothing to compare
        pytest.skip(f"FlashInfer fa3 MLA wrapper did not run here: {type(e).__name__}: {e}")
    ours = out.reshape(fi_out.shape).float()
    ref, _ = case.reference()
    ref_lowp, _ = case.reference(low_precision=True)
    assert_close_fa3(fi_out.float(), ref.reshape(fi_out.shape), ref_lowp.reshape(fi_out.shape), name="FlashInfer")
    rel = float((ours - fi_out.float()).norm() / fi_out.float().norm())
    assert rel < 1e-2, f"ours vs FlashInfer fa3: relative difference {rel:.3e}"


# --------------------------------------------------------------------------------------------
# DLPack: the launcher called with CuPy arrays
# --------------------------------------------------------------------------------------------

# A legacy capsule holds a DLManagedTensor, which starts with DLTensor
# {void* data; DLDevice {int32 type, id}; int32 ndim; DLDataType {uint8 code, bits; uint16 lanes}}.
_DTYPE_CODE_OFFSET = struct.calcsize("P") + 8 + 4
_KDL_BFLOAT = 4


class Bf16Array:
    """A CuPy uint16 array handed over DLPack as bfloat16 (CuPy has no bfloat16 dtype): the same
    memory, only the capsule's dtype code is rewritten."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        capsule = self.arr.__dlpack__(**kwargs) if kwargs else self.arr.__dlpack__()
        ptr = _capsule_pointer(capsule, b"dltensor")
        ctypes.c_uint8.from_address(ptr + _DTYPE_CODE_OFFSET).value = _KDL_BFLOAT
        return capsule


def _record_launcher_args(monkeypatch, case, ws, out, lse, s1, s2) -> tuple:
    """The launcher arguments (its mla_decode entry) the public function hands over for this call."""
    from jit_mla import api

    recorded = []

    class Recorder:
        def mla_decode(self, *args):
            recorded.append(args)

    with monkeypatch.context() as m:
        m.setattr(api, "get_launcher", lambda: Recorder())
        _call(case, ws, out, lse, s1=s1, s2=s2, sinks=case.sinks)
    return recorded[0]


def _to_cupy(cp, args: tuple) -> tuple:
    """Each torch tensor argument as an independent CuPy copy (one copy per distinct tensor)."""
    copies: dict[int, object] = {}

    def convert(t):
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) not in copies:
            if t.dtype == torch.bfloat16:
                copies[id(t)] = Bf16Array(cp.asarray(t.view(torch.int16)).view(cp.uint16).copy())
            else:
                copies[id(t)] = cp.asarray(t).copy()
        return copies[id(t)]

    return tuple(convert(a) for a in args)


def _from_cupy(cp, a, like: torch.Tensor) -> torch.Tensor:
    arr = a.arr if isinstance(a, Bf16Array) else a
    host = torch.from_numpy(cp.asnumpy(arr).view("int16" if like.dtype == torch.bfloat16 else arr.dtype))
    return host.view(like.dtype) if like.dtype == torch.bfloat16 else host


@pytest.mark.parametrize("layout", ["uniform", "ragged"])
def test_launcher_takes_cupy_arrays(monkeypatch, layout):
    cp = pytest.importorskip("cupy")
    import tvm_ffi

    from jit_mla.launcher import get_launcher

    ragged = layout == "ragged"
    case = _mixed_case(64, seed=19, ragged=ragged)
    ws = _workspace(case)
    out, lse = _buffers(case)
    s1, s2 = _scales(case, 0.5)
    args = _record_launcher_args(monkeypatch, case, ws, out, lse, s1, s2)
    launcher = get_launcher()

    launcher.mla_decode(*args)  # torch tensors: torch's current stream
    torch.cuda.synchronize()
    _check(case, out, lse, bmm2=0.5, sinks=case.sinks, label=f"torch args {layout}")

    # CuPy arrays go through __dlpack__; tvm-ffi takes the stream only from torch tensors, so a
    # call with no torch tensor runs on the tvm-ffi environment stream: the legacy default stream
    # (0) unless set with tvm_ffi.use_raw_stream. Both ways, with a sync around the call.
    dev = tvm_ffi.device(f"cuda:{torch.cuda.current_device()}")
    assert tvm_ffi.get_raw_stream(dev) == 0
    for how in ("default stream", "use_raw_stream"):
        cargs = _to_cupy(cp, args)
        cargs[0].arr.fill(0x7FC0)  # bf16 NaN bits: the CuPy call must write every element
        cargs[1].fill(cp.nan)
        cp.cuda.Device().synchronize()
        if how == "default stream":
            launcher.mla_decode(*cargs)
            cp.cuda.Device().synchronize()
        else:
            # The CuPy stream made current too: a CuPy that exports DLPack's C exchange API
            # hands tvm-ffi its current stream, one without it leaves the environment stream.
            stream = cp.cuda.Stream(non_blocking=True)
            with stream, tvm_ffi.use_raw_stream(dev, stream.ptr):
                launcher.mla_decode(*cargs)
            stream.synchronize()
        c_out = _from_cupy(cp, cargs[0], out)
        c_lse = _from_cupy(cp, cargs[1], lse)
        assert torch.equal(c_out, out.cpu()), f"CuPy out differs from torch out ({how})"
        assert torch.equal(c_lse, lse.cpu()), f"CuPy lse differs from torch lse ({how})"


# --------------------------------------------------------------------------------------------
# sm_count: the kernel runs one CTA per SM, all resident at once (cooperative launch)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sm_count", [1, 7, 4096])
def test_launcher_sm_count_fewer_or_more_than_the_device(monkeypatch, sm_count):
    """Fewer CTAs than SMs (SMs left to other streams) and more than the device has (clamped to
    its SM count, so the cooperative launch fits; the workspace is sized for the caller's value)."""
    from jit_mla.launcher import get_launcher

    case = _mixed_case(64, seed=23)
    out, lse = _buffers(case)
    s1, s2 = _scales(case, 0.5)
    args = list(_record_launcher_args(monkeypatch, case, _workspace(case), out, lse, s1, s2))
    args[4] = _workspace(case, sm_count)  # workspace_buffer
    args[13] = sm_count
    get_launcher().mla_decode(*args)
    _check(case, out, lse, bmm2=0.5, sinks=case.sinks, label=f"sm_count {sm_count}")


@pytest.mark.parametrize("ragged", [False, True], ids=["q2", "ragged"])
def test_seesaw_twins_by_the_kv_hint(monkeypatch, ragged):
    """max_seq_len (the launcher's max_kv_len, last) picks between the seesaw (its steady pair
    body compiled in) and its _short twin (the general body alone) by the KV blocks per CTA it
    estimates; both match the reference, and each other bitwise (results never depend on the
    hint). Eight H128 requests of mixed lengths on a table of 64 pages, q_len 2 on 4 CTAs
    (_short: at most 64 blocks) or ragged q_len 0-4 on 8 (128): a hint of 1 estimates one block
    per unit (32 or 64), a wide one the table's 64 per unit (2048 or 4096)."""
    from jit_mla import cli
    from jit_mla.launcher import get_launcher

    case = _mixed_case(128, seed=29, ragged=ragged)
    ctas = 8 if ragged else 4
    s1, s2 = _scales(case, 0.5)
    width = case.block_tables.shape[1] * 64
    rows = (case.max_q_len if ragged else 2) * 128
    args = list(_record_launcher_args(monkeypatch, case, _workspace(case), *_buffers(case), s1, s2))
    args[4] = _workspace(case, ctas)  # workspace_buffer
    args[13] = ctas  # sm_count
    results = []
    for kv_hint, name in ((1, "mla_sm90_attention_short"), (1 << 20, "mla_sm90_attention (TMA)")):
        kernel = cli.attention_kernel(64, rows, ctas=ctas, batch=case.batch, kv_len=min(kv_hint, width))
        assert kernel.startswith(name), kernel
        out, lse = _buffers(case)  # fresh poisoned outputs for each twin
        args[0], args[1], args[15] = out, lse, kv_hint  # out, lse, max_kv_len
        get_launcher().mla_decode(*args)
        _check(case, out, lse, bmm2=0.5, sinks=case.sinks, label=f"kv hint {kv_hint}: {kernel}")
        results.append((out, lse))
    (a, la), (b, lb) = results
    assert torch.equal(a, b) and torch.equal(la, lb), "the two seesaw twins differ"


# Calls on two streams at once, beside a third stream busy with matmuls (two-batch overlap in an
# engine). The launch is cooperative: a grid waits until all its CTAs fit, so the two streams'
# calls serialize on the SMs instead of interleaving. Run in a child process with a timeout, so a
# hang fails the test instead of stalling the suite.
_TWO_STREAMS = textwrap.dedent("""
    import torch, jit_mla
    from mla_data import make_case
    torch.manual_seed(0)
    cases = [make_case(8, [1, 3, 0, 2, 4, 1, 2, 3], 128, 64, [900, 17, 4096, 3, 1200, 64, 65, 2000],
                       ragged=True, device="cuda", seed=s) for s in (31, 32)]
    def call(case, ws):
        return jit_mla.trtllm_batch_decode_with_kv_cache_mla(
            case.query, case.kv_cache, ws, 128, 512, 64, case.block_tables, case.seq_lens, 4096,
            bmm1_scale=case.bmm1_scale, cum_seq_lens_q=case.cum_seq_lens_q, max_q_len=case.max_q_len)
    ws = [torch.empty(jit_mla.get_workspace_size(8, 128, total_q=c.query.shape[0]), dtype=torch.uint8,
                      device="cuda") for c in cases]
    want = [call(c, w) for c, w in zip(cases, ws)]  # one stream: the reference outputs
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in range(3)]
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    got = [[], []]
    for _ in range(20):
        with torch.cuda.stream(streams[2]):
            for _ in range(4):
                a = (a @ a).clamp_(-1, 1)
        for i in range(2):
            with torch.cuda.stream(streams[i]):
                got[i].append(call(cases[i], ws[i]))
    torch.cuda.synchronize()
    for i in range(2):
        assert all(torch.equal(g, want[i]) for g in got[i]), f"stream {i}: outputs differ"
    print("two streams ok")
""")


def test_two_streams_at_once_beside_a_busy_stream():
    tests_dir = str(Path(__file__).resolve().parent)
    run = subprocess.run([sys.executable, "-c", _TWO_STREAMS], capture_output=True, text=True,
                         timeout=300, cwd=tests_dir)
    assert run.returncode == 0 and "two streams ok" in run.stdout, run.stdout + run.stderr

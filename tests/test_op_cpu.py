"""The registered op ``torch.ops.jit_mla.mla_decode`` (jit_mla/op.py), on the CPU.

What runs here without a GPU: the schema and its declared mutations; the fake kernel (also the
Meta kernel) under ``torch.library.opcheck`` and ``FakeTensorMode`` with fake CUDA tensors;
``torch.compile(fullgraph=True)`` through the public function over meta tensors (the compiled
graph runs end to end: its op node dispatches to the Meta kernel); what recompiles and what does
not; and that the eager path and the op's kernel hand the launcher the same arguments (the
launcher replaced by a recorder); and what ``python -m jit_mla info``/``run`` say about the next
call. The numerics of compiled and graph-captured calls are in tests/test_engine_gpu.py.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode

import jit_mla
from jit_mla import api, op
from mla_data import SM_SCALE

# Inductor's import of torch.jit warns; not ours.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.jit._script")

B, H, PAGES, PAGE, MAX_PAGES = 3, 16, 8, 64, 4
Q_LEN = 2  # uniform layout: [B, Q_LEN, H, 576] (MTP verify)
RAGGED_CUM = [0, 2, 2, 5]  # ragged layout: request 1 has no query tokens
TOTAL_Q = RAGGED_CUM[-1]
WS_BYTES = 1 << 20  # any size: nothing here reaches the launcher's size check
BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32

LAYOUTS = ("uniform", "ragged")


def _tensor(shape, dtype, device, gen):
    if device != "cpu":  # meta, or fake CUDA under FakeTensorMode: metadata only
        return torch.empty(shape, dtype=dtype, device=device)
    if dtype == I32:
        return torch.randint(0, PAGES, shape, generator=gen, dtype=I32).to(device)
    return torch.randn(shape, generator=gen).to(dtype).to(device)


def make_inputs(device="meta", *, ragged=False, seed=0) -> dict:
    """The public function's tensors for a small call (seeded random on real devices)."""
    g = torch.Generator().manual_seed(seed)
    rows = (TOTAL_Q,) if ragged else (B, Q_LEN)
    d = {
        "query": _tensor(rows + (H, 576), BF16, device, g),  # [B, q, H, 576] or [total_q, H, 576]
        "kv_cache": _tensor((PAGES, PAGE, 576), BF16, device, g),
        "workspace_buffer": torch.empty(WS_BYTES, dtype=torch.uint8, device=device),
        "block_tables": _tensor((B, MAX_PAGES), I32, device, g),
        "seq_lens": _tensor((B,), I32, device, g),
    }
    if not ragged:
        d["cum_seq_lens_q"] = None
    elif device == "cpu":
        d["cum_seq_lens_q"] = torch.tensor(RAGGED_CUM, dtype=I32)
    else:
        d["cum_seq_lens_q"] = torch.empty(B + 1, dtype=I32, device=device)
    d["max_q_len"] = max(b - a for a, b in zip(RAGGED_CUM, RAGGED_CUM[1:])) if ragged else None
    return d


def call_api(d: dict, **kw):
    """The public function with FlashInfer's positional arguments, as an engine calls it."""
    return jit_mla.trtllm_batch_decode_with_kv_cache_mla(
        d["query"], d["kv_cache"], d["workspace_buffer"], 128, 512, 64, d["block_tables"],
        d["seq_lens"], kw.pop("max_seq_len", 4096), cum_seq_lens_q=d["cum_seq_lens_q"],
        max_q_len=d["max_q_len"], **kw,
    )  # fmt: skip


def op_args(device="meta", *, ragged=False, with_lse=True, tensor_scales=False):
    """Positional arguments of torch.ops.jit_mla.mla_decode for make_inputs(...)."""
    d = make_inputs(device, ragged=ragged)
    rows = tuple(d["query"].shape[:-1])
    out = torch.empty(rows + (512,), dtype=BF16, device=device)
    lse = torch.empty(rows, dtype=F32, device=device) if with_lse else None
    s1 = torch.full((1,), SM_SCALE, dtype=F32, device=device) if tensor_scales else None
    s2 = torch.full((1,), 0.5, dtype=F32, device=device) if tensor_scales else None
    max_q_len = d["max_q_len"] if ragged else Q_LEN
    return (
        out, lse, d["query"], d["kv_cache"], d["workspace_buffer"], d["block_tables"], d["seq_lens"],
        B, max_q_len, 4096, SM_SCALE, 0.5, s1, s2, None, d["cum_seq_lens_q"], None,
    )  # fmt: skip


def compiled(fn, backend="eager"):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    return torch.compile(fn, backend=counter, fullgraph=True), counter


def op_nodes(counter) -> list:
    return [
        n
        for g in counter.graphs
        for n in g.graph.nodes
        if n.op == "call_function" and "jit_mla.mla_decode" in str(n.target)
    ]


# --------------------------------------------------------------------------------------------
# Registration and the fake kernel
# --------------------------------------------------------------------------------------------


def test_op_is_registered_with_its_mutations_and_a_meta_kernel():
    schema = torch.ops.jit_mla.mla_decode.default._schema
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == {"out", "lse", "workspace_buffer"}
    assert len(schema.returns) == 0
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op.OP_NAME, "Meta")
    assert (op._D_V, op._D_QK) == (api.KV_LORA_RANK, api.HEAD_DIM_QK)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("with_lse", [True, False])
@pytest.mark.parametrize("tensor_scales", [False, True])
def test_opcheck_on_meta_tensors(layout, with_lse, tensor_scales):
    # schema (declared mutations), autograd registration, fake tensor and AOT dispatch checks
    args = op_args(ragged=layout == "ragged", with_lse=with_lse, tensor_scales=tensor_scales)
    result = torch.library.opcheck(torch.ops.jit_mla.mla_decode.default, args)
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("with_lse", [True, False])
def test_fake_kernel_accepts_right_buffers_on_fake_cuda_tensors(layout, with_lse):
    with FakeTensorMode():
        args = op_args("cuda", ragged=layout == "ragged", with_lse=with_lse, tensor_scales=True)
        assert args[2].device.type == "cuda"
        torch.ops.jit_mla.mla_decode(*args)  # nothing to return; no error


@pytest.mark.parametrize(
    "index,replacement,kind,message",
    [
        (0, lambda a: torch.empty(a[0].shape[:-1] + (576,), dtype=BF16, device="cuda"), ValueError,
         r"out must be bfloat16 \[3, 2, 16, 512\], got bfloat16 \[3, 2, 16, 576\]"),
        (0, lambda a: torch.empty(a[0].shape, dtype=F32, device="cuda"), TypeError,
         r"out must be bfloat16 \[3, 2, 16, 512\], got float32 \[3, 2, 16, 512\]"),
        (1, lambda a: torch.empty(a[1].shape + (1,), dtype=F32, device="cuda"), ValueError,
         r"lse must be float32 \[3, 2, 16\], got float32 \[3, 2, 16, 1\]"),
        (1, lambda a: torch.empty(a[1].shape, dtype=BF16, device="cuda"), TypeError,
         r"lse must be float32 \[3, 2, 16\], got bfloat16"),
        (2, lambda a: torch.empty(a[2].shape[:-1] + (512,), dtype=BF16, device="cuda"), ValueError,
         r"query must be \[B, q_len, H, 576\] or \[total_q, H, 576\], got bfloat16 \[3, 2, 16, 512\]"),
    ],
)  # fmt: skip
def test_fake_kernel_names_wrong_buffers(index, replacement, kind, message):
    with FakeTensorMode():
        args = list(op_args("cuda"))
        args[index] = replacement(args)
        with pytest.raises(kind, match=message):
            torch.ops.jit_mla.mla_decode(*args)


# --------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True) through the public function
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("with_lse", [True, False])
def test_compile_fullgraph_traces_the_op_with_the_right_shapes(backend, layout, with_lse):
    d = make_inputs(ragged=layout == "ragged")
    fn, counter = compiled(lambda d: call_api(d, bmm1_scale=SM_SCALE, return_lse=with_lse), backend)
    result = fn(d)
    out, lse = result if with_lse else (result, None)
    rows = (TOTAL_Q,) if layout == "ragged" else (B, Q_LEN)
    assert (tuple(out.shape), out.dtype) == (rows + (H, 512), BF16)
    if with_lse:
        assert (tuple(lse.shape), lse.dtype) == (rows + (H,), F32)
    assert counter.frame_count == 1
    assert len(op_nodes(counter)) == 1  # one node, no graph break


def test_compile_with_preallocated_out_lse_sinks_and_a_4d_pool_view():
    d = make_inputs()
    pool = torch.empty(PAGES + 4, 1, PAGE + 8, 576, dtype=BF16, device="meta")
    d["kv_cache"] = pool[2 : 2 + PAGES, :, :PAGE]  # [pages, 1, page, 576], a strided view
    out = torch.empty(B, Q_LEN, H, 512, dtype=BF16, device="meta")
    lse = torch.empty(B, Q_LEN, H, dtype=F32, device="meta")
    sinks = torch.empty(H, dtype=F32, device="meta")
    fn, counter = compiled(lambda d, o, l, s: call_api(d, out=o, lse=l, sinks=[s], return_lse=True))
    o, l = fn(d, out, lse, sinks)
    assert o.shape == out.shape and l.shape == lse.shape
    assert counter.frame_count == 1 and len(op_nodes(counter)) == 1


def test_new_lengths_tables_and_tensor_scales_do_not_recompile():
    fn, counter = compiled(lambda d, s1, s2: call_api(d, bmm1_scale=s1, bmm2_scale=s2, return_lse=True))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in range(3):
            d = make_inputs(seed=step)  # new seq_lens / block_tables tensors every step
            s1, s2 = torch.empty(1, dtype=F32, device="meta"), torch.empty(1, dtype=F32, device="meta")
            fn(d, s1, s2)
    assert counter.frame_count == 1


def test_a_float_scale_is_a_graph_constant():
    # Documented in jit_mla/op.py: the same float never recompiles, a new value does (the float
    # reaches the op as a float argument, so Dynamo guards on it); a changing scale belongs in a
    # one-element CUDA tensor.
    fn, counter = compiled(lambda d, s: call_api(d, bmm1_scale=s))
    d = make_inputs()
    fn(d, SM_SCALE)
    fn(d, SM_SCALE)
    assert counter.frame_count == 1
    fn(d, SM_SCALE * 2)
    assert counter.frame_count == 2


def test_a_changing_host_int_recompiles_once():
    # max_seq_len (a host hint) or a ragged max_q_len: the first new value makes it a symbolic
    # int (automatic dynamic); later values reuse that graph.
    fn, counter = compiled(lambda d, m: call_api(d, max_seq_len=m))
    d = make_inputs()
    for max_seq_len in (4096, 5000, 6000, 7000):
        fn(d, max_seq_len)
    assert counter.frame_count == 2


def test_ragged_without_max_q_len_does_not_trace():
    # Validating cum_seq_lens_q on the host needs a device-to-host copy and a data-dependent
    # branch: under fullgraph that is an error (Dynamo's, naming _validate_cum_seq_lens_q);
    # jit_mla/op.py and the README say to pass max_q_len when compiling.
    d = make_inputs(ragged=True)
    d["max_q_len"] = None
    fn, _ = compiled(call_api)
    with pytest.raises(torch._dynamo.exc.TorchDynamoException, match="data-dependent|Data-dependent"):
        fn(d)


def test_export_records_the_op():
    class Step(torch.nn.Module):
        def forward(self, query, kv_cache, workspace, block_tables, seq_lens, s1):
            return jit_mla.trtllm_batch_decode_with_kv_cache_mla(
                query, kv_cache, workspace, 128, 512, 64, block_tables, seq_lens, 4096,
                bmm1_scale=s1, return_lse=True)  # fmt: skip

    d = make_inputs()
    args = (d["query"], d["kv_cache"], d["workspace_buffer"], d["block_tables"], d["seq_lens"],
            torch.empty(1, dtype=F32, device="meta"))  # fmt: skip
    ep = torch.export.export(Step(), args)
    [node] = [n for n in ep.graph.nodes if n.target == torch.ops.jit_mla.mla_decode.default]
    assert node.args[12].name == "s1"  # the tensor scale, read on the device


# --------------------------------------------------------------------------------------------
# Both paths end in the same launcher call
# --------------------------------------------------------------------------------------------


class Recorder:
    """Stands in for the launcher module: records each call's arguments and its Python caller."""

    def __init__(self):
        self.calls = []

    def mla_decode(self, *args):
        caller = inspect.stack()[2]  # [0] this method, [1] api._launch, [2] who called _launch
        self.calls.append((args, f"{caller.filename}:{caller.function}"))


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(api, "get_launcher", lambda: rec)
    return rec


def _same_arguments(a: tuple, b: tuple) -> None:
    assert len(a) == len(b) == 16
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor), f"argument {i}"
            assert (x.data_ptr(), x.shape, x.stride(), x.dtype) == (y.data_ptr(), y.shape, y.stride(), y.dtype), f"argument {i}"
        else:
            assert type(x) is type(y) and x == y, f"argument {i}: {x!r} != {y!r}"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tensor_scales", [False, True])
def test_eager_and_compiled_calls_hand_the_launcher_the_same_arguments(recorder, layout, tensor_scales):
    d = make_inputs("cpu", ragged=layout == "ragged")
    rows = tuple(d["query"].shape[:-1])
    out, lse = torch.empty(rows + (512,), dtype=BF16), torch.empty(rows, dtype=F32)
    sinks = torch.randn(H)
    s1, s2 = (torch.tensor([SM_SCALE]), torch.tensor([0.5])) if tensor_scales else (SM_SCALE, 0.5)

    def step(d, out, lse, sinks, s1, s2):
        return call_api(d, out=out, lse=lse, sinks=sinks, bmm1_scale=s1, bmm2_scale=s2, enable_pdl=False)

    step(d, out, lse, sinks, s1, s2)  # eager: straight to the launcher
    fn, counter = compiled(step)
    fn(d, out, lse, sinks, s1, s2)  # compiled: the graph's op node runs the op's kernel
    (eager_args, eager_caller), (op_args_, op_caller) = recorder.calls
    assert eager_caller.endswith("api.py:trtllm_batch_decode_with_kv_cache_mla")  # no dispatcher
    assert op_caller.endswith("op.py:mla_decode")
    assert len(op_nodes(counter)) == 1
    _same_arguments(eager_args, op_args_)


def test_calling_the_op_directly_reaches_the_launcher(recorder):
    args = op_args("cpu", tensor_scales=True)
    torch.ops.jit_mla.mla_decode(*args)
    (launched, caller), = recorder.calls
    assert caller.endswith("op.py:mla_decode")
    assert launched[0] is args[0] or launched[0].data_ptr() == args[0].data_ptr()  # out
    assert launched[9].data_ptr() == args[12].data_ptr()  # bmm1: the tensor scale wins over the float


def _cpp_compiler() -> bool:
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return bool(get_cpp_compiler())
    except Exception:  # no compiler, or an Inductor without this helper
        return False


@pytest.mark.skipif(not _cpp_compiler(), reason="Inductor's CPU backend needs a C++ compiler")
def test_inductor_hands_the_launcher_the_callers_buffers(recorder):
    # out, lse and the workspace are declared mutated; Inductor re-inplaces the op, so the
    # launcher writes the caller's buffers (no clones, no copies back) and the consumer of out
    # reads it after the op.
    d = make_inputs("cpu")
    out, lse = torch.empty(B, Q_LEN, H, 512, dtype=BF16), torch.empty(B, Q_LEN, H, dtype=F32)
    s1 = torch.tensor([SM_SCALE])

    def step(d, out, lse, s1):
        o, l = call_api(d, out=out, lse=lse, bmm1_scale=s1, return_lse=True)
        return o.float() * 2.0, l

    torch._dynamo.reset()
    torch.compile(step, fullgraph=True)(d, out, lse, s1)
    (launched, caller), = recorder.calls
    assert caller.endswith("op.py:mla_decode")
    assert launched[0].data_ptr() == out.data_ptr()
    assert launched[1].data_ptr() == lse.data_ptr()
    assert launched[4].data_ptr() == d["workspace_buffer"].data_ptr()
    assert launched[9].data_ptr() == s1.data_ptr()


# --------------------------------------------------------------------------------------------
# What `python -m jit_mla` says about the next call
# --------------------------------------------------------------------------------------------


def test_kernel_choice_follows_the_launchers_page_size_rule():
    from jit_mla import cli

    for page in (8, 16, 32, 64, 128, 192, 256):
        assert cli.attention_kernel(page) == "mla_sm90_attention (TMA)", page
    for page in (1, 2, 4, 24, 48, 100, 96):
        assert cli.attention_kernel(page) == "mla_sm90_attention_any_page (cp.async)", page
    assert cli.attention_kernel(64, 16) == "mla_sm90_attention_narrow16 (TMA, transposed tiles)"
    # bf16 at 17-32 rows (H16 MTP 2): the 64-row seesaw, faster there than a 32-row narrow kernel
    assert cli.attention_kernel(32, 32) == "mla_sm90_attention (TMA)"
    assert cli.attention_kernel(64, 17) == "mla_sm90_attention (TMA)"
    assert cli.attention_kernel(64, 32, batch=8, kv_len=4096).startswith("mla_sm90_attention_short (TMA")
    assert cli.attention_kernel(64, 33) == "mla_sm90_attention (TMA)"
    assert cli.attention_kernel(64, 0) == "mla_sm90_attention (TMA)"  # ragged, no max_q_len
    assert cli.attention_kernel(24, 16) == "mla_sm90_attention_any_page (cp.async)"
    # a request with more rows than the grid holds at once (chunked prefill): the _reread twin
    assert cli.attention_kernel(64, 2048 * 128).startswith("mla_sm90_attention_reread (TMA")
    assert cli.attention_kernel(64, 132 * 64) == "mla_sm90_attention (TMA)"
    assert cli.attention_kernel(64, 3 * 128, ctas=5).startswith("mla_sm90_attention_reread (TMA")
    assert cli.attention_kernel(24, 2048 * 128) == "mla_sm90_attention_any_page (cp.async)"
    # at most 16 KV blocks per CTA (B8 kv4096 H128: 8 x 2 units x 64 blocks on 132): the _short twin
    assert cli.attention_kernel(64, 128, batch=8, kv_len=4096).startswith("mla_sm90_attention_short (TMA")
    assert cli.attention_kernel(64, 128, batch=1, kv_len=65536).startswith("mla_sm90_attention_short (TMA")
    assert cli.attention_kernel(64, 128, batch=32, kv_len=4096) == "mla_sm90_attention (TMA)"
    assert cli.attention_kernel(64, 128, batch=0, kv_len=4096) == "mla_sm90_attention (TMA)"  # batch unknown
    assert cli.attention_kernel(64, 0, batch=8, kv_len=4096) == "mla_sm90_attention (TMA)"  # no max_q_len
    assert cli.attention_kernel(64, 16, fp8=True).startswith("mla_sm90_attention_narrow16_fp8 ")
    assert cli.attention_kernel(16, 32, fp8=True).startswith("mla_sm90_attention_narrow32_fp8 ")
    assert cli.attention_kernel(24, 16, fp8=True).startswith("mla_sm90_attention_narrow16_fp8_any (cp.async")
    assert cli.attention_kernel(1, 32, fp8=True).startswith("mla_sm90_attention_narrow32_fp8_any (cp.async")
    # fp8 (bf16 query) beyond 32 rows (H 128, MTP) with TMA pages: the wide kernel (64-row units);
    # without a max_q_len or with other pages: 32-row units
    assert cli.attention_kernel(64, 128, fp8=True).startswith("mla_sm90_attention_wide_fp8 (TMA")
    assert cli.attention_kernel(16, 33, fp8=True).startswith("mla_sm90_attention_wide_fp8 (TMA")
    assert cli.attention_kernel(64, 0, fp8=True).startswith("mla_sm90_attention_narrow32_fp8 ")
    assert cli.attention_kernel(24, 33, fp8=True).startswith("mla_sm90_attention_narrow32_fp8_any (cp.async")
    # an e4m3 query with the fp8 cache: the _fp8q twins
    assert cli.attention_kernel(64, 16, fp8=True, fp8_query=True).startswith("mla_sm90_attention_narrow16_fp8q (TMA")
    assert cli.attention_kernel(24, 128, fp8=True, fp8_query=True).startswith(
        "mla_sm90_attention_narrow32_fp8q_any (cp.async")
    # ... and beyond 32 rows with TMA pages the wide kernel (64-row units); 32 rows or no hint stay narrow
    assert cli.attention_kernel(64, 128, fp8_query=True).startswith("mla_sm90_attention_wide_fp8q (TMA")
    assert cli.attention_kernel(16, 33, fp8_query=True).startswith("mla_sm90_attention_wide_fp8q (TMA")
    assert cli.attention_kernel(64, 32, fp8_query=True).startswith("mla_sm90_attention_narrow32_fp8q (TMA")
    assert cli.attention_kernel(64, 0, fp8_query=True).startswith("mla_sm90_attention_narrow32_fp8q (TMA")


def test_info_reports_the_next_call(capsys):
    from jit_mla import cli

    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("next call") :]
    so, built = cli.launcher_state()
    assert ("launcher: built, " if built else "launcher: not built yet; the first call builds ") + str(so) in block
    assert "mla_sm90_attention (TMA) for page sizes 8, 16, 32, 64 or multiples of 64" in block
    if not torch.cuda.is_available():
        assert "no GPU" in block


def test_run_says_so_before_a_first_build(monkeypatch, capsys, tmp_path):
    from jit_mla import cli, demo

    monkeypatch.setattr(cli, "launcher_state", lambda: (tmp_path / "m" / "jit_mla_launcher.so", False))
    order = []
    demo._prepare_launcher(lambda: order.append(capsys.readouterr().out))
    assert order == [f"building the launcher (first use, ~15 s) into {tmp_path / 'm'} ...\n"]
    assert capsys.readouterr().out.startswith("launcher built in ")


@pytest.mark.parametrize("hint, expected", [(4096, 4096), (torch.tensor(77).numpy()[()], 77), (None, 0),
                                            (1 << 70, 1 << 62)], ids=["int", "numpy-int", "none", "huge"])
def test_max_seq_len_reaches_the_launcher_as_its_last_argument(recorder, hint, expected):
    # The launcher's kernel-choice hint (KV blocks per CTA: the seesaw's _short twin), as an int.
    call_api(make_inputs("cpu"), max_seq_len=hint)
    (args, _), = recorder.calls
    assert type(args[-1]) is int and args[-1] == expected


def test_max_seq_len_not_an_integer_is_refused(recorder):
    with pytest.raises(TypeError, match="max_seq_len must be an int .*got float"):
        call_api(make_inputs("cpu"), max_seq_len=4096.0)
    assert not recorder.calls

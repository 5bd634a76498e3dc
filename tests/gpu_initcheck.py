"""Cases for compute-sanitizer initcheck (run by tests/gpu_sanitize.sh; sm_90a GPU).

initcheck flags device reads of memory nothing has written. Under pytest it drowns in false
reports: the test's own PyTorch reductions run uninstrumented (the kernel filter keeps the run
fast), so their results look unwritten when `.item()` copies them out. Here no PyTorch kernel runs
on the GPU: inputs are made on the CPU and copied over (a copy initializes), outputs and the
workspace are `torch.empty` (uninitialized on purpose: a kernel must write every row it owns and
read only what it wrote), and results are copied back and checked on the CPU. Any report is ours.
One exception, by design: a call may read the workspace's plan (header, input copies, the plan's
words and their shadows) before it knows whether a plan is there (csrc/common/plan_cache.cuh; any
value is handled), so those bytes are copied in as zeros (no plan), as an engine's first call
would find anything.

    compute-sanitizer --tool initcheck python3 tests/gpu_initcheck.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jit_mla  # noqa: E402
from mla_data import assert_close_fa3, make_case  # noqa: E402
from plan_layout import plan_layout  # noqa: E402

# (label, B, q_lens (int: uniform, list: ragged), H, page, kv_lens, sinks, types: "bf16", or
# "fp8" (an e4m3 cache, bf16 query) or "fp8q" (e4m3 query and cache): the narrow fp8 kernels, and
# the wide one for an e4m3 query of more than 32 rows with TMA pages)
CASES = [
    ("uniform-tma", 3, 1, 16, 64, [1, 200, 1000], False, "bf16"),
    ("uniform-q2-page1", 4, 2, 16, 1, [2, 9, 130, 700], False, "bf16"),
    ("ragged-zero-len-sinks", 5, [2, 0, 3, 1, 0], 128, 32, [2, 0, 400, 77, 5], True, "bf16"),
    ("split-long", 1, 1, 16, 64, [20000], False, "bf16"),
    ("split-ragged-H128", 2, [1, 3], 128, 64, [9000, 15000], False, "bf16"),
    ("fp8-ragged-tma", 3, [1, 0, 2], 16, 64, [300, 0, 77], False, "fp8"),
    ("fp8-page1-H128-sinks", 2, 1, 128, 1, [130, 700], True, "fp8"),
    ("fp8q-q2-tma-split", 2, 2, 16, 32, [5, 12000], False, "fp8q"),
    ("fp8q-ragged-page3-H64-sinks", 3, [1, 3, 0], 64, 3, [40, 90, 0], True, "fp8q"),
    ("fp8q-wide-H128-split-sinks", 2, [1, 2], 128, 64, [9000, 77], True, "fp8q"),
]


def run(label, B, q_lens, H, page, kv_lens, sinks, types) -> None:
    ragged = isinstance(q_lens, list)
    fp8 = types in ("fp8", "fp8q")
    kw_case = dict(ragged=ragged, seed=11, dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16,
                   q_dtype=torch.float8_e4m3fn if types == "fp8q" else torch.bfloat16)
    cpu = make_case(B, q_lens, H, page, kv_lens, **kw_case)
    gpu = make_case(B, q_lens, H, page, kv_lens, **kw_case, device="cuda")
    total_q = gpu.query.shape[0] if ragged else B * q_lens
    ws = torch.empty(jit_mla.get_workspace_size(B, H, total_q=total_q), dtype=torch.uint8, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    head = plan_layout(B, total_q, H, sms).end  # the header, copies, plan words and shadows
    ws[:head].copy_(torch.zeros(head, dtype=torch.uint8))  # a copy from the host initializes
    kw = {"sinks": cpu.sinks} if sinks else {}
    ref, ref_lse = cpu.reference(**kw)
    p_dtype = torch.float8_e4m3fn if types == "fp8q" else torch.bfloat16  # the kernels' P (reference)
    ref_lowp, _ = cpu.reference(low_precision=True, p_dtype=p_dtype, **kw)
    finite = torch.isfinite(ref_lse)
    for call in range(2):  # the second call reuses the first's plan (its words and shadows)
        out, lse = jit_mla.trtllm_batch_decode_with_kv_cache_mla(
            gpu.query, gpu.kv_cache, ws, 128, 512, 64, gpu.block_tables, gpu.seq_lens, max(kv_lens),
            bmm1_scale=gpu.bmm1_scale, sinks=gpu.sinks if sinks else None, return_lse=True,
            cum_seq_lens_q=gpu.cum_seq_lens_q, max_q_len=gpu.max_q_len if ragged else None,
        )  # fmt: skip
        out_h, lse_h = out.cpu(), lse.cpu()  # copies of what our kernels wrote
        assert_close_fa3(out_h.float(), ref, ref_lowp, name=f"out {label} call {call}")
        assert torch.equal(torch.isfinite(lse_h), finite), f"lse finiteness {label} call {call}"
        if bool(finite.any()):
            assert float((lse_h[finite] - ref_lse[finite]).abs().max()) < 2e-2, f"lse {label} call {call}"
    print(f"ok {label}", flush=True)


def main() -> None:
    for case in CASES:
        run(*case)
    print(f"{len(CASES)} initcheck cases passed")


if __name__ == "__main__":
    main()

"""One MLA call on a benchmark shape, for profilers (ncu, compute-sanitizer): no timing, no checks.

    ncu --kernel-name mla_sm90_attention --launch-skip 1 --launch-count 1 \\
        python benchmarks/profile_one.py --shape 128,1,128,4096
"""

from __future__ import annotations

import argparse
import math

import torch

import jit_mla


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="128,1,128,4096", help="B,Q_LEN,H,KV_LEN")
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--calls", type=int, default=2)
    args = ap.parse_args()
    b, q_len, h, kv = (int(x) for x in args.shape.split(","))
    pages = (kv + args.page - 1) // args.page
    dev = "cuda"
    cache = torch.randn(b * pages, args.page, 576, device=dev).to(torch.bfloat16)
    table = torch.randperm(b * pages, device=dev, dtype=torch.int32).view(b, pages)
    seq = torch.full((b,), kv, dtype=torch.int32, device=dev)
    q = torch.randn(b, q_len, h, 576, device=dev).to(torch.bfloat16)
    ws = torch.empty(jit_mla.get_workspace_size(b, h, q_len), dtype=torch.uint8, device=dev)
    for _ in range(args.calls):
        jit_mla.trtllm_batch_decode_with_kv_cache_mla(
            q, cache, ws, 128, 512, 64, table, seq, kv, bmm1_scale=1 / math.sqrt(192))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

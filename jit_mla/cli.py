"""``python -m jit_mla [run|build|info]`` (also the ``jit-mla`` script); ``run`` is the default."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import jit_mla
from jit_mla import _paths, cubins, env

_COMMANDS = ("run", "build", "info")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in _COMMANDS and argv[0] not in ("-h", "--help")):
        argv.insert(0, "run")
    args = _parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (cubins.CubinError, env.JitError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jit_mla",
        description="MLA attention kernels: run the demo, build, or show info.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the demo on the GPU (the default command)")
    run.add_argument("--shape", metavar="B,Q_LEN,H,KV_LEN", help="one problem shape for the demo")
    run.add_argument("--dtype", help="KV cache dtype for the demo (bf16)")
    run.add_argument("--repeat", type=int, help="timed calls per shape in the demo")
    run.set_defaults(func=_run)

    build = sub.add_parser("build", help="build the launcher module (and with --cubins the cubins)")
    build.add_argument(
        "--cubins",
        action="store_true",
        help=f"first regenerate the kernel cubins and manifest in {_paths.cubins_dir()} "
        "(needs nvcc, no GPU)",
    )
    build.add_argument(
        "--arch",
        action="append",
        help="arch(s) for --cubins, e.g. sm_90a; repeat or separate by commas "
        f"(default: all with kernels: {', '.join(sorted(cubins.KERNEL_SOURCES))})",
    )
    build.set_defaults(func=_build)

    info = sub.add_parser("info", help="versions, toolkit, cache, cubins and GPU")
    info.set_defaults(func=_info)
    return parser


def _run(args: argparse.Namespace) -> int | None:
    from jit_mla import demo  # lazy: needs a GPU and imports torch

    return demo.main(args)


def _build(args: argparse.Namespace) -> None:
    if args.cubins:
        given = " ".join(args.arch or sorted(cubins.KERNEL_SOURCES))
        archs = given.replace(",", " ").split()
        root = _paths.cubins_dir()
        manifest = cubins.build_cubins(archs, root)
        for arch in archs:
            entry = manifest["cubins"][arch]
            print(f"cubin {arch}: {root / entry['file']} (sha256 {entry['sha256'][:16]})")
    from jit_mla import launcher  # lazy: builds with tvm_ffi and ninja

    launcher.build_launcher()
    print("launcher: built")


def _info(args: argparse.Namespace) -> None:
    def line(label: str, value: Callable[[], object]) -> None:
        try:
            text = value()
        except Exception as e:  # info reports what is broken instead of stopping at it
            text = f"unavailable: {e}"
        print(f"{label:<10}{text}")

    import torch
    import tvm_ffi

    line("jit_mla", _jit_mla_version)
    line("torch", lambda: torch.__version__)
    line("tvm_ffi", lambda: tvm_ffi.__version__)
    line("nvcc", env.nvcc_version)
    line("CUDA", env.cuda_home)
    line("csrc", _paths.csrc_dir)
    line("cache", _cache_contents)
    line("cubins", _manifest_report)
    line("GPU", _gpu_report)
    line("next call", _next_call_report)


def tma_page_size(page_size: int) -> bool:
    """Whether the launcher picks the TMA kernel for this page size (csrc/launcher.cu's rule)."""
    return page_size % 64 == 0 or (page_size >= 8 and 64 % page_size == 0)


def attention_kernel(page_size: int, rows_per_request: int = 64, fp8: bool = False, fp8_query: bool = False,
                     ctas: int = 132, batch: int = 0, kv_len: int = 0) -> str:
    """The kernel a call launches (it plans, attends and merges splits): csrc/launcher.cu's rule.
    rows_per_request: q_len * H of a uniform call, max_q_len * H of a ragged one (0: max_q_len
    not given); fp8: a float8_e4m3fn cache; fp8_query: an e4m3 query too (implies fp8). An fp8
    cache with more than 32 rows and TMA pages runs on the wide kernels, else the narrow ones; a
    bf16 one on the narrow kernel only for 1-16 rows with TMA pages.
    ctas: the grid (the SMs, 132 on an H200); a bf16 request with more rows than ctas x 64 (a
    chunked prefill) runs the seesaw's _reread twin. batch: the batch size (0: unknown, as for the
    report); kv_len: the KV length the launcher assumes, max_seq_len when > 0 and at most
    block_tables' width x page_size; a call of at most 16 KV blocks of 64 tokens per CTA so
    estimated runs the seesaw's _short twin (no steady pair body)."""
    fp8 = fp8 or fp8_query
    if fp8 and tma_page_size(page_size) and rows_per_request > 32:
        if fp8_query:
            return "mla_sm90_attention_wide_fp8q (TMA, 64-row units, transposed tiles, e4m3 QK^T and PV, P in e4m3)"
        return ("mla_sm90_attention_wide_fp8 (TMA, 64-row units, transposed tiles, e4m3 QK^T and PV, "
                "Q and P as hi + lo)")
    narrow = fp8 or (1 <= rows_per_request <= 16 and tma_page_size(page_size))
    loads = "TMA" if tma_page_size(page_size) else "cp.async"
    any_page = "" if tma_page_size(page_size) else "_any"
    if fp8_query:
        suffix = f"_fp8q{any_page} ({loads}, transposed tiles, e4m3 QK^T and PV, P in e4m3)"
    elif fp8:
        suffix = f"_fp8{any_page} ({loads}, transposed tiles, e4m3 QK^T and PV, Q and P as hi + lo)"
    else:
        suffix = " (TMA, transposed tiles)"
    if narrow:
        return f"mla_sm90_attention_narrow{16 if 1 <= rows_per_request <= 16 else 32}{suffix}"
    if tma_page_size(page_size):
        if rows_per_request > ctas * 64:
            return "mla_sm90_attention_reread (TMA, KV at L2 normal priority)"
        blocks = batch * -(-rows_per_request // 64) * -(-kv_len // 64)
        if batch > 0 and rows_per_request >= 1 and blocks <= 16 * ctas:
            return "mla_sm90_attention_short (TMA, no steady pair body: few KV blocks per CTA)"
        return "mla_sm90_attention (TMA)"
    return "mla_sm90_attention_any_page (cp.async)"


def launcher_state() -> tuple[Path, bool]:
    """The launcher's ``.so`` for this csrc/, flags and toolkit, and whether it is built already."""
    from jit_mla import jit, launcher  # lazy: hashes csrc/ and asks nvcc its version

    spec = launcher.launcher_spec()
    mdir = jit.module_dir(spec)
    return mdir / f"{spec.name}.so", (mdir / "done").is_file()


def _next_call_report() -> str:
    """What the next API call in a new process uses: arch, launcher, cubin, kernels."""
    import torch

    from jit_mla import launcher

    if torch.cuda.is_available():
        arch = env.device_arch()
        lines = [f"{arch} (cuda:{torch.cuda.current_device()}, {torch.cuda.get_device_name()})"]
    else:
        arch = None
        lines = [f"no GPU: a call raises; the launcher still builds (for {launcher.launcher_spec().arch})"]
    so, built = launcher_state()
    lines.append(f"  launcher: built, {so}" if built else f"  launcher: not built yet; the first call builds {so} (~15 s, once)")
    if arch is not None:
        root = _paths.cubins_dir()
        entry = (cubins._load_manifest(root) or {}).get(arch)
        problems = [p for p in cubins.check_manifest(root) if arch in p]
        if problems:
            lines.append(f"  cubin:    refused, the call raises: {problems[0]}")
        elif entry is not None:
            lines.append(f"  cubin:    {root / entry['file']} (shipped, sha256 {entry['sha256'][:16]})")
        elif arch in cubins.KERNEL_SOURCES:
            cached = env.cache_dir() / "cubins" / cubins.source_hash(arch)[:16]
            lines.append(f"  cubin:    none shipped for {arch}: built into {cached} on first use")
        else:
            lines.append(f"  cubin:    no kernels for {arch} (jit_mla has {', '.join(sorted(cubins.KERNEL_SOURCES))})")
    lines.append(
        f"  kernels:  {attention_kernel(64)} for page sizes 8, 16, 32, 64 or multiples "
        f"of 64 (else {attention_kernel(24)}), narrow16 for q_len * H <= 16 "
        f"with those pages; a float8_e4m3fn cache on mla_sm90_attention_narrow16/32_fp8 for "
        f"q_len * H <= 16 / more (_fp8_any by cp.async for the other pages, more than 32 rows "
        f"there as 32-row units; "
        f"_fp8q with an e4m3 query), and for more than 32 rows with TMA pages on "
        f"mla_sm90_attention_wide_fp8 / _fp8q (64-row units); a bf16 request with more rows "
        f"than the grid holds at once (chunked prefill) with TMA pages on "
        f"mla_sm90_attention_reread, one of at most 16 KV blocks per CTA (one CTA per SM; "
        f"max_seq_len as the hint) on mla_sm90_attention_short; one "
        f"cooperative launch per call"
    )
    return "\n".join(lines)


def _jit_mla_version() -> str:
    return f"{jit_mla.__version__} ({Path(jit_mla.__file__).parent})"


def _cache_contents() -> str:
    cache = env.cache_dir()
    lines = [str(cache)]
    modules = sorted(d.name for d in cache.iterdir() if (d / "done").is_file())
    lines += [f"  built module: {name}" for name in modules]
    for manifest in sorted(cache.glob(f"cubins/*/{cubins.MANIFEST}")):
        for arch, entry in sorted((cubins._load_manifest(manifest.parent) or {}).items()):
            lines.append(f"  built cubin:  {arch} {manifest.parent / entry['file']}")
    if len(lines) == 1:
        lines.append("  (nothing built yet)")
    return "\n".join(lines)


def _manifest_report() -> str:
    root = _paths.cubins_dir()
    lines = [str(root / cubins.MANIFEST)]
    try:
        entries = cubins._load_manifest(root) or {}
    except cubins.CubinError:
        entries = {}  # check_manifest below says what is wrong with it
    for arch, entry in sorted(entries.items()):
        lines.append(f"  {arch}: {entry['file']} (nvcc {entry['nvcc_version']})")
    problems = cubins.check_manifest(root)
    lines += [f"  problem: {p}" for p in problems] or ["  status: ok"]
    return "\n".join(lines)


def _gpu_report() -> str:
    import torch

    if not torch.cuda.is_available():
        return "no GPU"
    shipped = cubins._load_manifest(_paths.cubins_dir()) or {}
    lines = []
    for i in range(torch.cuda.device_count()):
        arch = env.device_arch(i)
        if arch in shipped:
            fits = f"shipped cubin {shipped[arch]['file']}"
        elif arch in cubins.KERNEL_SOURCES:
            fits = "no shipped cubin: built into the cache on first use"
        else:
            fits = f"no kernels for {arch} (jit_mla has {', '.join(sorted(cubins.KERNEL_SOURCES))})"
        lines.append(f"{i}: {torch.cuda.get_device_name(i)} ({arch}): {fits}")
    return "\n".join(lines)

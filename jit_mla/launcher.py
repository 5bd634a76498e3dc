"""The launcher module: csrc/launcher.cu built through the JIT, with the verified cubin loaded.

`get_launcher()` is what the API calls: the first call in a process builds the launcher (once per
machine: the JIT cache keeps it) and hands it the sha256-verified cubin of the current GPU's arch;
later calls return the same module.
"""

from __future__ import annotations

import threading

import tvm_ffi

from . import cubins, env, jit
from ._paths import csrc_dir

# The launcher raises NotImplementedError for keywords we do not support yet; tvm-ffi maps only
# the error kinds registered with it.
tvm_ffi.error.register_error("NotImplementedError", NotImplementedError)

_DEFAULT_ARCH = "sm_90a"  # what a CPU-only machine builds for (the launcher is host code only)
_lock = threading.Lock()
_launcher: tvm_ffi.Module | None = None  # with the device's kernels loaded
_built: tvm_ffi.Module | None = None  # built and loaded, kernels or not


def launcher_spec() -> jit.JitSpec:
    """JitSpec of the launcher. It holds no device code: kernels come from the cubins."""
    archs = env.cuda_arch_list() or [_DEFAULT_ARCH]
    csrc = csrc_dir()
    return jit.JitSpec(
        name="jit_mla_launcher",
        sources=(csrc / "launcher.cu",),
        include_dirs=(csrc,),
        hashed_dirs=(csrc,),
        cuda_cflags=tuple(env.gencode_flag(a) for a in archs),
        arch=",".join(archs),
    )


def build_launcher() -> tvm_ffi.Module:
    """Build (or reuse from the cache) and load the launcher, without touching any GPU.

    Memoized per process: the JIT's own memo is keyed by a hash of every file under csrc/, which
    get_workspace_size and friends would otherwise recompute on each call.
    """
    global _built
    if _built is None:
        _built = jit.build_and_load(launcher_spec())
    return _built


def get_launcher() -> tvm_ffi.Module:
    """The launcher with the current device's verified kernels loaded. Memoized per process."""
    global _launcher
    if _launcher is not None:
        return _launcher
    with _lock:
        if _launcher is None:
            module = build_launcher()
            arch = env.device_arch()
            module.load_cubin(arch, cubins.verified_cubin(arch))
            _launcher = module
    return _launcher

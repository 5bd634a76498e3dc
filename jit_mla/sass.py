"""Checks of a built cubin's machine code (SASS), where a disassembler is at hand.

ptxas 13.0 has twice compiled a cp.async copy of the cp.async-page kernels as
``LDGSTS [R+UR], desc[UR][...]`` (a shared-memory address of a register plus a uniform register).
The H200 faults on it with an illegal instruction, a sticky error that fails every later call of
the process (docs/perf-notes.md, Sessions 9 and 14). Which form ptxas picks follows register
pressure anywhere in the kernel, so any kernel edit can bring it back; the cubin build refuses it
here, before a GPU run would find it.

The disassembler: ``$JIT_MLA_NVDISASM`` (a path to ``nvdisasm``, e.g. from the
``nvidia-cuda-nvdisasm`` wheel), else the toolkit's ``nvdisasm`` or ``cuobjdump``. Without one the
check is skipped with a log line (the CPU CI machines have none); ``benchmarks/validate_gpu.sh``
checks the shipped cubin on the GPU host again.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from jit_mla import env

logger = logging.getLogger("jit_mla")

# LDGSTS whose first operand (the shared-memory destination) adds a uniform register.
_BAD_LDGSTS = re.compile(r"\bLDGSTS\S*\s+\[[^\]]*\+UR\d+")


class SassError(RuntimeError):
    """The cubin holds an instruction form the target GPU rejects."""


def disassembler() -> list[str] | None:
    """The command that prints a cubin's SASS (the cubin's path appended), or None."""
    explicit = os.environ.get("JIT_MLA_NVDISASM", "")
    if explicit:
        return [explicit, "-c"]
    try:
        bin_dir: Path | None = env.cuda_home() / "bin"
    except env.JitError:  # no toolkit found: look on PATH only
        bin_dir = None
    for name, args in (("nvdisasm", ["-c"]), ("cuobjdump", ["--dump-sass"])):
        path = bin_dir / name if bin_dir is not None else None
        if path is not None and path.is_file():
            return [str(path), *args]
        found = shutil.which(name)
        if found:
            return [found, *args]
    return None


def check_sass_text(text: str, where: str = "the cubin") -> None:
    """Raise SassError naming each LDGSTS with a uniform-register shared-memory offset."""
    bad = [line.strip() for line in text.splitlines() if _BAD_LDGSTS.search(line)]
    if bad:
        shown = "\n".join(bad[:5]) + (f"\n... ({len(bad)} in all)" if len(bad) > 5 else "")
        raise SassError(
            f"{where}: ptxas emitted {len(bad)} LDGSTS with a uniform-register shared-memory offset, "
            "which the H200 rejects as an illegal instruction (change the cp.async kernel's code "
            f"until every LDGSTS is [R] or [R+IMM]):\n{shown}"
        )


def check_cubin(data: bytes, where: str = "the cubin") -> bool:
    """Check the cubin's SASS; False when no disassembler is at hand (nothing checked)."""
    cmd = disassembler()
    if cmd is None:
        logger.info("no nvdisasm or cuobjdump (set JIT_MLA_NVDISASM): %s's SASS is not checked", where)
        return False
    with tempfile.TemporaryDirectory(prefix="jit_mla-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(data)
        try:
            proc = subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as e:
            raise SassError(f"disassembling {where} with {cmd[0]} failed: {e}") from e
    if proc.returncode != 0:
        raise SassError(f"{cmd[0]} exit {proc.returncode} on {where}: {proc.stderr.strip()[-2000:]}")
    check_sass_text(proc.stdout, where)
    return True

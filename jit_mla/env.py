"""Environment: the one table of variables we read, the cache dir, the CUDA toolkit, the arch.

Every environment variable jit_mla reads is listed in ``ENV_VARS`` and read only here, so the
README table and the code cannot drift apart.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

ENV_VARS: dict[str, str] = {
    "JIT_MLA_CACHE_DIR": "where built modules and cubins are cached (default ~/.cache/jit_mla)",
    "JIT_MLA_VERBOSE": "1 prints the compiler commands of every JIT build",
    "JIT_MLA_CUDA_ARCH_LIST": "archs to build for, comma or space separated: sm_90a, 9.0a or 90a "
    "(default: the current device's arch)",
    "JIT_MLA_CHECK_INPUTS": "1 checks the values of device inputs (page ids, lengths, prefix sums) in "
    "every eager call: one host sync per call (read at import; jit_mla.env.reload())",
    "JIT_MLA_LOCK_TIMEOUT": "seconds to wait for another process's build lock (default 900)",
    "CUDA_HOME": "CUDA toolkit root, the folder holding bin/nvcc (default: from nvcc on PATH)",
}

_DEFAULT_LOCK_TIMEOUT_S = 900.0
_TRUTHY = frozenset({"1", "true", "yes", "on"})


class JitError(RuntimeError):
    """A JIT build could not be set up or did not succeed (toolkit, cache dir, compiler, lock)."""


# --------------------------------------------------------------------------------------------
# Cache dir
# --------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """``$JIT_MLA_CACHE_DIR`` or ``~/.cache/jit_mla``, created 0700; refused unless private."""
    raw = os.environ.get("JIT_MLA_CACHE_DIR", "")
    path = Path(raw).expanduser() if raw else Path.home() / ".cache" / "jit_mla"
    origin = f"JIT_MLA_CACHE_DIR={raw}" if raw else "the default; set JIT_MLA_CACHE_DIR to move it"
    try:
        _make_private_dirs(path)
    except OSError as e:
        raise JitError(f"cache dir {path} ({origin}) cannot be created: {e}") from e
    _check_cache_dir(path, origin)
    return path


def cache_subdir(*parts: str, what: str = "cache folder") -> Path:
    """``cache_dir()/<parts...>``: each missing folder created 0700, each one checked private.

    For the folders whose files are loaded into the process (a module dir, the cubin cache):
    one owned by another user or writable by group or others is refused with a ``JitError``.
    """
    path = cache_dir()
    for part in parts:
        if not part or part in (".", "..") or "/" in part or os.sep in part:
            raise ValueError(f"cache_subdir parts must be single folder names, got {parts!r}")
        path = path / part
        try:
            path.mkdir(mode=0o700, exist_ok=True)  # exist_ok: another process may race us here
            if not path.is_dir():
                raise NotADirectoryError(f"{path} exists and is not a directory")
        except OSError as e:
            raise JitError(
                f"cannot create {what} {path}: {e} (under the cache dir set by JIT_MLA_CACHE_DIR)"
            ) from e
        problem = _not_private(path)
        if problem:
            raise JitError(f"{what} {path} {problem}; or remove {path} (jit_mla rebuilds it)")
    return path


def _make_private_dirs(path: Path) -> None:
    # Path.mkdir(parents=True) gives only the leaf our mode; cached .so files are loaded into the
    # process, so every folder we create on the way is private too.
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        p.mkdir(mode=0o700, exist_ok=True)  # exist_ok: another process may race us here
    if not path.is_dir():
        raise NotADirectoryError(f"{path} exists and is not a directory")


def _check_cache_dir(path: Path, origin: str) -> None:
    """Refuse a cache dir that is not ours alone, or that we cannot write."""
    problem = _not_private(path)
    # os.access alone is not enough: root passes it everywhere, and read-only mounts or full
    # disks only show on a real write.
    if problem is None and not os.access(path, os.W_OK | os.X_OK):
        problem = "is not writable by this user"
    if problem is None:
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-") as f:
                f.write(b"x")
                f.flush()
        except OSError as e:
            problem = f"failed a test write: {e}"
    if problem:
        raise JitError(f"cache dir {path} ({origin}) is unusable: it {problem}")


def _not_private(path: Path) -> str | None:
    """Why ``path`` is not a folder only this user can write to; None when it is.

    The cache holds shared libraries and cubins that are loaded into the process: whoever can
    write there runs code as us. So the folder must be ours and closed to group and others
    (the sha256 stamps catch damage, not an attacker who rewrites the stamp as well).
    """
    if not hasattr(os, "geteuid"):  # not POSIX: no owners or modes to check
        return None
    try:
        st = path.stat()
    except OSError as e:
        return f"cannot be inspected: {e}"
    euid = os.geteuid()
    fix = (
        "set JIT_MLA_CACHE_DIR to a folder of your own (a path that does not exist yet is "
        "created 0700)"
    )
    if st.st_uid != euid:
        return (
            f"is owned by uid {st.st_uid} ({_user_name(st.st_uid)}), expected uid {euid} "
            f"({_user_name(euid)}), the user running jit_mla: code cached there would run as "
            f"this user; {fix}"
        )
    writable_by = [who for who, bit in (("group", 0o020), ("others", 0o002)) if st.st_mode & bit]
    if writable_by:
        return (
            f"has mode {st.st_mode & 0o7777:04o}, writable by {' and '.join(writable_by)}; "
            f"expected no group or other write permission (jit_mla creates it 0700): code "
            f"cached there would run as this user; {fix}, or `chmod 700 {path}` if it is "
            f"yours alone"
        )
    return None


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return "no such user"


# --------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------


def _read_check_inputs() -> bool:
    return os.environ.get("JIT_MLA_CHECK_INPUTS", "").strip().lower() in _TRUTHY


# Read once: the public function consults it on every call, where os.environ costs ~0.3 µs.
_check_inputs = _read_check_inputs()


def check_inputs_enabled() -> bool:
    return _check_inputs


def reload() -> None:
    """Read the variables that are cached at import (``JIT_MLA_CHECK_INPUTS``) again."""
    global _check_inputs
    _check_inputs = _read_check_inputs()


def verbose() -> bool:
    return os.environ.get("JIT_MLA_VERBOSE", "").strip().lower() in _TRUTHY


def lock_timeout() -> float:
    """Seconds to wait for another process's build lock (``$JIT_MLA_LOCK_TIMEOUT``, default 900)."""
    raw = os.environ.get("JIT_MLA_LOCK_TIMEOUT", "").strip()
    if not raw:
        return _DEFAULT_LOCK_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:  # also catches nan
        raise JitError(f"JIT_MLA_LOCK_TIMEOUT must be a positive number of seconds, got {raw!r}")
    return value


# --------------------------------------------------------------------------------------------
# CUDA toolkit
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def cuda_home() -> Path:
    """The CUDA toolkit root: ``$CUDA_HOME``, ``$CUDA_PATH``, else found from ``nvcc`` on PATH."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        raw = os.environ.get(var, "")
        if raw:
            home = Path(raw).expanduser()
            if not (home / "bin" / "nvcc").is_file():
                raise JitError(
                    f"{var}={raw}: expected a CUDA toolkit root holding bin/nvcc, "
                    f"but {home / 'bin' / 'nvcc'} does not exist"
                )
            return home

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise JitError(
            "no CUDA toolkit found: CUDA_HOME (and CUDA_PATH) are unset and there is no nvcc on "
            "PATH; set CUDA_HOME to the toolkit root (the folder holding bin/nvcc)"
        )
    return _toolkit_of(nvcc)


def _toolkit_of(nvcc: str) -> Path:
    # nvcc on PATH may be a wrapper script (`exec /usr/local/cuda-13.0/bin/nvcc "$@"`), so its own
    # folder says nothing. nvcc's dry run prints the toolkit it runs from as `#$ TOP=<root>/bin/..`
    # on stderr; it needs no input file to exist.
    try:
        proc = subprocess.run(
            [nvcc, "-dryrun", "-c", "x.cu"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise JitError(f"CUDA_HOME is unset and running {nvcc} (from PATH) failed: {e}") from e
    for line in (proc.stderr + proc.stdout).splitlines():
        if line.startswith("#$ TOP="):
            home = Path(line[len("#$ TOP=") :].strip()).resolve()
            if (home / "bin" / "nvcc").is_file():
                return home
            raise JitError(
                f"CUDA_HOME is unset and {nvcc} (from PATH) reports toolkit {home}, "
                f"which has no bin/nvcc; set CUDA_HOME to the toolkit root"
            )
    # nvcc needs the host compiler even for a dry run; its complaint is the useful part.
    tail = "\n".join((proc.stderr + proc.stdout).strip().splitlines()[-5:])
    raise JitError(
        f"CUDA_HOME is unset and {nvcc} (from PATH) did not print '#$ TOP=<toolkit>' for "
        f"'nvcc -dryrun' (exit {proc.returncode}); set CUDA_HOME to the toolkit root. "
        f"nvcc said:\n{tail}"
    )


def nvcc_path() -> Path:
    """The toolkit's real nvcc (never the PATH wrapper), so the compiler matches ``cuda_home()``."""
    return cuda_home() / "bin" / "nvcc"


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    """nvcc's full version, e.g. ``"13.0.88"`` (part of every module key)."""
    nvcc = nvcc_path()
    try:
        out = subprocess.run(
            [str(nvcc), "--version"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise JitError(f"running {nvcc} --version failed: {e}") from e
    m = re.search(r"\bV(\d+\.\d+\.\d+)", out)
    if m is None:
        raise JitError(f"{nvcc} --version: expected a 'V<major>.<minor>.<patch>' line, got:\n{out}")
    return m.group(1)


# --------------------------------------------------------------------------------------------
# Arch
# --------------------------------------------------------------------------------------------


def device_arch(index: int | None = None) -> str:
    """The device's build arch: ``sm_90a`` (9.0), ``sm_100a`` (10.0), else ``sm_XY``."""
    import torch  # lazy: importing torch costs seconds and env.py is imported by everything

    if not torch.cuda.is_available():
        raise JitError("no CUDA device: torch.cuda.is_available() is False")
    major, minor = torch.cuda.get_device_capability(index)
    # The `a` variants unlock the arch-specific instructions our kernels use (wgmma and
    # setmaxnreg on 9.0, tcgen05 on 10.0); their cubins run only on that exact arch.
    if (major, minor) in ((9, 0), (10, 0)):
        return f"sm_{major}{minor}a"
    return f"sm_{major}{minor}"


def cuda_arch_list() -> list[str]:
    """``$JIT_MLA_CUDA_ARCH_LIST`` normalized to ``sm_XY[a]``; else the device's arch; else []."""
    raw = os.environ.get("JIT_MLA_CUDA_ARCH_LIST", "").strip()
    if raw:
        archs: list[str] = []
        for entry in re.split(r"[\s,]+", raw):
            if entry:
                arch = _normalize_arch(entry, raw)
                if arch not in archs:
                    archs.append(arch)
        return archs

    import torch

    return [device_arch()] if torch.cuda.is_available() else []


def _normalize_arch(entry: str, raw: str) -> str:
    s = entry.strip().lower()
    if m := re.fullmatch(r"(\d{1,2})\.(\d)([af]?)", s):  # "9.0a", "10.0a"
        return f"sm_{m[1]}{m[2]}{m[3]}"
    if m := re.fullmatch(r"(?:sm_)?(\d{2,3})([af]?)", s):  # "sm_90a", "90a", "100a"
        return f"sm_{m[1]}{m[2]}"
    raise JitError(
        f"JIT_MLA_CUDA_ARCH_LIST: expected entries like sm_90a, 9.0a or 90a, "
        f"got {entry!r} (in {raw!r})"
    )


def gencode_flag(arch: str) -> str:
    """``"sm_90a"`` -> ``"-gencode=arch=compute_90a,code=sm_90a"`` (SASS for exactly that arch)."""
    m = re.fullmatch(r"sm_(\d{2,3}[af]?)", arch)
    if m is None:
        raise JitError(f"arch must look like sm_90a or sm_100a, got {arch!r}")
    return f"-gencode=arch=compute_{m[1]},code={arch}"

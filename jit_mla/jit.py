"""JIT build and load of TVM-FFI modules: JitSpec -> build.ninja in the cache -> ninja -> load.

Layout of one module in the cache (``cache_dir()/<name>_<key[:16]>/``)::

    .lock         file lock held while building (flock: dropped when its holder dies)
    build-XXXX/   one build's private dir: build.ninja, ninja's logs, obj/*.o, the linked .so
    <name>.so     the module, renamed into place from build-XXXX/ only once fully linked
    done          JSON stamp {format, key, sha256, size} of <name>.so, written last
    builds.log    one line per compile (pid, time, seconds); tests count these

Each build gets a fresh build dir because a killed build's compiler lives on: ninja starts every
command in its own process group, so killing the building process and its group leaves the
running nvcc (or the linker) to finish writing its output. In a shared obj/ it could rewrite an
object under the next build's linker (CI once linked a .so without its functions that way); in its
own dir it writes where no later build reads. Build dirs are removed best-effort when a build
starts and when it succeeds; one a survivor was writing into then waits for the next build.

The key hashes file *contents*, never mtimes, so a checkout, a copy or a `touch` never
rebuilds, and any edit to a source or a hashed header does. A module is trusted only when its
``done`` stamp matches the .so's sha256: a truncated or swapped .so, a garbled stamp or leftovers
of a killed compiler are wiped and rebuilt. The cache dir and every module dir are created 0700
and refused when another user owns them or group or others can write to them (``env``): the
stamp guards against damage, the folder's owner and mode against someone who rewrites both.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import filelock
import tvm_ffi
import tvm_ffi.libinfo

from jit_mla import env
from jit_mla.env import JitError

__all__ = ["JitError", "JitSpec", "build_and_load", "module_dir", "module_key"]

logger = logging.getLogger("jit_mla")

# Bump when the build layout, the base flags or the stamp format change: old cache entries are
# then simply never looked at again.
FORMAT_VERSION = "1"

_BASE_CFLAGS = ("-std=c++17", "-O2", "-Xcompiler=-fPIC,-fvisibility=hidden")
_STAMP = "done"
_LOCK = ".lock"
_BUILDS_LOG = "builds.log"
_KEEP_ON_CLEAN = frozenset({_LOCK, _BUILDS_LOG})  # the lock may be held by waiters; the log counts
_BUILD_DIR_PREFIX = "build-"
_OUTPUT_TAIL_LINES = 60


@dataclass(frozen=True)
class JitSpec:
    """What to build. Headers only affect the key when they live under one of ``hashed_dirs``."""

    name: str
    sources: tuple[Path, ...]
    include_dirs: tuple[Path, ...] = ()
    hashed_dirs: tuple[Path, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    arch: str = ""  # for the log line and the key only; the gencode flags go in cuda_cflags

    def __post_init__(self) -> None:
        # Accept lists and strings, but store tuples of Paths so the spec stays hashable. Paths
        # are made absolute because ninja runs in the module dir, not in the caller's cwd.
        for name in ("sources", "include_dirs", "hashed_dirs"):
            object.__setattr__(self, name, tuple(Path(p).absolute() for p in getattr(self, name)))
        for name in ("cuda_cflags", "ldflags"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        # The name becomes a folder and a file name in the cache.
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"JitSpec.name must be letters, digits, _ or -, got {self.name!r}")
        if not self.sources:
            raise ValueError(f"JitSpec {self.name!r}: sources must list at least one file, got ()")


# --------------------------------------------------------------------------------------------
# Key
# --------------------------------------------------------------------------------------------


def module_key(spec: JitSpec) -> str:
    """sha256 of everything that decides the built bytes: contents, flags, arch, tool versions."""
    h = hashlib.sha256()

    def field(label: str, data: bytes) -> None:
        # Length-prefixed, so no two different inputs can hash the same concatenation.
        h.update(f"{label}:{len(data)}:".encode())
        h.update(data)

    field("format", FORMAT_VERSION.encode())
    field("name", spec.name.encode())
    for src in spec.sources:
        field("source", src.name.encode())
        field("source-bytes", _read(src, "source"))
    for d in spec.hashed_dirs:
        if not d.is_dir():
            raise JitError(f"{spec.name}: hashed dir {d} does not exist or is not a directory")
        # __pycache__ appears when the folder is installed as a package; it is not build input.
        files = sorted(
            p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.relative_to(d).parts
        )
        field("hashed-dir", str(len(files)).encode())
        for p in files:
            field("file", p.relative_to(d).as_posix().encode())
            field("file-bytes", _read(p, "hashed file"))
    field("cuda_cflags", json.dumps(spec.cuda_cflags).encode())
    field("ldflags", json.dumps(spec.ldflags).encode())
    field("arch", spec.arch.encode())
    field("tvm_ffi", tvm_ffi.__version__.encode())
    field("nvcc", env.nvcc_version().encode())
    return h.hexdigest()


def module_dir(spec: JitSpec) -> Path:
    return env.cache_dir() / f"{spec.name}_{module_key(spec)[:16]}"


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise JitError(f"cannot read {what} {path}: {e}") from e


# --------------------------------------------------------------------------------------------
# Build and load
# --------------------------------------------------------------------------------------------

_memo: dict[str, tvm_ffi.Module] = {}
_memo_lock = threading.Lock()
_key_locks: dict[str, threading.Lock] = {}


def build_and_load(spec: JitSpec) -> tvm_ffi.Module:
    """The spec's module, built into the cache if needed; one load per key per process."""
    key = module_key(spec)
    with _memo_lock:
        if key in _memo:
            return _memo[key]
        # One lock per key: threads wanting the same module wait for one build, others don't.
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:
        if key not in _memo:
            module = _load_or_build(spec, key)
            with _memo_lock:
                _memo[key] = module
        return _memo[key]


def _load_or_build(spec: JitSpec, key: str) -> tvm_ffi.Module:
    # Created 0700; refused before anything in it is read when another user owns it or group or
    # others can write to it (whoever can write there could swap both the .so and its stamp).
    mdir = env.cache_subdir(f"{spec.name}_{key[:16]}", what="module dir")
    # Fast path without the lock: the stamp is written last and the .so renamed into place,
    # so a matching stamp means a complete module.
    so = _verified_so(mdir, spec.name, key)
    if so is not None:
        logger.debug("loading cached %s from %s", spec.name, so)
        return _load(so)

    with _BuildLock(mdir / _LOCK):
        # Another process may have finished the build while we waited.
        so = _verified_so(mdir, spec.name, key)
        if so is None:
            so = _build(spec, key, mdir)
    return _load(so)


def _load(so: Path) -> tvm_ffi.Module:
    try:
        return tvm_ffi.load_module(str(so))
    except Exception as e:  # tvm-ffi reports dlopen failures with its own error types
        raise JitError(f"built module {so} could not be loaded: {e}") from e


class _BuildLock:
    """The module dir's file lock: logs when it must wait, names the knob when it times out."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.timeout = env.lock_timeout()
        self.lock = filelock.FileLock(path)

    def __enter__(self) -> None:
        try:
            self.lock.acquire(timeout=0)
            return
        except filelock.Timeout:
            pass
        logger.info(
            "process %d waits for another process's build (lock %s, up to %.0f s)",
            os.getpid(),
            self.path,
            self.timeout,
        )
        try:
            self.lock.acquire(timeout=self.timeout)
        except filelock.Timeout:
            raise JitError(
                f"timed out after {self.timeout:.0f} s waiting for build lock {self.path} held by "
                f"another process; raise JIT_MLA_LOCK_TIMEOUT to wait longer"
            ) from None

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def _verified_so(mdir: Path, name: str, key: str) -> Path | None:
    """``<name>.so`` when the ``done`` stamp vouches for it byte for byte, else None."""
    so = mdir / f"{name}.so"
    try:
        stamp = json.loads((mdir / _STAMP).read_text())
        if (
            stamp.get("format") == FORMAT_VERSION
            and stamp.get("key") == key
            and stamp.get("size") == so.stat().st_size
            and stamp.get("sha256") == _sha256_file(so)
        ):
            return so
    except (OSError, ValueError, AttributeError):  # missing, unreadable, not JSON, not an object
        pass
    return None


def _build(spec: JitSpec, key: str, mdir: Path) -> Path:
    """Compile and link into ``mdir`` (caller holds the lock); returns ``<name>.so``."""
    _clean(mdir)
    work = Path(tempfile.mkdtemp(prefix=_BUILD_DIR_PREFIX, dir=mdir))  # 0700, a fresh name
    ninja_file = work / "build.ninja"
    linked_so = work / f"{spec.name}.so"
    ninja_file.write_text(_ninja_text(spec, work, linked_so))

    start = time.monotonic()
    _run_ninja(spec, work, ninja_file)
    seconds = time.monotonic() - start

    # Never link in place: a process loading <name>.so must see no file or the complete one.
    # Each step is made durable before the next, so the stamp never outlives its .so.
    so = mdir / f"{spec.name}.so"
    _fsync_file(linked_so)
    os.replace(linked_so, so)
    _fsync_dir(mdir)
    stamp = {
        "format": FORMAT_VERSION,
        "key": key,
        "sha256": _sha256_file(so),
        "size": so.stat().st_size,
    }
    _write_atomic(mdir / _STAMP, json.dumps(stamp, indent=1) + "\n")
    _fsync_dir(mdir)
    # Ours and any a killed build's compiler kept alive through the clean: once stamped, no clean
    # runs here again. A failed build never gets here, so its dir stays for its error message.
    for old in mdir.glob(f"{_BUILD_DIR_PREFIX}*"):
        shutil.rmtree(old, ignore_errors=True)

    with open(mdir / _BUILDS_LOG, "a") as log:
        log.write(
            f"pid={os.getpid()} time={time.strftime('%Y-%m-%dT%H:%M:%S')} "
            f"seconds={seconds:.2f} arch={spec.arch or '-'}\n"
        )
    logger.info("built %s for %s in %.1f s: %s", spec.name, spec.arch or "host", seconds, so)
    return so


def _clean(mdir: Path) -> None:
    # Whatever is here was not vouched for by a stamp: a killed build's dir, a half-linked .so,
    # a failed build's logs. Remove the stamp first so no reader trusts it.
    (mdir / _STAMP).unlink(missing_ok=True)
    for entry in mdir.iterdir():
        if entry.name in _KEEP_ON_CLEAN:
            continue
        if entry.is_dir() and not entry.is_symlink():
            # A killed build's compiler may still be writing in there; what it adds after the
            # removal is left for the sweep after this build's stamp.
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)  # filelock's short-lived probe files come and go


def _ninja_text(spec: JitSpec, work: Path, linked_so: Path) -> str:
    include_dirs = _unique(
        [
            Path(tvm_ffi.libinfo.find_include_path()),
            Path(tvm_ffi.libinfo.find_dlpack_include_path()),
            *spec.include_dirs,
        ]
    )
    cflags = [*_BASE_CFLAGS, *(f"-I{d}" for d in include_dirs), *spec.cuda_cflags]
    tvm_ffi_libdir = Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent
    ldflags = [f"-L{tvm_ffi_libdir}", "-ltvm_ffi", *spec.ldflags]

    lines = [
        "ninja_required_version = 1.3",
        f"nvcc = {_shell(str(env.nvcc_path()))}",
        f"cflags = {' '.join(map(_shell, cflags))}",
        f"ldflags = {' '.join(map(_shell, ldflags))}",
        "",
        "rule compile",
        "  command = $nvcc $cflags -c $in -o $out",
        "  description = nvcc $in",
        "",
        "rule link",
        "  command = $nvcc -shared $in $ldflags -o $out",
        "  description = link $out",
        "",
    ]
    objects = []
    for src, obj in zip(spec.sources, _object_names(spec.sources)):
        objects.append(work / "obj" / obj)
        lines.append(f"build {_ninja_path(objects[-1])}: compile {_ninja_path(src)}")
    lines.append(f"build {_ninja_path(linked_so)}: link {' '.join(map(_ninja_path, objects))}")
    lines.append(f"default {_ninja_path(linked_so)}")
    return "\n".join(lines) + "\n"


def _object_names(sources: tuple[Path, ...]) -> list[str]:
    # Two sources may share a file name (a/ops.cu, b/ops.cu); their objects must not.
    names, seen = [], set()
    for i, src in enumerate(sources):
        name = f"{src.stem}.o" if src.stem not in seen else f"{src.stem}_{i}.o"
        seen.add(src.stem)
        names.append(name)
    return names


def _run_ninja(spec: JitSpec, work: Path, ninja_file: Path) -> None:
    echo = env.verbose()
    cmd = [_ninja_binary(), "-C", str(work), "-f", str(ninja_file)]
    if echo:
        cmd.append("-v")  # ninja then echoes each full compiler command line
    tail: collections.deque[str] = collections.deque(maxlen=_OUTPUT_TAIL_LINES)
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
    except OSError as e:
        raise JitError(f"cannot run ninja ({cmd[0]}) to build {spec.name}: {e}") from e
    with proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            if echo:
                sys.stderr.write(line)
    if proc.returncode != 0:
        raise JitError(
            f"building {spec.name} failed (ninja exit {proc.returncode}); build dir {work} "
            f"(kept until the next build); last compiler output:\n{''.join(tail)}"
        )


def _ninja_binary() -> str:
    try:
        import ninja  # the pip package ships a binary, so no system ninja is needed

        return str(Path(ninja.BIN_DIR) / "ninja")
    except ImportError:
        found = shutil.which("ninja")
        if found is None:
            raise JitError("ninja not found: install the 'ninja' pip package") from None
        return found


# --------------------------------------------------------------------------------------------
# Small file helpers
# --------------------------------------------------------------------------------------------


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    # A rename is durable only once its directory is synced.
    _fsync_file(path)


def _unique(paths: list[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))


def _shell(arg: str) -> str:
    # Ninja hands commands to /bin/sh: quote for the shell, then escape ninja's own `$`.
    return shlex.quote(arg).replace("$", "$$")


def _ninja_path(path: Path) -> str:
    # In build lines ninja splits on spaces and `:`; `$` escapes them.
    return str(path).replace("$", "$$").replace(" ", "$ ").replace(":", "$:")

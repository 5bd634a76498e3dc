"""Kernel cubins: built with nvcc, recorded in a manifest, handed out only once verified.

Layout (``cubins/`` in the repository, ``jit_mla/_cubins`` in a wheel)::

    manifest.json          {"format": 1, "cubins": {arch: entry}}
    sm_90a/mla_sm90.cubin

An entry records ``file`` (relative to the manifest), ``sha256`` of the file, ``source_hash``
of ``csrc/`` (see ``source_hash``), ``nvcc_version``, ``flags`` and ``symbols``. A cubin is handed
to the launcher only when its bytes match the sha256 (else it was tampered with or corrupted) and
its source hash and flags match the sources and flags as they are now (else it is stale). An arch
with kernel sources but no shipped cubin is built into ``cache_dir()/cubins/`` on first use.

Builds are reproducible across machines and checkouts, so a rebuild must equal the committed
bytes wherever the repository lies. nvcc alone does not give that with ``-lineinfo``: cicc writes
absolute paths into the PTX file table (``.file 1 "/abs/csrc/sm90/mla_sm90.cu"``) and derives the
names of internal-linkage functions (``_INTERNAL_<hash of the path>_``, shown in the inlined-at
info) from the absolute source path. So each cubin is built in two nvcc steps with the same
flags: ``-ptx``, the file table rewritten to portable paths (``csrc/...``, ``include/...``), then
``-cubin`` from that PTX (byte-identical to a one-step ``-cubin`` from the same PTX); and cicc is
told the source's path is ``csrc/<source>`` (``-Xcicc --orig_src_path_name``).

Manifest flags name directories symbolically (``-I<csrc>``), so the manifest holds no path of the
machine that built it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import re
import shlex
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import filelock

from jit_mla import _paths, env, sass

__all__ = [
    "KERNEL_SOURCES",
    "CubinError",
    "KernelSource",
    "build_cubins",
    "check_manifest",
    "cubin_flags",
    "source_hash",
    "verified_cubin",
]

logger = logging.getLogger("jit_mla")

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
REBUILD_HINT = "run `python -m jit_mla build --cubins`"

# Placeholders in the recorded flags; replaced by real directories only on the nvcc command line.
CSRC = "<csrc>"
CUTLASS = "<cutlass>"

# Every file under csrc/ with these suffixes is part of every cubin's source hash, except the
# host-side TVM-FFI launcher, which jit.py compiles into the launcher module instead.
_HASHED_SUFFIXES = (".h", ".cuh", ".cu")
_NOT_IN_CUBINS = frozenset({"launcher.cu"})
_ENTRY_KEYS = frozenset({"file", "sha256", "source_hash", "nvcc_version", "flags", "symbols"})
_CUTLASS_INCLUDE = re.compile(rb'^\s*#\s*include\s*[<"](?:cutlass|cute)/', re.M)
_PTX_FILE = re.compile(r'^(\s*\.file\s+\d+\s+")([^"]*)(")', re.M)
_OUTPUT_TAIL_LINES = 40


class CubinError(RuntimeError):
    """A cubin is missing, tampered with, stale, or could not be built."""


@dataclass(frozen=True)
class KernelSource:
    """One arch's kernels: ``source`` relative to csrc/, compiled to one cubin with ``symbols``."""

    source: str
    symbols: tuple[str, ...]


KERNEL_SOURCES: dict[str, KernelSource] = {
    "sm_90a": KernelSource(
        "sm90/mla_sm90.cu",
        ("mla_sm90_attention", "mla_sm90_attention_any_page", "mla_sm90_attention_narrow16",
         "mla_sm90_attention_narrow16_fp8",
         "mla_sm90_attention_narrow32_fp8", "mla_sm90_attention_narrow16_fp8_any",
         "mla_sm90_attention_narrow32_fp8_any", "mla_sm90_attention_narrow16_fp8q",
         "mla_sm90_attention_narrow32_fp8q", "mla_sm90_attention_narrow16_fp8q_any",
         "mla_sm90_attention_narrow32_fp8q_any", "mla_sm90_attention_wide_fp8q",
         "mla_sm90_attention_wide_fp8", "mla_sm90_attention_reread",
         "mla_sm90_attention_short"),
    ),
}


# --------------------------------------------------------------------------------------------
# Sources and flags
# --------------------------------------------------------------------------------------------


def _kernel_source(arch: str) -> KernelSource:
    ks = KERNEL_SOURCES.get(arch)
    if ks is None:
        raise CubinError(
            f"no kernels for {arch!r}: jit_mla has kernels for {', '.join(sorted(KERNEL_SOURCES))}"
        )
    return ks


def _hashed_files(csrc: Path) -> list[str]:
    """Relative posix paths of the files every cubin's source hash covers, sorted."""
    return sorted(
        rel
        for p in csrc.rglob("*")
        if p.suffix in _HASHED_SUFFIXES
        and p.is_file()
        and (rel := p.relative_to(csrc).as_posix()) not in _NOT_IN_CUBINS
    )


def source_hash(arch: str) -> str:
    """sha256 of the arch's kernel source and every .h/.cuh/.cu under csrc/ but launcher.cu.

    Paths are relative and contents are read, so neither the checkout's location nor mtimes
    matter.
    """
    ks = _kernel_source(arch)
    csrc = _paths.csrc_dir()
    if not (csrc / ks.source).is_file():
        raise CubinError(f"kernel source for {arch} does not exist: {csrc / ks.source}")
    h = hashlib.sha256()

    def field(label: str, data: bytes) -> None:
        # Length-prefixed, so no two different inputs hash the same concatenation.
        h.update(f"{label}:{len(data)}:".encode())
        h.update(data)

    field("kernel", ks.source.encode())
    for rel in _hashed_files(csrc):
        field("file", rel.encode())
        field("bytes", (csrc / rel).read_bytes())
    return h.hexdigest()


def _uses_cutlass(csrc: Path) -> bool:
    return any(_CUTLASS_INCLUDE.search((csrc / rel).read_bytes()) for rel in _hashed_files(csrc))


def cubin_flags(arch: str) -> list[str]:
    """nvcc flags of the arch's cubin, as recorded in the manifest (directories symbolic)."""
    ks = _kernel_source(arch)
    flags = ["-cubin", env.gencode_flag(arch), "-O3", "-std=c++17", "-lineinfo", "-DNDEBUG"]
    flags.append(f"-I{CSRC}")
    if _uses_cutlass(_paths.csrc_dir()):
        flags.append(f"-I{CUTLASS}")
    # The path cicc derives internal-linkage names from: relative, so the same everywhere.
    flags += ["-Xcicc", "--orig_src_path_name", "-Xcicc", f"csrc/{ks.source}"]
    return flags


def _cutlass_include_dir() -> Path:
    # The nvidia-cutlass wheel (the `cutlass` extra) carries the CUTLASS/CuTe headers.
    spec = importlib.util.find_spec("cutlass_library")
    include = Path(spec.origin).parent / "source" / "include" if spec and spec.origin else None
    if include is None or not (include / "cute").is_dir():
        raise CubinError(
            "csrc/ includes CUTLASS/CuTe headers, which come with the nvidia-cutlass package: "
            "pip install 'jit-mla[cutlass]'"
        )
    return include


def _concrete(flags: list[str], csrc: Path) -> list[str]:
    dirs = {CSRC: csrc}
    if f"-I{CUTLASS}" in flags:
        dirs[CUTLASS] = _cutlass_include_dir()
    out = []
    for flag in flags:
        for name, path in dirs.items():
            flag = flag.replace(name, str(path))
        out.append(flag)
    return out


# --------------------------------------------------------------------------------------------
# Build
# --------------------------------------------------------------------------------------------


def build_cubins(archs: list[str] | tuple[str, ...], out_root: Path | str | None = None) -> dict:
    """Compile each arch's cubin into ``out_root`` (default ``cubins_dir()``); write the manifest.

    Entries of archs not named are kept. Returns the manifest written.
    """
    out_root = Path(out_root) if out_root is not None else _paths.cubins_dir()
    csrc = _paths.csrc_dir()
    try:
        entries = _load_manifest(out_root) or {}
    except CubinError:
        entries = {}  # a broken manifest is what a rebuild repairs
    for arch in archs:
        ks = _kernel_source(arch)
        rel = f"{arch}/{PurePosixPath(ks.source).stem}.cubin"
        flags = cubin_flags(arch)
        hashed = source_hash(arch)  # before compiling: an edit meanwhile then reads as stale
        data = _compile(ks, flags, csrc)
        missing = [s for s in ks.symbols if s not in _function_symbols(data)]
        if missing:
            raise CubinError(
                f"{csrc / ks.source} compiled for {arch} lacks the kernels {', '.join(missing)}; "
                f"its functions: {', '.join(sorted(_function_symbols(data))) or 'none'}"
            )
        try:
            sass.check_cubin(data, f"the {arch} cubin of {csrc / ks.source}")
        except sass.SassError as e:
            raise CubinError(str(e)) from e
        _write_atomic(out_root / rel, data)
        entries[arch] = {
            "file": rel,
            "sha256": hashlib.sha256(data).hexdigest(),
            "source_hash": hashed,
            "nvcc_version": env.nvcc_version(),
            "flags": flags,
            "symbols": list(ks.symbols),
        }
    manifest = {"format": MANIFEST_FORMAT, "cubins": entries}
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    _write_atomic(out_root / MANIFEST, text.encode())
    return manifest


def _compile(ks: KernelSource, flags: list[str], csrc: Path) -> bytes:
    """nvcc -ptx, portable file table, nvcc -cubin; returns the cubin's bytes."""
    cmd = [str(env.nvcc_path()), *_concrete(flags, csrc)]
    to_ptx = [f if f != "-cubin" else "-ptx" for f in cmd]
    stem = PurePosixPath(ks.source).stem
    with tempfile.TemporaryDirectory(prefix="jit_mla-cubin-") as tmp:
        ptx, cubin = Path(tmp) / f"{stem}.ptx", Path(tmp) / f"{stem}.cubin"
        _run_nvcc([*to_ptx, str(csrc / ks.source), "-o", str(ptx)], cwd=tmp)
        ptx.write_text(_portable_file_table(ptx.read_text(), csrc))
        _run_nvcc([*cmd, str(ptx), "-o", str(cubin)], cwd=tmp)
        return cubin.read_bytes()


def _portable_file_table(ptx: str, csrc: Path) -> str:
    """``.file`` paths made machine-independent: ``csrc/<rel>``, ``include/<header>``."""
    root = os.path.realpath(csrc)

    def portable(m: re.Match) -> str:
        path = os.path.realpath(m[2])
        if path.startswith(root + os.sep):
            path = "csrc/" + Path(path).relative_to(root).as_posix()
        else:
            # Toolkit and library headers as the #include names them, e.g.
            # <toolkit>/targets/x86_64-linux/include/cuda_bf16.hpp -> include/cuda_bf16.hpp
            _, sep, header = path.partition("/include/")
            path = f"include/{header}" if sep else path
        return m[1] + path + m[3]

    return _PTX_FILE.sub(portable, ptx)


def _run_nvcc(cmd: list[str], cwd: str) -> None:
    if env.verbose():
        logger.info("%s", shlex.join(cmd))
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except OSError as e:
        raise CubinError(f"cannot run {cmd[0]}: {e}") from e
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-_OUTPUT_TAIL_LINES:])
        raise CubinError(f"nvcc failed (exit {proc.returncode}): {shlex.join(cmd)}\n{tail}")
    check_ptxas_output(proc.stdout + proc.stderr, probe_bits())


_SERIALIZED = "wgmma.mma_async instructions are serialized"
# JIT_MLA_PROBE bits 3-5 (csrc/common/probe.h): the probes that printf from the kernels.
_PRINTF_PROBE_BITS = 0x38
_PROBE_DEFINE = re.compile(r"^#define JIT_MLA_PROBE (\d+)", re.M)


def probe_bits(csrc: Path | None = None) -> int:
    """The JIT_MLA_PROBE value csrc/common/probe.h defines (0 in the shipped sources)."""
    path = (csrc if csrc is not None else _paths.csrc_dir()) / "common" / "probe.h"
    try:
        m = _PROBE_DEFINE.search(path.read_text())
    except OSError:
        return 0
    return int(m[1]) if m else 0


def check_ptxas_output(text: str, probe: int = 0) -> None:
    """Refuse a build in which ptxas serialized the wgmma instructions (its notes C7510, C7520).

    ptxas reports them as information, and the cubin is correct, but each wgmma then waits for the
    previous one: measured 20-33% slower on every shape (session 6: C7520, twice from an unrelated
    change in the planner's code, read at first as an instruction-cache effect). A probe build
    that printfs from the kernels (JIT_MLA_PROBE bits 3-5, `probe`) always gets C7510 ("pipeline
    crossing function boundary at a function call", session 7): it is let through with a warning,
    as its plan, barrier and merge times stay true while its attention times are inflated.
    """
    hits = [line.strip() for line in text.splitlines() if _SERIALIZED in line]
    if not hits:
        return
    if probe & _PRINTF_PROBE_BITS and all("(C7510)" in h for h in hits):
        logger.warning(
            "probe build (JIT_MLA_PROBE=%d): ptxas serialized the wgmmas of %d kernels (C7510, the "
            "probes' printf); attention-phase times of this build are inflated", probe, len(hits))
        return
    codes = sorted({m for h in hits for m in re.findall(r"\((C75\d\d)\)", h)})
    raise CubinError(
        f"ptxas serialized wgmma instructions ({', '.join(codes) or 'no code'}), which makes the kernel "
        "20-33% slower; C7520: no wgmma may depend on a compiler-inserted warpgroup.arrive in a "
        "divergent path; C7510: no call (printf, an out-of-line function) while wgmmas are in flight:\n"
        + "\n".join(hits)
    )


def elf_sections(data: bytes) -> list[tuple[str, int, int, int, int, int]]:
    """(name, sh_type, offset, size, link, entsize) of each section of a little-endian ELF64 file
    (a cubin). ValueError when it is not one; a truncated one raises struct.error or IndexError."""
    if data[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]  # the section-name string table's offset

    def name(offset: int) -> str:
        start = names_at + offset
        return data[start : data.index(b"\0", start)].decode()

    return [(name(h[0]), h[1], h[4], h[5], h[6], h[9]) for h in headers]


def _function_symbols(data: bytes) -> set[str]:
    """Names of the FUNC symbols in an ELF64 cubin's symbol table (what `nm` would list)."""
    names: set[str] = set()
    try:
        sections = elf_sections(data)
        for _, sh_type, offset, size, link, entsize in sections:
            if sh_type != 2 or not entsize:  # SHT_SYMTAB
                continue
            strtab = sections[link][2]
            for pos in range(offset, offset + size, entsize):
                st_name, st_info = struct.unpack_from("<IB", data, pos)
                if st_info & 0xF == 2:  # STT_FUNC
                    end = data.index(b"\0", strtab + st_name)
                    names.add(data[strtab + st_name : end].decode())
    except (struct.error, IndexError, ValueError):  # not an ELF64, or truncated or garbled
        return set()
    return names


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # _remove_write_leftovers
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _remove_write_leftovers(root: Path) -> None:
    """The temp files (.<name>.XXXX) of processes killed inside _write_atomic, in root (the
    manifest's) and its arch dirs (the cubins'). Only under root's lock: nothing else writes then."""
    for stale in [*root.glob(".*.*"), *root.glob("*/.*.*")]:
        if stale.is_file() and not stale.is_symlink():
            stale.unlink()


# --------------------------------------------------------------------------------------------
# Verify
# --------------------------------------------------------------------------------------------


def _load_manifest(root: Path) -> dict[str, dict] | None:
    """The manifest's ``cubins`` table, or None when ``root`` has no manifest."""
    path = root / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise CubinError(f"{path}: unreadable or not JSON: {e}; {REBUILD_HINT}") from e
    if not isinstance(manifest, dict):
        manifest = {}
    entries = manifest.get("cubins")
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(entries, dict):
        raise CubinError(
            f'{path}: expected {{"format": {MANIFEST_FORMAT}, "cubins": {{...}}}}; {REBUILD_HINT}'
        )
    for arch, entry in entries.items():
        if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
            raise CubinError(f"{path}: entry {arch!r} must have exactly {sorted(_ENTRY_KEYS)}")
        rel = PurePosixPath(entry["file"])
        if rel.is_absolute() or ".." in rel.parts:
            raise CubinError(f"{path}: entry {arch!r} file must lie under {root}, got {rel}")
    return entries


def _check(arch: str, root: Path, entry: dict) -> tuple[bytes | None, str | None]:
    """Reads the entry's file once: (bytes, None) when it is sound, else (None, the problem)."""
    path = root / entry["file"]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, f"{path}: listed for {arch} in {root / MANIFEST} but missing"
    except OSError as e:
        return None, f"{path}: unreadable: {e}"
    sha = hashlib.sha256(data).hexdigest()
    if sha != entry["sha256"]:
        return None, (
            f"{path}: sha256 {sha} differs from the manifest's {entry['sha256']}: "
            f"the file was changed after it was built (tampered or corrupted); refusing it"
        )
    if arch not in KERNEL_SOURCES:
        return None, f"{path}: the manifest lists {arch}, which has no kernel sources"
    stale = f"{path} is stale for {arch}"
    current = source_hash(arch)
    if entry["source_hash"] != current:
        return None, (
            f"{stale}: built from sources with hash {entry['source_hash'][:16]}, csrc/ now hashes "
            f"to {current[:16]}; {REBUILD_HINT}"
        )
    flags = cubin_flags(arch)
    if entry["flags"] != flags:
        return None, f"{stale}: built with flags {entry['flags']}, now {flags}; {REBUILD_HINT}"
    missing = [s for s in KERNEL_SOURCES[arch].symbols if s not in _function_symbols(data)]
    if missing:
        return None, f"{stale}: it lacks the kernels {', '.join(missing)}; {REBUILD_HINT}"
    return data, None


def verified_cubin(arch: str, *, root: Path | str | None = None) -> bytes:
    """The arch's cubin bytes once verified; built into the cache when none is shipped.

    ``root`` (default ``cubins_dir()``) holds the manifest; tests point it elsewhere.
    """
    _kernel_source(arch)
    root = Path(root) if root is not None else _paths.cubins_dir()
    entry = (_load_manifest(root) or {}).get(arch)
    if entry is None:
        return _cached_cubin(arch)
    data, problem = _check(arch, root, entry)
    if problem:
        raise CubinError(problem)
    return data


def _cached_cubin(arch: str) -> bytes:
    """Build the arch's cubin into ``cache_dir()/cubins/<source_hash[:16]>/`` once; verify it."""
    root = env.cache_subdir("cubins", source_hash(arch)[:16], what="cubin cache dir")
    with _lock(root / ".lock"):
        # Built by another process or an earlier run? A cache entry that fails the checks is
        # ours to rebuild, not a reason to refuse.
        try:
            entry = (_load_manifest(root) or {}).get(arch)
        except CubinError:
            entry = None
        if entry is not None:
            data, problem = _check(arch, root, entry)
            if problem is None:
                return data
        _remove_write_leftovers(root)
        start = time.monotonic()
        entry = build_cubins([arch], root)["cubins"][arch]
        logger.info(
            "no shipped cubin for %s; built %s in %.1f s",
            arch,
            root / entry["file"],
            time.monotonic() - start,
        )
        data, problem = _check(arch, root, entry)
    if problem:
        raise CubinError(problem)
    return data


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    timeout = env.lock_timeout()
    lock = filelock.FileLock(path)
    try:
        lock.acquire(timeout=timeout)
    except filelock.Timeout:
        raise CubinError(
            f"timed out after {timeout:.0f} s waiting for cubin build lock {path} held by another "
            f"process; raise JIT_MLA_LOCK_TIMEOUT to wait longer"
        ) from None
    try:
        yield
    finally:
        lock.release()


def check_manifest(root: Path | str | None = None) -> list[str]:
    """Problems of the manifest in ``root`` (default ``cubins_dir()``); empty when all is sound."""
    root = Path(root) if root is not None else _paths.cubins_dir()
    try:
        entries = _load_manifest(root)
    except CubinError as e:
        return [str(e)]
    if entries is None:
        return [f"{root / MANIFEST}: missing; {REBUILD_HINT}"]
    problems = []
    for arch, entry in sorted(entries.items()):
        try:
            _, problem = _check(arch, root, entry)
        except CubinError as e:  # e.g. the kernel source itself is gone
            problem = str(e)
        if problem:
            problems.append(problem)
    return problems

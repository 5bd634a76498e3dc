"""Cubin store: manifest, sha256 and source-hash refusals, cache builds, reproducible rebuilds.

CPU only: nvcc compiles cubins without a GPU. Most tests run twice, against
- ``fake``: a tiny kernel tree (a header, a kernel source, a launcher.cu that is not hashed),
  built once per module and copied per test, so they run before the real kernels exist; and
- ``shipped``: copies of the repository's ``cubins/`` and ``csrc/``, skipped until the cubins
  are built.
Every test works on copies in tmp_path, with its own JIT_MLA_CACHE_DIR.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import filelock
import pytest

import jit_mla
from jit_mla import _paths, cli, cubins, env
from jit_mla.cubins import CubinError, KernelSource

SHIPPED_ROOT = _paths.cubins_dir()
SHIPPED_CSRC = _paths.csrc_dir()
NOT_BUILT = "cubins/manifest.json not built yet"

FAKE_ARCH = "sm_80"  # built by the `fake` store
FAKE_UNSHIPPED_ARCH = "sm_86"  # has kernel sources but no entry in the fake store's manifest
FAKE_KERNELS = KernelSource("fake/kern.cu", ("fake_scale", "fake_shift"))
FAKE_SOURCES = {FAKE_ARCH: FAKE_KERNELS, FAKE_UNSHIPPED_ARCH: FAKE_KERNELS}
FAKE_TREE = {
    "config.h": "#pragma once\nconstexpr float kScale = 2.0f;  // fake: no real shape\n",
    "common/util.cuh": '#pragma once\n#include "config.h"\n'
    "__device__ __forceinline__ float scaled(float x) { return kScale * x; }\n",
    "fake/kern.cu": '#include <cuda_bf16.h>\n#include "common/util.cuh"\n'
    "// p: [32] f32\n"
    'extern "C" __global__ void fake_scale(float* p) { p[threadIdx.x] = scaled(p[threadIdx.x]); }\n'
    "// p: [32] bf16\n"
    'extern "C" __global__ void fake_shift(__nv_bfloat16* p) {\n'
    "  p[threadIdx.x] = __float2bfloat16(__bfloat162float(p[threadIdx.x]) + 1.0f);\n}\n",
    "launcher.cu": "// host-side TVM-FFI launcher: compiled by jit.py, never into a cubin\n",
    "README.md": "not a source: not hashed\n",
}


def shipped_manifest() -> dict:
    path = SHIPPED_ROOT / cubins.MANIFEST
    if not path.is_file():
        pytest.skip(NOT_BUILT)
    return json.loads(path.read_text())


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JIT_MLA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("JIT_MLA_VERBOSE", raising=False)


@pytest.fixture(scope="module")
def fake_built(tmp_path_factory) -> tuple[Path, Path]:
    """(csrc, cubins root) of the fake tree, built once for the module."""
    base = tmp_path_factory.mktemp("fake")
    csrc = write_tree(base / "csrc", FAKE_TREE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cubins, "KERNEL_SOURCES", FAKE_SOURCES)
        mp.setattr(_paths, "csrc_dir", lambda: csrc)
        cubins.build_cubins([FAKE_ARCH], base / "cubins")
    return csrc, base / "cubins"


@pytest.fixture
def fake(fake_built, tmp_path, monkeypatch):
    """The fake tree, its kernel sources patched in, csrc and cubins copied for this test."""
    csrc = shutil.copytree(fake_built[0], tmp_path / "csrc")
    root = shutil.copytree(fake_built[1], tmp_path / "cubins")
    monkeypatch.setattr(cubins, "KERNEL_SOURCES", FAKE_SOURCES)
    monkeypatch.setattr(_paths, "csrc_dir", lambda: csrc)
    monkeypatch.setattr(_paths, "cubins_dir", lambda: root)
    return csrc, root


@dataclass
class Store:
    root: Path  # holds manifest.json
    csrc: Path  # what _paths.csrc_dir() returns
    arch: str

    @property
    def file(self) -> Path:
        return self.root / json.loads((self.root / cubins.MANIFEST).read_text())["cubins"][
            self.arch
        ]["file"]

    @property
    def kernel_source(self) -> Path:
        return self.csrc / cubins.KERNEL_SOURCES[self.arch].source


@pytest.fixture(params=["fake", "shipped"])
def store(request, tmp_path, monkeypatch) -> Store:
    """A private copy of a built cubin store and the sources it was built from."""
    if request.param == "fake":
        csrc, root = request.getfixturevalue("fake")
        return Store(root, csrc, FAKE_ARCH)
    arch = sorted(shipped_manifest()["cubins"])[0]
    root = shutil.copytree(SHIPPED_ROOT, tmp_path / "cubins")
    csrc = shutil.copytree(SHIPPED_CSRC, tmp_path / "csrc")
    monkeypatch.setattr(_paths, "csrc_dir", lambda: csrc)
    return Store(root, csrc, arch)


# --------------------------------------------------------------------------------------------
# The shipped manifest
# --------------------------------------------------------------------------------------------


def test_shipped_manifest_matches_files_and_sources():
    manifest = shipped_manifest()
    assert manifest["format"] == cubins.MANIFEST_FORMAT
    assert sorted(manifest["cubins"]) == sorted(cubins.KERNEL_SOURCES), (
        "every arch with kernel sources ships a cubin"
    )
    assert cubins.check_manifest() == []
    for arch, entry in manifest["cubins"].items():
        assert entry["flags"] == cubins.cubin_flags(arch)
        assert entry["symbols"] == list(cubins.KERNEL_SOURCES[arch].symbols)


def test_shipped_manifest_is_machine_independent():
    shipped_manifest()
    text = (SHIPPED_ROOT / cubins.MANIFEST).read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    assert str(SHIPPED_ROOT.parent) not in text and str(Path.home()) not in text
    for entry in json.loads(text)["cubins"].values():
        assert not Path(entry["file"]).is_absolute()
        absolute = [f for f in entry["flags"] if f.lstrip("-I").startswith("/") or "=/" in f]
        assert absolute == [], "flags name directories symbolically, e.g. -I<csrc>"


def test_kernel_sources_ship_with_the_package():
    for arch, ks in cubins.KERNEL_SOURCES.items():
        assert (_paths.csrc_dir() / ks.source).is_file(), f"{arch}: {ks.source} not in csrc"
    assert _paths.csrc_dir().name in ("csrc", "_csrc")
    assert _paths.cubins_dir().name in ("cubins", "_cubins")


@pytest.mark.slow
def test_rebuild_equals_committed(tmp_path):
    """The committed cubins are exactly what their sources and flags give (same nvcc)."""
    manifest = shipped_manifest()
    built_with = {e["nvcc_version"] for e in manifest["cubins"].values()}
    if built_with != {env.nvcc_version()}:
        pytest.skip(
            f"cubins built with nvcc {sorted(built_with)}, this machine has {env.nvcc_version()}"
        )
    rebuilt = cubins.build_cubins(sorted(manifest["cubins"]), tmp_path)
    assert rebuilt == manifest
    for entry in manifest["cubins"].values():
        rebuilt_bytes = (tmp_path / entry["file"]).read_bytes()
        assert rebuilt_bytes == (SHIPPED_ROOT / entry["file"]).read_bytes()
    assert (tmp_path / cubins.MANIFEST).read_text() == (SHIPPED_ROOT / cubins.MANIFEST).read_text()


# --------------------------------------------------------------------------------------------
# Verification: the same checks on the fake store and on a copy of the shipped one
# --------------------------------------------------------------------------------------------


def test_verified_cubin_returns_the_files_bytes(store):
    assert cubins.check_manifest(store.root) == []
    assert cubins.verified_cubin(store.arch, root=store.root) == store.file.read_bytes()


def test_tampered_cubin_is_refused(store):
    data = bytearray(store.file.read_bytes())
    data[len(data) // 2] ^= 0x01
    store.file.write_bytes(bytes(data))
    with pytest.raises(CubinError, match="tampered") as e:
        cubins.verified_cubin(store.arch, root=store.root)
    assert str(store.file) in str(e.value)
    [problem] = cubins.check_manifest(store.root)
    assert str(store.file) in problem and "sha256" in problem


def test_missing_cubin_is_refused(store):
    store.file.unlink()
    with pytest.raises(CubinError, match="missing") as e:
        cubins.verified_cubin(store.arch, root=store.root)
    assert str(store.file) in str(e.value)
    [problem] = cubins.check_manifest(store.root)
    assert "missing" in problem


@pytest.mark.parametrize("edited", ["kernel source", "header"])
def test_stale_cubin_is_refused(store, edited):
    if edited == "kernel source":
        path = store.kernel_source
    else:
        path = next(p for p in sorted(store.csrc.rglob("*")) if p.suffix in (".h", ".cuh"))
    append(path, "// edited after the cubin was built\n")
    with pytest.raises(CubinError, match="stale") as e:
        cubins.verified_cubin(store.arch, root=store.root)
    assert str(store.file) in str(e.value)
    assert "python -m jit_mla build --cubins" in str(e.value)
    [problem] = cubins.check_manifest(store.root)
    assert "stale" in problem


def test_launcher_and_non_sources_do_not_make_cubins_stale(store):
    before = cubins.source_hash(store.arch)
    (store.csrc / "launcher.cu").write_text("// the launcher changed\n")
    (store.csrc / "NOTES.txt").write_text("not a source\n")
    assert cubins.source_hash(store.arch) == before
    assert cubins.check_manifest(store.root) == []


def test_other_flags_make_the_cubin_stale(store):
    manifest_path = store.root / cubins.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["cubins"][store.arch]["flags"] = ["-cubin", "-O0"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(CubinError, match="stale.*flags"):
        cubins.verified_cubin(store.arch, root=store.root)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("{not json", "not JSON"),
        ('{"format": 2, "cubins": {}}', "format"),
        ('{"format": 1, "cubins": {"sm_80": {"file": "x.cubin"}}}', "must have exactly"),
    ],
)
def test_broken_manifest_is_refused(fake, text, expected):
    _, root = fake
    (root / cubins.MANIFEST).write_text(text)
    with pytest.raises(CubinError, match=expected):
        cubins.verified_cubin(FAKE_ARCH, root=root)
    [problem] = cubins.check_manifest(root)
    assert str(root / cubins.MANIFEST) in problem


def test_manifest_file_outside_its_folder_is_refused(fake):
    _, root = fake
    manifest = json.loads((root / cubins.MANIFEST).read_text())
    manifest["cubins"][FAKE_ARCH]["file"] = "../elsewhere.cubin"
    (root / cubins.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CubinError, match="must lie under"):
        cubins.verified_cubin(FAKE_ARCH, root=root)


def test_arch_without_kernels_is_refused(fake):
    supported = f"{FAKE_ARCH}, {FAKE_UNSHIPPED_ARCH}"
    with pytest.raises(CubinError, match=f"no kernels for 'sm_70'.*{supported}"):
        cubins.verified_cubin("sm_70")
    with pytest.raises(CubinError, match="no kernels for 'sm_70'"):
        cubins.build_cubins(["sm_70"], fake[1])


def test_missing_kernel_source_is_named(fake):
    csrc, root = fake
    (csrc / FAKE_KERNELS.source).unlink()
    with pytest.raises(CubinError, match=f"kernel source for {FAKE_ARCH} does not exist"):
        cubins.verified_cubin(FAKE_ARCH, root=root)
    [problem] = cubins.check_manifest(root)
    assert "does not exist" in problem


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------


def test_manifest_is_stable_and_machine_independent(fake, tmp_path):
    csrc, root = fake
    text = (root / cubins.MANIFEST).read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    assert str(tmp_path) not in text and "/tmp" not in text
    entry = json.loads(text)["cubins"][FAKE_ARCH]
    assert entry["file"] == f"{FAKE_ARCH}/kern.cubin"
    assert entry["nvcc_version"] == env.nvcc_version()
    assert entry["source_hash"] == cubins.source_hash(FAKE_ARCH)
    assert entry["symbols"] == list(FAKE_KERNELS.symbols)
    assert entry["flags"] == cubins.cubin_flags(FAKE_ARCH)
    assert "-I<csrc>" in entry["flags"] and "-lineinfo" in entry["flags"]
    assert "--use_fast_math" not in entry["flags"]


def test_build_is_reproducible_wherever_the_sources_lie(fake, tmp_path, monkeypatch):
    """Byte-identical cubins from a copy of csrc elsewhere: a clone anywhere rebuilds the same."""
    csrc, root = fake
    elsewhere = shutil.copytree(csrc, tmp_path / "some" / "other" / "checkout" / "csrc")
    monkeypatch.setattr(_paths, "csrc_dir", lambda: elsewhere)
    rebuilt = cubins.build_cubins([FAKE_ARCH], tmp_path / "rebuilt")
    manifest_text = (tmp_path / "rebuilt" / cubins.MANIFEST).read_text()
    assert manifest_text == (root / cubins.MANIFEST).read_text()
    file = rebuilt["cubins"][FAKE_ARCH]["file"]
    data = (tmp_path / "rebuilt" / file).read_bytes()
    assert data == (root / file).read_bytes()
    assert str(tmp_path).encode() not in data  # no path of this machine in the cubin


def test_build_keeps_other_archs_entries(fake):
    _, root = fake
    before = json.loads((root / cubins.MANIFEST).read_text())["cubins"][FAKE_ARCH]
    manifest = cubins.build_cubins([FAKE_UNSHIPPED_ARCH], root)
    assert manifest["cubins"][FAKE_ARCH] == before
    assert cubins.check_manifest(root) == []


def test_source_hash_ignores_location_and_mtime(fake, tmp_path, monkeypatch):
    csrc, _ = fake
    before = cubins.source_hash(FAKE_ARCH)
    moved = shutil.copytree(csrc, tmp_path / "moved", copy_function=shutil.copy)  # new mtimes
    monkeypatch.setattr(_paths, "csrc_dir", lambda: moved)
    assert cubins.source_hash(FAKE_ARCH) == before
    append(moved / "common" / "util.cuh", "\n")
    assert cubins.source_hash(FAKE_ARCH) != before


def test_missing_kernel_symbol_fails_the_build(fake, tmp_path, monkeypatch):
    monkeypatch.setitem(
        cubins.KERNEL_SOURCES,
        FAKE_ARCH,
        KernelSource(FAKE_KERNELS.source, ("fake_scale", "no_such")),
    )
    with pytest.raises(CubinError, match="lacks the kernels no_such"):
        cubins.build_cubins([FAKE_ARCH], tmp_path / "out")
    assert not (tmp_path / "out" / cubins.MANIFEST).exists()


def test_nvcc_error_is_reported(fake, tmp_path):
    csrc, _ = fake
    append(csrc / FAKE_KERNELS.source, "this is not C++;\n")
    with pytest.raises(CubinError, match="nvcc failed") as e:
        cubins.build_cubins([FAKE_ARCH], tmp_path / "out")
    assert "kern.cu" in str(e.value) and "error" in str(e.value)


def test_unshipped_arch_is_built_into_the_cache_once(fake, tmp_path, caplog):
    """An arch with kernel sources but no manifest entry: built on first use, one INFO line."""
    csrc, root = fake
    caplog.set_level(logging.INFO, logger="jit_mla")
    data = cubins.verified_cubin(FAKE_UNSHIPPED_ARCH, root=root)

    built = [r for r in caplog.records if "no shipped cubin" in r.getMessage()]
    assert len(built) == 1, caplog.text
    assert built[0].levelno == logging.INFO and built[0].name == "jit_mla"
    assert f"no shipped cubin for {FAKE_UNSHIPPED_ARCH}; built " in built[0].getMessage()
    cache = tmp_path / "cache" / "cubins" / cubins.source_hash(FAKE_UNSHIPPED_ARCH)[:16]
    assert cubins.check_manifest(cache) == []
    assert (cache / FAKE_UNSHIPPED_ARCH / "kern.cubin").read_bytes() == data
    assert "fake_shift" in cubins._function_symbols(data)
    assert FAKE_UNSHIPPED_ARCH not in json.loads((root / cubins.MANIFEST).read_text())["cubins"]

    caplog.clear()
    assert cubins.verified_cubin(FAKE_UNSHIPPED_ARCH, root=root) == data
    assert "no shipped cubin" not in caplog.text, "the second use must reuse the cached build"

    # A broken cache entry is the cache's to repair: rebuilt, not refused.
    (cache / FAKE_UNSHIPPED_ARCH / "kern.cubin").write_bytes(b"garbage")
    assert cubins.verified_cubin(FAKE_UNSHIPPED_ARCH, root=root) == data
    assert caplog.text.count("no shipped cubin") == 1


def test_no_manifest_at_all_builds_into_the_cache(fake, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cubins.verified_cubin(FAKE_ARCH, root=empty) == cubins.verified_cubin(FAKE_ARCH)
    [problem] = cubins.check_manifest(empty)
    assert "missing" in problem


def test_cache_build_waits_for_the_lock_then_times_out(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("JIT_MLA_LOCK_TIMEOUT", "0.2")
    cache = tmp_path / "cache" / "cubins" / cubins.source_hash(FAKE_UNSHIPPED_ARCH)[:16]
    cache.mkdir(parents=True)
    # flock locks conflict between two open file descriptions, also within one process.
    with filelock.FileLock(cache / ".lock", is_singleton=False):
        with pytest.raises(CubinError, match="timed out .* JIT_MLA_LOCK_TIMEOUT"):
            cubins.verified_cubin(FAKE_UNSHIPPED_ARCH)


def test_symbol_check_reads_only_well_formed_elf(fake):
    _, root = fake
    data = (root / FAKE_ARCH / "kern.cubin").read_bytes()
    assert set(FAKE_KERNELS.symbols) <= cubins._function_symbols(data)
    for broken in (b"", b"garbage", data[:6], data[:100], data[: len(data) // 2]):
        assert not set(FAKE_KERNELS.symbols) <= cubins._function_symbols(broken)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def test_cli_build_cubins_regenerates_the_store(fake, monkeypatch, capsys):
    _, root = fake
    (root / cubins.MANIFEST).unlink()
    shutil.rmtree(root / FAKE_ARCH)
    launcher_built = []
    fake_launcher = types.SimpleNamespace(build_launcher=lambda: launcher_built.append(1))
    monkeypatch.setitem(sys.modules, "jit_mla.launcher", fake_launcher)
    monkeypatch.setattr(jit_mla, "launcher", fake_launcher, raising=False)

    assert cli.main(["build", "--cubins", "--arch", FAKE_ARCH]) == 0
    assert launcher_built == [1]
    assert cubins.check_manifest(root) == []
    assert sorted(json.loads((root / cubins.MANIFEST).read_text())["cubins"]) == [FAKE_ARCH]
    assert f"cubin {FAKE_ARCH}: {root / FAKE_ARCH / 'kern.cubin'}" in capsys.readouterr().out

    assert cli.main(["build", "--cubins", "--arch", "sm_70"]) == 1
    assert "no kernels for 'sm_70'" in capsys.readouterr().err


def test_cli_info_reports_manifest_status(fake, capsys):
    import torch

    _, root = fake
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"{FAKE_ARCH}: {FAKE_ARCH}/kern.cubin (nvcc {env.nvcc_version()})" in out
    assert "status: ok" in out
    assert env.nvcc_version() in out
    if not torch.cuda.is_available():
        assert "no GPU" in out

    (root / FAKE_ARCH / "kern.cubin").write_bytes(b"tampered")
    assert cli.main(["info"]) == 0
    assert "problem: " in capsys.readouterr().out


def test_ptxas_serialized_wgmma_fails_the_build():
    # ptxas's C7520 is "info", not an error, but the kernel it describes runs 20-33% slower.
    cubins.check_ptxas_output("ptxas info    : (C7519) warpgroup.arrive is injected in around line 7\n")
    text = (
        "ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are "
        "serialized due to program dependence on compiler-inserted WG.AR in divergent path in "
        "the function 'mla_sm90_attention'\n"
    )
    with pytest.raises(CubinError, match=r"C7520.*\n.*mla_sm90_attention"):
        cubins.check_ptxas_output(text)


_C7510 = (
    "ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are "
    "serialized due to wgmma pipeline crossing function boundary at a function call in the "
    "function 'mla_sm90_attention_narrow16'\n"
)


def test_ptxas_call_serialized_wgmma_fails_a_shipped_build_not_a_printf_probe(caplog):
    # C7510 (a call while wgmmas are in flight) is refused like C7520 ...
    with pytest.raises(CubinError, match=r"C7510"):
        cubins.check_ptxas_output(_C7510)
    with pytest.raises(CubinError, match=r"C7510"):
        cubins.check_ptxas_output(_C7510, probe=1)  # the no-loads probe has no printf
    # ... except in a probe build that printfs from the kernels (JIT_MLA_PROBE bits 3-5): a warning.
    with caplog.at_level("WARNING", logger=cubins.logger.name):
        cubins.check_ptxas_output(_C7510, probe=32)
    assert "inflated" in caplog.text
    with pytest.raises(CubinError, match=r"C7520"):  # C7520 is never let through
        cubins.check_ptxas_output(_C7510 + _C7510.replace("C7510", "C7520"), probe=8)


def test_probe_bits_reads_probe_h(tmp_path):
    assert cubins.probe_bits() == 0  # the shipped sources
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "probe.h").write_text("#ifndef JIT_MLA_PROBE\n#define JIT_MLA_PROBE 24\n#endif\n")
    assert cubins.probe_bits(tmp_path) == 24
    assert cubins.probe_bits(tmp_path / "missing") == 0

"""JIT build cache: keys, rebuilds, concurrency, recovery, and the environment it reads.

CPU only: the probe module (tests/data/jit_probe.cu) is host C++ exported through TVM-FFI, so
it builds with nvcc and runs without a GPU. Each test gets its own JIT_MLA_CACHE_DIR and its own
copy of the probe sources, so edits never touch the repository. Every compile appends one line to
the module dir's builds.log; the tests count compiles with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import filelock
import pytest

from conftest import probe_spec
from jit_mla import env, jit
from jit_mla.env import JitError
from jit_mla.jit import JitSpec

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_state(tmp_path, monkeypatch):
    """A private cache dir, no leftover knobs, and empty in-process memos for every test."""
    monkeypatch.setenv("JIT_MLA_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("JIT_MLA_LOCK_TIMEOUT", "JIT_MLA_VERBOSE", "JIT_MLA_CUDA_ARCH_LIST"):
        monkeypatch.delenv(var, raising=False)
    _clear_memos()
    yield
    _clear_memos()


def _clear_memos() -> None:
    jit._memo.clear()
    env.cuda_home.cache_clear()
    env.nvcc_version.cache_clear()


def builds(spec: JitSpec) -> int:
    """How many times this spec's module dir was compiled."""
    log = jit.module_dir(spec) / "builds.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path} should contain {old!r}"
    path.write_text(text.replace(old, new))


# A fresh interpreter that builds/loads the probe and prints what its functions return. With
# ready/go paths it first signals that its imports are done, then waits for the go file, so that
# all children reach build_and_load at the same moment.
CHILD = r"""
import json, logging, os, sys, time
from pathlib import Path
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from jit_mla import jit
a = json.loads(sys.argv[1])
if a.get("ready"):
    Path(a["ready"]).touch()
    while not os.path.exists(a["go"]):
        time.sleep(0.01)
spec = jit.JitSpec(a["name"], tuple(map(Path, a["sources"])),
                   include_dirs=tuple(map(Path, a["include_dirs"])),
                   hashed_dirs=tuple(map(Path, a["hashed_dirs"])))
m = jit.build_and_load(spec)
print(json.dumps({"add_one": m.add_one(41), "header_value": m.header_value()}))
"""


def child_args(spec: JitSpec, **extra: str) -> str:
    return json.dumps(
        {
            "name": spec.name,
            "sources": [str(p) for p in spec.sources],
            "include_dirs": [str(p) for p in spec.include_dirs],
            "hashed_dirs": [str(p) for p in spec.hashed_dirs],
            **extra,
        }
    )


def child_env() -> dict[str, str]:
    # The children inherit the test's JIT_MLA_* settings (monkeypatch edits os.environ).
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), e.get("PYTHONPATH")]))
    return e


def popen_python(code: str, *args: str, **popen_kw) -> subprocess.Popen:
    """A fresh interpreter running `code` with argv[1:] = args, in child_env(), output piped."""
    return subprocess.Popen([sys.executable, "-c", code, *args], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen_kw)


def start_child(spec: JitSpec, **extra: str) -> subprocess.Popen:
    return popen_python(CHILD, child_args(spec, **extra))


def copy_probe(probe: JitSpec, dest: Path) -> JitSpec:
    """The probe's files copied to dest, as the probe's spec there."""
    shutil.copytree(probe.sources[0].parent, dest)
    return probe_spec(dest)


def finish_child(proc: subprocess.Popen) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, f"child failed (exit {proc.returncode}):\n{err}"
    return json.loads(out.strip().splitlines()[-1]), err


def run_child(spec: JitSpec) -> tuple[dict, str]:
    return finish_child(start_child(spec))


# --------------------------------------------------------------------------------------------
# Build, reuse, rebuild
# --------------------------------------------------------------------------------------------


def test_cold_build_then_warm_reuse(probe, caplog):
    caplog.set_level("INFO", logger="jit_mla")
    module = jit.build_and_load(probe)
    assert module.add_one(41) == 42
    assert module.header_value() == 7
    assert builds(probe) == 1
    assert any("built jit_probe" in r.getMessage() for r in caplog.records)
    assert (jit.module_dir(probe) / "jit_probe.so").is_file()

    # Same process: the memo hands back the same module object.
    assert jit.build_and_load(probe) is module

    # New process: loads from the cache, no compile.
    result, err = run_child(probe)
    assert result == {"add_one": 42, "header_value": 7}
    assert builds(probe) == 1
    assert "built jit_probe" not in err


def test_source_edit_rebuilds_and_unchanged_source_does_not(probe):
    first_key = jit.module_key(probe)
    assert jit.build_and_load(probe).add_one(41) == 42

    edit(probe.sources[0], "return x + 1;", "return x + 2;")
    assert jit.module_key(probe) != first_key
    assert jit.build_and_load(probe).add_one(41) == 43
    assert builds(probe) == 1  # the edited module's own dir

    # Back to the original bytes: the original key and module, without compiling again, in this
    # process (memo cleared, so through the on-disk stamp) and in a new one.
    edit(probe.sources[0], "return x + 2;", "return x + 1;")
    assert jit.module_key(probe) == first_key
    jit._memo.clear()
    assert jit.build_and_load(probe).add_one(41) == 42
    assert run_child(probe)[0]["add_one"] == 42
    assert builds(probe) == 1
    assert len(list((jit.module_dir(probe).parent).glob("jit_probe_*/builds.log"))) == 2


def test_header_edit_rebuilds(probe):
    assert jit.build_and_load(probe).header_value() == 7
    first_dir = jit.module_dir(probe)

    edit(probe.hashed_dirs[0] / "probe.h", "PROBE_HEADER_VALUE 7", "PROBE_HEADER_VALUE 8")
    assert jit.module_dir(probe) != first_dir
    assert jit.build_and_load(probe).header_value() == 8
    assert builds(probe) == 1
    assert len(list(first_dir.parent.glob("jit_probe_*/builds.log"))) == 2


def test_key_depends_on_contents_not_mtimes_or_location(probe, tmp_path):
    key = jit.module_key(probe)
    header = probe.hashed_dirs[0] / "probe.h"
    for path in (probe.sources[0], header):
        os.utime(path, (1_000_000, 1_000_000))
    assert jit.module_key(probe) == key, "touching files must not change the key"

    # Same bytes and names elsewhere: same key (a fresh checkout reuses the cache).
    same = copy_probe(probe, tmp_path / "moved")
    assert jit.module_key(same) == key

    # Flags, arch and new files under a hashed dir are part of the key.
    assert jit.module_key(JitSpec(**{**vars(probe), "cuda_cflags": ("-DX=1",)})) != key
    assert jit.module_key(JitSpec(**{**vars(probe), "ldflags": ("-lm",)})) != key
    assert jit.module_key(JitSpec(**{**vars(probe), "arch": "sm_90a"})) != key
    (header.parent / "extra.h").write_text("// new header\n")
    assert jit.module_key(probe) != key


# --------------------------------------------------------------------------------------------
# Concurrency and recovery
# --------------------------------------------------------------------------------------------


def test_threads_share_one_build(probe):
    n = 4
    barrier = threading.Barrier(n)
    modules: list = [None] * n

    def load(i: int) -> None:
        barrier.wait()
        modules[i] = jit.build_and_load(probe)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(m is modules[0] for m in modules)
    assert modules[0].add_one(1) == 2
    assert builds(probe) == 1



def test_concurrent_cold_processes_compile_once(probe, tmp_path):
    n = 8
    sync = tmp_path / "sync"
    sync.mkdir()
    go = sync / "go"
    children = [start_child(probe, ready=str(sync / f"ready{i}"), go=str(go)) for i in range(n)]
    deadline = time.monotonic() + 300
    while len(list(sync.glob("ready*"))) < n:
        failed = [c for c in children if c.poll() is not None]
        assert not failed, f"child exited early:\n{failed[0].communicate()[1]}"
        assert time.monotonic() < deadline, "children did not get ready in 300 s"
        time.sleep(0.05)
    go.touch()

    results = [finish_child(c) for c in children]
    assert [r for r, _ in results] == [{"add_one": 42, "header_value": 7}] * n
    assert builds(probe) == 1
    # The compile takes seconds, so the others found the lock taken and said so.
    assert any("waits for another process's build" in err for _, err in results)


@pytest.mark.parametrize("damage", ["truncate_so", "garble_stamp", "delete_so"])
def test_damaged_cache_entry_is_rebuilt(probe, damage):
    # Build in a child: this process must not map the library the test then truncates in place
    # (the loader would read the cut-off pages at exit and die with SIGBUS).
    assert run_child(probe)[0]["add_one"] == 42
    mdir = jit.module_dir(probe)
    so = mdir / "jit_probe.so"
    if damage == "truncate_so":
        os.truncate(so, so.stat().st_size // 2)
    elif damage == "garble_stamp":
        (mdir / "done").write_text("{not json")
    else:
        so.unlink()

    assert run_child(probe)[0]["add_one"] == 42
    assert builds(probe) == 2
    assert run_child(probe)[0]["add_one"] == 42
    assert builds(probe) == 2


def test_stale_lock_and_killed_compiler_leftovers(probe):
    # What a build killed mid-way leaves: a lock file with no holder (flock died with the
    # process), its build dir with a half-written object, a half-linked .so, ninja's files, and
    # no stamp; also what older layouts left in the module dir itself.
    mdir = jit.module_dir(probe)
    killed = mdir / "build-killed"
    (killed / "obj").mkdir(parents=True)
    (mdir / ".lock").touch()
    (killed / "obj" / "jit_probe.o").write_bytes(b"\x7fELF half an object")
    (killed / "jit_probe.so").write_bytes(b"\x7fELF half a library")
    (mdir / "jit_probe.so.tmp").write_bytes(b"\x7fELF half a library")
    for d in (mdir, killed):
        (d / "build.ninja").write_text("garbage\n")
        (d / ".ninja_log").write_text("garbage\n")
        (d / ".ninja_deps").write_bytes(b"garbage")

    assert jit.build_and_load(probe).add_one(41) == 42
    assert builds(probe) == 1
    left = sorted(p.name for p in mdir.iterdir())
    assert left == [".lock", "builds.log", "done", "jit_probe.so"], left


def test_lock_timeout_names_the_lock_and_the_variable(probe, monkeypatch, caplog):
    monkeypatch.setenv("JIT_MLA_LOCK_TIMEOUT", "0.3")
    caplog.set_level("INFO", logger="jit_mla")
    lock_path = jit.module_dir(probe) / ".lock"
    lock_path.parent.mkdir(parents=True)
    with filelock.FileLock(lock_path):  # "another process" is building
        with pytest.raises(JitError) as info:
            jit.build_and_load(probe)
    assert str(lock_path) in str(info.value)
    assert "JIT_MLA_LOCK_TIMEOUT" in str(info.value)
    assert any("waits for another process's build" in r.getMessage() for r in caplog.records)
    assert builds(probe) == 0


def test_verbose_prints_compiler_commands(probe, monkeypatch, capsys):
    monkeypatch.setenv("JIT_MLA_VERBOSE", "1")
    jit.build_and_load(probe)
    err = capsys.readouterr().err
    nvcc = str(env.nvcc_path())
    assert f"{nvcc} -std=c++17" in err, "the compile command should be echoed"
    assert f"{nvcc} -shared" in err, "the link command should be echoed"


def test_compile_error_shows_compiler_output_and_build_dir(probe):
    edit(probe.sources[0], "return x + 1;", "return x + ;")
    with pytest.raises(JitError) as info:
        jit.build_and_load(probe)
    message = str(info.value)
    # The failed build's own dir, kept for a look: its build.ninja holds the commands.
    m = re.search(re.escape(str(jit.module_dir(probe))) + r"/build-\w+", message)
    assert m, message
    assert (Path(m[0]) / "build.ninja").is_file()
    assert "jit_probe.cu" in message and "error" in message
    assert not (jit.module_dir(probe) / "done").exists()
    assert builds(probe) == 0


def test_spec_rejects_bad_name_and_empty_sources(probe):
    with pytest.raises(ValueError, match="JitSpec.name"):
        JitSpec(name="../escape", sources=probe.sources)
    with pytest.raises(ValueError, match="sources"):
        JitSpec(name="jit_probe", sources=())


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------


def test_env_vars_table_lists_every_variable():
    assert set(env.ENV_VARS) == {
        "JIT_MLA_CACHE_DIR",
        "JIT_MLA_VERBOSE",
        "JIT_MLA_CUDA_ARCH_LIST",
        "JIT_MLA_CHECK_INPUTS",
        "JIT_MLA_LOCK_TIMEOUT",
        "CUDA_HOME",
    }
    assert all(isinstance(d, str) and d for d in env.ENV_VARS.values())


def test_cache_dir_is_created_private(tmp_path, monkeypatch):
    path = tmp_path / "a" / "b" / "cache"
    monkeypatch.setenv("JIT_MLA_CACHE_DIR", str(path))
    assert env.cache_dir() == path
    for p in (path, path.parent, path.parent.parent):
        assert p.stat().st_mode & 0o777 == 0o700, p


@pytest.mark.parametrize("layout", ["parent_is_file", "path_is_file"])
def test_unwritable_cache_dir_names_path_and_variable(tmp_path, monkeypatch, probe, layout):
    # Tests run as root, which chmod does not stop; a regular file in the way stops everyone.
    blocker = tmp_path / "blocker"
    blocker.write_text("a regular file")
    path = blocker / "cache" if layout == "parent_is_file" else blocker
    monkeypatch.setenv("JIT_MLA_CACHE_DIR", str(path))
    for call in (env.cache_dir, lambda: jit.build_and_load(probe)):
        with pytest.raises(JitError) as info:
            call()
        assert str(path) in str(info.value)
        assert "JIT_MLA_CACHE_DIR" in str(info.value)


def test_cuda_home_sees_through_path_wrapper(tmp_path, monkeypatch):
    real = env.cuda_home().resolve()
    wrapper_bin = tmp_path / "wrapper_bin"
    wrapper_bin.mkdir()
    wrapper = wrapper_bin / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec "{real}/bin/nvcc" "$@"\n')
    wrapper.chmod(0o755)

    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    # nvcc's dry run needs the host compiler, so keep the rest of PATH behind the wrapper.
    monkeypatch.setenv("PATH", f"{wrapper_bin}{os.pathsep}{os.environ['PATH']}")
    _clear_memos()
    assert shutil.which("nvcc") == str(wrapper)
    assert env.cuda_home() == real
    assert env.nvcc_path() == real / "bin" / "nvcc"
    version = env.nvcc_version()
    assert version.count(".") == 2 and all(part.isdigit() for part in version.split("."))


@pytest.mark.parametrize("var", ["CUDA_HOME", "CUDA_PATH"])
def test_cuda_home_pointing_nowhere(tmp_path, monkeypatch, var):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv(var, str(tmp_path / "nowhere"))
    _clear_memos()
    with pytest.raises(JitError) as info:
        env.cuda_home()
    assert var in str(info.value) and str(tmp_path / "nowhere") in str(info.value)


def test_no_toolkit_anywhere(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    _clear_memos()
    with pytest.raises(JitError) as info:
        env.cuda_home()
    assert "CUDA_HOME" in str(info.value) and "PATH" in str(info.value)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("sm_90a", ["sm_90a"]),
        ("9.0a", ["sm_90a"]),
        ("90a", ["sm_90a"]),
        ("10.0a, sm_90a", ["sm_100a", "sm_90a"]),
        ("9.0a 8.6,sm_90a", ["sm_90a", "sm_86"]),
        (" SM_100A ", ["sm_100a"]),
    ],
)
def test_arch_list_parsing(monkeypatch, raw, expected):
    monkeypatch.setenv("JIT_MLA_CUDA_ARCH_LIST", raw)
    assert env.cuda_arch_list() == expected


@pytest.mark.parametrize("bad", ["sm_9x", "hopper", "9.0b", "compute_90a"])
def test_arch_list_rejects_bad_entries(monkeypatch, bad):
    monkeypatch.setenv("JIT_MLA_CUDA_ARCH_LIST", f"sm_90a,{bad}")
    with pytest.raises(JitError) as info:
        env.cuda_arch_list()
    assert "JIT_MLA_CUDA_ARCH_LIST" in str(info.value) and repr(bad) in str(info.value)


def test_arch_from_device(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert env.cuda_arch_list() == []
    with pytest.raises(JitError, match="no CUDA device"):
        env.device_arch()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for capability, arch in [((9, 0), "sm_90a"), ((10, 0), "sm_100a"), ((8, 6), "sm_86")]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None, c=capability: c)
        assert env.device_arch() == arch
        assert env.cuda_arch_list() == [arch]


def test_gencode_flag():
    assert env.gencode_flag("sm_90a") == "-gencode=arch=compute_90a,code=sm_90a"
    assert env.gencode_flag("sm_100a") == "-gencode=arch=compute_100a,code=sm_100a"
    with pytest.raises(JitError, match="9.0a"):
        env.gencode_flag("9.0a")


def test_lock_timeout_parsing(monkeypatch):
    assert env.lock_timeout() == 900.0
    monkeypatch.setenv("JIT_MLA_LOCK_TIMEOUT", "2.5")
    assert env.lock_timeout() == 2.5
    for bad in ("soon", "0", "-1", "nan"):
        monkeypatch.setenv("JIT_MLA_LOCK_TIMEOUT", bad)
        with pytest.raises(JitError, match="JIT_MLA_LOCK_TIMEOUT"):
            env.lock_timeout()

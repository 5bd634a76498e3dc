"""The JIT cache as an attack surface: folder owner and mode, swapped files, dead lock holders.

The cache holds shared libraries and cubins that are loaded into the process, so whoever can
write there runs code as the user. What protects it:
- the cache dir and every module dir are created 0700 and refused (JitError naming the path, the
  owner or mode found, what is expected and JIT_MLA_CACHE_DIR) when another user owns them or
  group or others can write to them;
- a module is loaded only when its sha256 matches its ``done`` stamp, a cache-built cubin only
  when its sha256 matches its manifest: anything else is rebuilt, never loaded;
- build locks are flock locks, released by the kernel when their holder dies.

CPU only (the probe module is host C++; the fake cubins compile without a GPU). Tests run as root
here and in CI, and chmod does not stop root: "another user" is made with ``os.chown`` and
refusals are checked on the owner and mode bits, never on a failing write.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import filelock
import pytest

from jit_mla import _paths, cubins, env, jit
from jit_mla.env import JitError
from test_cubins import FAKE_SOURCES, FAKE_TREE, FAKE_UNSHIPPED_ARCH, write_tree
from test_jit import _fresh_state  # noqa: F401 - autouse: a private cache dir and empty memos per test
from test_jit import CHILD, builds, child_args, copy_probe, edit, popen_python, run_child

OTHER_UID = 4321 if os.geteuid() != 4321 else 4322  # any uid but ours; need not exist


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------


def chown_to_another_user(path: Path) -> None:
    try:
        os.chown(path, OTHER_UID, -1, follow_symlinks=False)
    except PermissionError:
        pytest.skip("os.chown to another uid needs root (the tests run as root in CI)")


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def assert_names(message: str, *parts: str) -> None:
    for part in parts:
        assert part in message, f"{part!r} missing from the error:\n{message}"


# Holds the flock lock at argv[1] and says so on stdout, then sleeps until it is killed.
LOCK_HOLDER = r"""
import sys, time, filelock
lock = filelock.FileLock(sys.argv[1])  # kept referenced: a collected FileLock releases itself
lock.acquire()
print("locked", flush=True)
time.sleep(600)
"""


def start_lock_holder(path: Path) -> subprocess.Popen:
    proc = popen_python(LOCK_HOLDER, str(path))
    line = proc.stdout.readline()
    assert line.strip() == "locked", f"lock holder did not start:\n{line}{proc.stderr.read()}"
    return proc


def is_locked(path: Path) -> bool:
    # flock locks of two open file descriptions conflict, also within one process.
    probe_lock = filelock.FileLock(path, is_singleton=False)
    try:
        probe_lock.acquire(timeout=0)
    except filelock.Timeout:
        return True
    probe_lock.release()
    return False


def sigkill(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (it runs in its own session), then reap it. Ninja gives
    each command a process group of its own, so a compiler it was running lives on."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate(timeout=60)


# --------------------------------------------------------------------------------------------
# Folders are created private
# --------------------------------------------------------------------------------------------


def test_cache_and_module_dirs_are_created_0700_whatever_the_umask(tmp_path, monkeypatch, probe):
    cache = tmp_path / "a" / "cache"
    monkeypatch.setenv("JIT_MLA_CACHE_DIR", str(cache))
    old = os.umask(0)  # the most permissive umask: the modes must come from jit_mla itself
    try:
        assert env.cache_dir() == cache
        sub = env.cache_subdir("x", "y")
    finally:
        os.umask(old)
    assert sub == cache / "x" / "y"
    for p in (cache.parent, cache, cache / "x", sub):
        assert mode(p) == 0o700, f"{p}: {oct(mode(p))}"

    assert jit.build_and_load(probe).add_one(1) == 2
    assert mode(jit.module_dir(probe)) == 0o700


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b"])
def test_cache_subdir_takes_single_folder_names(bad):
    with pytest.raises(ValueError, match="single folder names"):
        env.cache_subdir("ok", bad)


def test_private_dirs_of_our_own_are_accepted(tmp_path, monkeypatch):
    # Readable by others is fine (nothing to hide, only nothing to inject): 0755 and 0700 pass.
    for m in (0o700, 0o750, 0o755):
        path = tmp_path / f"cache{m:o}"
        path.mkdir()
        path.chmod(m)
        monkeypatch.setenv("JIT_MLA_CACHE_DIR", str(path))
        assert env.cache_dir() == path
        assert mode(path) == m, "an existing dir of ours is used as it is, not chmod-ed"


# --------------------------------------------------------------------------------------------
# Folders of another user, or writable by others, are refused
# --------------------------------------------------------------------------------------------


def assert_refused_by_both(probe, *fragments: str) -> None:
    """env.cache_dir() and a build both raise JitError whose message names every fragment."""
    for call in (env.cache_dir, lambda: jit.build_and_load(probe)):
        with pytest.raises(JitError) as info:
            call()
        assert_names(str(info.value), *fragments)


def test_cache_dir_owned_by_another_user_is_refused(tmp_path, probe):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    chown_to_another_user(cache)
    assert_refused_by_both(
        probe, f"cache dir {cache}", "JIT_MLA_CACHE_DIR", f"owned by uid {OTHER_UID}",
        f"expected uid {os.geteuid()}")  # fmt: skip
    assert list(cache.iterdir()) == [], "nothing may be written into a refused cache dir"


@pytest.mark.parametrize(
    "bad_mode, who", [(0o777, "group and others"), (0o770, "group"), (0o703, "others")]
)
def test_cache_dir_writable_by_others_is_refused(tmp_path, probe, bad_mode, who):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(bad_mode)
    assert_refused_by_both(
        probe, f"cache dir {cache}", "JIT_MLA_CACHE_DIR", f"has mode {bad_mode:04o}, writable by {who}",
        "expected no group or other write permission", "0700")  # fmt: skip
    assert list(cache.iterdir()) == []


@pytest.mark.parametrize("damage", ["chown", "chmod 777", "chmod 770", "symlink to foreign"])
def test_foreign_or_open_module_dir_is_refused_before_anything_is_loaded(
    probe, tmp_path, damage
):
    # A complete, stamped module: what an attacker would leave for us to load.
    assert run_child(probe)[0]["add_one"] == 42
    mdir = jit.module_dir(probe)
    if damage == "chown":
        chown_to_another_user(mdir)
    elif damage.startswith("chmod"):
        mdir.chmod(int(damage.split()[1], 8))
    else:  # the module dir replaced by a link to a folder someone else owns
        foreign = tmp_path / "foreign"
        mdir.rename(foreign)
        chown_to_another_user(foreign)
        mdir.symlink_to(foreign)

    with pytest.raises(JitError) as info:
        jit.build_and_load(probe)
    expected = f"mode 0{damage.split()[1]}" if damage.startswith("chmod") else f"uid {OTHER_UID}"
    assert_names(str(info.value), f"module dir {mdir}", expected, "JIT_MLA_CACHE_DIR")
    assert jit.module_key(probe) not in jit._memo, "nothing may be loaded from a refused dir"
    assert builds(probe) == 1, "nor built into it"

    # Put right, the same module loads without a rebuild.
    if damage == "symlink to foreign":
        mdir.unlink()
        foreign.rename(mdir)
    os.chown(mdir, os.geteuid(), -1)
    mdir.chmod(0o700)
    assert jit.build_and_load(probe).add_one(41) == 42
    assert builds(probe) == 1


# --------------------------------------------------------------------------------------------
# Swapped files are rebuilt, never loaded
# --------------------------------------------------------------------------------------------


def test_so_swapped_for_another_valid_library_of_the_same_size_is_rebuilt(probe, tmp_path):
    # The original module and a variant (x + 2): both complete, loadable libraries.
    assert run_child(probe)[0]["add_one"] == 42
    mdir = jit.module_dir(probe)
    so = mdir / "jit_probe.so"

    variant = copy_probe(probe, tmp_path / "variant")
    edit(variant.sources[0], "return x + 1;", "return x + 2;")
    assert run_child(variant)[0]["add_one"] == 43
    swapped = (jit.module_dir(variant) / "jit_probe.so").read_bytes()
    size = so.stat().st_size
    # Trailing bytes past the ELF's last section do not stop it loading: pad to the same size,
    # so the stamp's size check alone cannot tell the two apart.
    assert len(swapped) <= size, f"variant .so {len(swapped)} B > original {size} B"
    swapped += b"\0" * (size - len(swapped))
    assert swapped != so.read_bytes()

    tmp = mdir / "swap.tmp"
    tmp.write_bytes(swapped)
    os.replace(tmp, so)
    assert so.stat().st_size == json.loads((mdir / "done").read_text())["size"]
    assert jit._verified_so(mdir, "jit_probe", jit.module_key(probe)) is None

    # A loaded swap would answer 43; the rebuilt original answers 42.
    assert run_child(probe)[0]["add_one"] == 42
    assert builds(probe) == 2
    assert jit._verified_so(mdir, "jit_probe", jit.module_key(probe)) == so


@pytest.fixture
def fake_cubin_sources(tmp_path, monkeypatch) -> Path:
    """test_cubins' fake kernel tree as csrc/, with its kernel sources patched in."""
    csrc = write_tree(tmp_path / "csrc", FAKE_TREE)
    monkeypatch.setattr(cubins, "KERNEL_SOURCES", FAKE_SOURCES)
    monkeypatch.setattr(_paths, "csrc_dir", lambda: csrc)
    return csrc


@pytest.mark.parametrize("swap", ["cubin", "cubin and manifest"])
def test_cache_built_cubin_not_matching_its_manifest_is_rebuilt(
    fake_cubin_sources, tmp_path, monkeypatch, caplog, swap
):
    caplog.set_level("INFO", logger="jit_mla")
    no_store = tmp_path / "no_store"  # no shipped manifest: the arch is built into the cache
    no_store.mkdir()
    arch = FAKE_UNSHIPPED_ARCH
    data = cubins.verified_cubin(arch, root=no_store)
    cache_root = tmp_path / "cache" / "cubins" / cubins.source_hash(arch)[:16]
    cached = cache_root / arch / "kern.cubin"
    assert cached.read_bytes() == data

    # Another valid cubin with the same kernels (kScale = 3): built from an edited tree.
    other_csrc = write_tree(tmp_path / "other_csrc", FAKE_TREE)
    edit(other_csrc / "config.h", "kScale = 2.0f", "kScale = 3.0f")
    with monkeypatch.context() as mp:
        mp.setattr(_paths, "csrc_dir", lambda: other_csrc)
        cubins.build_cubins([arch], tmp_path / "other")
    other = (tmp_path / "other" / arch / "kern.cubin").read_bytes()
    assert other != data
    assert set(FAKE_SOURCES[arch].symbols) <= cubins._function_symbols(other)

    cached.write_bytes(other)
    if swap == "cubin and manifest":  # a consistent pair, of other sources
        shutil.copy(tmp_path / "other" / cubins.MANIFEST, cache_root / cubins.MANIFEST)
        assert cubins.check_manifest(cache_root) and "stale" in cubins.check_manifest(cache_root)[0]
    else:
        assert "sha256" in cubins.check_manifest(cache_root)[0]

    caplog.clear()
    assert cubins.verified_cubin(arch, root=no_store) == data
    assert caplog.text.count("no shipped cubin") == 1, "the swapped cubin is rebuilt"
    assert cached.read_bytes() == data
    assert cubins.check_manifest(cache_root) == []


# The cubin cache (cache_dir()/cubins/<source hash>/) is created by cubins._cached_cubin, with
# root.mkdir(parents=True): 0755 under the usual umask, and not checked. The cache dir above it is
# 0700 and checked, so others cannot reach it, but the cubin cache should get the module dirs'
# treatment: `root = env.cache_subdir("cubins", source_hash(arch)[:16], what="cubin cache dir")`.

def test_cubin_cache_dirs_are_created_0700(fake_cubin_sources, tmp_path):
    no_store = tmp_path / "no_store"
    no_store.mkdir()
    cubins.verified_cubin(FAKE_UNSHIPPED_ARCH, root=no_store)
    cache_root = tmp_path / "cache" / "cubins" / cubins.source_hash(FAKE_UNSHIPPED_ARCH)[:16]
    for p in (cache_root.parent, cache_root):
        assert mode(p) == 0o700, f"{p}: {oct(mode(p))}"


def test_cubin_cache_temp_files_of_a_killed_writer_are_removed(fake_cubin_sources, tmp_path):
    # A process killed inside _write_atomic leaves its mkstemp file; the next build (under the
    # lock, the entry being incomplete) removes it.
    no_store = tmp_path / "no_store"
    no_store.mkdir()
    cache_root = tmp_path / "cache" / "cubins" / cubins.source_hash(FAKE_UNSHIPPED_ARCH)[:16]
    (cache_root / FAKE_UNSHIPPED_ARCH).mkdir(parents=True, mode=0o700)
    cache_root.parent.chmod(0o700)
    stale = [cache_root / ".manifest.json.k1ll3d", cache_root / FAKE_UNSHIPPED_ARCH / ".x.cubin.k1ll3d"]
    for path in stale:
        path.write_bytes(b"half a file")
    cubins.verified_cubin(FAKE_UNSHIPPED_ARCH, root=no_store)
    assert [p for p in stale if p.exists()] == []
    assert cubins.check_manifest(cache_root) == []


def test_cubin_cache_dir_of_another_user_is_refused(fake_cubin_sources, tmp_path):
    no_store = tmp_path / "no_store"
    no_store.mkdir()
    cache_root = tmp_path / "cache" / "cubins" / cubins.source_hash(FAKE_UNSHIPPED_ARCH)[:16]
    cache_root.mkdir(parents=True, mode=0o700)
    chown_to_another_user(cache_root)
    with pytest.raises(JitError) as info:
        cubins.verified_cubin(FAKE_UNSHIPPED_ARCH, root=no_store)
    assert_names(str(info.value), str(cache_root), f"uid {OTHER_UID}", "JIT_MLA_CACHE_DIR")


# --------------------------------------------------------------------------------------------
# Locks: a dead holder never blocks, a live one times out with the knob named
# --------------------------------------------------------------------------------------------


def test_lock_of_a_sigkilled_holder_does_not_block(probe, monkeypatch, caplog):
    monkeypatch.setenv("JIT_MLA_LOCK_TIMEOUT", "5")  # far longer than a free lock takes
    caplog.set_level("INFO", logger="jit_mla")
    lock = env.cache_subdir(jit.module_dir(probe).name) / ".lock"
    holder = start_lock_holder(lock)
    assert is_locked(lock)
    holder.send_signal(signal.SIGKILL)
    holder.communicate(timeout=60)
    assert holder.returncode == -signal.SIGKILL
    assert lock.exists(), "the lock file stays behind; only the flock on it is gone"
    assert not is_locked(lock)

    assert jit.build_and_load(probe).add_one(41) == 42
    assert builds(probe) == 1
    assert "waits for another process's build" not in caplog.text


def wait_for_build_dir(child: subprocess.Popen, mdir: Path) -> Path:
    """The child's private build dir, once its build.ninja is written (under the lock, just
    before ninja runs)."""
    deadline = time.monotonic() + 120
    while not (found := list(mdir.glob("build-*/build.ninja"))):
        assert child.poll() is None, f"child exited early:\n{child.communicate()[1]}"
        assert time.monotonic() < deadline, "the child did not start building in 120 s"
        time.sleep(0.005)
    return found[0].parent


def test_build_sigkilled_mid_compile_does_not_block_the_next(probe, monkeypatch):
    # A child building for real, killed with its process group once it holds the lock and ninja
    # runs (start_new_session: ninja dies with it; the compiler it started may not).
    child = popen_python(CHILD, child_args(probe), start_new_session=True)
    mdir = jit.module_dir(probe)
    killed_dir = wait_for_build_dir(child, mdir)
    sigkill(child)
    assert child.returncode == -signal.SIGKILL
    assert not (mdir / "done").exists(), "the child was meant to die mid-build"

    monkeypatch.setenv("JIT_MLA_LOCK_TIMEOUT", "5")
    assert jit.build_and_load(probe).add_one(41) == 42
    assert builds(probe) == 1  # the killed build never finished, so it never logged
    # Its files are gone; the folder itself may stay when its surviving compiler wrote into it
    # during both removals (at the build's start and after its stamp).
    assert not (killed_dir / "build.ninja").exists(), "the next build cleans the killed build's dir"


# A CUDA_HOME whose bin/nvcc passes through to the real one, except in two roles, so that a killed
# build's compiler can be made to finish at the worst moment: just before the next build links.
# - ORPHAN_DIR set (the child that will be killed): compiling, it writes its pid, waits for
#   $ORPHAN_DIR/go, empties its -o output (a late compiler's last write; it fails when the output's
#   folder is gone) and then says it is done in $ORPHAN_DIR/wrote.
# - ORPHAN_DIR unset, linking (-shared): lets the orphan go and waits until it is done.
# Every wait gives up (the orphan's after 600 s, the link's after 60 s) and leaves
# $ORPHAN_DIR/timed_out, so a broken premise fails the test instead of hanging it or passing
# without the race.
# {real}: the real nvcc, shell-quoted.
FAKE_NVCC = """#!/bin/sh
wait_for() {{  # PATH TENTHS_OF_SECONDS
    n=0; while [ ! -e "$1" ] && [ $n -lt "$2" ]; do sleep 0.1; n=$((n+1)); done
    [ -e "$1" ] || touch "{orphan_dir}/timed_out"
}}
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
if [ -n "$ORPHAN_DIR" ] && [ "$1" = "-std=c++17" ]; then
    exec >/dev/null 2>&1  # ninja's pipe dies with ninja; a quiet compiler never writes to it
    echo $$ > "$ORPHAN_DIR/pid.tmp" && mv "$ORPHAN_DIR/pid.tmp" "$ORPHAN_DIR/pid"  # whole or absent
    wait_for "$ORPHAN_DIR/go" 6000
    cat /dev/null > "$out" 2>/dev/null
    touch "$ORPHAN_DIR/wrote"
    exit 0
fi
case " $* " in *" -shared "*)
    touch "{orphan_dir}/go"
    wait_for "{orphan_dir}/wrote" 600;;
esac
exec {real} "$@"
"""


def test_compiler_of_a_killed_build_cannot_reach_the_next(probe, tmp_path, monkeypatch):
    # The killed build's compiler outlives it (ninja put it in a process group of its own) and
    # writes its object after the next build compiled and before it links. With one shared obj/
    # the next build linked that empty object into a .so without functions; a private build dir
    # per build keeps the late write away from it.
    orphan_dir = tmp_path / "orphan"
    orphan_dir.mkdir()
    fake_home = tmp_path / "fake_cuda"
    (fake_home / "bin").mkdir(parents=True)
    nvcc = fake_home / "bin" / "nvcc"
    nvcc.write_text(FAKE_NVCC.format(orphan_dir=orphan_dir, real=shlex.quote(str(env.nvcc_path()))))
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(fake_home))
    env.cuda_home.cache_clear()

    monkeypatch.setenv("ORPHAN_DIR", str(orphan_dir))  # for the child only (popen copies environ)
    child = popen_python(CHILD, child_args(probe), start_new_session=True)
    monkeypatch.delenv("ORPHAN_DIR")
    mdir = jit.module_dir(probe)
    wait_for_build_dir(child, mdir)
    deadline = time.monotonic() + 60
    while not (orphan_dir / "pid").exists():
        assert child.poll() is None, f"child exited early:\n{child.communicate()[1]}"
        assert time.monotonic() < deadline, "the child's compiler did not start in 60 s"
        time.sleep(0.005)
    sigkill(child)
    orphan = int((orphan_dir / "pid").read_text())
    try:
        os.kill(orphan, 0)  # the compiler survived its build: the premise of this test
        assert jit.build_and_load(probe).add_one(41) == 42
        assert (orphan_dir / "wrote").exists(), "the orphan was meant to write before the link"
    finally:
        (orphan_dir / "go").touch()  # never leave the orphan spinning
    assert not (orphan_dir / "timed_out").exists(), "a wait of the fake nvcc timed out"
    assert run_child(probe)[0]["add_one"] == 42, "the stamped module on disk is the good one"
    assert builds(probe) == 1


def test_cubin_lock_of_a_sigkilled_holder_does_not_block(tmp_path, monkeypatch):
    monkeypatch.setenv("JIT_MLA_LOCK_TIMEOUT", "5")
    lock = tmp_path / "cubins.lock"
    holder = start_lock_holder(lock)
    holder.send_signal(signal.SIGKILL)
    holder.communicate(timeout=60)
    start = time.monotonic()
    with cubins._lock(lock):
        pass
    # A held lock would have raised after JIT_MLA_LOCK_TIMEOUT (5 s); this only bounds a stall.
    assert time.monotonic() - start < 60


def test_live_lock_holder_times_out_naming_the_variable(probe, monkeypatch):
    monkeypatch.setenv("JIT_MLA_LOCK_TIMEOUT", "0.5")
    lock = env.cache_subdir(jit.module_dir(probe).name) / ".lock"
    holder = start_lock_holder(lock)
    try:
        start = time.monotonic()
        with pytest.raises(JitError) as info:
            jit.build_and_load(probe)
        assert time.monotonic() - start < 30
        assert_names(str(info.value), str(lock), "JIT_MLA_LOCK_TIMEOUT", "timed out after")
        assert builds(probe) == 0
    finally:
        holder.kill()
        holder.communicate(timeout=60)


"""Per-arch GPU marks. CPU-only machines (CI) run everything that needs no GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from jit_mla.jit import JitSpec

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture
def probe(tmp_path) -> JitSpec:
    """The JIT probe module's spec (tests/data/jit_probe.cu) over a private copy of its sources,
    so tests may edit them."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(DATA / "jit_probe.cu", src / "jit_probe.cu")
    shutil.copytree(DATA / "jit_probe_inc", src / "inc")
    return probe_spec(src)


def probe_spec(src: Path) -> JitSpec:
    """The JIT probe's spec over a folder holding jit_probe.cu and inc/."""
    return JitSpec(name="jit_probe", sources=(src / "jit_probe.cu",), include_dirs=(src / "inc",),
                   hashed_dirs=(src / "inc",))


def _capability():
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def pytest_collection_modifyitems(config, items):
    cap = _capability()
    skip_sm90a = pytest.mark.skip(
        reason="requires_sm90a: the wgmma kernels need an sm_90a GPU (Hopper, compute capability 9.0); "
        + ("no CUDA GPU here" if cap is None else f"this GPU is sm_{cap[0]}{cap[1]}")
    )
    skip_gpu = pytest.mark.skip(reason="requires_gpu: needs a CUDA GPU; none here")
    for item in items:
        if "requires_sm90a" in item.keywords and cap != (9, 0):
            item.add_marker(skip_sm90a)
        if "requires_gpu" in item.keywords and cap is None:
            item.add_marker(skip_gpu)


def pytest_terminal_summary(terminalreporter):
    import error_log

    if not error_log.RECORDS:
        return
    worst = max(error_log.RECORDS, key=lambda r: r[1].get("max_err", 0.0))
    worst_lse = max(r[2] for r in error_log.RECORDS)
    terminalreporter.write_line(
        f"jit_mla GPU checks: {len(error_log.RECORDS)} comparisons; largest out error "
        f"{worst[1]} ({worst[0]}); largest lse error {worst_lse:.3g}"
    )

"""Where the kernel sources and the shipped cubins are.

A wheel (a non-editable install) carries the repository's ``csrc/`` and ``cubins/`` inside the
package as ``jit_mla/_csrc`` and ``jit_mla/_cubins`` (pyproject's package-dir mapping). In the
source tree, and in an editable install of it, they stay at the repository root.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _installed_or_repo(installed: str, repo: str) -> Path:
    shipped = _PACKAGE / installed
    return shipped if shipped.is_dir() else _PACKAGE.parent / repo


def csrc_dir() -> Path:
    """``jit_mla/_csrc`` of an installed package, else the source tree's ``csrc/``."""
    return _installed_or_repo("_csrc", "csrc")


def cubins_dir() -> Path:
    """``jit_mla/_cubins`` of an installed package, else the source tree's ``cubins/``."""
    return _installed_or_repo("_cubins", "cubins")

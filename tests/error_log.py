"""Collects the errors GPU tests measured, so the session summary can report the largest."""

from __future__ import annotations

RECORDS: list[tuple[str, dict, float]] = []


def record(label: str, stats: dict, lse_err: float) -> None:
    RECORDS.append((label, stats, lse_err))

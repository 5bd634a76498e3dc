"""Where the split plan lies in the workspace: a mirror of csrc/launcher.cu's workspace_layout
(256-byte parts), for the tests that look into it (test_plan_cache_gpu.py, gpu_initcheck.py)."""

from __future__ import annotations

from dataclasses import dataclass

KEY_WORDS = 12  # csrc/common/params.h: kPlanKeyWords
PLAN_FORMAT = 0x4A4D5004  # csrc/common/params.h: kPlanFormat, the header's first word
MAX_CTAS = 256  # csrc/config.h: kMaxCtas
MIN_UNIT_ROWS = 16  # csrc/launcher.cu: kMinUnitRows


def _align(x: int) -> int:
    return (x + 255) // 256 * 256


@dataclass(frozen=True)
class PlanLayout:
    """Byte offsets from the workspace's start (a torch allocation is 256-byte aligned)."""

    header: int
    copies: int
    group_prefix: int  # the span's start
    bounds: int
    split_groups: int
    shadow: int  # the shadow span's start (= the span's end)
    end: int  # the shadow span's end: all a call reads before it knows whether a plan is there


def plan_layout(batch: int, total_q: int, num_heads: int, sm_count: int) -> PlanLayout:
    ctas = min(max(sm_count, 1), MAX_CTAS)
    units = total_q * num_heads // MIN_UNIT_ROWS + batch
    header = 0
    copies = _align(4 * KEY_WORDS)
    cost_prefix = copies + _align(4 * (2 * batch + 1))
    group_prefix = cost_prefix + _align(8 * (units + 1))
    bounds = group_prefix + _align(4 * (batch + 1))
    split_groups = bounds + _align(8 * (ctas + 1))
    shadow = split_groups + _align(4 * (2 * ctas + 1))
    return PlanLayout(header, copies, group_prefix, bounds, split_groups, shadow,
                      shadow + (shadow - group_prefix))  # fmt: skip

"""csrc/common/fast_div.h's arithmetic, checked on the CPU with Python integers.

The kernels divide token indices by the page size (and rows by the head count) as
`umulhi(2n, mul) >> (shift - 31)`, with mul and shift from `make_fast_div`; the GPU suite runs it
only for the page sizes it uses (64, 192, ...). This checks the identity for every divisor up to
300, powers of two and large ones, at the dividends where a rounding error would show first.
"""

from __future__ import annotations

import random

import pytest

_N_MAX = 2**31 - 1  # fast_div's domain: 0 <= n < 2^31


def _make_fast_div(d: int) -> tuple[int, int]:
    """mul, shift as make_fast_div computes them (fast_div.h)."""
    shift = 31 + (d - 1).bit_length()
    return ((1 << shift) + d - 1) // d, shift


def _fast_div(n: int, mul: int, shift: int) -> int:
    """The device form: the high word of the 32-bit product (2n) * mul, shifted by shift - 31."""
    return (((n << 1) * mul) >> 32) >> (shift - 31)


def _dividends(d: int, rng: random.Random) -> list[int]:
    near = [k * d + e for k in (1, 2, 3, _N_MAX // d - 1, _N_MAX // d) for e in (-1, 0, 1)]
    return [n for n in [0, 1, d - 1, d, _N_MAX - 1, _N_MAX, *near, *rng.sample(range(_N_MAX), 40)] if 0 <= n <= _N_MAX]


DIVISORS = [*range(1, 301), *(1 << k for k in range(9, 31)), 1000, 4097, 65535, 65537, 10**6 + 3, 2**30 + 1, _N_MAX]


@pytest.mark.parametrize("d", DIVISORS)
def test_fast_div_is_floor_division(d):
    mul, shift = _make_fast_div(d)
    assert mul < 2**32 and 31 <= shift <= 62
    rng = random.Random(d)
    for n in _dividends(d, rng):
        assert _fast_div(n, mul, shift) == n // d, (n, d)


@pytest.mark.parametrize("d", DIVISORS)
def test_power_of_two_test_matches_the_divisor(d):
    # fast_div_pow2 / fast_mod_pow2 take the shift / mask path exactly when mul == 2^31
    mul, shift = _make_fast_div(d)
    assert (mul == 2**31) == (d & (d - 1) == 0)
    if mul == 2**31:
        assert all(n >> (shift - 31) == n // d and n & (d - 1) == n % d for n in _dividends(d, random.Random(d)))

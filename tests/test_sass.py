"""The cubin build's SASS check (jit_mla/sass.py): the LDGSTS form the H200 rejects."""

from __future__ import annotations

import pytest

from jit_mla import sass

# Lines as nvdisasm -c prints them: the first from a cubin that faulted on the H200 (session 14),
# the others from the shipped one.
BAD = "        /*8850*/                   LDGSTS.E.BYPASS.128 [R23+UR0], desc[UR1][R14.64], P0 ;"
BAD_IMM = "        /*8870*/                   LDGSTS.E.BYPASS.128 [R23+UR0+0x1000], desc[UR1][R14.64+0x40], P0 ;"
GOOD = "        /*7620*/                   LDGSTS.E.BYPASS.128 [R19], desc[UR4][R10.64], P0 ;"
GOOD_IMM = "        /*7680*/                   LDGSTS.E.BYPASS.128 [R19+0x1000], desc[UR8][R10.64+0x40], P0 ;"
OTHER = "        /*0390*/                   ULDC.64 UR44, c[0x0][0x208] ;"


def test_accepts_register_and_immediate_offsets():
    sass.check_sass_text("\n".join([GOOD, GOOD_IMM, OTHER]))


@pytest.mark.parametrize("line", [BAD, BAD_IMM], ids=["ur", "ur-imm"])
def test_refuses_a_uniform_register_offset(line):
    with pytest.raises(sass.SassError, match=r"1 LDGSTS with a uniform-register shared-memory offset"):
        sass.check_sass_text("\n".join([GOOD, line, OTHER]), "the test cubin")


def test_the_global_address_may_use_uniform_registers():
    # desc[UR..] and a uniform base in the global operand are fine: only the shared one faulted.
    sass.check_sass_text("LDGSTS.E.BYPASS.128 [R19+0x20], desc[UR4][R10.64+UR6], P0 ;")


def test_no_disassembler_skips_the_check(monkeypatch, tmp_path):
    monkeypatch.delenv("JIT_MLA_NVDISASM", raising=False)
    monkeypatch.setattr(sass, "disassembler", lambda: None)
    assert sass.check_cubin(b"not a cubin") is False


def test_explicit_disassembler_is_used(monkeypatch, tmp_path):
    tool = tmp_path / "fake_nvdisasm"
    tool.write_text(f"#!/bin/sh\necho '{BAD}'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("JIT_MLA_NVDISASM", str(tool))
    assert sass.disassembler() == [str(tool), "-c"]
    with pytest.raises(sass.SassError, match="illegal instruction"):
        sass.check_cubin(b"\x7fELF", "the fake cubin")

"""benchmarks/pc_stalls.py on a hand-written cubin listing and ncu source CSV (no GPU)."""

from __future__ import annotations

import csv
import io

import pytest
from bench_scripts import load_benchmark


@pytest.fixture(scope="module")
def pcs():
    return load_benchmark("pc_stalls")


# Two kernels as `nvdisasm -gi -c` prints them: annotations (innermost first) before each
# instruction; an instruction without new annotations keeps the previous chain.
SASS = """\
\t.section\t.text.other,"ax",@progbits
.text.other:
\t//## File "csrc/a.cuh", line 1
        /*0000*/                   NOP ;
\t.section\t.text.k,"ax",@progbits
.text.k:
\t//## File "csrc/sm90/tma.cuh", line 39 inlined at "csrc/sm90/body.cuh", line 58
\t//## File "csrc/sm90/body.cuh", line 58 inlined at "csrc/sm90/body.cuh", line 500
\t//## File "csrc/sm90/body.cuh", line 500
        /*0000*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R1], R2 ;
        /*0010*/                   @!P0 BRA `(.L_x_1) ;
\t//## File "csrc/sm90/tma.cuh", line 39 inlined at "csrc/sm90/body.cuh", line 58
\t//## File "csrc/sm90/body.cuh", line 58 inlined at "csrc/sm90/body.cuh", line 600
\t//## File "csrc/sm90/body.cuh", line 600
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R1], R2 ;
\t//## File "csrc/common/combine.cuh", line 7
        /*0030*/                   FFMA R0, R1, R2, R0 ;
"""


def _csv(rows: list[list[int]]) -> list[list[str]]:
    header = ["Address", "Source", "stall_long_sb", "stall_no_inst", "stall_long_sb (Not Issued)"]
    out = [["Kernel Name", "k"], header]
    for i, (lsb, ni) in enumerate(rows):
        out.append([f"0x{16 * i:x}", "I", str(lsb), str(ni), "99"])
    text = io.StringIO()
    csv.writer(text).writerows(out)
    return list(csv.reader(io.StringIO(text.getvalue())))


def test_chains_follow_the_kernel_and_carry_over(pcs):
    chains = pcs.sass_chains(SASS.splitlines(True), "k")
    assert len(chains) == 4
    assert chains[0][0] == ("tma.cuh", 39) and chains[0][-1] == ("body.cuh", 500)
    assert chains[1] == chains[0]  # no new annotation: the same source
    assert chains[2][-1] == ("body.cuh", 600)
    assert chains[3] == (("combine.cuh", 7),)
    assert pcs.sass_chains(SASS.splitlines(True), "missing") == []


def test_samples_skip_not_issued_columns(pcs):
    name, samples = pcs.read_samples(_csv([[5, 1], [0, 0], [3, 0], [0, 4]]))
    assert name == "k"
    assert samples[0] == {"long_sb": 5, "no_inst": 1}


def test_tables_by_file_site_and_region(pcs):
    chains = pcs.sass_chains(SASS.splitlines(True), "k")
    _, samples = pcs.read_samples(_csv([[5, 1], [0, 0], [3, 0], [0, 4]]))
    by_file = pcs.tabulate(samples, chains, "file")
    assert by_file[2].startswith("| tma.cuh:39 | 9 | 69.2 |")
    assert by_file[3].startswith("| combine.cuh:7 | 4 | 30.8 |")
    by_site = pcs.tabulate(samples, chains, "site", site_file="body.cuh", only_line=("tma.cuh", 39))
    assert by_site[2:] == ["| body.cuh:500 | 6 | 66.7 | long_sb 5, no_inst 1 |",
                           "| body.cuh:600 | 3 | 33.3 | long_sb 3 |"]
    nearest = pcs.tabulate(samples, chains, "site", site_file="body.cuh", depth=0, only_line=("tma.cuh", 39))
    assert nearest[2] == "| body.cuh:58 | 9 | 100.0 | long_sb 8, no_inst 1 |"
    by_region = pcs.tabulate(samples, chains, "region", cuts=[2])
    assert by_region[2:] == ["| region 0 | 6 | 46.2 | long_sb 5, no_inst 1 |",
                             "| region 1 | 7 | 53.8 | no_inst 4, long_sb 3 |"]


def test_a_different_cubin_is_refused(pcs):
    chains = pcs.sass_chains(SASS.splitlines(True), "k")
    _, samples = pcs.read_samples(_csv([[1, 0]]))
    with pytest.raises(ValueError, match="not the same cubin"):
        pcs.tabulate(samples, chains, "file")
    with pytest.raises(ValueError, match="Address"):
        pcs.read_samples([["Kernel Name", "k"], ["x", "1"]])

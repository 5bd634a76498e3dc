#!/bin/bash
# Session 34, call 1 (prepared in Session 33). Before it, here: `git merge s33-page-div`, four
# commits on e7acd81: 1bde477 page ids and rows by multiply-shift (cubin sha256 5b45a04c),
# 2cf86c3 the merge's LSE loops past 128 splits rolled (cubin c33036ce), 2d50f5d and 794cf7d
# tests. Check that cubins/sm_90a/mla_sm90.cubin is c33036ce after the merge.
# Variants, prepared in Session 33 (git-ignored trees, ~12 MB each):
#   .ab/pre  main before both (0dfc1bd's kernel, cubin 93b2ebdd)
#   .ab/pd   1bde477 alone (cubin 5b45a04c)
# Device: bash .ab/run_s34a.sh COMMIT, carry [".gpu-wheels", ".ab/pre", ".ab/pd", ".ab/run_s34a.sh"],
# timeout 600 (all of .ab is ~48 MB, near the 64 MiB carry limit with the wheels). The full
# validation of the merged commit (GPU suite 234 expected: 8 new cases with 192-token pages),
# then validate_gpu.sh's 2-round A/B on all rows: pre / main and pd / main, > 1 where the
# merged kernel is faster. (The probe pw2 measured 0.95-0.995 of main on the H 128 and fp8 rows
# for the page division alone.) ~350 s + 2 x 80 s.
set -u
LOGS=/tmp/v bash benchmarks/validate_gpu.sh "${1:?commit}" pre pd > /tmp/v_out.txt 2>&1
# Everything comes back in $OUT/all.tgz (validate_gpu.sh packs it); copying the logs as well
# went past the number of files a call returns (Session 33).
tail -n 70 /tmp/v_out.txt

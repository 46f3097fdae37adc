#!/usr/bin/env bash
# Failure behaviour: one rank's failure ends the whole job promptly (never a hang), and a
# collective past parallel.timeout_s names itself and the missing rank.
source "$(dirname "$0")/lib.sh"
D=$COMM_DRIVER

# rank 1 sleeps 60 s instead of entering allreduce #4; timeout 2 s -> job over in ~10 s
must_fail_within "collective timeout" 15 \
  "allreduce #4 on world \(4 ranks\) did not complete within 2 s; ranks still missing: 1$" \
  4 "$D" timeout timeout=2 rank=1 after=3 sleep=60
grep -q "rank 1: finished allreduce #3 on world" "$WORK/out" || { cat "$WORK/out" >&2; fail "timeout: no progress line for rank 1"; }
must_fail_within "rank exits with an error mid-run" 60 "exit code: *3|Exit code: *3" \
  4 "$D" exit rank=2 after=2
must_fail_within "bad input on one rank (loom_comm_fail)" 60 \
  "loom: rank 1: error: data/train.bin: bad magic at byte 0" 4 "$D" fail rank=1
must_fail_within "LOOM_CHECK on one rank (fatal hook)" 60 \
  "loom: rank 3: fatal error; ending the whole job" 4 "$D" panic rank=3
# SIGSEGV: under ASan its handler reports and exits; with ASan's handler off (or no ASan) loom's
# handler prints the rank and calls MPI_Abort
must_fail_within "SIGSEGV on one rank" 60 "fatal signal 11|AddressSanitizer: SEGV" 2 "$D" segv rank=1
ASAN_OPTIONS=$ASAN_OPTIONS:handle_segv=0 \
  must_fail_within "SIGSEGV on one rank (loom's handler)" 60 \
  "loom: rank 1: fatal signal 11 \(SIGSEGV\); ending the whole job" 4 "$D" segv rank=1
must_fail_within "SIGKILL on one rank" 60 "signal 9|Killed" 4 "$D" kill rank=1 after=5
echo "PASS"

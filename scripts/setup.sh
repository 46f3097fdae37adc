#!/usr/bin/env bash
# Installs what loom needs on Debian 12 (as root), skipping what is already there.
#   scripts/setup.sh          build dependencies + the default corpus
#   scripts/setup.sh --test   + test dependencies (cmocka, Slurm, clang, the PyPI references pinned in
#                             tests/requirements.txt)
set -euo pipefail
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

pkgs=(build-essential cmake pkg-config libopenblas-openmp-dev libdnnl-dev libyaml-dev libjansson-dev
      libssl-dev libpcre2-dev libicu-dev libzstd-dev libxxhash-dev libopenmpi-dev openmpi-bin fortunes fortunes-min
      libmicrohttpd-dev libcurl4-openssl-dev)
[ $want_test = 1 ] && pkgs+=(file zstd libcmocka-dev python3 python3-pip slurmctld slurmd slurm-client munge)
[ $want_test = 1 ] && pkgs+=(clang libclang-rt-14-dev)   # tests/fuzz: clang with libFuzzer
[ $want_test = 1 ] && pkgs+=(strace util-linux)           # tests/e2e: fsync order (strace), flock(1)
[ $want_test = 1 ] && pkgs+=(curl)                         # tests/e2e: loom serve with a real client
[ $want_test = 1 ] && pkgs+=(bsdutils)                  # tests/e2e/test_progress: script(1), a pseudo-terminal
[ $want_test = 1 ] && pkgs+=(prometheus)                  # tests/e2e/test_prometheus: a real scraper, promtool
[ $want_test = 1 ] && pkgs+=(chromium)                    # tests/e2e/test_report: renders report.html headless
[ $want_test = 1 ] && pkgs+=(time)                        # bench/bench_synth.sh: CPU seconds (GNU time)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" != 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ $want_test = 1 ]; then
  # The PyPI references, pinned in one file (exact-equality tests must not drift with a release).
  PY=${PYTHON:-python3}
  req="$(dirname "$0")/../tests/requirements.txt"
  if ! $PY - "$req" <<'PYCHECK' 2>/dev/null; then
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, want = line.split("==")
        if version(name) != want:
            sys.exit(1)
PYCHECK
    echo "setup: installing the pinned test references ($req) from PyPI"
    $PY -m pip install -q -r "$req" || $PY -m pip install -q --break-system-packages -r "$req"
  fi
fi

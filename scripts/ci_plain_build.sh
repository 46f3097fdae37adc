#!/usr/bin/env bash
# CI (.ci/run): `make run` needs only what `scripts/setup.sh` (without --test) installs.
#
# On CI's machine the test packages are installed too, so they are hidden here: pkg-config (what
# CMake asks for cmocka) sees every .pc file of the system except those of the packages only
# `setup.sh --test` installs. `make run` then configures, builds the loom binary into its own
# build directory, builds the default dataset and trains byte-tiny for a few steps, in a
# scratch copy of the checkout. It fails when the configure step wants a test package (as it
# once did: tests/CMakeLists.txt required cmocka), or when setup.sh's plain list names one.
#   scripts/ci_plain_build.sh [STEPS]   (default 20)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}

# the test-only packages (setup.sh --test) must not be in the plain list
plain=$(bash -c 'source <(sed -n "/^pkgs=(/,/)/p" scripts/setup.sh); echo "${pkgs[@]}"')
for p in libcmocka-dev python3 python3-pip clang slurmd; do
  case " $plain " in *" $p "*) echo "ci_plain_build: FAIL: setup.sh installs the test package $p for make run"; exit 1 ;; esac
done

work=$(mktemp -d /tmp/loom-plain.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
# pkg-config without the test packages' .pc files
mkdir -p "$work/pc"
hidden=$(for p in libcmocka-dev; do dpkg -L "$p" 2>/dev/null | grep '\.pc$' || true; done)
for d in $(pkg-config --variable pc_path pkg-config | tr ':' ' '); do
  [ -d "$d" ] || continue
  for f in "$d"/*.pc; do
    [ -e "$f" ] || continue
    grep -qxF "$f" <<<"$hidden" && continue
    [ -e "$work/pc/$(basename "$f")" ] || ln -s "$f" "$work/pc/"
  done
done
export PKG_CONFIG_LIBDIR="$work/pc" PKG_CONFIG_PATH=
if pkg-config --exists cmocka; then echo "ci_plain_build: FAIL: cmocka still visible"; exit 1; fi

# a copy of the checkout as a new user has it (tracked files only), then `make run`
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$work" --one-top-level=loom
cd "$work/loom"
t0=$SECONDS
make run STEPS="$steps" BUILD=build-plain > "$work/run.log" 2>&1 || {
  tail -40 "$work/run.log"; echo "ci_plain_build: FAIL: make run without the test packages"; exit 1; }
[ ! -e build-plain/tests ] || {
  echo "ci_plain_build: FAIL: the configure step did not leave the tests out"; exit 1; }
[ -x build-plain/loom ] && [ ! -e build-plain/loom-asan ] || {
  echo "ci_plain_build: FAIL: make run should build build-plain/loom alone"; exit 1; }
[ -f runs/byte-tiny/ckpt/step_$(printf '%07d' "$steps")/COMPLETE ] || {
  tail -40 "$work/run.log"; echo "ci_plain_build: FAIL: no checkpoint at step $steps"; exit 1; }
grep -q '"mfu"' runs/byte-tiny/metrics.jsonl || {
  echo "ci_plain_build: FAIL: no mfu in metrics.jsonl"; exit 1; }
echo "ci_plain_build: ok: make run without the test packages configured, built build-plain/loom" \
     "alone, trained $steps steps and sampled ($((SECONDS - t0)) s)"

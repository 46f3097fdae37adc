#!/usr/bin/env bash
# `mpirun -np N loom data build`: a recipe with text, JSONL and labelled binary sources (steps
# incl. exact dedup across sources and near dedup) built by one plain process, by mpirun -np 1,
# 2 and 3 gives byte-identical output directories (every file compared, nothing ignored:
# SOURCE_DATE_EPOCH fixes the manifests' "created" stamps, which member 0 writes); caching
# under 2 ranks (one changed source rebuilt, the others reused, the same bytes as one process;
# an unchanged rebuild does nothing); a BPE recipe split over 3 ranks equals one process; and an
# injected failure on one rank (LOOM_TEST_FAIL_BUILD=RANK) ends the job non-zero within 60 s
# with the rank's message and leaves the previous output untouched.
set -euo pipefail
LOOM_SRC=${LOOM_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
LOOM=${LOOM_BIN:-$LOOM_SRC/build/loom}
source "$LOOM_SRC/tests/skip_lib.sh"
command -v mpirun >/dev/null || { echo "FAIL: mpirun not found (Debian package openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 SOURCE_DATE_EPOCH=1700000000
MPIRUN=(timeout -k 5 120 mpirun --oversubscribe -x OMP_NUM_THREADS -x SOURCE_DATE_EPOCH)
W=$(mktemp -d /tmp/loom-mpi-databuild.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok: $*"; }
# build WHAT LOG [mpirun args...]: `loom data build mix.yaml`, plain when no args
build() {
  local what=$1 log=$2; shift 2
  local rc=0
  if [ $# -eq 0 ]; then "$LOOM" data build mix.yaml >"$log" 2>&1 || rc=$?
  else "${MPIRUN[@]}" "$@" "$LOOM" data build mix.yaml >"$log" 2>&1 || rc=$?; fi
  [ $rc -eq 0 ] || { cat "$log" >&2; fail "$what: exit $rc"; }
  ! grep -qE "AddressSanitizer|runtime error|fatal signal" "$log" || { cat "$log" >&2; fail "$what: crashed"; }
}
# same A B: the two trees hold the same files with the same bytes
same() {
  diff <(cd "$1" && find . -type f | sort) <(cd "$2" && find . -type f | sort) >/dev/null ||
    { diff <(cd "$1" && find . | sort) <(cd "$2" && find . | sort) >&2; return 1; }
  diff -r "$1" "$2" >/dev/null || { diff -r "$1" "$2" | head -20 >&2; return 1; }
}

# ---- corpora: text (with exact duplicates inside and across sources), JSONL (a bad line,
# near duplicates), binaries with a labels file ----
python3 - <<'PY'
import json, os, random
random.seed(3)
words = ("amber basalt cedar delta ember fjord garnet heron indigo juniper kelp lichen marble "
         "nectar onyx pebble quill rowan sorrel tansy umber violet wren yarrow zephyr").split()
def doc(n): return " ".join(random.choice(words) for _ in range(n))
os.makedirs("text", exist_ok=True)
shared = [doc(60) for _ in range(5)]          # also in the JSONL source: dropped there
for f in range(4):
    docs = [doc(random.randint(20, 200)) for _ in range(40)] + shared[f:f + 2] + ["x"]
    open(f"text/part{f}.txt", "w").write("\n%\n".join(docs))
os.makedirs("jl", exist_ok=True)
with open("jl/a.jsonl", "w") as fh:
    base = [doc(150) for _ in range(30)]
    for i, d in enumerate(base + shared):
        fh.write(json.dumps({"text": d}) + "\n")
        if i % 10 == 0:
            w = d.split(); w[3] = "EDITED"; fh.write(json.dumps({"text": " ".join(w)}) + "\n")
    fh.write('{"text": "unterminated\n')
os.makedirs("bin", exist_ok=True)
rows = ["path,label"]
for i in range(12):
    open(f"bin/f{i:02d}.bin", "wb").write(bytes(random.getrandbits(8) for _ in range(random.randint(500, 3000))))
    rows.append(f"f{i:02d}.bin,{'cat' if i % 3 else 'dog'}")
open("bin/f12.bin", "wb").write(open("bin/f03.bin", "rb").read())   # exact duplicate
rows.append("f12.bin,cat")
open("labels.csv", "w").write("\n".join(rows) + "\n")
PY
cat > mix.yaml <<EOF
name: mix
sources:
  - name: prose
    kind: text
    path: text
    split: "\n%\n"
    doc_suffix: "\n"
    steps: [utf8_repair, {length: {min_bytes: 10}}, dedup_exact]
  - name: web
    kind: jsonl
    path: jl
    on_error: skip
    weight: 2
    steps: [dedup_exact, {dedup_near: {num_perm: 64, bands: 16, shingle: 3, threshold: 0.7}}]
  - name: blobs
    kind: binary
    path: bin
    labels: labels.csv
    repeat_cap: 2
    steps: [dedup_exact]
dedup_across_sources: true
tokenizer: byte
val_fraction: 0.2
output: out
shard_tokens: 2048
EOF

# ---- one process, then 1, 2 and 3 ranks: the same bytes ----
build "plain build" plain.log
mv out ref
n=$(cat ref/train/manifest.jsonl ref/val/manifest.jsonl | wc -l)
[ "$n" -ge 12 ] || fail "only $n shards: too few to split over ranks"
grep -q '"created":"2023-11-14T22:13:20Z"' ref/train/manifest.jsonl || fail "SOURCE_DATE_EPOCH not used for created"
for np in 1 2 3; do
  build "mpirun -np $np" np$np.log -np $np
  [ $np -eq 1 ] || grep -q ", $np ranks)" np$np.log || { cat np$np.log; fail "-np $np: not built as a team of $np"; }
  [ "$(grep -c 'data build: mix:' np$np.log)" = 1 ] || { cat np$np.log; fail "-np $np: summary not printed once"; }
  mv out np$np
  same ref np$np || fail "-np $np output differs from one process"
  pass "-np $np: $n shards, manifests and dataset.json byte-identical to one process"
done
"$LOOM" data verify --inputs np3 >/dev/null || fail "verify of the 3-rank build"

# ---- caching under 2 ranks: change one source (the last: nothing after it depends on it) ----
python3 -c "import random; random.seed(9); open('bin/f13.bin','wb').write(bytes(random.getrandbits(8) for _ in range(2500)))"
echo "f13.bin,dog" >> labels.csv
cp -a ref out
build "plain rebuild after a change" plain_c.log
grep -q "1 source(s) rebuilt, 2 reused" plain_c.log || { cat plain_c.log; fail "plain rebuild: not 1 rebuilt + 2 reused"; }
mv out ref_c
cp -a ref out
build "2-rank rebuild after a change" np2_c.log -np 2
grep -q "1 source(s) rebuilt, 2 reused" np2_c.log || { cat np2_c.log; fail "2-rank rebuild: not 1 rebuilt + 2 reused"; }
same ref_c out || fail "2-rank cached rebuild differs from one process"
pass "caching under 2 ranks: 1 source rebuilt, 2 reused, byte-identical to one process"
build "2-rank unchanged rebuild" np2_u.log -np 2
grep -q "up to date" np2_u.log || { cat np2_u.log; fail "unchanged 2-rank rebuild did work"; }
[ "$(grep -c 'up to date' np2_u.log)" = 1 ] || { cat np2_u.log; fail "'up to date' not printed once"; }
same ref_c out || fail "an unchanged rebuild changed the output"
pass "unchanged rebuild under 2 ranks: up to date, nothing written"

# ---- a failure on one rank ends the job and leaves the previous output untouched ----
echo "extra document for the failure case" > text/part9.txt   # so shards must be written
cp -a out before
t0=$SECONDS
rc=0
LOOM_TEST_FAIL_BUILD=1 "${MPIRUN[@]}" -x LOOM_TEST_FAIL_BUILD -np 3 "$LOOM" data build mix.yaml \
  >fail.log 2>&1 || rc=$?
secs=$((SECONDS - t0))
[ $rc -ne 0 ] || { cat fail.log; fail "injected failure on rank 1: mpirun exited 0"; }
[ $rc -ne 124 ] && [ $secs -le 60 ] || { cat fail.log; fail "injected failure: took ${secs}s (exit $rc)"; }
grep -q "rank 1: error: data build: .*LOOM_TEST_FAIL_BUILD=1: injected failure" fail.log ||
  { cat fail.log; fail "the failing rank's message is missing"; }
same before out || fail "the failed build changed the previous output"
pass "failure on rank 1 of 3: exit $rc after ${secs}s, previous output untouched: $(grep -m1 'rank 1: error' fail.log)"
# member 0 SIGKILLed while writing shards: the job ends, its temp directory stays behind until
# the next build of the output, which removes it (nothing else of a dead build survives)
rc=0
LOOM_TEST_FAIL_BUILD=0:kill "${MPIRUN[@]}" -x LOOM_TEST_FAIL_BUILD -np 2 "$LOOM" data build mix.yaml \
  >kill.log 2>&1 || rc=$?
[ $rc -ne 0 ] || { cat kill.log; fail "member 0 SIGKILLed: mpirun exited 0"; }
ls -d out.tmp.* >/dev/null 2>&1 || { cat kill.log; fail "member 0 SIGKILLed: no temp directory left (the check needs one)"; }
same before out || fail "the killed build changed the previous output"
build "the next 2-rank build" next.log -np 2
grep -q "removed [0-9]* temp director.* left by builds that are no longer running" next.log ||
  { cat next.log; fail "the next build did not report the removed temp directories"; }
! ls -d out.tmp.* out.old.* >/dev/null 2>&1 || fail "left behind after the next build: $(ls -d out.tmp.* out.old.*)"
"$LOOM" data verify out >/dev/null || fail "verify after the next build"
pass "member 0 SIGKILLed (exit $rc): the next build removed its temp directory and built the output"
rm text/part9.txt

# ---- BPE: token counting and encoding split over 3 ranks ----
if ! skip_part reference "the BPE recipe split over 3 ranks (its tokenizer comes from Hugging Face tokenizers)"; then
  python3 -c "import tokenizers" || fail "python 'tokenizers' is missing (tests/requirements.txt: scripts/setup.sh --test), or opt out with LOOM_TEST_SKIP=reference"
  python3 - >/dev/null 2>&1 <<'PY'
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
docs = open("text/part0.txt").read().split("\n%\n")
t = Tokenizer(models.BPE())
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t.decoder = decoders.ByteLevel()
t.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
t.save("tokenizer.json")
PY
  sed -e 's#^tokenizer: byte#tokenizer: {type: bpe, path: tokenizer.json}#' -e 's#^shard_tokens: 2048#shard_tokens: 512#' \
      -e '/^  - name: blobs/,/^    steps: \[dedup_exact\]/d' mix.yaml > bpe.yaml
  cp mix.yaml mix_byte.yaml && cp bpe.yaml mix.yaml && rm -rf out
  rc=0; "$LOOM" data build mix.yaml >bpe.log 2>&1 || rc=$?
  [ $rc -eq 0 ] || { cat bpe.log; fail "bpe plain build: exit $rc"; }
  mv out bpe_ref
  build "bpe -np 3" bpe3.log -np 3
  same bpe_ref out || fail "bpe: 3-rank output differs from one process"
  pass "bpe recipe: 3 ranks byte-identical to one process ($(cat bpe_ref/train/manifest.jsonl | wc -l) train shards)"
fi

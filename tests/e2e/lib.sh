# Shared helpers for the e2e tests (sourced).
set -euo pipefail
LOOM_SRC=${LOOM_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
LOOM_BIN=${LOOM_BIN:-$LOOM_SRC/build/loom}
LOOM_ASAN_BIN=${LOOM_ASAN_BIN:-$LOOM_SRC/build/loom-asan}
WORK=$(mktemp -d /tmp/loom-e2e.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
source "$LOOM_SRC/tests/skip_lib.sh"   # skip_part: the LOOM_TEST_SKIP opt-out for part of a test

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok: $*"; }

# crashed FILE: FILE holds a sanitizer report, a segfault or a LOOM_CHECK abort.
crashed() { grep -qE "AddressSanitizer|runtime error|Segmentation|fatal:" "$1"; }

# expect_ok "what" cmd args...: the command must exit 0 without a crash report. Its stdout and
# stderr stay in $WORK/out.txt and $WORK/err.txt for further checks.
expect_ok() {
  local what=$1; shift
  local rc=0
  "$@" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
  if [ $rc -ne 0 ] || crashed "$WORK/err.txt"; then
    cat "$WORK/out.txt" "$WORK/err.txt" >&2; fail "$what: exit $rc"
  fi
  pass "$what"
}

# expect_fail "what" "regex the message must match" cmd args...: the command must exit
# non-zero without a crash report and its stderr must match the regex (output kept as above).
expect_fail() {
  local what=$1 pattern=$2; shift 2
  local rc=0
  "$@" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
  [ $rc -ne 0 ] || { cat "$WORK/out.txt" "$WORK/err.txt" >&2; fail "$what: exited 0"; }
  if crashed "$WORK/err.txt"; then cat "$WORK/err.txt" >&2; fail "$what: crashed"; fi
  grep -qE -- "$pattern" "$WORK/err.txt" || { cat "$WORK/err.txt" >&2; fail "$what: message does not match /$pattern/"; }
  pass "$what (exit $rc): $(head -c 300 "$WORK/err.txt" | tr '\n' ' ')"
}

# start_server PORTFILE LOG cmd args...: runs a server (loom serve --port-file, or the stand-in
# tests/e2e/fake_openai.py) in the background with stderr in LOG, kills it at exit (the work
# folder is kept when KEEP is set), and waits up to 60 s for its port in PORTFILE. SERVER_PID is
# its pid. Prefix the command with `env VAR=...` for a server-only environment.
start_server() {
  local portfile=$1 log=$2; shift 2
  "$@" 2>"$log" &
  SERVER_PID=$!
  trap 'kill $SERVER_PID 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
  for _ in $(seq 600); do
    [ -s "$portfile" ] && return 0
    kill -0 $SERVER_PID 2>/dev/null || break
    sleep 0.1
  done
  cat "$log" >&2; fail "the server ($1) did not start"
}

# serve_completion "what" LOOM serve CKPT args...: that server (on a free port) answers one
# greedy /v1/completions request with at least one token, then stops on SIGTERM without a crash
# report
serve_completion() {
  local what=$1; shift
  rm -f "$WORK/port"
  start_server "$WORK/port" "$WORK/serve.err" "$@" --port 0 --port-file "$WORK/port"
  python3 - "$(cat "$WORK/port")" <<'PY' || { cat "$WORK/serve.err" >&2; fail "$what: no completion"; }
import json, sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions",
    data=json.dumps({"prompt": "the quick", "max_tokens": 5, "temperature": 0}).encode(),
    headers={"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=60))
assert r["choices"][0]["text"] is not None and r["usage"]["completion_tokens"] >= 1, r
PY
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || true
  crashed "$WORK/serve.err" && { cat "$WORK/serve.err" >&2; fail "$what: the server crashed"; }
  pass "$what answers a completion"
}

# make_dataset DIR: a small text corpus -> DIR/data/{train,val}
make_dataset() {
  local d=$1
  mkdir -p "$d/corpus"
  python3 - "$d/corpus" <<'PY'
import random, sys, os
random.seed(7)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly".split()
for f in range(4):
    with open(os.path.join(sys.argv[1], f"part{f}.txt"), "w") as fh:
        for doc in range(60):
            fh.write(" ".join(random.choice(words) for _ in range(random.randint(20, 80))))
            fh.write("\n%\n")
PY
  cat > "$d/recipe.yaml" <<YAML
name: e2e
sources:
  - name: corpus
    kind: text
    path: $d/corpus
    split: "\n%\n"
tokenizer: byte
seq_len: 32
val_fraction: 0.1
output: $d/data
shard_tokens: 20000
YAML
  "$LOOM_BIN" data build "$d/recipe.yaml" >/dev/null 2>&1 || { "$LOOM_BIN" data build "$d/recipe.yaml"; fail "data build"; }
}

# a tiny model config writing into run dir $2 over dataset $1
make_config() {
  cat > "$2" <<YAML
run:
  dir: $3
data:
  train: $1/data/train
  val: $1/data/val
model:
  flavor: ${FLAVOR:-gpt2}
  vocab_size: 256
  d_model: 32
  n_layer: 2
  n_head: 4
  n_kv_head: ${KVH:-4}
training:
  steps: 10
  schedule_steps: 12
  batch_size: 2
  seq_len: 32
  lr: 3e-3
  warmup: 2
  peak_flops: 1e11
eval:
  every: 3
  batches: 2
checkpoint:
  every: 5
YAML
}

# make_labelled_recipe DIR [FILES [STEPS]]: FILES (default 36) binary files of three classes in
# turn (noise: random bytes; text: words; ramp: a byte ramp), 100..900 bytes each, in DIR/files,
# their labels in DIR/labels.jsonl, and DIR/recipe.yaml building them (byte tokens, seq_len 64,
# val_fraction 0.2) into DIR/data/{train,val}; STEPS, e.g. "[dedup_exact]", the source's
# processing steps. Sets LABELLED_ARGS: the --set options that train a classify head on it.
make_labelled_recipe() {
  local d=$1 files=${2:-36} steps=${3:-}
  mkdir -p "$d/files"
  python3 - "$d" "$files" <<'PY'
import json, os, random, sys
random.seed(3)
root, files = sys.argv[1], int(sys.argv[2])
with open(os.path.join(root, "labels.jsonl"), "w") as lab:
    for i in range(files):
        cls = ["noise", "text", "ramp"][i % 3]
        n = random.randint(100, 900)
        if cls == "noise": data = bytes(random.getrandbits(8) for _ in range(n))
        elif cls == "text": data = " ".join(random.choice(["alpha", "beta", "gamma"]) for _ in range(n // 6)).encode()
        else: data = bytes((j * 7) % 256 for j in range(n))
        open(os.path.join(root, "files", f"f{i:03d}.bin"), "wb").write(data)
        lab.write(json.dumps({"path": f"f{i:03d}.bin", "label": cls}) + "\n")
PY
  cat > "$d/recipe.yaml" <<YAML
name: bin
sources:
  - name: files
    kind: binary
    path: $d/files
    labels: $d/labels.jsonl
${steps:+    steps: $steps}
tokenizer: byte
seq_len: 64
val_fraction: 0.2
output: $d/data
YAML
  LABELLED_ARGS=(--set model.head=classify --set model.num_classes=3 --set model.vocab_size=257
                 --set data.train="$d/data/train" --set data.val="$d/data/val"
                 --set training.seq_len=64)
}

# make_labelled_dataset DIR [FILES]: make_labelled_recipe, built with loom (DIR/data/{train,val})
make_labelled_dataset() {
  make_labelled_recipe "$@"
  "$LOOM_BIN" data build "$1/recipe.yaml" >/dev/null 2>&1 \
    || { "$LOOM_BIN" data build "$1/recipe.yaml"; fail "labelled data build"; }
}

# make_fullsize DIR CONFIG STEPS: byte-tiny's shape (d 256, 4 layers, T 256, batch 8: GEMMs
# large enough for oneDNN's real sgemm) over a small corpus built into DIR/data, STEPS steps,
# no evaluation and no periodic checkpoints (run.dir: --set it)
make_fullsize() {
  local d=$1 cfg=$2 steps=$3
  mkdir -p "$d/fs_corpus"
  python3 - "$d/fs_corpus" <<'PY'
import os, random, sys
random.seed(11)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly".split()
with open(os.path.join(sys.argv[1], "a.txt"), "w") as fh:
    for _ in range(300):
        fh.write(" ".join(random.choice(words) for _ in range(random.randint(100, 300))) + "\n%\n")
PY
  cat > "$d/fs_recipe.yaml" <<YAML
name: fullsize
sources:
  - name: corpus
    kind: text
    path: $d/fs_corpus
    split: "\n%\n"
tokenizer: byte
seq_len: 256
val_fraction: 0.05
output: $d/fs_data
YAML
  "$LOOM_BIN" data build "$d/fs_recipe.yaml" >/dev/null 2>&1 || { "$LOOM_BIN" data build "$d/fs_recipe.yaml"; fail "data build"; }
  cat > "$cfg" <<YAML
data:
  train: $d/fs_data/train
  val: $d/fs_data/val
model:
  flavor: gpt2
  vocab_size: 256
  d_model: 256
  n_layer: 4
  n_head: 4
training:
  steps: $steps
  batch_size: 8
  seq_len: 256
  lr: 1e-3
  warmup: 2
  peak_flops: 1e11
eval:
  every: 0
checkpoint:
  every: 0
YAML
}

# all_threads_block PID: every thread of PID blocks SIGINT (bit 2 of SigBlk) and SIGTERM
# (bit 15), so the kernel can deliver them to none (loom's signal thread reads a signalfd);
# prints the number of threads checked; in $(...), follow it with `|| exit 1`
all_threads_block() {
  local st blk n=0
  for st in /proc/$1/task/*/status; do
    blk=$(sed -n 's/^SigBlk:\s*//p' "$st" 2>/dev/null) || continue
    [ -n "$blk" ] || continue
    (( (16#$blk >> 1) & 1 && (16#$blk >> 14) & 1 )) \
      || fail "thread $(basename "$(dirname "$st")") ($(cat "$(dirname "$st")/comm" 2>/dev/null)) of pid $1 takes SIGINT/SIGTERM (SigBlk $blk)"
    n=$((n + 1))
  done
  echo $n
}

# losses of a run, one per line, exactly as written
losses() { python3 -c "
import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l); print(r['step'], repr(r['loss']), repr(r['grad_norm']), repr(r.get('val_loss')))
" "$1/metrics.jsonl"; }

# make_mixed_dataset DIR [LOOM]: two text sources, alpha (weight 3, repeat_cap 1) and beta
# (weight 1), small shards -> DIR/data/train (82 windows of T = 16 in 5 manifest lines)
make_mixed_dataset() {
  local d=$1 loom=${2:-$LOOM_BIN}
  python3 - "$d" <<'PY'
import os, random, sys
random.seed(3)
words = "amber birch cedar delta ember fjord grove heron inlet juniper kestrel larch".split()
def doc(n): return " ".join(random.choice(words) for _ in range(n))
for name, ndocs in [("alpha", 9), ("beta", 5)]:
    os.makedirs(os.path.join(sys.argv[1], name), exist_ok=True)
    with open(os.path.join(sys.argv[1], name, "docs.txt"), "w") as f:
        f.write("\n%\n".join(doc(random.randint(8, 30)) for _ in range(ndocs)))
PY
  cat > "$d/mixed.yaml" <<YAML
name: mixed
sources:
  - name: alpha
    kind: text
    path: $d/alpha
    split: "\n%\n"
    weight: 3
    repeat_cap: 1
  - name: beta
    kind: text
    path: $d/beta
    split: "\n%\n"
    weight: 1
tokenizer: byte
seq_len: 16
output: $d/data
shard_tokens: 400
YAML
  "$loom" data build "$d/mixed.yaml" >/dev/null 2>&1 || { "$loom" data build "$d/mixed.yaml"; fail "data build (mixed)"; }
}

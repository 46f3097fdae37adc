#!/usr/bin/env bash
# The progress line (docs/observability.md, "Progress"): under a pseudo-terminal (bsdutils
# `script`) `loom data build`, `loom train` and `loom synth` redraw one line in place ("\r"
# updates with their fields); with stderr not a terminal their output has no "\r".
source "$(dirname "$0")/lib.sh"
cd "$WORK"
command -v script >/dev/null || fail "script(1) is not installed (bsdutils, scripts/setup.sh)"
python3 - <<'PY'
import random
random.seed(5)
with open("corpus.txt", "w") as f:
    f.write("\n\n\n".join(" ".join(random.choice(["1+2", "3*4", "(5-6)"]) for _ in range(20))
                          for _ in range(200)) + "\n")
with open("seeds.txt", "w") as f:
    f.write("1+2\n3*4\n5-6\n")
PY
cat > recipe.yaml <<YAML
name: progress
sources:
  - name: corpus
    kind: text
    path: $WORK/corpus.txt
    split: "\n\n\n"
tokenizer: byte
seq_len: 32
val_fraction: 0.1
output: $WORK/data
YAML
make_config "$WORK" m.yaml "$WORK/run"
cat > synth.yaml <<YAML
name: progress
seed: 1
seeds:
  - path: $WORK/seeds.txt
templates:
  next: "{feedback}{seed}\n"
template: next
feedback: "{previous}\n"
generator:
  kind: local
  checkpoint: $WORK/run
  max_tokens: 8
  temperature: 1.0
  stop: ["\n"]
validators:
  - kind: length
    min: 1
    max: 40
max_attempts: 2
samples_per_seed: 2
output: $WORK/synth.jsonl
summary: $WORK/synth.summary.json
YAML
# in_tty NAME CMD: runs CMD under a pseudo-terminal; its output (stdout + stderr) in NAME.tty
in_tty() {
  local rc=0
  script -qfec "$2" /dev/null </dev/null >"$1.tty" 2>&1 || rc=$?
  [ $rc -eq 0 ] || { cat "$1.tty" >&2; fail "$1 under a terminal: exit $rc"; }
}
# has_updates FILE REGEX: FILE has at least one "\r" that starts a line matching REGEX
has_updates() {
  python3 - "$1" "$2" <<'PY' || { cat -A "$1" | tail -20 >&2; fail "$1: no in-place update /$2/"; }
import re, sys
text = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
pieces = text.split("\r")[1:]  # what follows each carriage return
hits = [p for p in pieces if re.match(sys.argv[2], p)]
print(f"{sys.argv[1]}: {len(hits)} in-place update(s) matching, e.g. {hits[-1][:120].rstrip()!r}" if hits else "")
sys.exit(0 if hits else 1)
PY
}
no_cr() { ! grep -q $'\r' "$1" || { cat -A "$1" >&2; fail "$1: a carriage return without a terminal"; }; }

L="$LOOM_BIN"
in_tty build "$L data build $WORK/recipe.yaml"
has_updates build.tty "data build: source 'corpus': (read|written) [0-9]+(/[0-9]+)? docs \| [0-9.]+ MB \| [0-9]+ tokens \| [0-9.]+ MB/s \| (eta|elapsed) [0-9]"
# a BPE tokenizer: the tokenize phase (documents of the total, ETA)
"$LOOM_BIN" tokenizer train --vocab-size 280 --out tok.json corpus.txt >/dev/null 2>&1 || fail "tokenizer train"
sed "s|^tokenizer: byte|tokenizer: {type: bpe, path: $WORK/tok.json}|; s|^output: .*|output: $WORK/bpe|" recipe.yaml > bpe.yaml
in_tty bpe "$L data build $WORK/bpe.yaml"
has_updates bpe.tty "data build: source 'corpus': tokenize [0-9]+/200 docs \| [0-9.]+ MB \| [0-9]+ tokens \| [0-9.]+ MB/s \| eta [0-9]"
rm -rf data
expect_ok "data build without a terminal" "$L" data build recipe.yaml
no_cr "$WORK/err.txt"
grep -q "data build: source 'corpus': built" "$WORK/err.txt" || fail "the summary line is gone"
in_tty train "$L train $WORK/m.yaml --set training.steps=8 --set eval.every=0"
has_updates train.tty "step [0-9]+/8 \| loss [0-9.]+ \| lr [0-9.e+-]+ \| [0-9]+ tok/s \| mfu .* \| eta [0-9]+s"
grep -q "step 8/8" train.tty || fail "the last step is not drawn"
rm -rf run
expect_ok "train without a terminal" "$L" train m.yaml --set training.steps=8 --set eval.every=0 --set training.log_every=4
no_cr "$WORK/err.txt"
[ "$(grep -c '^step [0-9]*/8 |' "$WORK/err.txt")" = 2 ] || { cat "$WORK/err.txt" >&2; fail "plain lines: not one per log_every"; }
in_tty synth "$L synth $WORK/synth.yaml"
has_updates synth.tty "synth: attempt [12]/2: [0-9]+/6 accepted, [0-9]+ rejected, ([0-9]+ to retry, )?[0-9]+ generations, [0-9.]+ samples/s, (eta|elapsed) [0-9]"
expect_ok "synth without a terminal" "$L" synth synth.yaml
no_cr "$WORK/err.txt"
grep -q "^synth: attempt 1/2: " "$WORK/err.txt" || { cat "$WORK/err.txt" >&2; fail "plain synth line"; }
pass "progress lines update in place on a terminal, plain lines otherwise"

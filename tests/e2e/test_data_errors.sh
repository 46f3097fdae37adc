#!/usr/bin/env bash
# `loom data build / verify / inspect` end to end, on the sanitizer binary: a good build, its
# determinism and replacement, and every error path (exit code AND message checked).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
LOOM=$LOOM_ASAN_BIN
W=$WORK # expect_ok / expect_fail leave out.txt and err.txt here
cd "$W"

# ---- a small corpus: 3 text files (one in a subdirectory), a symlink to one of them, an
# excluded binary index, a hidden file ----
mkdir -p corpus/sub
python3 - <<'PY'
import random
random.seed(3)
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
def doc(): return " ".join(random.choice(words) for _ in range(random.randint(5, 60)))
for path, n in [("corpus/a.txt", 80), ("corpus/b.txt", 50), ("corpus/sub/c.txt", 70)]:
    with open(path, "w") as f:
        f.write("\n%\n".join(doc() for _ in range(n)) + "\n%\n")
open("corpus/a.txt.dat", "wb").write(bytes(range(256)))
open("corpus/.hidden", "w").write("should not be read\n")
PY
ln -s a.txt corpus/a.txt.u8   # same file again: must be read once

cat > good.yaml <<EOF
name: small
sources:
  - name: words
    kind: text
    path: $W/corpus
    exclude: ["*.dat"]
    split: "\n%\n"
tokenizer: byte
seq_len: 32
val_fraction: 0.2
output: out/small
shard_tokens: 4000
EOF

expect_ok "build a small recipe" "$LOOM" data build good.yaml
for f in out/small/train/manifest.jsonl out/small/train/dataset.json out/small/train/shard_00000.bin \
         out/small/val/manifest.jsonl out/small/val/dataset.json out/small/val/shard_00000.bin; do
  [ -f "$f" ] || fail "missing $f"
done
ls out | grep -qvE '^small$' && fail "temporary directories left in out/: $(ls out)"
pass "output files exist"
# token count = the corpus bytes minus the separators (symlink and .dat not counted)
python3 - <<'PY' || fail "token/doc counts"
import json
docs = []
for p in ["corpus/a.txt", "corpus/b.txt", "corpus/sub/c.txt"]:
    docs += [d for d in open(p, "rb").read().split(b"\n%\n") if d]
tok = sum(len(d) for d in docs)
got_tok = got_docs = 0
for split in ["train", "val"]:
    meta = json.load(open(f"out/small/{split}/dataset.json"))
    got_tok += meta["counts"]["tokens"]; got_docs += meta["counts"]["documents"]
    assert meta["tokenizer"] == {"id": "byte", "vocab_size": 256}, meta["tokenizer"]
    assert [i["path"].split("/")[-1] for i in meta["inputs"]] == ["a.txt", "b.txt", "c.txt"], meta["inputs"]
    lines = [json.loads(l) for l in open(f"out/small/{split}/manifest.jsonl")]
    assert sum(l["tokens"] for l in lines) == meta["counts"]["tokens"]
    assert all(len(l["sha256"]) == 64 and l["recipe"] == meta["recipe"]["sha256"] for l in lines)
assert (got_tok, got_docs) == (tok, len(docs)), (got_tok, got_docs, tok, len(docs))
assert json.load(open("out/small/val/dataset.json"))["counts"]["documents"] > 0
print(f"ok: {tok} tokens in {len(docs)} documents, as in the corpus")
PY
n_train=$(wc -l < out/small/train/manifest.jsonl)
[ "$n_train" -ge 2 ] || fail "expected several train shards with shard_tokens=4000, got $n_train"

expect_ok "verify the build" "$LOOM" data verify out/small
grep -q "^ok: out/small/train: $n_train shard(s)" out.txt || { cat out.txt; fail "verify output"; }
grep -q "^ok: out/small/val:" out.txt || fail "verify did not check val"
expect_ok "verify one dataset" "$LOOM" data verify out/small/train
expect_ok "inspect" "$LOOM" data inspect out/small
grep -q "shard_00000.bin" out.txt && grep -q "tokenizer byte" out.txt || { cat out.txt; fail "inspect output"; }

# rebuild into an existing build: replaced cleanly, and the same recipe + inputs give
# identical shard bytes (the recipe's sha256 is in every shard header, so same recipe file)
cp -r out/small first
echo junk > out/small/train/shard_00099.bin
expect_ok "rebuild over a previous build" "$LOOM" data build good.yaml
[ ! -e out/small/train/shard_00099.bin ] || fail "old output was not replaced"
[ "$(ls out)" = small ] || fail "leftovers in out/: $(ls out)"
for f in first/train/*.bin first/val/*.bin; do
  cmp -s "$f" "out/small/${f#first/}" || fail "non-deterministic shard: $f"
done
[ "$(ls out/small/train)" = "$(ls first/train)" ] || fail "different shard files after a rebuild"
pass "same recipe + inputs -> identical shard bytes"
expect_ok "verify the rebuild" "$LOOM" data verify out/small

# ---- recipe errors ----
mkdir -p notdata && echo precious > notdata/file.txt
sed 's#output: out/small#output: notdata#' good.yaml > clobber.yaml
expect_fail "refuses to replace a non-dataset directory" "clobber.yaml: output 'notdata' exists and is not a loom data build" \
  "$LOOM" data build clobber.yaml
[ "$(cat notdata/file.txt)" = precious ] || fail "notdata was touched"

sed 's#^seq_len: 32#seq_len: 32\ncolour: blue#' good.yaml > unknown_key.yaml
line=$(grep -n '^colour' unknown_key.yaml | cut -d: -f1)
expect_fail "unknown top-level key" "unknown_key.yaml:$line: unknown key 'colour'" \
  "$LOOM" data build unknown_key.yaml

sed 's#    kind: text#    kind: text\n    encoding: utf-8#' good.yaml > unknown_src_key.yaml
line=$(grep -n 'encoding' unknown_src_key.yaml | cut -d: -f1)
expect_fail "unknown source key" "unknown_src_key.yaml:$line: unknown key 'encoding' in a source" \
  "$LOOM" data build unknown_src_key.yaml

printf 'name: broken\nsources:\n  - name: [unclosed\ntokenizer: byte\n' > malformed.yaml
expect_fail "malformed YAML" "malformed.yaml:[0-9]+:[0-9]+: malformed YAML" "$LOOM" data build malformed.yaml
printf 'name: x\n  bad indent: 1\n' > malformed2.yaml
expect_fail "malformed YAML (indent)" "malformed2.yaml:2:[0-9]+: malformed YAML" "$LOOM" data build malformed2.yaml

sed "s#path: $W/corpus#path: $W/no/such/dir#" good.yaml > missing.yaml
expect_fail "missing source path" "missing.yaml:3: source 'words': path '$W/no/such/dir' does not exist" \
  "$LOOM" data build missing.yaml
sed "s#path: $W/corpus#path: $W/corpus/*.md#" good.yaml > noglob.yaml
expect_fail "glob matching nothing" "source 'words': path '$W/corpus/\*.md' matches no files" \
  "$LOOM" data build noglob.yaml
sed 's#^val_fraction: 0.2#val_fraction: 1.5#' good.yaml > badfrac.yaml
expect_fail "val_fraction out of range" "badfrac.yaml:[0-9]+: 'val_fraction' must be in \[0, 1\)" \
  "$LOOM" data build badfrac.yaml
sed 's#^tokenizer: byte#tokenizer: gpt2#' good.yaml > badtok.yaml
expect_fail "unsupported tokenizer" "badtok.yaml:8: unsupported tokenizer 'gpt2'" "$LOOM" data build badtok.yaml
sed 's#^shard_tokens: 4000#shard_tokens: lots#' good.yaml > badint.yaml
expect_fail "non-integer shard_tokens" "badint.yaml:[0-9]+: 'shard_tokens' must be an integer, got 'lots'" \
  "$LOOM" data build badint.yaml
expect_fail "missing recipe file" "nope.yaml: cannot open" "$LOOM" data build nope.yaml
# a recipe whose alias refers to its own anchor (an endless tree, which hung the build):
# refused at once (the time limit turns a hang into a failure)
printf 'name: t\noutput: o\ntokenizer: byte\nsources: [{steps: &a [*a, *a]}]\n' > alias.yaml
expect_fail "recipe with anchors and aliases" "alias.yaml:4:19: YAML anchors and aliases are not supported" \
  timeout 20 "$LOOM" data build alias.yaml
# a byte that is not UTF-8 on line 11 is reported at its line and column
sed 's/^output: out\/small$/output: out\/sm\xffall/' good.yaml > badutf8.yaml
expect_fail "non-UTF-8 byte in a recipe" "badutf8.yaml:11:15: malformed YAML: invalid leading UTF-8 octet" \
  "$LOOM" data build badutf8.yaml
ls out | grep -qE "\.(tmp|old)\." && fail "a failed build left a temporary directory: $(ls out)"

# ---- corrupted datasets: verify must fail naming the shard ----
cp -r out/small bad1
size=$(stat -c %s bad1/train/shard_00001.bin)
truncate -s 5000 bad1/train/shard_00001.bin
expect_fail "truncated shard" "bad1/train/shard_00001.bin: truncated: header says $size bytes, file has 5000" \
  "$LOOM" data verify bad1

cp -r out/small bad2
python3 -c "
import sys; p='bad2/train/shard_00000.bin'; b=bytearray(open(p,'rb').read()); b[4096+123]^=0x20; open(p,'wb').write(b)"
expect_fail "flipped token byte" "bad2/train/shard_00000.bin: block 0 \(bytes 4096\.\.[0-9]+\) checksum mismatch" \
  "$LOOM" data verify bad2

cp -r out/small bad3
python3 -c "
p='bad3/val/shard_00000.bin'; b=bytearray(open(p,'rb').read()); b[30]^=1; open(p,'wb').write(b)"
expect_fail "flipped header byte" "bad3/val/shard_00000.bin: header checksum mismatch" "$LOOM" data verify bad3

cp -r out/small bad4
sed -i '1s/"sha256":"[0-9a-f]*"/"sha256":"'"$(printf 'ab%.0s' $(seq 32))"'"/' bad4/train/manifest.jsonl
expect_fail "manifest sha256 mismatch" "bad4/train/shard_00000.bin: sha256 mismatch: manifest.jsonl:1 says abab" \
  "$LOOM" data verify bad4

cp -r out/small bad5
sed -i '2s/.*/{"shard": "shard_00001.bin", oops}/' bad5/train/manifest.jsonl
expect_fail "malformed manifest line" "bad5/train/manifest.jsonl:2: invalid JSON" "$LOOM" data verify bad5

cp -r out/small bad6
rm bad6/val/manifest.jsonl
expect_fail "missing manifest" "bad6/val/manifest.jsonl: no manifest" "$LOOM" data verify bad6/val
expect_fail "missing directory" "nowhere: dataset directory does not exist" "$LOOM" data verify nowhere

# an unlisted shard is ignored (and reported by verify)
cp out/small/train/shard_00000.bin out/small/train/shard_00042.bin
expect_ok "unlisted shard ignored" "$LOOM" data verify out/small/train
grep -q "shard_00042.bin is not in the manifest" out.txt || fail "unlisted shard not reported"

# ---- usage ----
rc=0; "$LOOM" data >/dev/null 2>&1 || rc=$?; [ $rc -eq 2 ] || fail "'data' without a subcommand: exit $rc"
rc=0; "$LOOM" data frobnicate x >/dev/null 2>err.txt || rc=$?
[ $rc -eq 2 ] && grep -q "unknown subcommand 'frobnicate'" err.txt || fail "unknown subcommand: exit $rc"
pass "usage errors exit 2"
echo "all data e2e checks passed"

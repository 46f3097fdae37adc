#!/usr/bin/env bash
# Recipes end to end (sanitizer binary): every source kind, every step with its counts,
# near/exact dedup, labels (by path and by sha256, JSONL and CSV) reaching the shards, hostile
# inputs (bad JSONL lines, symlinks leaving the root, FIFOs, sockets, unreadable files: each
# skipped, counted and reported by name), caching (an unchanged build does nothing; changing
# one source rebuilds only it) and identical shards for 1 and 2 threads.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
LOOM=$LOOM_ASAN_BIN
W=$WORK # expect_ok / expect_fail leave out.txt and err.txt here
cd "$W"

# ---- corpora ----
python3 - <<'PY'
import json, os, random, hashlib
random.seed(11)
words = ("river stone cloud maple harbor lantern velvet quartz meadow ember falcon willow "
         "copper thistle orchard saffron glacier tundra bramble cobalt").split()
def doc(n): return " ".join(random.choice(words) for _ in range(n))
os.makedirs("text", exist_ok=True)
# text: 6 docs per file; one bad UTF-8 doc, one too short, one with FORBIDDEN, one exact dup
docs_a = [doc(40), doc(40), "tiny", doc(30) + " FORBIDDEN " + doc(5), doc(40)]
docs_a.append(docs_a[0])                        # exact duplicate
open("text/a.txt", "w").write("\n%\n".join(docs_a))
bad = doc(20).encode() + b" \xff\xfe broken \xe2\x82 end " + doc(10).encode()
open("text/b.txt", "wb").write(b"\n%\n".join([bad, doc(35).encode()]))
# near dup: 20 distinct docs + 20 copies with a couple of words edited
base = [doc(120) for _ in range(20)]
near = []
for d in base:
    w = d.split(); w[5] = "EDITED"; w[60] = "CHANGED"; near.append(" ".join(w))
os.makedirs("near", exist_ok=True)
open("near/docs.txt", "w").write("\n%\n".join(base + near))
# jsonl: good lines, bad lines (invalid JSON, no field, non-string, not an object), blank
os.makedirs("jl", exist_ok=True)
lines = [json.dumps({"text": doc(25), "id": i}) for i in range(8)]
lines.insert(2, '{"text": "unterminated')
lines.insert(4, json.dumps({"body": "no text field"}))
lines.insert(6, json.dumps({"text": 42}))
lines.insert(7, "[1, 2, 3]")
lines.insert(8, "")
open("jl/part1.jsonl", "w").write("\n".join(lines) + "\n")
z = [json.dumps({"text": doc(25)}) for _ in range(5)]
open("jl/part2.jsonl", "w").write("\n".join(z) + "\n")
# binary: files in class dirs, labels files keyed by path (jsonl) and sha256 (csv)
os.makedirs("bin/cat", exist_ok=True); os.makedirs("bin/dog", exist_ok=True)
labels_jsonl, labels_csv = [], ["sha256,label"]
for i in range(4):
    for cls in ["cat", "dog"]:
        data = bytes(random.randrange(256) for _ in range(random.randint(50, 300)))
        p = f"{cls}/{i}.bin"
        open("bin/" + p, "wb").write(data)
        labels_jsonl.append(json.dumps({"path": p, "label": cls}))
        labels_csv.append(f'{hashlib.sha256(data).hexdigest()},"{cls}"')
open("bin/stray.bin", "wb").write(b"\x00\x01unlabelled")
open("labels.jsonl", "w").write("\n".join(labels_jsonl) + "\n")
open("labels.csv", "w").write("\r\n".join(labels_csv) + "\r\n")
open("outside.bin", "wb").write(b"secret outside the root")
PY
zstd -q jl/part2.jsonl -o jl/part2.jsonl.zst && rm jl/part2.jsonl
ln -s ../outside.bin bin/escape.bin          # leaves the root
ln -s cat/0.bin bin/zz_alias.bin             # inside the root: same inode, read once
mkfifo bin/pipe.bin
python3 -c "import socket; s=socket.socket(socket.AF_UNIX); s.bind('bin/sock.bin')"
if [ "$(id -u)" != 0 ]; then echo x > bin/locked.bin; chmod 000 bin/locked.bin; fi

cat > all.yaml <<EOF
name: kinds
sources:
  - name: prose
    kind: text
    path: $W/text
    split: "\n%\n"
    weight: 2.5
    repeat_cap: 3
    steps:
      - utf8_repair
      - length: {min_bytes: 10}
      - regex: {exclude: "FORBIDDEN"}
      - dedup_exact
  - name: nearby
    kind: text
    path: $W/near
    split: "\n%\n"
    steps:
      - dedup_near: {num_perm: 128, bands: 32, shingle: 5, threshold: 0.7}
  - name: lines
    kind: jsonl
    path: $W/jl
    text_field: text
    on_error: skip
  - name: pics
    kind: binary
    path: $W/bin
    labels: $W/labels.jsonl
    label_key: path
    exclude: ["*.csv"]
tokenizer: byte
output: out/kinds
shard_tokens: 3000
EOF

expect_ok "build: text + jsonl(.zst) + binary sources with steps" "$LOOM" data build all.yaml
cp err.txt build1.log
# hostile inputs: each reported by name on stderr
for what in "escape.bin: symlink leaves the source root" "pipe.bin: a FIFO" "sock.bin: a socket" \
            "stray.bin: no label" "part1.jsonl:3: invalid JSON" "part1.jsonl:5: no field \"text\"" \
            "part1.jsonl:7: field \"text\" is not a string"; do
  grep -qF "$what" build1.log || { cat build1.log; fail "not reported: $what"; }
done
if [ "$(id -u)" != 0 ]; then grep -qF "locked.bin: cannot open" build1.log || fail "unreadable file not reported"; fi
pass "hostile inputs reported by name"
expect_ok "verify" "$LOOM" data verify --inputs out/kinds
expect_ok "inspect" "$LOOM" data inspect out/kinds
grep -q "source pics (binary, rebuilt)" out.txt && grep -q "classes: 0=cat 1=dog" out.txt &&
  grep -q "utf8_repair: 8 -> 8 docs" out.txt || { cat out.txt; fail "inspect does not show the sources"; }
grep -q "escape.bin: symlink leaves the source root" out.txt || fail "inspect does not list skipped files"

python3 - "$(id -u)" <<'PY' || fail "dataset.json / manifest / shard contents"
import json, struct, sys, hashlib
root = sys.argv[1] == "0"
ds = json.load(open("out/kinds/train/dataset.json"))
src = {s["name"]: s for s in ds["sources"]}
steps = {s["step"]: s for s in src["prose"]["steps"]}
# prose: 6 + 2 docs read; 1 repaired; "tiny" dropped; FORBIDDEN dropped; 1 exact dup dropped
assert steps["read"]["docs_out"] == 8, steps
assert steps["utf8_repair"]["changed"] == 1 and steps["utf8_repair"]["docs_out"] == 8, steps
assert steps["utf8_repair"]["bytes_out"] > steps["utf8_repair"]["bytes_in"], steps
assert steps["length"]["docs_in"] == 8 and steps["length"]["docs_out"] == 7, steps
assert steps["regex"]["docs_out"] == 6, steps
assert steps["dedup_exact"]["docs_out"] == 5, steps
# near: the 20 edited copies go, the 20 distinct documents stay
near = {s["step"]: s for s in src["nearby"]["steps"]}
assert near["read"]["docs_out"] == 40 and near["dedup_near"]["docs_out"] == 20, near
# jsonl: 8 + 5 good docs, 4 bad lines skipped and named
lines = src["lines"]
assert lines["steps"][0]["docs_out"] == 13, lines["steps"]
assert lines["bad_lines"]["count"] == 4, lines["bad_lines"]
assert [b["what"].rsplit("/", 1)[1] for b in lines["bad_lines"]["first"]] == \
    ["part1.jsonl:3", "part1.jsonl:5", "part1.jsonl:7", "part1.jsonl:8"], lines["bad_lines"]
# binary: 8 labelled files (zz_alias.bin is the same inode as cat/0.bin), stray skipped
pics = src["pics"]
assert pics["steps"][0]["docs_out"] == 8, pics["steps"]
assert pics["unlabeled"]["count"] == 1 and pics["unlabeled"]["first"][0]["what"].endswith("stray.bin")
skipped = {s["what"].rsplit("/", 1)[1]: s["why"] for s in pics["skipped_files"]["first"]}
want = {"escape.bin", "pipe.bin", "sock.bin"} | (set() if root else {"locked.bin"})
assert set(skipped) == want, skipped
assert ds["classes"] == ["cat", "dog"], ds["classes"]
assert all(len(i["sha256"]) == 64 for i in ds["inputs"])
assert not any(i["path"].endswith("outside.bin") for i in ds["inputs"])
# manifest: one source per shard, weight and repeat_cap on every line
man = [json.loads(l) for l in open("out/kinds/train/manifest.jsonl")]
assert {m["source"] for m in man} == {"prose", "nearby", "lines", "pics"}
for m in man:
    w, c = (2.5, 3) if m["source"] == "prose" else (1, 0)
    assert m["weight"] == w and m["repeat_cap"] == c, m
# labels reach the shards: the labels section (header offset 272) of the pics shards
want_labels = []
for p in sorted(f"{c}/{i}.bin" for c in ["cat", "dog"] for i in range(4)):
    want_labels.append((open("bin/" + p, "rb").read(), 0 if p.startswith("cat") else 1))
got = []
for m in man:
    b = open("out/kinds/train/" + m["shard"], "rb").read()
    ntok, ndocs = struct.unpack_from("<QQ", b, 24)
    loff, lbytes = struct.unpack_from("<QQ", b, 272)
    docs_off = struct.unpack_from("<Q", b, 72)[0]
    if m["source"] != "pics":
        assert loff == 0 and lbytes == 0, m
        continue
    assert lbytes == 4 * ndocs, (lbytes, ndocs)
    starts = list(struct.unpack_from(f"<{ndocs}Q", b, docs_off)) + [ntok]
    labels = struct.unpack_from(f"<{ndocs}I", b, loff)
    toks = b[4096:4096 + ntok]
    for k in range(ndocs):
        got.append((toks[starts[k]:starts[k + 1]], labels[k]))
assert got == want_labels, [(len(a), l) for a, l in got]
print("ok: counts per step, bad lines, skipped files, classes, weights and labels in shards")
PY

# ---- caching ----
stat -c '%i %Y' out/kinds/train/*.bin > inodes1.txt
sleep 1
expect_ok "rebuild unchanged" "$LOOM" data build all.yaml
grep -q "up to date" err.txt || { cat err.txt; fail "an unchanged build did work"; }
stat -c '%i %Y' out/kinds/train/*.bin > inodes2.txt
cmp -s inodes1.txt inodes2.txt || fail "an unchanged build touched the shards"
pass "unchanged recipe + inputs: nothing rebuilt, shards untouched"
echo '{"text": "a brand new line for the jsonl source"}' > jl/part3.jsonl
expect_ok "rebuild after changing one source" "$LOOM" data build all.yaml
grep -q "source 'lines': built" err.txt || { cat err.txt; fail "the changed source was not rebuilt"; }
for s in prose nearby pics; do
  grep -q "source '$s': reused" err.txt || { cat err.txt; fail "source $s was rebuilt"; }
done
python3 - <<'PY' || fail "reused shards are the same files"
import json, os
man = [json.loads(l) for l in open("out/kinds/train/manifest.jsonl")]
ino = {int(l.split()[0]) for l in open("inodes1.txt")}
for m in man:
    i = os.stat("out/kinds/train/" + m["shard"]).st_ino
    assert (i in ino) == (m["source"] != "lines"), (m, i)
ds = json.load(open("out/kinds/train/dataset.json"))
built = {s["name"]: s["built"] for s in ds["sources"]}
assert built == {"prose": "reused", "nearby": "reused", "lines": "rebuilt", "pics": "reused"}, built
assert {s["name"]: s["steps"][0]["docs_out"] for s in ds["sources"]}["lines"] == 14
PY
pass "changing one source rebuilt only it (others hard-linked)"
expect_ok "verify after a partial rebuild" "$LOOM" data verify out/kinds

# ---- the same shards for 1 and 2 threads (fresh builds) ----
sed 's#output: out/kinds#output: out/t1#' all.yaml > t1.yaml
sed 's#output: out/kinds#output: out/t2#' all.yaml > t2.yaml
OMP_NUM_THREADS=1 "$LOOM" data build t1.yaml 2>/dev/null || fail "build with 1 thread"
OMP_NUM_THREADS=2 "$LOOM" data build t2.yaml 2>/dev/null || fail "build with 2 threads"
for f in out/t1/train/*.bin out/t1/val/*.bin; do
  [ -e "$f" ] || continue
  cmp -s "$f" "out/t2/${f#out/t1/}" || fail "shard differs between 1 and 2 threads: $f"
done
cut -d, -f1-5 out/t1/train/manifest.jsonl > m1.txt; cut -d, -f1-5 out/t2/train/manifest.jsonl > m2.txt  # not recipe (t1.yaml != t2.yaml), created
cmp -s m1.txt m2.txt || fail "manifest differs between 1 and 2 threads"
[ "$(ls out/t1/train)" = "$(ls out/t2/train)" ] || fail "different shard files"
pass "identical shards and manifests for OMP_NUM_THREADS=1 and 2"

# ---- labels keyed by sha256 in CSV, a default label ----
cat > csv.yaml <<EOF
name: csvlabels
sources:
  - name: pics
    kind: binary
    path: $W/bin
    labels: $W/labels.csv
    label_key: sha256
    default_label: unknown
    steps: [dedup_exact]
tokenizer: byte
output: out/csv
EOF
expect_ok "binary source with CSV labels keyed by sha256" "$LOOM" data build csv.yaml
python3 - <<'PY' || fail "csv labels"
import json
ds = json.load(open("out/csv/train/dataset.json"))
assert ds["classes"] == ["cat", "dog", "unknown"], ds["classes"]
pics = ds["sources"][0]
assert pics["steps"][0]["docs_out"] == 9 and pics["unlabeled"]["count"] == 0, pics
PY
pass "sha256-keyed CSV labels and default_label"

# ---- errors ----
sed 's#on_error: skip#on_error: fail#; s#output: out/kinds#output: out/strict#' all.yaml > strict.yaml
expect_fail "bad JSONL line with on_error: fail" "jl/part1.jsonl:3: invalid JSON" "$LOOM" data build strict.yaml
[ ! -e out/strict ] || fail "a failed build left output"
printf '{"text": "%s"}\n' "$(head -c 3000 /dev/zero | tr '\0' a)" > jl/long.jsonl
sed 's#on_error: skip#on_error: fail\n    max_line_bytes: 1000#' all.yaml > long.yaml
expect_fail "over-long JSONL line" "jl/long.jsonl:1: line is longer than max_line_bytes \(1000\)" "$LOOM" data build long.yaml
rm jl/long.jsonl
mkdir jz && cp jl/part2.jsonl.zst jz/a.jsonl.zst && head -c 100 jl/part2.jsonl.zst > jz/b.jsonl.zst
printf 'name: z\nsources:\n  - {name: z, kind: jsonl, path: %s/jz, on_error: fail}\ntokenizer: byte\noutput: out/z\n' "$W" > trunc.yaml
expect_fail "truncated .zst" "jz/b.jsonl.zst: truncated zstd stream" "$LOOM" data build trunc.yaml
sed -i 's#on_error: fail#on_error: skip#' trunc.yaml
expect_ok "truncated .zst skipped with on_error: skip" "$LOOM" data build trunc.yaml
grep -q "jz/b.jsonl.zst: truncated zstd stream" err.txt || { cat err.txt; fail "truncated .zst not reported"; }
sed 's#regex: {exclude: "FORBIDDEN"}#regex: {exclude: "(unclosed"}#' all.yaml > badre.yaml
line=$(grep -n unclosed badre.yaml | cut -d: -f1)
expect_fail "bad regex" "badre.yaml:$line: source 'prose': regex '\(unclosed'" "$LOOM" data build badre.yaml
sed 's#bands: 32#bands: 30#' all.yaml > badbands.yaml
expect_fail "bands must divide num_perm" "bands \(30\) must divide num_perm \(128\)" "$LOOM" data build badbands.yaml
sed 's#      - dedup_exact#      - dedupe#' all.yaml > badstep.yaml
expect_fail "unknown step" "badstep.yaml:[0-9]+: source 'prose': unknown step 'dedupe'" "$LOOM" data build badstep.yaml
sed 's#    weight: 2.5#    weight: -1#' all.yaml > badweight.yaml
expect_fail "negative weight" "badweight.yaml:[0-9]+: 'weight' must be positive" "$LOOM" data build badweight.yaml
sed 's#    text_field: text#    text_field: text\n    labels: x.csv#' all.yaml > wrongkey.yaml
expect_fail "key of another kind" "source 'lines': 'labels' does not apply to kind 'jsonl'" "$LOOM" data build wrongkey.yaml
printf 'path,label\ncat/0.bin,cat\ncat/0.bin,dog\n' > dup.csv
sed "s#labels: $W/labels.jsonl#labels: $W/dup.csv#" all.yaml > duplabels.yaml
expect_fail "conflicting labels" "dup.csv:3: \"cat/0.bin\" is labelled \"dog\" here and \"cat\" on line 2" "$LOOM" data build duplabels.yaml
sed 's#^tokenizer: byte#tokenizer: {type: bpe}#' all.yaml > bpe_nopath.yaml
expect_fail "bpe without a path" "tokenizer 'bpe' needs 'path'" "$LOOM" data build bpe_nopath.yaml

# ---- tokenizer: {type: bpe}: the shards hold exactly what Hugging Face `tokenizers` encodes ----
if ! skip_part reference "the bpe recipe against Hugging Face tokenizers"; then
  python3 -c "import tokenizers" || fail "python 'tokenizers' is missing (tests/requirements.txt: scripts/setup.sh --test), or opt out with LOOM_TEST_SKIP=reference"
  python3 - <<'PY'
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
import json, random
random.seed(5)
words = "river stone cloud maple harbor lantern velvet quartz meadow ember".split()
docs = [" ".join(random.choice(words) for _ in range(30)) for _ in range(40)]
open("bpe_corpus.txt", "w").write("\n%\n".join(docs))
t = Tokenizer(models.BPE())
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t.decoder = decoders.ByteLevel()
t.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
t.save("tokenizer.json")
json.dump([t.encode(d).ids for d in docs], open("bpe_want.json", "w"))
PY
  printf 'name: bpe\nsources:\n  - {name: c, kind: text, path: bpe_corpus.txt, split: "\\n%%\\n"}\ntokenizer: {type: bpe, path: tokenizer.json}\noutput: out/bpe\nshard_tokens: 500\n' > bpe.yaml
  rc=0; "$LOOM" data build bpe.yaml >out.txt 2>err.txt || rc=$?
  [ $rc -eq 0 ] && ! crashed err.txt || { cat err.txt; fail "bpe build: exit $rc"; }
  python3 - <<'PY' || fail "bpe shards differ from tokenizers' encoding"
import json, struct
want = [i for d in json.load(open("bpe_want.json")) for i in d]
got = []
for l in open("out/bpe/train/manifest.jsonl"):
    b = open("out/bpe/train/" + json.loads(l)["shard"], "rb").read()
    w, v = struct.unpack_from("<II", b, 16)
    n = struct.unpack_from("<Q", b, 24)[0]
    assert w == 2 and v == 300, (w, v)
    got += struct.unpack_from(f"<{n}H", b, 4096)
assert got == want, (len(got), len(want))
tok = json.load(open("out/bpe/train/dataset.json"))["tokenizer"]
assert len(tok["id"]) == 64 and tok["vocab_size"] == 300, tok
PY
  pass "tokenizer: bpe -> the same ids as HF tokenizers, tokenizer hash in dataset.json"
fi
echo "all recipe e2e checks passed"

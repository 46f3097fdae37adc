#!/usr/bin/env bash
# loom synth (issue 30): the cache is appended block by block (generator.batch items), so a
# run killed inside its only round keeps every block it finished (it kept nothing: the cache
# was written per round) and the rerun generates only the rest; the progress line's
# "rejected" counts items, as the summary does (it counted rejected attempts).
source "$(dirname "$0")/lib.sh"
cd "$WORK"
start_server port fake.log python3 "$LOOM_SRC/tests/e2e/fake_openai.py" port requests.log
count() { if [ -f "$1" ]; then grep -c . "$1" || true; else echo 0; fi; }
for i in $(seq 0 31); do echo "NEW $i seed"; done > seeds.txt
# the command validator counts its runs; while $WORK/kill exists, its 20th run SIGKILLs synth
# (its parent): inside block 3 of 4 (batch 8, one request and one validator at a time)
cat > p.yaml <<YAML
name: blocks
seeds:
  - path: $WORK/seeds.txt
templates:
  t: "{seed}"
template: t
generator:
  kind: http
  url: http://127.0.0.1:$(cat port)/v1
  model: fake
  temperature: 0.7
  concurrency: 1
  batch: 8
validators:
  - kind: command
    name: counted
    command: [sh, -c, "cat > /dev/null; echo x >> $WORK/commands.log; if [ -e $WORK/kill ] && [ \$(grep -c . $WORK/commands.log) -ge 20 ]; then kill -KILL \$PPID; fi"]
max_attempts: 1
output: $WORK/out.jsonl
summary: $WORK/summary.json
YAML
touch kill
rc=0; "$LOOM_BIN" synth p.yaml --threads 1 --quiet 2>synth.log || rc=$?
[ $rc = 137 ] || { cat synth.log; fail "synth was not killed by its validator (exit $rc)"; }
[ ! -e out.jsonl ] || fail "a killed run wrote its output"
cached=$(count out.jsonl.cache/generations.jsonl)
[ "$cached" -ge 16 ] && [ "$cached" -le 19 ] \
  || fail "the killed run cached $cached generations: blocks 1 and 2 (16) should be in the cache, at most the block in progress lost"
pass "killed inside block 3 of its only round: $cached generations cached"
rm kill
expect_ok "the rerun" "$LOOM_BIN" synth p.yaml --threads 1 --quiet
python3 - "$cached" <<'PY' || fail "the rerun: $(cat summary.json)"
import json, sys
cached = int(sys.argv[1])
s = json.load(open("summary.json"))
c = s["cache"]
assert s["accepted"] == 32, s
assert c["generation_hits"] == cached and c["generations_run"] == 32 - cached, c
PY
requests=$(count requests.log)
# the killed run sent blocks 1-3 (24 requests), the rerun only what was not cached
[ "$requests" = $((24 + 32 - cached)) ] || fail "$requests requests in all, expected $((24 + 32 - cached))"
pass "the rerun took $cached generations from the cache and generated $((32 - cached))"

# progress: 4 of 16 items (the COPY seeds) are rejected at each of 3 attempts
for i in $(seq 0 15); do if [ $((i % 4)) = 1 ]; then echo "COPY w$i a b c d"; else echo "NEW $i"; fi; done > seeds2.txt
sed -e "s#$WORK/seeds.txt#$WORK/seeds2.txt#" -e 's/max_attempts: 1/max_attempts: 3/' \
    -e 's#command: \[sh, -c, .*#command: [sh, -c, "! grep -q zzz"]#' -e "s#$WORK/out.jsonl#$WORK/out2.jsonl#" p.yaml > p2.yaml
expect_ok "synth with retries" "$LOOM_BIN" synth p2.yaml --threads 1
last=$(grep "synth: attempt" "$WORK/err.txt" | tail -1)
python3 - "$last" <<'PY' || fail "the progress line disagrees with the summary: $last"
import json, re, sys
s = json.load(open("summary.json"))
m = re.search(r"(\d+)/(\d+) accepted, (\d+) rejected", sys.argv[1])
assert m, sys.argv[1]
assert s["rejected"] == 4 and s["accepted"] == 12, s
assert (int(m.group(1)), int(m.group(3))) == (s["accepted"], s["rejected"]), (m.groups(), s["accepted"], s["rejected"])
PY
pass "the last progress line says 12 accepted, 4 rejected, as the summary: $last"

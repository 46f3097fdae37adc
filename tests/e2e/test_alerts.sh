#!/usr/bin/env bash
# alerts: rules "METRIC CONDITION -> ACTION" from the config. An injected loss spike
# (LOOM_TEST_LOSS_SPIKE=STEP:FACTOR, a test hook scaling the reported loss) fires
# "loss > 3 * ema(10)", whose exec action runs the command with LOOM_ALERT_* set; a stop rule
# ends the run after a checkpoint with exit status 3, and the same command resumes; every firing
# is a line of run.dir/alerts.jsonl; malformed rules are errors naming the key and the item.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
cat >> "$WORK/c.yaml" <<YAML
alerts:
  - loss > 3 * ema(10) -> log
  - "loss > 3 * ema(10) -> exec: echo \$LOOM_ALERT_STEP \$LOOM_ALERT_METRIC \$LOOM_ALERT_VALUE > $WORK/exec.out"
  - grad_norm < 0 -> stop
YAML
LOOM_TEST_LOSS_SPIKE=15:10 expect_ok "a run with a loss spike at step 15" "$LOOM_BIN" train "$WORK/c.yaml" \
  --set training.steps=20 --set training.schedule_steps=20 --set checkpoint.every=0
grep -q "alert at step 15: loss > 3 \* ema(10) -> log" "$WORK/err.txt" || { cat "$WORK/err.txt"; fail "no alert logged"; }
for i in $(seq 1 50); do [ -s "$WORK/exec.out" ] && break; sleep 0.1; done
read -r s m v < "$WORK/exec.out" || fail "the exec action did not run"
[ "$s $m" = "15 loss" ] || fail "exec saw step/metric '$s $m'"
python3 - "$WORK/run" "$v" <<'PY' || fail "alerts.jsonl"
import json, sys
run, v = sys.argv[1], float(sys.argv[2])
rows = {json.loads(l)["step"]: json.loads(l) for l in open(run + "/metrics.jsonl")}
al = [json.loads(l) for l in open(run + "/alerts.jsonl")]
mine = [a for a in al if "ema(10)" in a["rule"]]
assert [(a["step"], a["action"]) for a in mine] == [(15, "log"), (15, "exec")], al
assert all(a["metric"] == "loss" and a["value"] == rows[15]["loss"] for a in mine), mine
assert abs(v - rows[15]["loss"]) < 1e-6 * v, (v, rows[15]["loss"])
assert mine[0]["reference"] > 0 and mine[0]["value"] > mine[0]["reference"], mine
assert mine[1]["command"].startswith("echo "), mine
assert not [a for a in al if a["rule"].startswith("grad_norm")], al
print("ok: the spike fired log and exec once, at step 15; alerts.jsonl has both")
PY
pass "loss spike: log + exec"

# stop: a NaN loss at step 6 (LOOM_TEST_INJECT_NAN) fires "loss nonfinite -> stop"
make_config "$WORK" "$WORK/s.yaml" "$WORK/stop"
rc=0
LOOM_TEST_INJECT_NAN=0:6 "$LOOM_BIN" train "$WORK/s.yaml" --set training.steps=10 \
  --set checkpoint.every=0 --set 'alerts=["loss nonfinite -> stop"]' >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
[ $rc -eq 3 ] || { cat "$WORK/err.txt"; fail "stop: exit $rc, expected 3"; }
crashed "$WORK/err.txt" && { cat "$WORK/err.txt"; fail "stop: crashed"; }
grep -q "step 6: stopped by an alert rule with action stop" "$WORK/err.txt" || { cat "$WORK/err.txt"; fail "stop: message"; }
[ -f "$WORK/stop/ckpt/step_0000006/COMPLETE" ] || fail "stop: no checkpoint at step 6"
python3 - "$WORK/stop/alerts.jsonl" <<'PY' || fail "stop: alerts.jsonl"
import json, sys
al = [json.loads(l) for l in open(sys.argv[1])]
st = [a for a in al if a["action"] == "stop"]
assert len(st) == 1 and st[0]["step"] == 6 and st[0]["value"] is None and st[0]["rule"] == "loss nonfinite -> stop", al
PY
expect_ok "the stopped run resumes" "$LOOM_BIN" train "$WORK/s.yaml" --set training.steps=10 \
  --set checkpoint.every=0 --set 'alerts=["loss nonfinite -> stop"]'
grep -q "resumed from .*step_0000006" "$WORK/err.txt" || fail "did not resume from step 6"
pass "stop: checkpoint, exit status 3, resume"

# malformed rules: the key, the item and the problem
bad() { expect_fail "$1" "$2" "$LOOM_BIN" train "$WORK/s.yaml" --set run.dir="$WORK/bad" --set "alerts=$3"; }
bad "unknown metric" "config key 'alerts' .*item 1 .*unknown metric 'los'" '["los > 1 -> log"]'
bad "no arrow" "config key 'alerts' .*item 2 .*no \"->\"" '["loss > 1 -> log", "loss > 2 log"]'
bad "unknown action" "config key 'alerts' .*unknown action 'halt'" '["loss > 1 -> halt"]'
bad "unknown function" "config key 'alerts' .*unknown function 'avg'" '["loss > 2 * avg(5) -> log"]'
bad "bad condition" "config key 'alerts' .*condition must be nonfinite" '["loss = 2 -> log"]'
bad "zero window" "config key 'alerts' .*window 0" '["loss > ema(0) -> log"]'
bad "exec without command" "config key 'alerts' .*exec: needs a command" '["loss > 1 -> exec:"]'
bad "not a list" "alerts" '5'
[ -e "$WORK/bad/metrics.jsonl" ] && fail "a run with a bad rule started training"
pass "malformed rules: clear errors"

#!/usr/bin/env bash
# obs.tensorboard: run.dir/tb/ holds TensorBoard event files written by loom (in C); the
# `tensorboard` package's EventAccumulator reads the scalars back, equal (as float32) to
# metrics.jsonl, step by step.
source "$(dirname "$0")/lib.sh"
python3 -c "import tensorboard" 2>/dev/null || fail "python package tensorboard missing (tests/requirements.txt)"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
expect_ok "train with obs.tensorboard" "$LOOM_BIN" train "$WORK/c.yaml" --set training.steps=6 \
  --set obs.tensorboard=true
ls "$WORK"/run/tb/events.out.tfevents.* >/dev/null || fail "no event file in run/tb"
python3 - "$WORK/run" <<'PY' || fail "TensorBoard reads other values than metrics.jsonl"
import json, sys
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
run = sys.argv[1]
acc = EventAccumulator(run + "/tb", size_guidance={"scalars": 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
checked = 0
for tag in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "step_ms", "val_loss", "rss_bytes",
            "comm_exposed_share"):
    assert tag in tags, (tag, tags)
    got = {e.step: e.value for e in acc.Scalars(tag)}
    want = {r["step"]: r[tag] for r in rows if r.get(tag) is not None}
    assert sorted(got) == sorted(want), (tag, sorted(got), sorted(want))
    for s, v in want.items():
        assert np.float32(got[s]) == np.float32(v), (tag, s, got[s], v)
        checked += 1
assert sorted(e.step for e in acc.Scalars("val_loss")) == [3, 6]
print(f"ok: EventAccumulator read {checked} scalars, equal to metrics.jsonl")
PY
pass "TensorBoard event files read back by the tensorboard package"

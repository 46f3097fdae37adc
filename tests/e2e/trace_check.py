"""Checks a loom trace.json (tests/e2e/test_profile.sh, tests/mpi/test_obs_mpi.sh):
valid JSON in the Trace Event format, spans on each main-thread track nest (a span starts and
ends inside its parent or after it), collective lanes never overlap, each profiled step's
matmul and attention spans sum to the step's model FLOPs within 2%, and the ranks expected are
present. usage: trace_check.py RUN_DIR NRANKS STEPS"""
import json, sys

run, nranks, nsteps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
doc = json.load(open(f"{run}/trace.json"))
assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list), "no traceEvents list"
ev = doc["traceEvents"]
EPS = 0.01  # microseconds: ts and dur are written with 3 decimals
spans = []
for e in ev:
    assert e["ph"] in ("X", "M"), e
    assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
    if e["ph"] == "M":
        assert e["name"] in ("process_name", "thread_name", "process_sort_index"), e
        continue
    for k in ("name", "cat", "ts", "dur", "args"):
        assert k in e, (k, e)
    assert e["dur"] >= 0, e
    spans.append(e)
pids = sorted({e["pid"] for e in spans})
op_flops, model_share = {}, {}  # per step index, summed over the ranks
seen = set()  # op names over every rank (a pipeline's first stage has no loss, its last no embedding)
assert pids == list(range(nranks)), f"ranks in the trace: {pids}, expected 0..{nranks - 1}"

for pid in pids:
    main = sorted((e for e in spans if e["pid"] == pid and e["tid"] == 0),
                  key=lambda e: (e["ts"], -e["dur"]))
    stack = []
    for e in main:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + EPS:
            stack.pop()
        if stack:
            p = stack[-1]
            assert e["ts"] + e["dur"] <= p["ts"] + p["dur"] + EPS, \
                f"rank {pid}: {e['name']} overlaps its parent {p['name']} without nesting"
        stack.append(e)
    for tid in sorted({e["tid"] for e in spans if e["pid"] == pid and e["tid"] > 0}):
        lane = sorted((e for e in spans if e["pid"] == pid and e["tid"] == tid),
                      key=lambda e: e["ts"])
        for a, b in zip(lane, lane[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + EPS, f"rank {pid} lane {tid}: overlap"
        for e in lane:
            assert e["cat"] == "comm" and "group" in e["args"] and "bytes" in e["args"], e
    steps = [e for e in main if e["cat"] == "step"]
    assert len(steps) == nsteps, f"rank {pid}: {len(steps)} step spans, expected {nsteps}"
    for s in steps:
        t0, t1 = s["ts"], s["ts"] + s["dur"]
        evals = [(e["ts"], e["ts"] + e["dur"]) for e in main
                 if e["name"] == "eval" and t0 - EPS <= e["ts"] <= t1 + EPS]
        inside = [e for e in main if e["cat"] == "op" and t0 - EPS <= e["ts"] and
                  e["ts"] + e["dur"] <= t1 + EPS and
                  not any(a - EPS <= e["ts"] <= b + EPS for a, b in evals)]  # training only
        names = {e["name"] for e in inside}
        seen |= names
        for need in ("matmul_forward", "adamw_update"):
            assert need in names, f"rank {pid}: no {need} span in {s['args']}"
        # a fresh input gradient is overwritten (matmul_backward_set), a classifier head's
        # accumulated into (matmul_backward)
        assert names & {"matmul_backward", "matmul_backward_set"}, \
            f"rank {pid}: no matmul backward span in {s['args']}"
        assert names & {"flash_attention_forward", "attention_forward"}, names
        for e in inside:
            assert e["args"]["flops"] >= 0 and e["args"]["bytes"] > 0, e
        gemm = sum(e["args"]["flops"] for e in inside
                   if e["name"].startswith("matmul") or "attention" in e["name"])
        k = steps.index(s)
        op_flops[k] = op_flops.get(k, 0) + gemm
        model_share[k] = model_share.get(k, 0) + s["args"]["model_flops"] / s["args"]["replica_ranks"]
        phases = {e["name"] for e in main if e["cat"] in ("phase", "data") and
                  t0 <= e["ts"] <= t1}
        assert {"optimizer", "data_wait"} <= phases and \
            ({"forward", "backward"} <= phases or "pipeline" in phases), phases
# every rank's matmul and attention spans of a step sum to the model FLOPs of the step (each
# replica's FLOPs counted once; with tp/pp/cp a replica's ops are spread over its ranks)
for k in sorted(op_flops):
    assert abs(op_flops[k] - model_share[k]) <= 0.02 * model_share[k], \
        f"step {k}: ops' FLOPs {op_flops[k]:.6g} vs the model FLOPs {model_share[k]:.6g}"
for need in ("crossentropy", "embedding"):
    assert any(n.startswith(need) for n in seen), f"no {need} span on any rank"
print(f"ok: trace: {len(spans)} spans, ranks {pids}, {nsteps} steps each, nesting and FLOPs checked")

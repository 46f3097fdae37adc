# Whole models on a device backend against the cpu backend, through the CLI: training losses
# and gradient norms step by step (gpt2 and llama, flash and sdpa, fp32 and bf16, MoE),
# bit-exact resume on the device, greedy generation and a served completion equal to the cpu's.
# LOOM_TEST_CUDA_BACKEND: cuda (gpu/test_gpu_train: skipped, with the reason, without a GPU)
# or cuda-emu (cuda-emu/test_gpu_train: the CUDA kernels run by the emulator on the CPU).
# Tolerances: fp32 1e-4 relative per step (summation orders differ: cuBLAS vs oneDNN, the
# kernels' reductions); bf16 3e-2 (the two sides round different intermediate values).
source "$(dirname "$0")/../e2e/lib.sh"
BE=${LOOM_TEST_CUDA_BACKEND:-cuda-emu}
if [ "$BE" = cuda ]; then
  info=$("$LOOM_BIN" version | sed -n 's/^cuda: //p')
  case "$info" in
  device*) echo "cuda: $info" ;;
  *) why=${info:-this build has no CUDA backend (nvcc was not found)}
     echo "SKIP: $why"; [ -n "${LOOM_TEST_SKIPPED_FILE:-}" ] && echo "gpu: $why" >>"$LOOM_TEST_SKIPPED_FILE"
     exit 77 ;;
  esac
fi
make_dataset "$WORK"

# compare RUN_A RUN_B TOL WHAT: losses and grad norms step by step within TOL (relative)
compare() {
  losses "$1" >"$WORK/l1"; losses "$2" >"$WORK/l2"
  python3 - "$WORK/l1" "$WORK/l2" "$3" "$4" <<'PY' || fail "$4: the device run left the cpu's"
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
tol, what = float(sys.argv[3]), sys.argv[4]
assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
worst = 0.0
for x, y in zip(a, b):
    for col in (1, 2):
        u, v = float(x[col]), float(y[col])
        e = abs(u - v) / (1e-6 + abs(u))
        worst = max(worst, e)
        assert e <= tol, f"step {x[0]} col {col}: cpu {u} device {v} (rel {e:.2e} > {tol})"
print(f"{what}: {len(a)} steps, worst relative difference {worst:.2e} <= {tol}")
PY
}

run() { # run NAME EXTRA...: train 6 steps on cpu and on $BE
  local name=$1; shift
  make_config "$WORK" "$WORK/$name.yaml" "$WORK/cpu_$name"
  "$LOOM_BIN" train "$WORK/$name.yaml" --set training.steps=6 --set checkpoint.every=0 "$@" \
    2>"$WORK/log_cpu_$name" || { cat "$WORK/log_cpu_$name"; fail "$name: cpu run"; }
  make_config "$WORK" "$WORK/${name}_d.yaml" "$WORK/dev_$name"
  LOOM_BACKEND=$BE "$LOOM_BIN" train "$WORK/${name}_d.yaml" --set training.steps=6 \
    --set checkpoint.every=0 "$@" 2>"$WORK/log_dev_$name" || { cat "$WORK/log_dev_$name"; fail "$name: $BE run"; }
}

export FLAVOR=gpt2 KVH=4
run gpt2_flash
compare "$WORK/cpu_gpt2_flash" "$WORK/dev_gpt2_flash" 1e-4 "gpt2 flash fp32" && pass "gpt2 flash fp32 on $BE == cpu"
run gpt2_sdpa --set model.attention=sdpa
compare "$WORK/cpu_gpt2_sdpa" "$WORK/dev_gpt2_sdpa" 1e-4 "gpt2 sdpa fp32" && pass "gpt2 sdpa fp32 on $BE == cpu"
export FLAVOR=llama KVH=2
run llama_flash
compare "$WORK/cpu_llama_flash" "$WORK/dev_llama_flash" 1e-4 "llama flash fp32" && pass "llama (GQA) flash fp32 on $BE == cpu"
run llama_bf16 --set training.precision=bf16
compare "$WORK/cpu_llama_bf16" "$WORK/dev_llama_bf16" 3e-2 "llama bf16" && pass "llama bf16 on $BE ~ cpu bf16"
run llama_moe --set model.moe.experts=4 --set model.moe.top_k=2
compare "$WORK/cpu_llama_moe" "$WORK/dev_llama_moe" 1e-4 "llama moe fp32" && pass "llama MoE (4 experts, top 2) on $BE == cpu"

# bit-exact resume on the device: 3 + 3 steps == 6
make_config "$WORK" "$WORK/r.yaml" "$WORK/dev_resume"
LOOM_BACKEND=$BE "$LOOM_BIN" train "$WORK/r.yaml" --set training.steps=3 --set checkpoint.every=3 2>"$WORK/log_r1" \
  || { cat "$WORK/log_r1"; fail "resume: first half"; }
LOOM_BACKEND=$BE "$LOOM_BIN" train "$WORK/r.yaml" --set training.steps=6 --set checkpoint.every=3 2>"$WORK/log_r2" \
  || { cat "$WORK/log_r2"; fail "resume: second half"; }
grep -q "resumed from .*step_0000003" "$WORK/log_r2" || { cat "$WORK/log_r2"; fail "did not resume"; }
losses "$WORK/dev_resume" >"$WORK/lr"; losses "$WORK/dev_llama_flash" >"$WORK/lf"
diff "$WORK/lr" "$WORK/lf" || fail "resumed on $BE: losses differ from the uninterrupted $BE run"
pass "3 + 3 steps resumed on $BE == 6 uninterrupted, bit for bit"

# greedy generation from the trained checkpoint: the device's tokens are the cpu's
ck=$(ls -d "$WORK/dev_resume/ckpt/step_"* | tail -1)
"$LOOM_BIN" generate "$ck" --prompt "the quick" --tokens 16 --temperature 0 >"$WORK/g_cpu" 2>"$WORK/log_g1" \
  || { cat "$WORK/log_g1"; fail "generate on cpu"; }
LOOM_BACKEND=$BE "$LOOM_BIN" generate "$ck" --prompt "the quick" --tokens 16 --temperature 0 >"$WORK/g_dev" 2>"$WORK/log_g2" \
  || { cat "$WORK/log_g2"; fail "generate on $BE"; }
diff "$WORK/g_cpu" "$WORK/g_dev" || fail "greedy tokens on $BE differ from the cpu's"
pass "greedy generation on $BE == cpu ($(head -c 60 "$WORK/g_dev" | tr '\n' ' '))"
# sampled (temperature 1, a fixed seed): each token depends on the whole distribution, not
# only its top (a 6-step model's greedy text repeats one letter)
S="--prompt the --tokens 24 --temperature 1 --seed 7 --format ids"
"$LOOM_BIN" generate "$ck" $S >"$WORK/g_cpu" 2>"$WORK/log_g1" || { cat "$WORK/log_g1"; fail "sample on cpu"; }
LOOM_BACKEND=$BE "$LOOM_BIN" generate "$ck" $S >"$WORK/g_dev" 2>"$WORK/log_g2" || { cat "$WORK/log_g2"; fail "sample on $BE"; }
[ "$(tr ' ' '\n' <"$WORK/g_dev" | sort -u | wc -l)" -ge 4 ] || fail "sampling gave a degenerate sequence: $(cat "$WORK/g_dev")"
diff "$WORK/g_cpu" "$WORK/g_dev" || fail "sampled tokens (seed 7) on $BE differ from the cpu's"
pass "sampled generation (seed 7) on $BE == cpu ($(head -c 80 "$WORK/g_dev" | tr '\n' ' '))"

# loom serve on the device: a greedy completion equal to the cpu server's
serve_text() { # serve_text BACKEND OUT: one completion's text from `loom serve CKPT` on BACKEND
  rm -f "$WORK/port"
  LOOM_BACKEND=$1 start_server "$WORK/port" "$WORK/serve_$1.err" "$LOOM_BIN" serve "$ck" --port 0 --port-file "$WORK/port"
  python3 - "$(cat "$WORK/port")" "$2" <<'PY' || { cat "$WORK/serve_$1.err" >&2; fail "serve on $1: no completion"; }
import json, sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions",
    data=json.dumps({"prompt": "the lazy", "max_tokens": 12, "temperature": 0}).encode(),
    headers={"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=120))
open(sys.argv[2], "w").write(r["choices"][0]["text"])
PY
  kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
}
serve_text cpu "$WORK/s_cpu"
serve_text "$BE" "$WORK/s_dev"
[ -s "$WORK/s_dev" ] || fail "serve on $BE: an empty completion"
cmp -s "$WORK/s_cpu" "$WORK/s_dev" || fail "serve on $BE: '$(cat "$WORK/s_dev")' != cpu's '$(cat "$WORK/s_cpu")'"
pass "loom serve on $BE: the greedy completion equals the cpu server's ('$(cat "$WORK/s_dev")')"

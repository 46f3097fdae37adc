#!/usr/bin/env bash
# loom serve (the ASan build) with a real client, the `openai` package: completions and chat,
# streaming (SSE) and not, equal to `loom generate` greedy; hostile requests (truncated JSON,
# wrong types, huge and chunked bodies, unknown paths and methods, a client leaving mid-stream,
# 16 requests over a concurrency limit of 2, 1,000 concurrent connections) get the right
# status codes and no crash; SIGTERM lets a request in flight finish, then the server exits 0
# with no leak; bad options and a busy port are errors.
source "$(dirname "$0")/lib.sh"
python3 -c "import openai" 2>/dev/null || fail "the openai package is missing (scripts/setup.sh --test installs it)"
ulimit -n 8192 2>/dev/null || ulimit -n 4096 2>/dev/null || true
cd "$WORK"
make_dataset "$WORK"
make_config "$WORK" "$WORK/m.yaml" "$WORK/run"
expect_ok "train" "$LOOM_BIN" train "$WORK/m.yaml" --set training.steps=30 --set model.max_seq_len=128
expected=$("$LOOM_BIN" generate "$WORK/run" --prompt "the quick" --tokens 12 --temperature 0)
expected=${expected#the quick}
start_server "$WORK/port" "$WORK/serve.log" env ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:log_path=$WORK/asan \
  "$LOOM_ASAN_BIN" serve "$WORK/run" --port 0 --port-file "$WORK/port" --model-id tiny \
  --max-body 8192 --max-concurrent 2 --max-tokens 100 --max-connections 1100 --max-connections-per-client 1100
pid=$SERVER_PID
port=$(cat "$WORK/port")
grep -q "127.0.0.1:$port" "$WORK/serve.log" || fail "not bound to 127.0.0.1: $(cat "$WORK/serve.log")"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")
[ "$code" = 200 ] || fail "/health: $code"
python3 "$LOOM_SRC/tests/e2e/serve_client.py" "$port" tiny "the quick" "$expected" \
  || { cat "$WORK/serve.log" >&2; fail "client checks"; }
kill -0 $pid || fail "the server died"
# SIGTERM with a request in flight: it completes, then the server exits 0. The request
# streams, and the signal waits for its first chunk (a fixed sleep raced the client's
# connect on a loaded machine: the server could stop accepting before the request arrived).
curl -sN -X POST "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "the quick", "max_tokens": 100, "temperature": 0, "stream": true}' > "$WORK/inflight.txt" &
cpid=$!
for _ in $(seq 3000); do grep -q '^data: {' "$WORK/inflight.txt" 2>/dev/null && break; sleep 0.02; done
grep -q '^data: {' "$WORK/inflight.txt" || fail "no first chunk of the streamed request within 60 s"
kill -TERM $pid
wait $cpid || fail "the request in flight failed"
rc=0; wait $pid || rc=$?
grep -q '"finish_reason": *"length"' "$WORK/inflight.txt" && grep -q '^data: \[DONE\]' "$WORK/inflight.txt" \
  || fail "in-flight response did not complete: $(tail -c 600 "$WORK/inflight.txt")"
[ $rc = 0 ] || { cat "$WORK/serve.log" "$WORK"/asan* >&2 2>/dev/null; fail "server exit $rc after SIGTERM"; }
grep -q "SIGTERM" "$WORK/serve.log" || fail "no shutdown message"
if ls "$WORK"/asan* >/dev/null 2>&1; then cat "$WORK"/asan* >&2; fail "sanitizer report"; fi
pass "SIGTERM: the request in flight finished, exit 0, no leak"
expect_fail "bad port" "port" "$LOOM_BIN" serve "$WORK/run" --port 70000
expect_fail "bad host" "host" "$LOOM_BIN" serve "$WORK/run" --host nowhere
python3 -c "
import socket,time,sys
s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(120)" > "$WORK/busy" &
bpid=$!
for _ in $(seq 50); do [ -s "$WORK/busy" ] && break; sleep 0.1; done
expect_fail "busy port" "cannot listen" "$LOOM_BIN" serve "$WORK/run" --port "$(cat "$WORK/busy")"
kill $bpid 2>/dev/null || true
pass "loom serve"

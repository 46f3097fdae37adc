# `loom serve` against slow and greedy clients (issue 30): a connection whose request line,
# headers or body trickle in (a byte every 0.4 s, which resets the idle --timeout every time)
# is closed at --request-timeout; one client address cannot hold more than
# --max-connections-per-client connections, so another client is still served; a keep-alive
# connection's deadline restarts with each request; a garbage request line is a 400 and a chunk
# over --max-body a 413, both at once.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
make_dataset "$WORK"
make_config "$WORK" "$WORK/m.yaml" "$WORK/run"
expect_ok "train" "$LOOM_BIN" train "$WORK/m.yaml" --set training.steps=2
start_server "$WORK/port" "$WORK/serve.log" "$LOOM_ASAN_BIN" serve "$WORK/run" --port 0 \
  --port-file "$WORK/port" --timeout 60 --request-timeout 3 --max-connections 32 --max-body 8192 \
  --max-connections-per-client 4
python3 - "$(cat "$WORK/port")" <<'PY' || { cat "$WORK/serve.log" >&2; fail "slow clients"; }
import json, socket, sys, time
port = int(sys.argv[1])
FAIL = []

def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        FAIL.append(what)

def conn(src="127.0.0.1"):
    s = socket.socket()
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s

def closed_after(s, data, every=0.4, limit=15.0):
    """Trickles data a byte at a time; returns the seconds until the server closed the
    connection (None: still open after limit seconds)."""
    t0 = time.time()
    s.settimeout(every)
    i = 0
    while time.time() - t0 < limit:
        try:
            if s.recv(4096) == b"":
                return time.time() - t0
        except socket.timeout:
            pass
        except (ConnectionResetError, BrokenPipeError):
            return time.time() - t0
        try:
            s.send(data[i % len(data):i % len(data) + 1])
        except (ConnectionResetError, BrokenPipeError):
            return time.time() - t0
        i += 1
    return None

def request(s, path="/health", body=None):
    if body is None:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    else:
        s.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    s.settimeout(30)
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(4096)
        if not d:
            return None, buf
        buf += d
    head, rest = buf.split(b"\r\n\r\n", 1)
    n = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
    while len(rest) < n:
        rest += s.recv(4096)
    return int(head.split()[1]), rest

# a request head trickled in, a byte every 0.4 s: closed at the 3 s deadline, not at --timeout 60
t = closed_after(conn(), b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200)
check(t is not None and 2.5 <= t <= 6.5, f"a trickled request head is closed at --request-timeout 3 ({t} s)")
# the body likewise: the head arrives at once, the body a byte at a time
s = conn()
body = json.dumps({"prompt": "the quick", "max_tokens": 2}).encode() + b" " * 200
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          + f"Content-Length: {len(body)}\r\n\r\n".encode())
t = closed_after(s, body)
check(t is not None and 2.5 <= t <= 6.5, f"a trickled request body is closed at --request-timeout 3 ({t} s)")
# a keep-alive connection: the deadline restarts with every request
s = conn()
st1, _ = request(s)
time.sleep(2)
st2, _ = request(s, "/v1/completions", json.dumps({"prompt": "the", "max_tokens": 3}).encode())
time.sleep(2)
st3, _ = request(s)
check((st1, st2, st3) == (200, 200, 200), f"three requests 2 s apart on one connection: {(st1, st2, st3)}")
s.close()

# answered at once, before libmicrohttpd sees them: a garbage request line (it closed the
# connection without a response, or waited for the idle timeout) and a chunk over --max-body
# (it waited for the chunk's bytes until the idle timeout)
def answer(data):
    s = conn()
    s.sendall(data)
    s.settimeout(10)
    t0, got = time.time(), b""
    try:
        while True:
            d = s.recv(4096)
            if not d:
                break
            got += d
    except (socket.timeout, ConnectionResetError) as e:
        got += repr(e).encode()
    return got, time.time() - t0
for data in [b"GARBAGE\r\n\r\n", b"\x00\x01\x02 zz\r\n\r\n", b"GET /health HTTP/9.9\r\n\r\n",
             b"get /health HTTP/1.1\r\n\r\n"]:
    got, t = answer(data)
    check(got.startswith(b"HTTP/1.1 400 ") and b"not an HTTP/1.x request line" in got and t < 2,
          f"{data[:20]!r}: 400 at once ({t:.2f} s): {got[:60]!r}")
for size in [b"ffffffffffffffff", b"fffffffffffffffffffff", b"2001"]:
    got, t = answer(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\nab")
    check(got.startswith(b"HTTP/1.1 413 ") and b"over the body limit of 8192 bytes" in got and t < 2,
          f"a chunk of {size.decode()} (hex) bytes: 413 at once ({t:.2f} s): {got[:60]!r}")
body = json.dumps({"prompt": "the", "max_tokens": 2}).encode()
got, t = answer(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
check(got.startswith(b"HTTP/1.1 200 ") and b"text_completion" in got, f"a chunked request within the limit is answered: {got[:40]!r}")

# one client address holds its 4 connections; its 5th is closed at once; another address
# (127.0.0.2, also loopback) is still served
# (a connection that just ended counts until libmicrohttpd has cleaned it up, a fraction of a
# second: wait for the ones above to go)
time.sleep(1.5)
held = [conn() for _ in range(4)]
time.sleep(0.3)
s5 = conn()
s5.settimeout(5)
t0 = time.time()
try:
    got = s5.recv(100)
except (ConnectionResetError, socket.timeout) as e:
    got = e
t5 = time.time() - t0
check((got == b"" or isinstance(got, ConnectionResetError)) and t5 < 2.5,
      f"a 5th connection of one client is closed at once, not at the 3 s deadline ({got!r}, {t5:.2f} s)")
st, _ = request(conn("127.0.0.2"))
check(st == 200, f"another client is served while the first holds its 4 connections ({st})")
for h in held:
    h.close()
time.sleep(0.5)
st, _ = request(conn())
check(st == 200, f"the first client is served again once it closed them ({st})")
sys.exit(1 if FAIL else 0)
PY
kill -0 $SERVER_PID || fail "the server died"
kill -TERM $SERVER_PID
rc=0; wait $SERVER_PID || rc=$?
[ $rc = 0 ] || { cat "$WORK/serve.log"; fail "the server exited $rc after SIGTERM"; }
crashed "$WORK/serve.log" && { cat "$WORK/serve.log"; fail "sanitizer report"; }
grep -q "did not arrive within --request-timeout 3 s" "$WORK/serve.log" || { cat "$WORK/serve.log"; fail "no log line for the closed connections"; }
pass "slow and greedy clients"

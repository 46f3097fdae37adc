#!/usr/bin/env bash
# loom report RUN_DIR: run.dir/report.html, one self-contained page (inline SVG, no script, no
# URL) with every plot (loss + val loss, lr, grad norm, tokens/s, MFU, memory, exposed
# communication, per-rank step time, the profile's split, a trace timeline), the alerts, the data manifest
# summary, the profile's top ops and the config. It renders in headless Chromium (Debian
# chromium) without console errors, every plot in the DOM, and a screenshot that is not blank.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
LOOM_TEST_LOSS_SPIKE=9:6 expect_ok "train" "$LOOM_BIN" train "$WORK/c.yaml" --set training.steps=12 \
  --set profile.steps=3-4 --set 'alerts=["loss > 2 * ema(5) -> log"]'
expect_ok "loom report" "$LOOM_BIN" report "$WORK/run"
R="$WORK/run/report.html"
[ -s "$R" ] || fail "no report.html"
python3 - "$R" <<'PY' || fail "report content"
import re, sys
html = open(sys.argv[1]).read()
plots = ["loss", "lr", "grad_norm", "tokens_per_s", "mfu", "memory", "comm", "rank_step", "profile-split", "trace"]
for p in plots:
    m = re.search(r'<figure class="plot" id="plot-%s"><svg [^>]*>(.*?)</svg>' % re.escape(p), html, re.S)
    assert m, f"plot {p} missing"
    if p not in ("profile-split", "trace"):
        assert '<polyline class="series"' in m.group(1), f"plot {p} has no line"
loss = re.search(r'id="plot-loss".*?</svg>', html, re.S).group(0)
assert "train loss" in loss and "val loss" in loss and loss.count("<polyline") == 2
for bad in ("http://", "https://", "<script", "<link", "src=", "@import", "url("):
    assert bad not in html, f"external reference: {bad}"
assert "loss &gt; 2 * ema(5) -&gt; log" in html, "alert not listed"
assert re.search(r"<td>train</td><td><code>[^<]*/data/train</code></td><td>\d+</td><td>\d+</td>", html), "data summary"
assert "matmul_forward" in html and 'class="ops"' in html, "profile top ops"
trace = re.search(r'id="plot-trace".*?</svg>', html, re.S).group(0)
for name in ("forward", "backward", "optimizer", "matmul_forward"):
    assert f"<title>{name} (" in trace, f"trace timeline: no {name} span"
assert '<pre class="config">' in html and "peak_flops: 1e11" in html.replace("'", ""), "config"
print("ok: every plot, the alert, the data summary, the profile and the config; no external reference")
PY
pass "report.html content"

command -v chromium >/dev/null || fail "chromium not found (Debian package chromium; scripts/setup.sh --test)"
chrome() { timeout -k 5 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --no-first-run --user-data-dir="$WORK/chrome" --enable-logging=stderr --v=0 "$@"; }
chrome --window-size=1400,3000 --screenshot="$WORK/shot.png" "file://$R" >"$WORK/chrome.out" 2>&1 ||
  { cat "$WORK/chrome.out"; fail "chromium screenshot"; }
grep -iE "CONSOLE|Uncaught" "$WORK/chrome.out" && fail "console messages while rendering"
python3 "$LOOM_SRC/tests/e2e/png_check.py" "$WORK/shot.png" || fail "blank screenshot"
chrome --dump-dom "file://$R" >"$WORK/dom.html" 2>"$WORK/chrome.err" || { cat "$WORK/chrome.err"; fail "chromium dump-dom"; }
n=$(grep -o '<figure class="plot" id="plot-[a-z_-]*"><svg' "$WORK/dom.html" | wc -l)
[ "$n" -eq 10 ] || fail "the rendered DOM has $n plots, expected 10"
grep -iE "CONSOLE|Uncaught" "$WORK/chrome.err" && fail "console messages in dump-dom"
pass "headless Chromium renders the report: 10 plots, no console message, a screenshot that is not blank"

expect_fail "not a run directory" "metrics.jsonl.*is .* a run directory" "$LOOM_BIN" report "$WORK/nowhere"

# A killed `loom data build` leaves nothing behind for good: the next build of the output removes
# the temp directories (OUTPUT.tmp.<pid>) of builds that are no longer running, and puts back a
# previous output that a killed build had moved aside. Two builds of one output at once: the
# second refuses (.OUTPUT.lock beside the output, held for the whole build).
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"                       # $WORK/recipe.yaml -> $WORK/data
leftovers() { ls -d "$WORK"/data.tmp.* "$WORK"/data.old.* 2>/dev/null || true; }

# a build killed (SIGKILL) while writing its shards
echo "a new document so that the build has shards to write" > "$WORK/corpus/part9.txt"
rc=0
LOOM_TEST_FAIL_BUILD=0:kill "$LOOM_BIN" data build "$WORK/recipe.yaml" >"$WORK/log" 2>&1 || rc=$?
[ $rc -eq 137 ] || { cat "$WORK/log"; fail "the injected SIGKILL did not happen (exit $rc)"; }
[ -n "$(leftovers)" ] || fail "the killed build left no temp directory (the test needs one)"
pass "killed build left $(leftovers | xargs -n1 basename)"
expect_ok "the next build" "$LOOM_ASAN_BIN" data build "$WORK/recipe.yaml"
grep -q "removed 1 temp directory of .*/data left by builds that are no longer running" "$WORK/err.txt" \
  || { cat "$WORK/err.txt"; fail "no message about the removed temp directory"; }
[ -z "$(leftovers)" ] || fail "left behind after the next build: $(leftovers)"
expect_ok "verify after the next build" "$LOOM_BIN" data verify "$WORK/data"

# killed between moving the previous output aside and renaming the new one into place
mv "$WORK/data" "$WORK/data.old.424242"
expect_ok "a build after a kill between the renames" "$LOOM_ASAN_BIN" data build "$WORK/recipe.yaml"
grep -q "data.old.424242 (the previous output, moved aside by a build that was killed) was put back" \
  "$WORK/err.txt" || { cat "$WORK/err.txt"; fail "the previous output was not put back"; }
grep -q "up to date" "$WORK/err.txt" || { cat "$WORK/err.txt"; fail "the put-back output was not reused"; }
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
pass "the previous output was put back and reused"

# a build running (its lock held) and a second one
python3 -c "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); time.sleep(60)" \
  "$WORK/.data.lock" >/dev/null 2>&1 &
HOLDER=$!
trap 'kill $HOLDER 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do flock -n "$WORK/.data.lock" true 2>/dev/null || break; sleep 0.1; done
mkdir "$WORK/data.tmp.777"   # the running build's temp directory: not touched
expect_fail "a second build of the same output" \
  "another .loom data build. of output '.*/data' is running .*\.data\.lock is locked by another process \(it has not said who it is yet\)" \
  "$LOOM_ASAN_BIN" data build "$WORK/recipe.yaml"
[ -d "$WORK/data.tmp.777" ] || fail "the running build's temp directory was removed"
kill $HOLDER; wait $HOLDER 2>/dev/null || true
rm -rf "$WORK/data.tmp.777"
echo "all data-build leftover tests passed"

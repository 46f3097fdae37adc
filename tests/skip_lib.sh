# Opt-outs inside a test (sourced; see tests/run_test.sh). LOOM_TEST_SKIP is the only way to
# skip: a missing tool is a failure.

# test_skipping CATEGORY: true when LOOM_TEST_SKIP names CATEGORY.
test_skipping() {
  local w
  local IFS=','
  for w in ${LOOM_TEST_SKIP:-}; do
    [ "${w//[[:space:]]/}" = "$1" ] && return 0
  done
  return 1
}

# skip_part CATEGORY "what": when LOOM_TEST_SKIP names CATEGORY, records "what" as left out
# (run_test.sh then reports the test as skipped, naming it) and returns 0; otherwise returns 1.
#   if ! skip_part reference "the BPE recipe against Hugging Face tokenizers"; then ...; fi
skip_part() {
  test_skipping "$1" || return 1
  echo "SKIP (LOOM_TEST_SKIP=$LOOM_TEST_SKIP): $2"
  [ -n "${LOOM_TEST_SKIPPED_FILE:-}" ] && echo "$1: $2" >>"$LOOM_TEST_SKIPPED_FILE"
  return 0
}


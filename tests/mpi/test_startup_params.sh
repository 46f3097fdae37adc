#!/usr/bin/env bash
# The trainer's start-up line names the whole model's parameter count under tp, pp and ep
# (each rank's view holds only a part: before, it printed rank 0's part as the model's,
# "17568 parameters; dp=1 tp=2" for a 34,976-parameter model), and rank 0's part beside it.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
count() { sed -n 's/.*model: [a-z0-9]*, \([0-9]*\) parameters.*/\1/p' "$1" | head -1; }
"$LOOM_BIN" train "$WORK/c.yaml" --set training.steps=1 --set run.dir="$WORK/one" 2>"$WORK/one.log" \
  || { cat "$WORK/one.log"; fail "one process"; }
whole=$(count "$WORK/one.log")
[ -n "$whole" ] || { cat "$WORK/one.log"; fail "no start-up line"; }
for par in parallel.tp=2 parallel.pp=2; do
  run_mpi 2 "$WORK/two.log" "$LOOM_BIN" train "$WORK/c.yaml" --set training.steps=1 --set "$par" \
    --set run.dir="$WORK/run_$par"
  [ $RC = 0 ] || { cat "$WORK/two.log"; fail "$par: exit $RC"; }
  n=$(count "$WORK/two.log")
  [ "$n" = "$whole" ] || { grep "model:" "$WORK/two.log"; fail "$par: the start-up line says $n parameters, the model has $whole"; }
  grep -qE "model: [a-z0-9]*, $whole parameters \([0-9]+ on rank 0\)" "$WORK/two.log" \
    || { grep "model:" "$WORK/two.log"; fail "$par: rank 0's part is not named"; }
  pass "$par: $(grep -o "model: [^;]*" "$WORK/two.log")"
done

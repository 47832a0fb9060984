#!/usr/bin/env bash
# End-to-end GPU test of the main job: 200 steps of the serving loop in graph mode with every 10th
# step verified against the CPU references and zero allocations after warm-up, then the same trace
# in eager mode and in graph mode with the insert slots derived on the device (instead of the
# scheduler's slot lists) and in graph mode over the model front's own buffers (--engine-buffers),
# whose output checksums must all be identical. Then the same trace with whole steps in one launch
# (--one-launch), in graph mode (every 20th step verified chunk by chunk on its rows of the step,
# zero allocations after warm-up) and in eager mode (verified too): their two checksums must be identical (they
# differ from the per-chunk runs' by design: the front fills a step's inputs otherwise, and chunk
# graphs write padded rows); with flat step graphs for all-full steps (--flat-steps) the checksum
# is the same again, and with every step flat (--flat-pad, each chunk on the largest bucket) the
# verified steps pass and no allocation is made. Exit 77 (skipped) without a GPU.
set -uo pipefail
serve_loop=${1:?usage: serve_loop_test.sh path/to/serve_loop}
trace=(--steps 200 --seed 11 --max-tokens 256 --max-model-len 8192 --min-len 300 --max-len 8192
       --budget 512 --requests 12 --no-progress --checksum --require-gpu)
args=("${trace[@]}" --verify 20)
one_launch=("${trace[@]}" --verify 10 --one-launch)

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# run_leg NAME WHAT ARGS...: serve_loop ARGS, its output in $logs/NAME; a failed run prints it
# and fails the test, naming WHAT.
run_leg() {
  local log=$logs/$1 what=$2
  shift 2
  "$serve_loop" "$@" >"$log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { cat "$log"; echo "serve_loop_test: $what failed (exit $rc)"; exit 1; }
}
# expect NAME PATTERN WHY: the output of leg NAME has a line matching PATTERN, or the test fails.
expect() {
  grep -q "$2" "$logs/$1" || { cat "$logs/$1"; echo "serve_loop_test: $3"; exit 1; }
}
# same_outputs NAME_A NAME_B WHAT: both legs printed the same, non-empty output checksum.
same_outputs() {
  local a b
  a=$(grep "output checksum" "$logs/$1")
  b=$(grep "output checksum" "$logs/$2")
  if [ -z "$a" ] || [ "$a" != "$b" ]; then
    echo "serve_loop_test: $3 give different outputs: '$a' vs '$b'"
    exit 1
  fi
}

"$serve_loop" "${args[@]}" --mode graph >"$logs/graph" 2>&1
rc=$?
cat "$logs/graph"
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || { echo "serve_loop_test: graph run failed (exit $rc)"; exit 1; }
expect graph "verified chunks *20 passed, 0 failed" "verification did not pass 20 chunks"
expect graph "CUDA allocation calls *0 after warm-up" "allocations after warm-up"

run_leg eager "eager run" "${args[@]}" --mode eager
cat "$logs/eager"
same_outputs graph eager "graph and eager runs"
echo "serve_loop_test: graph and eager outputs are bit-identical ($(grep "output checksum" "$logs/graph"))"

run_leg derived "graph run with derived slots" "${args[@]}" --mode graph --derive-slots
same_outputs graph derived "derived slots and slot lists"
echo "serve_loop_test: slots derived on the device and the scheduler's slot lists give bit-identical outputs"

run_leg engine "graph run over engine-owned buffers" "${args[@]}" --mode graph --engine-buffers
expect engine "verified chunks *20 passed, 0 failed" "engine-buffer verification did not pass"
same_outputs graph engine "engine-owned and pooled buffers"
grep "warm-up:" "$logs/graph" "$logs/engine"
echo "serve_loop_test: engine-owned buffers give bit-identical outputs"

run_leg one_graph "one-launch graph run" "${one_launch[@]}" --mode graph
cat "$logs/one_graph"
expect one_graph "verified steps *10 passed, 0 failed" "one-launch verification did not pass 10 steps"
expect one_graph "CUDA allocation calls *0 after warm-up" "one-launch allocations after warm-up"

run_leg one_eager "one-launch eager run" "${one_launch[@]}" --mode eager
expect one_eager "verified steps *10 passed, 0 failed" "one-launch eager verification did not pass 10 steps"
same_outputs one_graph one_eager "one-launch graph and eager runs"
grep "verified steps" "$logs/one_eager"
echo "serve_loop_test: one-launch graph and eager outputs are bit-identical ($(grep "output checksum" "$logs/one_graph"))"

run_leg flat "one-launch run with flat steps" "${one_launch[@]}" --mode graph --flat-steps 4
expect flat "verified steps *10 passed, 0 failed" "flat-step verification did not pass 10 steps"
same_outputs one_graph flat "one-launch runs with and without flat step graphs"
grep "flat steps" "$logs/flat"
echo "serve_loop_test: flat step graphs give bit-identical outputs"

run_leg pad "one-launch run with padded flat steps" "${one_launch[@]}" --mode graph --flat-steps 4 --flat-pad
expect pad "verified steps *10 passed, 0 failed" "padded flat-step verification did not pass 10 steps"
expect pad "CUDA allocation calls *0 after warm-up" "padded flat steps allocated after warm-up"
grep -E "flat steps|output checksum" "$logs/pad"
echo "serve_loop_test: padded flat steps pass verification"

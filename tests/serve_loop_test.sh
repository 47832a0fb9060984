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

graph_log=$(mktemp)
eager_log=$(mktemp)
derived_log=$(mktemp)
engine_log=$(mktemp)
one_graph_log=$(mktemp)
one_eager_log=$(mktemp)
flat_log=$(mktemp)
pad_log=$(mktemp)
trap 'rm -f "$graph_log" "$eager_log" "$derived_log" "$engine_log" "$one_graph_log" "$one_eager_log" "$flat_log" "$pad_log"' EXIT
"$serve_loop" "${args[@]}" --mode graph >"$graph_log" 2>&1
rc=$?
cat "$graph_log"
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || { echo "serve_loop_test: graph run failed (exit $rc)"; exit 1; }
grep -q "verified chunks *20 passed, 0 failed" "$graph_log" || { echo "serve_loop_test: verification did not pass 20 chunks"; exit 1; }
grep -q "CUDA allocation calls *0 after warm-up" "$graph_log" || { echo "serve_loop_test: allocations after warm-up"; exit 1; }

"$serve_loop" "${args[@]}" --mode eager >"$eager_log" 2>&1
rc=$?
cat "$eager_log"
[ $rc -eq 0 ] || { echo "serve_loop_test: eager run failed (exit $rc)"; exit 1; }
g=$(grep "output checksum" "$graph_log")
e=$(grep "output checksum" "$eager_log")
if [ -z "$g" ] || [ "$g" != "$e" ]; then
  echo "serve_loop_test: graph and eager outputs differ: '$g' vs '$e'"
  exit 1
fi
echo "serve_loop_test: graph and eager outputs are bit-identical ($g)"

"$serve_loop" "${args[@]}" --mode graph --derive-slots >"$derived_log" 2>&1
rc=$?
[ $rc -eq 0 ] || { cat "$derived_log"; echo "serve_loop_test: graph run with derived slots failed (exit $rc)"; exit 1; }
l=$(grep "output checksum" "$derived_log")
if [ "$g" != "$l" ]; then
  echo "serve_loop_test: derived slots and slot lists give different outputs: '$g' vs '$l'"
  exit 1
fi
echo "serve_loop_test: slots derived on the device and the scheduler's slot lists give bit-identical outputs"

"$serve_loop" "${args[@]}" --mode graph --engine-buffers >"$engine_log" 2>&1
rc=$?
[ $rc -eq 0 ] || { cat "$engine_log"; echo "serve_loop_test: graph run over engine-owned buffers failed (exit $rc)"; exit 1; }
grep -q "verified chunks *20 passed, 0 failed" "$engine_log" || { cat "$engine_log"; echo "serve_loop_test: engine-buffer verification did not pass"; exit 1; }
b=$(grep "output checksum" "$engine_log")
if [ "$g" != "$b" ]; then
  echo "serve_loop_test: engine-owned and pooled buffers give different outputs: '$g' vs '$b'"
  exit 1
fi
grep "warm-up:" "$graph_log" "$engine_log"
echo "serve_loop_test: engine-owned buffers give bit-identical outputs"

"$serve_loop" "${one_launch[@]}" --mode graph >"$one_graph_log" 2>&1
rc=$?
cat "$one_graph_log"
[ $rc -eq 0 ] || { echo "serve_loop_test: one-launch graph run failed (exit $rc)"; exit 1; }
grep -q "verified steps *10 passed, 0 failed" "$one_graph_log" || { echo "serve_loop_test: one-launch verification did not pass 10 steps"; exit 1; }
grep -q "CUDA allocation calls *0 after warm-up" "$one_graph_log" || { echo "serve_loop_test: one-launch allocations after warm-up"; exit 1; }

"$serve_loop" "${one_launch[@]}" --mode eager >"$one_eager_log" 2>&1
rc=$?
[ $rc -eq 0 ] || { cat "$one_eager_log"; echo "serve_loop_test: one-launch eager run failed (exit $rc)"; exit 1; }
grep -q "verified steps *10 passed, 0 failed" "$one_eager_log" || { cat "$one_eager_log"; echo "serve_loop_test: one-launch eager verification did not pass 10 steps"; exit 1; }
og=$(grep "output checksum" "$one_graph_log")
oe=$(grep "output checksum" "$one_eager_log")
if [ -z "$og" ] || [ "$og" != "$oe" ]; then
  echo "serve_loop_test: one-launch graph and eager outputs differ: '$og' vs '$oe'"
  exit 1
fi
grep "verified steps" "$one_eager_log"
echo "serve_loop_test: one-launch graph and eager outputs are bit-identical ($og)"

"$serve_loop" "${one_launch[@]}" --mode graph --flat-steps 4 >"$flat_log" 2>&1
rc=$?
[ $rc -eq 0 ] || { cat "$flat_log"; echo "serve_loop_test: one-launch run with flat steps failed (exit $rc)"; exit 1; }
grep -q "verified steps *10 passed, 0 failed" "$flat_log" || { cat "$flat_log"; echo "serve_loop_test: flat-step verification did not pass 10 steps"; exit 1; }
of=$(grep "output checksum" "$flat_log")
if [ "$og" != "$of" ]; then
  echo "serve_loop_test: one-launch outputs with and without flat step graphs differ: '$og' vs '$of'"
  exit 1
fi
grep "flat steps" "$flat_log"
echo "serve_loop_test: flat step graphs give bit-identical outputs"

"$serve_loop" "${one_launch[@]}" --mode graph --flat-steps 4 --flat-pad >"$pad_log" 2>&1
rc=$?
[ $rc -eq 0 ] || { cat "$pad_log"; echo "serve_loop_test: one-launch run with padded flat steps failed (exit $rc)"; exit 1; }
grep -q "verified steps *10 passed, 0 failed" "$pad_log" || { cat "$pad_log"; echo "serve_loop_test: padded flat-step verification did not pass 10 steps"; exit 1; }
grep -q "CUDA allocation calls *0 after warm-up" "$pad_log" || { cat "$pad_log"; echo "serve_loop_test: padded flat steps allocated after warm-up"; exit 1; }
grep -E "flat steps|output checksum" "$pad_log"
echo "serve_loop_test: padded flat steps pass verification"

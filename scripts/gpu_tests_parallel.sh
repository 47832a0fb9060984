#!/usr/bin/env bash
# Runs the GPU test binary's cases in several processes at once on one device, then the cases
# that must run alone, so the whole suite fits in less of a session's device time (its cases
# spend much of their time on the host: warm-ups, captures, references).
#
# usage: scripts/gpu_tests_parallel.sh [--jobs N] [--out DIR] [--durations-from DIR] BIN [TEST_SPEC]
#   BIN        the GPU test binary (build/release/tests/spgraph_gpu_tests, Catch2 2 or 3)
#   TEST_SPEC  a Catch2 test spec, e.g. "[step],[executor]" (default: every case not hidden)
#   --jobs     processes at once (default 4); the cases are dealt to them in turn
#   --out      where the logs go (default $OUT, else /tmp/gpu_tests_parallel): shard_<i>.names and
#              shard_<i>.log per process (with each case's duration), serial.names and serial.log,
#              summary.txt
#   --durations-from  an earlier run's --out: the cases are dealt longest first, each to the
#              process with the least time so far, by the durations in its logs (on the H200 the
#              longest case takes ~50 s of the suite's ~350)
# The cases tagged [pool] (they read the device's free memory, which the other processes move)
# and [trap] (each ends a child process's context on purpose) run after the shards, in one
# process. Exit status: 0 when every process passed, 1 when one failed, 77 without a device (the
# binary's own skip), 2 for a usage error.
set -uo pipefail
JOBS=4
DURS=""
OUTDIR=${OUT:-/tmp/gpu_tests_parallel}
while [[ $# -gt 0 ]]; do
  case $1 in
    --jobs) JOBS=$2; shift 2 ;;
    --out) OUTDIR=$2; shift 2 ;;
    --durations-from) DURS=$2; shift 2 ;;
    -*) echo "$0: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 [--jobs N] [--out DIR] [--durations-from DIR] BIN [TEST_SPEC]" >&2
  exit 2
fi
BIN=$1
SPEC=${2:-}
if ! [[ $JOBS =~ ^[0-9]+$ ]] || ((JOBS < 1 || JOBS > 64)); then
  echo "$0: --jobs takes 1..64, not '$JOBS'" >&2
  exit 2
fi
[[ -x $BIN ]] || { echo "$0: $BIN is not an executable" >&2; exit 2; }
if [[ -n $DURS ]] && ! compgen -G "$DURS/*.log" >/dev/null; then
  echo "$0: --durations-from $DURS holds no logs of an earlier run" >&2
  exit 2
fi
mkdir -p "$OUTDIR"

# The names of the cases a spec selects, one a line: Catch2 2's option (its exit status is the
# number of cases listed, so a spec that matches none probes for it), else Catch2 3's. A listing
# needs no device.
if "$BIN" --list-test-names-only "[no such tag]" >/dev/null 2>&1; then
  list() { "$BIN" --list-test-names-only "$@" || true; }
else
  list() { "$BIN" --list-tests --verbosity quiet "$@"; }
fi
# A name as a line of an --input-file: Catch2 reads , [ ] * ~ and \ as spec syntax unless escaped.
escape() { sed 's/[][\\,*~]/\\&/g'; }

all=$(list ${SPEC:+"$SPEC"}) || { echo "$0: $BIN could not list its tests" >&2; exit 2; }
alone=$(list "[pool],[trap]") || alone=""  # (Catch2 3 may fail a listing that matches nothing)
[[ -n $all ]] || { echo "$0: no test case matches '${SPEC}'" >&2; exit 2; }
serial=$(grep -xF -f <(printf '%s\n' "$alone") <<<"$all")
parallel=$(grep -vxF -f <(printf '%s\n' "$alone") <<<"$all")
n_par=$(grep -c . <<<"$parallel")
n_ser=$(grep -c . <<<"$serial")
((JOBS > n_par)) && JOBS=$((n_par > 0 ? n_par : 1))

# "shard<TAB>name" for each case: dealt in turn, or with --durations-from the longest first, each
# to the shard with the least time so far (a case the earlier run did not time counts 0 s).
assign() {
  if [[ -z $DURS ]]; then
    awk '{ print (NR - 1) % jobs "\t" $0 }' jobs="$JOBS"
    return
  fi
  awk 'FNR == NR {
         if (match($0, /^[0-9.]+ s: /)) { t = substr($0, 1, RLENGTH - 4) + 0; n = substr($0, RLENGTH + 1); if (t > d[n]) d[n] = t }
         next
       }
       { print (($0 in d) ? d[$0] : 0) "\t" $0 }' <(cat "$DURS"/*.log 2>/dev/null) - |
    sort -t "$(printf '\t')" -k1,1gr -s |
    awk -F '\t' '{ best = 0; for (k = 1; k < jobs; ++k) if (load[k] < load[best]) best = k
                   load[best] += $1; print best "\t" substr($0, index($0, "\t") + 1) }' jobs="$JOBS"
}
assignment=$(grep . <<<"$parallel" | assign)  # before the logs it may read are replaced
rm -f "$OUTDIR"/shard_*.names "$OUTDIR"/shard_*.log "$OUTDIR"/serial.names "$OUTDIR"/serial.log
while IFS=$'\t' read -r k name; do
  [[ -n $name ]] || continue
  printf '%s\n' "$name" | escape >>"$OUTDIR/shard_$k.names"
done <<<"$assignment"
[[ -n $serial ]] && printf '%s\n' "$serial" | escape >"$OUTDIR/serial.names"

summary=$OUTDIR/summary.txt
: >"$summary"
t0=$SECONDS
pids=()
for ((k = 0; k < JOBS; ++k)); do
  [[ -s $OUTDIR/shard_$k.names ]] || continue
  (
    s=$SECONDS
    "$BIN" -f "$OUTDIR/shard_$k.names" --reporter compact --durations yes >"$OUTDIR/shard_$k.log" 2>&1
    echo "$?" >"$OUTDIR/shard_$k.rc"
    echo "$((SECONDS - s))" >"$OUTDIR/shard_$k.s"
  ) &
  pids+=($!)
done
wait "${pids[@]}" 2>/dev/null
rc_all=0
for ((k = 0; k < JOBS; ++k)); do
  [[ -s $OUTDIR/shard_$k.names ]] || continue
  rc=$(cat "$OUTDIR/shard_$k.rc" 2>/dev/null || echo "?")
  [[ $rc == 77 ]] && { echo "$0: no CUDA device; skipped" | tee -a "$summary"; exit 77; }
  [[ $rc == 0 ]] || rc_all=1
  echo "shard $k: $(grep -c . "$OUTDIR/shard_$k.names") cases, rc $rc, $(cat "$OUTDIR/shard_$k.s") s: $(grep . "$OUTDIR/shard_$k.log" | tail -1)" | tee -a "$summary"
done
echo "shards: $n_par cases in $JOBS processes, $((SECONDS - t0)) s" | tee -a "$summary"
if [[ -s $OUTDIR/serial.names ]]; then
  s=$SECONDS
  "$BIN" -f "$OUTDIR/serial.names" --reporter compact --durations yes >"$OUTDIR/serial.log" 2>&1
  rc=$?
  [[ $rc == 0 ]] || rc_all=1
  echo "alone: $n_ser cases, rc $rc, $((SECONDS - s)) s: $(grep . "$OUTDIR/serial.log" | tail -1)" | tee -a "$summary"
fi
echo "all: $((n_par + n_ser)) cases, $((SECONDS - t0)) s, $([[ $rc_all == 0 ]] && echo passed || echo FAILED)" | tee -a "$summary"
exit "$rc_all"

#!/usr/bin/env bash
# scripts/gpu_tests_parallel.sh against a fake test binary (no GPU, about 1 s): every case runs
# exactly once, the [pool] and [trap] cases alone after the shards, a failing case fails the run,
# the binary's no-device exit (77) is passed on, and a bad --jobs runs nothing. With the real GPU
# test binary as $1 (listing its cases needs no device; the asan preset, which does not build it,
# does not run this test), its names are dealt through the script and
# each shard's --input-file, read back by that binary's Catch2, selects exactly the shard's cases:
# the script's escaping of the spec syntax in names (commas, brackets, '*').
set -uo pipefail
script="$(cd "$(dirname "$0")/.." && pwd)/scripts/gpu_tests_parallel.sh"
real=${1:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "gpu_tests_parallel_test: $*" >&2; exit 1; }
unescape() { sed 's/\\\(.\)/\1/g'; }

# A Catch2-2-like binary over $work/names.txt (every case) and $work/alone.txt (the [pool] and
# [trap] cases): lists (exit status = cases listed), and runs an --input-file's cases, recording
# each name with the file it came from; a case whose name holds FAILS fails; FAKE_NO_DEVICE=1
# exits 77 as the real binary does without a device.
cat >"$work/fake" <<'FAKE'
#!/usr/bin/env bash
dir=$(dirname "$0")
if [[ $1 == --list-test-names-only ]]; then
  case ${2:-} in
    "") cat "$dir/names.txt"; exit $(grep -c . "$dir/names.txt") ;;
    "[pool],[trap]") cat "$dir/alone.txt"; exit $(grep -c . "$dir/alone.txt") ;;
    *) exit 0 ;;
  esac
fi
[[ ${FAKE_NO_DEVICE:-0} == 1 ]] && { echo "no CUDA device found; skipping (exit code 77)"; exit 77; }
[[ $1 == -f ]] || exit 3
rc=0
while IFS= read -r line; do
  name=$(sed 's/\\\(.\)/\1/g' <<<"$line")
  printf '%s\t%s\n' "$(basename "$2")" "$name" >>"$dir/ran.txt"
  [[ $name == *FAILS* ]] && rc=1
done <"$2"
echo "Passed or failed: rc $rc"; echo
exit $rc
FAKE
chmod +x "$work/fake"

cat >"$work/names.txt" <<'NAMES'
a pool larger than the device is refused before allocating
combine for C4A: prefix 0, long prefix, seq_len < W, query_len 0, padding
combine writes -1 for bad top-k indices; -1 stays -1 (never -1 + M * b)
sparse_mla: wgmma tiles (Q K^T, P V) [m64n256]
a trap in the kernel is reported, not hung
a step of k chunks in one launch writes each chunk's rows
steady state makes zero CUDA allocation calls over 10000 steps
faults are counted over the whole run, not only the last step
NAMES
printf '%s\n' "a pool larger than the device is refused before allocating" "a trap in the kernel is reported, not hung" >"$work/alone.txt"

# 1. Every case once; the alone cases in serial.names, after the shards; 3 shards of 2.
OUT=$work/o1 "$script" --jobs 3 "$work/fake" >"$work/o1.log" 2>&1 || fail "a passing run exited $? ($(cat "$work/o1.log"))"
cut -f2 "$work/ran.txt" | sort >"$work/ran_names.txt"
sort "$work/names.txt" | diff - "$work/ran_names.txt" >/dev/null || fail "cases run differ from the listing: $(sort "$work/names.txt" | diff - "$work/ran_names.txt")"
[[ $(grep -c . "$work/ran.txt") == 8 ]] || fail "expected 8 runs, got $(grep -c . "$work/ran.txt")"
awk -F'\t' '$1 == "serial.names"' "$work/ran.txt" | cut -f2 | sort | diff - <(sort "$work/alone.txt") >/dev/null ||
  fail "the [pool]/[trap] cases did not run alone"
tail -2 "$work/ran.txt" | cut -f1 | sort -u | grep -qx serial.names || fail "the alone cases did not run last"
for k in 0 1 2; do
  [[ $(grep -c "^shard_$k.names" "$work/ran.txt") == 2 ]] || fail "shard $k ran $(grep -c "^shard_$k.names" "$work/ran.txt") cases, not 2"
done
grep -q "all: 8 cases, .* passed" "$work/o1/summary.txt" || fail "summary: $(cat "$work/o1/summary.txt")"
grep -q "^shard 0: 2 cases, rc 0, .* s: Passed or failed: rc 0$" "$work/o1/summary.txt" ||
  fail "summary: a shard's line without its binary's last line: $(cat "$work/o1/summary.txt")"

# 2. A failing case fails the run and the summary says so.
rm -f "$work/ran.txt"
sed -i 's/^steady state/steady state FAILS/' "$work/names.txt"
OUT=$work/o2 "$script" --jobs 2 "$work/fake" >"$work/o2.log" 2>&1
rc=$?
[[ $rc == 1 ]] || fail "a failing case: exit $rc, not 1"
grep -q "FAILED" "$work/o2/summary.txt" || fail "a failing case: the summary does not say FAILED"

# 3. No device: the binary's 77 is passed on.
FAKE_NO_DEVICE=1 OUT=$work/o3 "$script" "$work/fake" >"$work/o3.log" 2>&1
rc=$?
[[ $rc == 77 ]] || fail "no device: exit $rc, not 77"

# 4. A bad --jobs is refused before anything runs.
rm -f "$work/ran.txt"
OUT=$work/o4 "$script" --jobs 0 "$work/fake" >"$work/o4.log" 2>&1
rc=$?
[[ $rc == 2 && ! -e $work/ran.txt ]] || fail "--jobs 0: exit $rc (want 2), ran: $(cat "$work/ran.txt" 2>/dev/null)"

# 5. --durations-from: longest first, each to the least-loaded process (10, 9, 2, 1, 1, 1 s over
#    two: 10+1+1 and 9+2+1, where dealing in turn gives 13 and 11); a case the logs do not time
#    counts 0 s; the logs may be the --out being written; a folder without logs is refused.
printf '%s\n' "ten, s" "one a" "two" "nine" "one b" "one c" "untimed" >"$work/names.txt"
: >"$work/alone.txt"
mkdir -p "$work/o6"
printf '%s\n' "10.000 s: ten, s" "9.000 s: nine" "2.000 s: two" "1.000 s: one a" "0.500 s: one b" "1.000 s: one b" \
  "1.000 s: one c" "0.200 s: a section, not a case" >"$work/o6/shard_0.log"
rm -f "$work/ran.txt"
OUT=$work/o6 "$script" --jobs 2 --durations-from "$work/o6" "$work/fake" >"$work/o6.log" 2>&1 || fail "--durations-from: exit $? ($(cat "$work/o6.log"))"
declare -A secs=(["ten, s"]=10 ["nine"]=9 ["two"]=2 ["one a"]=1 ["one b"]=1 ["one c"]=1 ["untimed"]=0)
shard_sum() {
  local n total=0
  while IFS= read -r n; do total=$((total + ${secs[$n]})); done < <(unescape <"$work/o6/shard_$1.names")
  echo "$total"
}
[[ $(shard_sum 0) == 12 && $(shard_sum 1) == 12 ]] || fail "--durations-from: shards of $(shard_sum 0) and $(shard_sum 1) s, not 12 and 12"
[[ $(grep -c . "$work/ran.txt") == 7 ]] || fail "--durations-from: $(grep -c . "$work/ran.txt") runs, not 7 (every case once)"
OUT=$work/o7 "$script" --durations-from "$work/nowhere" "$work/fake" >"$work/o7.log" 2>&1
rc=$?
[[ $rc == 2 ]] || fail "--durations-from a folder without logs: exit $rc, not 2"

# 6. The real binary's names through the script's shard files and back through its Catch2.
if [[ -n $real ]]; then
  [[ -x $real ]] || fail "$real is not an executable"
  # Catch2 2's listing option, else Catch2 3's (as the script picks).
  if "$real" --list-test-names-only "[no such tag]" >/dev/null 2>&1; then
    LIST=(--list-test-names-only)
  else
    LIST=(--list-tests --verbosity quiet)
  fi
  "$real" "${LIST[@]}" >"$work/names.txt" 2>/dev/null
  "$real" "${LIST[@]}" "[pool],[trap]" >"$work/alone.txt" 2>/dev/null
  [[ -s $work/names.txt ]] || fail "$real listed no cases"
  OUT=$work/o5 "$script" --jobs 4 "$work/fake" >"$work/o5.log" 2>&1 || fail "the real names through the fake: exit $?"
  for f in "$work"/o5/shard_*.names "$work"/o5/serial.names; do
    [[ -s $f ]] || continue
    "$real" "${LIST[@]}" -f "$f" 2>/dev/null | sort >"$work/selected.txt"
    unescape <"$f" | sort | diff - "$work/selected.txt" >/dev/null ||
      fail "$(basename "$f") selects other cases in $real: $(unescape <"$f" | sort | diff - "$work/selected.txt")"
  done
fi
echo "gpu_tests_parallel_test: passed"

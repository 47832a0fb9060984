#!/usr/bin/env bash
# scripts/attention_ab_bins.sh against fake `bench` binaries (no GPU): each writes one record of
# the automatic path's variant for the launch mode it was given and a decoy record of another
# variant, and a table row carrying FlashMLA's figure (and, given --checksum, a checksum line).
# Checks that the summary takes each build's records of the requested mode only, its medians over
# the rounds, vs_ref and the ratio, that --burst, --s-kv and --checksum reach bench, that
# --checksum marks builds that compute the first build's bits, another build's bits and a first
# build whose rounds disagree (exit 3 for either), and a bad --launch is refused before anything
# runs.
set -uo pipefail
script="$(cd "$(dirname "$0")/.." && pwd)/scripts/attention_ab_bins.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "attention_ab_bins_test: $*" >&2; exit 1; }

# fake NAME US [SUM]: a bench whose automatic path takes US µs in every mode (round r adds r µs)
# and, given --checksum, prints the checksum SUM (default 0x00000000000000aa; "round": one per round)
fake() {
  mkdir -p "$work/$1"
  cat >"$work/$1/bench" <<FAKE
#!/usr/bin/env bash
launch=oneshot
burst=0
kv=""
checksum=0
while [[ \$# -gt 0 ]]; do
  case \$1 in --launch) launch=\$2; shift 2 ;; --json) json=\$2; shift 2 ;; --burst) burst=100; shift ;; --s-kv) kv=/kv\$2; shift 2 ;;
    --checksum) checksum=1; shift ;; *) shift ;; esac
done
variant=spgraph
[[ \$launch != oneshot ]] && variant="spgraph+\$launch"
round=\${json##*_r}; round=\${round%.json}
us=\$(python3 -c "print($2 + \$round + \$burst)")
cat >"\$json" <<JSON
[{"suite": "attention", "name": "small-h64-k640/8192/sq64\$kv", "variant": "\$variant", "metric": "gpu_us", "value": \$us},
 {"suite": "attention", "name": "small-h64-k640/8192/sq64", "variant": "spgraph+decoy", "metric": "gpu_us", "value": 999}]
JSON
echo "small-h64-k640       512   64   640   8192    64             wgmma      1      \$us     250.0        21.8   0.800  \$variant"
sum=${3:-0x00000000000000aa}
[[ \$sum == round ]] && sum=0x000000000000000\$round
[[ \$checksum == 1 ]] && echo "checksum small-h64-k640/8192/sq64\$kv \$variant \$sum"
exit 0
FAKE
  chmod +x "$work/$1/bench"
}
fake base 27
fake cand 22
fake same 24 0x00000000000000aa
fake other 25 0x00000000000000bb
fake unstable 26 round

for mode in oneshot prepared chain gated; do
  args=(--rows sq64 --rounds 3)
  [[ $mode != oneshot ]] && args+=(--launch "$mode")
  OUT="$work/out-$mode" bash "$script" "${args[@]}" base="$work/base" cand="$work/cand" >"$work/$mode.log" 2>&1 ||
    fail "$mode: exit $? ($(tail -3 "$work/$mode.log"))"
  # base: rounds 27, 28, 29 -> median 28; cand: 22, 23, 24 -> 23; vs_ref 28 / 23; ratio 21.8 / median
  line_base=$(grep -E "^small-h64-k640/8192/sq64 +base " "$work/out-$mode/ab_bins.txt") || fail "$mode: no base row"
  line_cand=$(grep -E "^small-h64-k640/8192/sq64 +cand " "$work/out-$mode/ab_bins.txt") || fail "$mode: no cand row"
  read -r _ _ med_b r0 _ r1 _ r2 vs_b ratio_b <<<"$line_base"
  read -r _ _ med_c _ _ _ _ _ vs_c ratio_c <<<"$line_cand"
  [[ $med_b == 28.0 && $r0 == 27.0 && $r1 == 28.0 && $r2 == 29.0 ]] || fail "$mode: base row '$line_base'"
  [[ $med_c == 23.0 && $vs_b == 1.000 && $vs_c == 1.217 ]] || fail "$mode: cand row '$line_cand'"
  [[ $ratio_b == 0.779 && $ratio_c == 0.948 ]] || fail "$mode: ratios '$ratio_b' '$ratio_c'"
done

# --burst reaches bench (the fake adds 100 µs to a burst figure)
OUT="$work/out-burst" bash "$script" --rows sq64 --rounds 3 --burst base="$work/base" cand="$work/cand" >"$work/burst.log" 2>&1 ||
  fail "--burst: exit $?"
grep -qE "^small-h64-k640/8192/sq64 +base +128.0 " "$work/out-burst/ab_bins.txt" || fail "--burst: $(cat "$work/out-burst/ab_bins.txt")"

# --s-kv reaches bench (the fake names its rows .../kvN, as bench does)
OUT="$work/out-skv" bash "$script" --rows sq64 --rounds 2 --s-kv 24576 base="$work/base" cand="$work/cand" >"$work/skv.log" 2>&1 ||
  fail "--s-kv: exit $?"
grep -qE "^small-h64-k640/8192/sq64/kv24576 +cand +22.5 " "$work/out-skv/ab_bins.txt" || fail "--s-kv: $(cat "$work/out-skv/ab_bins.txt")"

# --checksum: equal bits pass (exit 0), another build's bits fail (exit 3), as does a first build
# whose own rounds disagree; each marked in the bits column
OUT="$work/out-sum" bash "$script" --rows sq64 --rounds 2 --checksum --launch gated base="$work/base" same="$work/same" \
  >"$work/sum.log" 2>&1 || fail "--checksum, equal bits: exit $? ($(tail -3 "$work/sum.log"))"
grep -qE "^small-h64-k640/8192/sq64 +base .* ref$" "$work/out-sum/ab_bins.txt" || fail "--checksum: no ref mark: $(cat "$work/out-sum/ab_bins.txt")"
grep -qE "^small-h64-k640/8192/sq64 +same .* =$" "$work/out-sum/ab_bins.txt" || fail "--checksum: no = mark"
grep -q "every build computed the first build's bits" "$work/out-sum/ab_bins.txt" || fail "--checksum: no all-equal line"
OUT="$work/out-diff" bash "$script" --rows sq64 --rounds 2 --checksum base="$work/base" same="$work/same" other="$work/other" \
  >"$work/diff.log" 2>&1
rc=$?
[[ $rc -eq 3 ]] || fail "--checksum, other bits: exit $rc, expected 3"
grep -qE "^small-h64-k640/8192/sq64 +other .* DIFF$" "$work/out-diff/ab_bins.txt" || fail "--checksum: no DIFF mark"
grep -qE "^small-h64-k640/8192/sq64 +same .* =$" "$work/out-diff/ab_bins.txt" || fail "--checksum: same build not = beside a DIFF"
grep -q "checksums differ or are missing: small-h64-k640/8192/sq64 other DIFF" "$work/out-diff/ab_bins.txt" ||
  fail "--checksum: the differing build not named"
OUT="$work/out-unstable" bash "$script" --rows sq64 --rounds 2 --checksum unstable="$work/unstable" same="$work/same" \
  >"$work/unstable.log" 2>&1
rc=$?
[[ $rc -eq 3 ]] || fail "--checksum, unstable reference: exit $rc, expected 3"
grep -qE "^small-h64-k640/8192/sq64 +unstable .* UNSTABLE$" "$work/out-unstable/ab_bins.txt" || fail "--checksum: no UNSTABLE mark"
grep -qE "^small-h64-k640/8192/sq64 +same .* DIFF$" "$work/out-unstable/ab_bins.txt" || fail "--checksum: a build equal to an unstable reference not DIFF"
# without --checksum nothing is compared: no bits column, no checksum line
grep -q "bits\|checksums" "$work/out-oneshot/ab_bins.txt" && fail "without --checksum: a bits column or checksum line"

OUT="$work/out-bad" bash "$script" --rows sq64 --launch bogus base="$work/base" cand="$work/cand" >"$work/bad.log" 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "--launch bogus: exit $rc, expected 2"
grep -q "oneshot, prepared, chain or gated" "$work/bad.log" || fail "--launch bogus: no message naming the modes"
[[ ! -e $work/out-bad ]] || fail "--launch bogus: wrote $work/out-bad before refusing"
echo "attention_ab_bins_test: passed (4 launch modes, --burst, --s-kv, --checksum equal / other / unstable bits, a bad mode refused)"

#!/usr/bin/env bash
# scripts/ab_builds.sh without building (--dry-run): each variant's flags reach both compilers of
# its own build tree, its bench goes to DEST/NAME, the commit to DEST/COMMIT, and a malformed
# variant or a missing DEST is refused (exit 2) before any command.
set -uo pipefail
script="$(cd "$(dirname "$0")/.." && pwd)/scripts/ab_builds.sh"
fail() { echo "ab_builds_test: $*" >&2; exit 1; }

out=$(bash "$script" --dry-run /tmp/ab-dest base= "two=-DA -DB" 2>&1) || fail "dry run: exit $? ($out)"
grep -qxF 'cmake --preset release -B build/ab-base -DSPGRAPH_BUILD_TESTS=OFF -DCMAKE_CXX_FLAGS= -DCMAKE_CUDA_FLAGS= ' <<<"$out" ||
  fail "base not configured with empty flags: $out"
grep -qxF 'cmake --preset release -B build/ab-two -DSPGRAPH_BUILD_TESTS=OFF -DCMAKE_CXX_FLAGS=-DA\ -DB -DCMAKE_CUDA_FLAGS=-DA\ -DB ' <<<"$out" ||
  fail "two's flags not given to both compilers as one value: $out"
grep -qxF 'cp build/ab-two/samples/bench /tmp/ab-dest/two/bench ' <<<"$out" || fail "two's bench not copied to DEST/two: $out"
[[ $(grep -c -- '--target bench' <<<"$out") -eq 2 ]] || fail "not one bench build per variant: $out"
grep -qxF 'git rev-parse --short HEAD > /tmp/ab-dest/COMMIT' <<<"$out" || fail "no COMMIT: $out"

for args in "/tmp/ab-dest bad/name=1" "/tmp/ab-dest noequals" "base=" "/tmp/ab-dest"; do
  # shellcheck disable=SC2086
  out=$(bash "$script" --dry-run $args 2>&1)
  rc=$?
  [[ $rc -eq 2 ]] || fail "'$args': exit $rc, expected 2 ($out)"
  grep -q "cmake" <<<"$out" && fail "'$args': a command ran before the refusal ($out)"
done
echo "ab_builds_test: passed (flags to both compilers per variant, outputs, four malformed calls refused)"

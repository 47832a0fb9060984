#!/usr/bin/env bash
# The host code under AddressSanitizer + UndefinedBehaviorSanitizer (the asan preset: Clang, host
# C++ instrumented, device code PTX-only and never run): the CPU tests and every fuzz target's
# committed corpus through CTest, then each fuzz target fuzzed for a bounded time.
# Usage: scripts/sanitize_tests.sh [SECONDS_PER_FUZZ_TARGET]   (default 30; 0 skips fuzzing)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
scripts/setup.sh --sanitize
export PATH="/usr/local/cuda/bin:$PATH"
# detect_leaks: every leak fails; the CUDA runtime is never initialised (no device), so it leaks nothing here.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cmake --preset asan
cmake --build --preset asan
ctest --preset asan
if [ "$seconds" != 0 ]; then
  scripts/fuzz.sh build/asan "$seconds"
fi

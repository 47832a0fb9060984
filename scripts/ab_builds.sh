#!/usr/bin/env bash
# Builds the `bench` binaries of an A/B of compile-time variants (issue 15), here, for sm_90a, to
# carry to the GPU machine for scripts/attention_ab_bins.sh.
#
# usage: scripts/ab_builds.sh [--dry-run] DEST NAME=FLAGS [NAME=FLAGS ...]
#   each NAME (letters, digits, '-', '_') gets build/ab-NAME, configured from the release preset
#   without tests, FLAGS (e.g. "-DSPGRAPH_WGMMA_TIMELINE"; empty for the tree as it is) given to
#   both the C++ and the CUDA compilers, so a switch reaches bench and the library alike; its
#   bench goes to DEST/NAME/bench, and the tree's commit to DEST/COMMIT.
#   --dry-run prints the commands instead of running them.
# Example: scripts/ab_builds.sh .device/r23 base= tl=-DSPGRAPH_WGMMA_TIMELINE qtma=-DSPGRAPH_WGMMA_Q_TMA
set -euo pipefail
cd "$(dirname "$0")/.."
run() { if [[ $dry == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi; }
dry=0
if [[ ${1:-} == --dry-run ]]; then dry=1; shift; fi
if [[ $# -lt 2 || $1 == *=* ]]; then
  echo "usage: $0 [--dry-run] DEST NAME=FLAGS [NAME=FLAGS ...]" >&2
  exit 2
fi
dest=$1
shift
for spec in "$@"; do
  name=${spec%%=*}
  if [[ $spec != *=* || ! $name =~ ^[A-Za-z0-9_-]+$ ]]; then
    echo "$0: '$spec' is not NAME=FLAGS with a NAME of letters, digits, '-' and '_'" >&2
    exit 2
  fi
done
export PATH="/usr/local/cuda/bin:$PATH"
for spec in "$@"; do
  name=${spec%%=*}
  flags=${spec#*=}
  run cmake --preset release -B "build/ab-$name" -DSPGRAPH_BUILD_TESTS=OFF "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_CUDA_FLAGS=$flags"
  run cmake --build "build/ab-$name" --target bench -j "$(nproc)"
  run mkdir -p "$dest/$name"
  run cp "build/ab-$name/samples/bench" "$dest/$name/bench"
done
if [[ $dry == 1 ]]; then
  echo "git rev-parse --short HEAD > $dest/COMMIT"
else
  git rev-parse --short HEAD >"$dest/COMMIT"
fi

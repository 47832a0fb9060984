#!/usr/bin/env bash
# Sets up, builds and runs spgraph's main job, the graph-replay serving loop. Without a CUDA device
# it says so and prints the planned buffer pool instead. Extra arguments go to serve_loop
# (scripts/run_main.sh --help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="/usr/local/cuda/bin:$PATH"
cmake --workflow --preset build
exec build/release/samples/serve_loop "$@"

#!/usr/bin/env bash
# Sets up, builds and runs every spgraph test. Without a CUDA device the GPU tests report "skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="/usr/local/cuda/bin:$PATH"
cmake --workflow --preset test

#!/usr/bin/env bash
# Sets up, builds and runs every spgraph test: CTest (C++), then the Python package's pytest suite
# against the library CTest just built, then the package as `pip wheel ./python` builds it
# (installed into a fresh folder and imported from there). Without a CUDA device (or torch) the tests that need one
# report "skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
export PATH="/usr/local/cuda/bin:$PATH"
cmake --workflow --preset test
scripts/python_tests.sh build/release build/python
scripts/python_wheel.sh build/release

#!/usr/bin/env bash
# On the GPU machine: builds the Python extension against a carried spgraph install and runs the
# whole Python suite (GPU tests included), then prints a short summary last. Needs no network:
# Python, torch (CUDA build), nanobind, pytest, CMake and the CUDA 13 toolkit must be there.
#
# Here (no GPU needed):   cmake --workflow --preset build
#                         cmake --install build/release --prefix build/spgraph-prefix
# On the device, from the repository root, with build/spgraph-prefix carried:
#                         scripts/python_device.sh build/spgraph-prefix [PYTEST_ARGS...]
# Logs and the JUnit report go to $OUT (default /tmp/spgraph-python).
set -uo pipefail
cd "$(dirname "$0")/.."
prefix=${1:?usage: scripts/python_device.sh PREFIX [PYTEST_ARGS...] (PREFIX: an install of spgraph)}
shift
out=${OUT:-/tmp/spgraph-python}
mkdir -p "$out"
config=$(find "$prefix" -name spgraphConfig.cmake 2>/dev/null | head -1)
if [ -z "$config" ]; then
  echo "python_device: no spgraphConfig.cmake under $prefix (install the library there first)" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
python3 -c "import sys, torch, nanobind; print('python', sys.version.split()[0], '| torch', torch.__version__,
'cuda', torch.version.cuda, '| nanobind', nanobind.__version__, '| devices', torch.cuda.device_count())" \
  2>&1 | tee "$out/versions.txt"

timeout 560 scripts/python_tests.sh "$(dirname "$config")" /tmp/spgraph-python-build -- \
  --junitxml="$out/pytest.xml" --durations=15 "$@" >"$out/pytest.log" 2>&1
rc=$?
tail -40 "$out/pytest.log"
echo "== summary (python_tests exit $rc; full log: $out/pytest.log)"
python3 scripts/junit_summary.py "$out/pytest.xml"
exit $rc

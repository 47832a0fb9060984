#!/usr/bin/env bash
# The Python package the way a user installs it: `pip wheel ./python` (scikit-build-core driving
# the same CMake project python_tests.sh builds directly) against a built or installed spgraph,
# the wheel installed into a fresh target folder, and the package imported from there (not from
# the source tree or a build folder) and asked for a CPU-side plan. No GPU needed.
#
# usage: scripts/python_wheel.sh [SPGRAPH_DIR]   (default build/release: a build tree or an install's
#                                                 lib/cmake/spgraph folder holding spgraphConfig.cmake)
set -euo pipefail
cd "$(dirname "$0")/.."
spgraph_dir=$(cd "${1:-build/release}" && pwd)
py=$(command -v "${PYTHON:-python3}")
export PATH="/usr/local/cuda/bin:$PATH"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
# No build isolation: the build requirements (scikit-build-core, nanobind) are the ones setup.sh
# installed, so this runs offline.
"$py" -m pip wheel ./python --no-deps --no-build-isolation --wheel-dir "$work/dist" \
  -Ccmake.define.spgraph_DIR="$spgraph_dir" -Cbuild-dir="$work/build" >"$work/pip.log" 2>&1 ||
  { tail -40 "$work/pip.log"; echo "python_wheel: pip wheel failed" >&2; exit 1; }
wheel=$(ls "$work"/dist/spgraph-*.whl)
"$py" -m pip install --quiet --root-user-action=ignore --no-deps --no-index --target "$work/site" "$wheel"
cd "$work"
PYTHONPATH="$work/site" "$py" - "$work/site" <<'PY'
import os, sys
import spgraph
site = os.path.realpath(sys.argv[1])
where = os.path.realpath(spgraph.__file__)
assert where.startswith(site + os.sep), f"spgraph imported from {where}, not from the installed wheel in {site}"
plan = str(spgraph.plan(spgraph.PipelineConfig.v4_default(), True))
assert "chunk_meta" in plan, plan[:200]  # the pool plan names its slots
print(f"python_wheel: {os.path.basename(sys.argv[1])}: spgraph {getattr(spgraph, '__version__', '?')} imported "
      f"from the wheel, plan of the V4 program {len(plan.splitlines())} lines")
PY
echo "python_wheel: $(basename "$wheel") built and installed in $(( $(date +%s) - start )) s"

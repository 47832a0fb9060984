#!/usr/bin/env bash
# Installs what building and testing spgraph needs and is not there yet (Debian/Ubuntu).
# Needs: the CUDA 13 toolkit (nvcc, CUDA runtime, CUPTI), CMake >= 3.25, a C++20 compiler, Catch2;
# with --sanitize, also Clang with its sanitizer and libFuzzer runtimes (the asan preset);
# with --python, also what the Python package (python/) and its tests need: Python >= 3.10 with
# headers, and from PyPI nanobind, scikit-build-core, pytest, numpy and torch (optional: without it
# the torch tests report "skipped"; SPGRAPH_NO_TORCH=1 skips installing it, about 3 GB with its CUDA
# libraries, about 2 minutes here).
set -euo pipefail
with_python=0
with_sanitize=0
for arg in "$@"; do
  case "$arg" in
    --python) with_python=1 ;;
    --sanitize) with_sanitize=1 ;;
    *) echo "spgraph setup: unknown option '$arg' (--python, --sanitize)" >&2; exit 2 ;;
  esac
done

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
PY=${PYTHON:-python3}
if [ $with_python = 0 ]; then
  :
elif ! command -v "$PY" >/dev/null 2>&1; then
  need_apt+=(python3 python3-dev python3-pip)
elif ! "$PY" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  need_apt+=(python3-dev)
fi
if [ ! -f /usr/include/catch2/catch.hpp ] && [ ! -f /usr/include/catch2/catch_all.hpp ] &&
   [ ! -f /usr/local/include/catch2/catch_all.hpp ]; then
  need_apt+=(catch2)
fi
if [ $with_sanitize = 1 ] && ! command -v clang++ >/dev/null 2>&1; then
  need_apt+=(clang)
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
apt_install() {
  echo "spgraph setup: installing $*"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}
[ ${#need_apt[@]} -gt 0 ] && apt_install "${need_apt[@]}"

# Clang's sanitizer and libFuzzer runtimes ship apart from the compiler on some releases
# (libclang-rt-N-dev on Debian 12, in libclang-common-N-dev on older Ubuntu): link a trivial
# fuzz target to find out.
fuzzer_links() {
  local out
  out=$(mktemp)
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
    clang++ -fsanitize=fuzzer,address,undefined -x c++ - -o "$out" >/dev/null 2>&1
  local rc=$?
  rm -f "$out"
  return $rc
}
if [ $with_sanitize = 1 ] && ! fuzzer_links; then
  major=$(clang++ -dumpversion | cut -d. -f1)
  $SUDO apt-get update -qq
  for pkg in "libclang-rt-$major-dev" "libclang-common-$major-dev"; do
    if apt-cache show "$pkg" >/dev/null 2>&1; then
      apt_install "$pkg"
      break
    fi
  done
  fuzzer_links || { echo "spgraph setup: clang++ cannot link -fsanitize=fuzzer,address,undefined" >&2; exit 1; }
fi

if ! command -v nvcc >/dev/null 2>&1; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "spgraph setup: using /usr/local/cuda/bin/nvcc (add /usr/local/cuda/bin to PATH to silence this)"
  else
    echo "spgraph setup: nvcc not found; install the CUDA 13 toolkit (it is needed to build, not a GPU)" >&2
    exit 1
  fi
fi

[ $with_python = 1 ] || exit 0

# Python packages, from PyPI. PEP 668 (a distribution's own Python) is overridden: these are the
# project's build and test tools.
export PIP_ROOT_USER_ACTION=ignore PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1
missing=()
for mod in nanobind:nanobind scikit_build_core:scikit-build-core pytest:pytest numpy:numpy; do
  "$PY" -c "import ${mod%%:*}" 2>/dev/null || missing+=("${mod##*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "spgraph setup: pip installing ${missing[*]}"
  "$PY" -m pip install --quiet "${missing[@]}"
fi
if [ "${SPGRAPH_NO_TORCH:-0}" != 1 ] && ! "$PY" -c "import torch" 2>/dev/null; then
  echo "spgraph setup: pip installing torch (for the torch layer's tests; SPGRAPH_NO_TORCH=1 skips it)"
  if ! "$PY" -m pip install --quiet "torch>=2.4"; then
    echo "spgraph setup: torch could not be installed; the tests that need it will report skipped" >&2
  fi
fi

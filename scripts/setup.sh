#!/usr/bin/env bash
# Installs what building and testing spgraph needs and is not there yet (Debian/Ubuntu).
# Needs: the CUDA 13 toolkit (nvcc, CUDA runtime, CUPTI), CMake >= 3.25, a C++20 compiler, Catch2.
set -euo pipefail

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
if [ ! -f /usr/include/catch2/catch.hpp ] && [ ! -f /usr/include/catch2/catch_all.hpp ] &&
   [ ! -f /usr/local/include/catch2/catch_all.hpp ]; then
  need_apt+=(catch2)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "spgraph setup: installing ${need_apt[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v nvcc >/dev/null 2>&1; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "spgraph setup: using /usr/local/cuda/bin/nvcc (add /usr/local/cuda/bin to PATH to silence this)"
  else
    echo "spgraph setup: nvcc not found; install the CUDA 13 toolkit (it is needed to build, not a GPU)" >&2
    exit 1
  fi
fi

// Test runner for both test binaries. The GPU binary (SPG_GPU_TESTS) exits with 77 when there is
// no CUDA device, so CTest reports its tests as skipped, never as passed; listing its tests (an
// option starting with --list) needs no device (scripts/gpu_tests_parallel.sh shards the list).
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include <cstdio>
#include <cstring>

#ifdef SPG_GPU_TESTS
#include "spgraph/core/resources.hpp"
#endif

int main(int argc, char* argv[]) {
#ifdef SPG_GPU_TESTS
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::strncmp(argv[i], "--list", 6) == 0;
  if (!listing && !spg::core::cuda_device_available()) {
    std::printf("spgraph GPU tests: no CUDA device found; skipping (exit code 77)\n");
    return 77;
  }
#endif
  return Catch::Session().run(argc, argv);
}

// A device fault ends as an error the host sees, never as a hang: a kernel that traps, and one
// stuck in the attention kernels' own bounded mbarrier wait (src/spgraph/kernels/sparse_mla/wgmma_sm90.cuh:
// it traps after 2^34 cycles, ~9 s at the H200's clock) on a barrier nothing ever arrives on.
// A trap leaves the CUDA context unusable for the rest of its process, so each case runs in a
// child process (this binary again, on the hidden test case below) under a time limit; the parent
// requires the child to exit by itself, non-zero, having reported a CudaError.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/catch.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/kernels/sparse_mla/wgmma_sm90.cuh"

extern char** environ;

namespace {

__global__ void trapping_kernel(int* reached) {
  if (threadIdx.x == 0) *reached = 1;
  __trap();
}

/// One thread waits for phase 0 of a barrier that expects one arrival and never gets it.
__global__ void stuck_barrier_kernel(int* reached) {
  __shared__ std::uint64_t bar;
  const auto addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(&bar));
  spg::kernels::detail::mbar_init(addr, 1);
  spg::kernels::detail::mbar_init_fence();
  *reached = 1;
  spg::kernels::detail::mbar_wait(addr, 0);
  *reached = 2;  // never: the wait traps
}

constexpr const char* kChildVariable = "SPG_TRAP_CHILD";

struct ChildResult {
  bool exited{false};    ///< ended by itself (not killed at the time limit)
  int exit_code{-1};
  int signal{0};
  double seconds{0};
  std::string output;
};

/// Runs this test binary on the hidden child case with SPG_TRAP_CHILD=`which`, killed after `limit_s`.
ChildResult run_child(const char* which, double limit_s) {
  char exe[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  REQUIRE(n > 0);
  char out_path[] = "/tmp/spgraph-trap-XXXXXX";
  const int out_fd = mkstemp(out_path);
  REQUIRE(out_fd >= 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_fd, STDERR_FILENO);
  std::string spec = "[.trap-child]";
  std::string reporter = "--reporter";
  std::string compact = "compact";
  char* argv[] = {exe, spec.data(), reporter.data(), compact.data(), nullptr};
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, kChildVariable, std::strlen(kChildVariable)) != 0) env_strings.emplace_back(*e);
  }
  env_strings.push_back(std::string(kChildVariable) + "=" + which);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  ChildResult r;
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, exe, &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out_fd);
  REQUIRE(spawned == 0);
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (done == pid) {
      r.exited = WIFEXITED(status);
      r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      break;
    }
    if (r.seconds > limit_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.signal = SIGKILL;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ifstream in(out_path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  std::remove(out_path);
  return r;
}

void expect_reported(const ChildResult& r, double limit_s) {
  INFO("child output:\n" << r.output);
  INFO("after " << r.seconds << " s");
  REQUIRE(r.signal != SIGKILL);  // a hang: the time limit had to end it
  CHECK(r.exited);
  CHECK(r.exit_code != 0);
  CHECK(r.exit_code != 77);
  CHECK(r.output.find("trap child: CudaError cudaError") != std::string::npos);
  CHECK(r.output.find("trap child: CudaError cudaSuccess") == std::string::npos);
  CHECK(r.seconds < limit_s);
}

}  // namespace

TEST_CASE("a trapping kernel ends its launch with an error the host sees", "[gpu][trap]") {
  expect_reported(run_child("trap", 60.0), 60.0);
}

TEST_CASE("an mbarrier wait that can never complete traps instead of hanging the stream", "[gpu][trap]") {
  // 2^34 cycles: ~9 s at the H200's 1.98 GHz, ~17 s at 1 GHz; the limit leaves room for both.
  expect_reported(run_child("mbarrier", 120.0), 120.0);
}

// The child side: launched only by the cases above (hidden tag, and SPG_TRAP_CHILD set).
TEST_CASE("trap child", "[.trap-child]") {
  const char* which = std::getenv(kChildVariable);
  // A filter of negated tags alone selects hidden cases too: name this one among its exclusions.
  INFO("the [trap] cases' child side, run by them with " << kChildVariable << " set; "
       << "exclude it from negated filters with ~[.trap-child]");
  REQUIRE(which != nullptr);
  spg::core::DeviceBuffer reached(sizeof(int));
  SPG_CUDA_TRY(cudaMemset(reached.data(), 0, sizeof(int)));
  if (std::string(which) == "trap") {
    trapping_kernel<<<1, 32>>>(static_cast<int*>(reached.data()));
  } else {
    stuck_barrier_kernel<<<1, 1>>>(static_cast<int*>(reached.data()));
  }
  const cudaError_t launched = cudaGetLastError();
  REQUIRE(launched == cudaSuccess);
  const cudaError_t finished = cudaDeviceSynchronize();
  std::printf("trap child: CudaError %s\n", cudaGetErrorName(finished));
  std::fflush(stdout);
  try {
    SPG_CUDA_TRY(finished);
  } catch (const spg::CudaError& e) {
    std::printf("trap child: %s\n", e.what());
    std::fflush(stdout);
    throw;  // the child's test fails: a non-zero exit code
  }
}

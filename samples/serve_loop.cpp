// serve_loop: spgraph's main job. Plans the buffer pool for a layer program; with a CUDA device it
// runs the graph-replay serving loop, without one it says so and prints the plan.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "memory/error.hpp"
#include "memory/pipeline_config.hpp"
#include "memory/pipeline_pool.hpp"
#include "memory/resources.hpp"

namespace {

struct Options {
  bool plan_only{false};
  int max_requests{4};
  int max_tokens{2048};
  int max_model_len{65536};
};

void print_help() {
  std::printf(
      "usage: serve_loop [--plan] [--max-requests R] [--max-tokens T] [--max-model-len L]\n"
      "  --plan              print the pool plan for the config and exit (no GPU needed)\n"
      "  --max-requests R    requests per chunk, 1..64 (default 4)\n"
      "  --max-tokens T      tokens per chunk, 1..65536 (default 2048)\n"
      "  --max-model-len L   longest sequence, 1..1048576 (default 65536)\n");
}

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "serve_loop: %s (see --help)\n", msg.c_str());
  std::exit(2);
}

int parse_int(const char* flag, const char* value, int lo, int hi) {
  if (value == nullptr) usage_error(std::string(flag) + " needs a value in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (*end != '\0' || v < lo || v > hi) {
    usage_error(std::string(flag) + " = '" + value + "' must be an integer in [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  }
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (std::strcmp(a, "--help") == 0 || std::strcmp(a, "-h") == 0) {
      print_help();
      std::exit(0);
    } else if (std::strcmp(a, "--plan") == 0) {
      o.plan_only = true;
    } else if (std::strcmp(a, "--max-requests") == 0) {
      o.max_requests = parse_int(a, next, 1, 64);
      ++i;
    } else if (std::strcmp(a, "--max-tokens") == 0) {
      o.max_tokens = parse_int(a, next, 1, 65536);
      ++i;
    } else if (std::strcmp(a, "--max-model-len") == 0) {
      o.max_model_len = parse_int(a, next, 1, 1 << 20);
      ++i;
    } else {
      usage_error(std::string("unknown flag '") + a + "'");
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  spg::memory::PipelineConfig config = spg::memory::PipelineConfig::v4_default();
  config.max_requests = opt.max_requests;
  config.max_tokens = opt.max_tokens;
  config.max_model_len = opt.max_model_len;
  try {
    const auto plan = spg::memory::plan_pipeline_pool(config);
    const bool have_gpu = spg::memory::cuda_device_available();
    if (!have_gpu && !opt.plan_only) {
      std::printf("serve_loop: no CUDA device found; printing the planned buffer pool instead (CPU-side planner).\n\n");
    }
    std::printf("layer program: %zu layers (R = %d, T = %d, max_model_len = %d)\n", config.layers.size(),
                config.max_requests, config.max_tokens, config.max_model_len);
    for (std::size_t i = 0; i < config.layers.size(); ++i) {
      std::printf("  layer %zu: %s\n", i, config.layers[i].label().c_str());
    }
    std::printf("\n%s", plan.table().c_str());
    return 0;
  } catch (const spg::InvalidArgument& e) {
    std::fprintf(stderr, "serve_loop: invalid configuration: %s\n", e.what());
    return 2;
  } catch (const spg::Error& e) {
    std::fprintf(stderr, "serve_loop: %s\n", e.what());
    return 1;
  }
}

// serve_loop's command line: see serve_loop_options.hpp.
#include "samples/serve_loop_options.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "spgraph/core/error.hpp"

namespace spg::samples {

namespace {

// The one statement of every integer flag's bounds.
const std::vector<IntegerFlag> kIntegerFlags = {
    {"--steps", 1, 10000000},
    {"--verify", 0, 100000},
    {"--seed", 0, std::int64_t{1} << 62},
    {"--requests", 1, 1000000},
    {"--min-len", 1, 1 << 20},
    {"--max-len", 1, 1 << 20},
    {"--budget", 16, 1 << 24},  // at least the smallest bucket
    {"--max-requests", 1, 64},
    {"--max-tokens", 16, 65536},
    {"--max-model-len", 1, 1 << 20},
    {"--step-requests", 1, 4096},  // graphs::kMaxStepRequests
    {"--flat-steps", 2, 4096},     // the executor refuses more than a step's most chunks
};

const IntegerFlag& integer_flag(const char* name) {
  for (const IntegerFlag& f : kIntegerFlags) {
    if (std::strcmp(f.name, name) == 0) return f;
  }
  throw std::logic_error(std::string("serve_loop: no integer flag ") + name);
}

std::string bounds(const IntegerFlag& f) { return std::to_string(f.lo) + ".." + std::to_string(f.hi); }

struct UsageError {
  std::string message;
};

}  // namespace

const std::vector<IntegerFlag>& serve_loop_integer_flags() { return kIntegerFlags; }

bool parse_decimal(const std::string& text, long long lo, long long hi, long long& value) noexcept {
  if (text.empty()) return false;
  long long v = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
    const int d = c - '0';
    if (v > (std::numeric_limits<long long>::max() - d) / 10) return false;  // past any bound
    v = v * 10 + d;
  }
  if (v < lo || v > hi) return false;
  value = v;
  return true;
}

bool parse_plain_decimal(const std::string& text, double& value) noexcept {
  // digits [. digits] [(e|E) [+|-] digits], with at least one digit before the exponent.
  std::size_t i = 0;
  const std::size_t n = text.size();
  auto digits = [&] {
    const std::size_t start = i;
    while (i < n && text[i] >= '0' && text[i] <= '9') ++i;
    return i - start;
  };
  std::size_t mantissa = digits();
  if (i < n && text[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (i < n && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < n && (text[i] == '+' || text[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  if (i != n) return false;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + n || !std::isfinite(v)) return false;
  value = v;
  return true;
}

std::string serve_loop_help() {
  auto b = [](const char* name) { return bounds(integer_flag(name)); };
  char rate[96];
  std::snprintf(rate, sizeof rate, "%g..%g", scheduler::kMinArrivalRate, scheduler::kMaxArrivalRate);
  return std::string(
             "usage: serve_loop [flags]\n"
             "Prefills a synthetic stream of prompts through the V4 layer program (4 C4A, 2 C128A, 2 SWA\n"
             "layers), one CUDA graph launch per chunk, and reports throughput and step times.\n\n") +
         "  --steps N            scheduler steps to run, " + b("--steps") + " (default 1000)\n"
         "  --mode graph|eager   replay captured graphs (default) or launch the same kernels eagerly\n"
         "  --verify N           check N sampled chunks end to end against the CPU references, " + b("--verify") +
         "\n"
         "                       (default 0); with --one-launch N sampled steps, each of their chunks on its\n"
         "                       rows of the step\n"
         "  --json FILE          also write the report as JSON records\n"
         "  --plan               print the layer program, buckets and pool plan, then exit (no GPU needed)\n"
         "  --seed S             workload and model-front seed, " + b("--seed") + " (default 1)\n"
         "  --requests N         requests per workload batch, " + b("--requests") + " (default 256; a new batch\n"
         "                       arrives whenever the previous one has finished)\n"
         "  --min-len L          shortest prompt, " + b("--min-len") + " and at most --max-len (default 1024)\n"
         "  --max-len L          longest prompt, " + b("--max-len") + " and at most --max-model-len (default 65536)\n"
         "  --lengths uniform|log-normal   prompt length distribution (default log-normal)\n"
         "  --arrivals all|poisson         arrival pattern (default all)\n"
         "  --rate R             Poisson arrivals per step, a decimal in " + rate + " (default 1)\n"
         "  --budget B           max_num_batched_tokens per step, " + b("--budget") +
         " (at least the smallest bucket; default 8192)\n"
         "  --max-requests R     requests per chunk, " + b("--max-requests") + " (default 4)\n"
         "  --max-tokens T       tokens per chunk, " + b("--max-tokens") + " (default 2048)\n"
         "  --max-model-len L    longest sequence, " + b("--max-model-len") + " (default 65536)\n"
         "  --checksum           print a checksum of every chunk's outputs (graph and eager runs of one\n"
         "                       trace must print the same); with --one-launch of every step's rows, equal\n"
         "                       between its graph and eager runs but not to the per-chunk run's (the model\n"
         "                       front fills a step's inputs otherwise, and chunk graphs write padded rows)\n"
         "  --require-gpu        exit with code 77 (skipped) instead of planning when there is no GPU\n"
         "  --derive-slots       hand the executor no insert slot mappings: the device derives the same\n"
         "                       slots from the block tables (default: the scheduler's slot mappings)\n"
         "  --engine-buffers     the model front allocates the caches and tensors itself (one cudaMalloc\n"
         "                       each, as an engine would) and binds them: the pool holds only spgraph's\n"
         "                       own workspaces; outputs and --checksum are the same as without it\n"
         "  --allow-faults       exit 0 even when the device counted faults over the run (by default any\n"
         "                       fault, in any step, makes the exit code 1)\n"
         "  --no-alloc-count     do not count CUDA allocation calls: CUPTI stays unloaded, so host times\n"
         "                       are not inflated by its subscriber (graph launches cost ~2 us instead of\n"
         "                       ~0.2 us a node)\n"
         "  --one-launch         launch each scheduler step whole, run(StepInput): one graph launch per\n"
         "                       step (eager mode: the same kernels from a host loop); the model front\n"
         "                       runs once per step, for the step's rows (docs/graphs.md, Steps)\n"
         "  --step-requests N    most requests in a step with --one-launch, " + b("--step-requests") +
         " (default 64;\n"
         "                       the scheduler then opens at most N / R chunks a step)\n"
         "  --flat-steps N       with --one-launch, steps of up to N chunks whose chunks are all full\n"
         "                       launch one plain graph (flat_step_chunks, " + b("--flat-steps") + "; at most\n"
         "                       a step's most chunks; warm-up captures N - 1 such graphs per staging\n"
         "                       block, and the staged steps' graphs of one chunk per bucket)\n"
         "  --flat-pad           with --flat-steps, every step of 2 .. N chunks launches its plain graph,\n"
         "                       each chunk on the largest bucket (flat_step_pad)\n"
         "  --no-progress        no progress bar\n"
         "Integers are decimal digits only (no sign, spaces or hex).\n";
}

ParsedCommandLine parse_serve_loop_options(const std::vector<std::string>& args) {
  ParsedCommandLine out;
  ServeLoopOptions& o = out.options;
  try {
    for (std::size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      const std::string* next = i + 1 < args.size() ? &args[i + 1] : nullptr;
      auto take_int = [&](const char* name) -> long long {
        const IntegerFlag& f = integer_flag(name);
        if (next == nullptr) throw UsageError{a + " needs an integer in [" + std::to_string(f.lo) + ", " + std::to_string(f.hi) + "]"};
        ++i;
        long long v = 0;
        if (!parse_decimal(*next, f.lo, f.hi, v)) {
          throw UsageError{a + " = '" + *next + "' must be a decimal integer in [" + std::to_string(f.lo) + ", " +
                           std::to_string(f.hi) + "]"};
        }
        return v;
      };
      if (a == "--help" || a == "-h") {
        out.help = true;
        return out;
      } else if (a == "--plan") {
        o.plan_only = true;
      } else if (a == "--no-progress") {
        o.progress = false;
      } else if (a == "--checksum") {
        o.checksum = true;
      } else if (a == "--require-gpu") {
        o.require_gpu = true;
      } else if (a == "--no-alloc-count") {
        o.count_allocations = false;
      } else if (a == "--derive-slots") {
        o.derive_slots = true;
      } else if (a == "--engine-buffers") {
        o.engine_buffers = true;
      } else if (a == "--allow-faults") {
        o.allow_faults = true;
      } else if (a == "--one-launch") {
        o.one_launch = true;
      } else if (a == "--step-requests") {
        o.step_requests = static_cast<int>(take_int("--step-requests"));
      } else if (a == "--flat-steps") {
        o.flat_steps = static_cast<int>(take_int("--flat-steps"));
      } else if (a == "--flat-pad") {
        o.flat_pad = true;
      } else if (a == "--steps") {
        o.steps = static_cast<long>(take_int("--steps"));
      } else if (a == "--verify") {
        o.verify = static_cast<int>(take_int("--verify"));
      } else if (a == "--seed") {
        o.seed = static_cast<std::uint64_t>(take_int("--seed"));
      } else if (a == "--requests") {
        o.requests = static_cast<int>(take_int("--requests"));
      } else if (a == "--min-len") {
        o.min_len = static_cast<int>(take_int("--min-len"));
      } else if (a == "--max-len") {
        o.max_len = static_cast<int>(take_int("--max-len"));
      } else if (a == "--budget") {
        o.budget = static_cast<int>(take_int("--budget"));
      } else if (a == "--max-requests") {
        o.max_requests = static_cast<int>(take_int("--max-requests"));
      } else if (a == "--max-tokens") {
        o.max_tokens = static_cast<int>(take_int("--max-tokens"));
      } else if (a == "--max-model-len") {
        o.max_model_len = static_cast<int>(take_int("--max-model-len"));
      } else if (a == "--mode" || a == "--lengths" || a == "--arrivals" || a == "--json" || a == "--rate") {
        if (next == nullptr) throw UsageError{a + " needs a value"};
        ++i;
        const std::string& v = *next;
        if (a == "--mode") {
          if (v != "graph" && v != "eager") throw UsageError{"--mode = '" + v + "' must be graph or eager"};
          o.eager = v == "eager";
        } else if (a == "--lengths") {
          try {
            o.lengths = scheduler::parse_length_distribution(v);
          } catch (const Error&) {
            throw UsageError{"--lengths = '" + v + "' must be uniform or log-normal"};
          }
        } else if (a == "--arrivals") {
          try {
            o.arrivals = scheduler::parse_arrival_pattern(v);
          } catch (const Error&) {
            throw UsageError{"--arrivals = '" + v + "' must be all or poisson"};
          }
        } else if (a == "--json") {
          if (v.empty()) throw UsageError{"--json needs a file name"};
          o.json = v;
        } else {
          double rate = 0.0;
          if (!parse_plain_decimal(v, rate) || !(rate >= scheduler::kMinArrivalRate && rate <= scheduler::kMaxArrivalRate)) {
            char msg[160];
            std::snprintf(msg, sizeof msg, "' must be a plain decimal in [%g, %g]", scheduler::kMinArrivalRate,
                          scheduler::kMaxArrivalRate);
            throw UsageError{"--rate = '" + v + msg};
          }
          o.rate = rate;
        }
      } else {
        throw UsageError{"unknown flag '" + a + "'"};
      }
    }
    if (o.max_len > o.max_model_len) {
      throw UsageError{"--max-len = " + std::to_string(o.max_len) + " must be at most --max-model-len = " +
                       std::to_string(o.max_model_len)};
    }
    if (o.one_launch && o.budget > (1 << 20)) {
      throw UsageError{"--budget = " + std::to_string(o.budget) + " must be at most 1048576 with --one-launch "
                       "(max_step_tokens)"};
    }
    if (o.flat_steps > 0 && !o.one_launch) throw UsageError{"--flat-steps needs --one-launch"};
    if (o.flat_pad && o.flat_steps == 0) throw UsageError{"--flat-pad needs --flat-steps"};
    if (o.min_len > o.max_len) {
      throw UsageError{"--min-len = " + std::to_string(o.min_len) + " must be at most --max-len = " +
                       std::to_string(o.max_len)};
    }
  } catch (const UsageError& e) {
    out.error = e.message;
  }
  return out;
}

}  // namespace spg::samples

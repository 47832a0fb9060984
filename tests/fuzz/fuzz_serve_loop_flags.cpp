// Fuzzes serve_loop's command line (samples/serve_loop_options): the input is split into
// arguments at NUL bytes. Properties: the parser never throws or crashes; an accepted command line
// has every option within the bounds --help states, and every integer flag's value is decimal
// digits only, every --rate value a plain decimal.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.hpp"
#include "samples/serve_loop_options.hpp"
#include "spgraph/scheduler/workload.hpp"

using namespace spg::samples;

namespace {
bool digits_only(const std::string& s) {
  if (s.empty()) return false;
  for (const char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args(1);
  for (std::size_t i = 0; i < size && args.size() <= 24; ++i) {
    if (data[i] == 0) {
      args.emplace_back();
    } else {
      args.back() += static_cast<char>(data[i]);
    }
  }
  const ParsedCommandLine p = parse_serve_loop_options(args);
  if (p.help || !p.error.empty()) return 0;
  const ServeLoopOptions& o = p.options;
  // Walk the arguments as the parser consumes them: a flag that takes a value takes the next one.
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    bool integer = false;
    for (const IntegerFlag& f : serve_loop_integer_flags()) integer = integer || a == f.name;
    const bool text = a == "--mode" || a == "--lengths" || a == "--arrivals" || a == "--json" || a == "--rate";
    if (!integer && !text) continue;
    SPG_FUZZ_CHECK(i + 1 < args.size(), "%s accepted without a value", a.c_str());
    const std::string& v = args[++i];
    if (integer) SPG_FUZZ_CHECK(digits_only(v), "%s accepted '%s'", a.c_str(), v.c_str());
    if (a == "--rate") {
      for (const char c : v) {
        SPG_FUZZ_CHECK((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-',
                       "--rate accepted '%s'", v.c_str());
      }
      SPG_FUZZ_CHECK(!v.empty() && ((v[0] >= '0' && v[0] <= '9') || v[0] == '.'), "--rate accepted '%s'", v.c_str());
    }
  }
  SPG_FUZZ_CHECK(o.steps >= 1 && o.steps <= 10000000, "steps %ld", o.steps);
  SPG_FUZZ_CHECK(o.budget >= 16 && o.budget <= (1 << 24), "budget %d", o.budget);
  SPG_FUZZ_CHECK(o.max_requests >= 1 && o.max_requests <= 64, "max_requests %d", o.max_requests);
  SPG_FUZZ_CHECK(o.max_tokens >= 16 && o.max_tokens <= 65536, "max_tokens %d", o.max_tokens);
  SPG_FUZZ_CHECK(o.min_len >= 1 && o.min_len <= o.max_len && o.max_len <= o.max_model_len && o.max_model_len <= (1 << 20),
                 "lengths %d %d %d", o.min_len, o.max_len, o.max_model_len);
  SPG_FUZZ_CHECK(o.rate >= spg::scheduler::kMinArrivalRate && o.rate <= spg::scheduler::kMaxArrivalRate && std::isfinite(o.rate),
                 "rate %g", o.rate);
  SPG_FUZZ_CHECK(o.seed <= (std::uint64_t{1} << 62), "seed %llu", static_cast<unsigned long long>(o.seed));
  return 0;
}

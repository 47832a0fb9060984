// serve_loop's command line (samples/serve_loop_options.hpp): strict numbers, every bound the same
// in the parser's message and in --help, and usage errors that name the flag and the bound.
#include <string>
#include <vector>

#include "common/catch.hpp"
#include "samples/serve_loop_options.hpp"

using spg::samples::parse_serve_loop_options;
using spg::samples::ParsedCommandLine;

namespace {
ParsedCommandLine parse(std::vector<std::string> args) { return parse_serve_loop_options(args); }
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("serve_loop integers are decimal digits only", "[serve_loop]") {
  // Issue 17: strtol accepted " 7" and "+7" (and --rate took strtod's "0x10").
  for (const char* bad : {" 7", "+7", "7 ", "0x10", "-1", "", "7.0", "1e3", "seven", "99999999999999999999999"}) {
    INFO("--steps '" << bad << "'");
    const ParsedCommandLine p = parse({"--steps", bad});
    CHECK(p.error == std::string("--steps = '") + bad + "' must be a decimal integer in [1, 10000000]");
  }
  CHECK(parse({"--steps", "007"}).options.steps == 7);
  CHECK(parse({"--steps", "10000000"}).error.empty());
  CHECK(has(parse({"--steps", "10000001"}).error, "must be a decimal integer in [1, 10000000]"));
  CHECK(parse({"--steps"}).error == "--steps needs an integer in [1, 10000000]");
  const ParsedCommandLine seed = parse({"--seed", "4611686018427387904"});
  CHECK(seed.error.empty());
  CHECK(seed.options.seed == (std::uint64_t{1} << 62));
  CHECK(has(parse({"--seed", "4611686018427387905"}).error, "[0, 4611686018427387904]"));
}

TEST_CASE("serve_loop --rate is a plain decimal within the workload's bounds", "[serve_loop]") {
  for (const char* bad : {"0x10", " 1", "+1", "1 ", "inf", "nan", "1e-300", "1e7", "0", "1,5", "e3", ".", "1e", "-0.5", ""}) {
    INFO("--rate '" << bad << "'");
    CHECK(parse({"--rate", bad}).error == std::string("--rate = '") + bad + "' must be a plain decimal in [1e-06, 1e+06]");
  }
  for (const auto& [text, value] : {std::pair{"0.5", 0.5}, std::pair{"2e-3", 2e-3}, std::pair{".5", 0.5},
                                    std::pair{"1e6", 1e6}, std::pair{"3", 3.0}, std::pair{"1E-6", 1e-6}}) {
    INFO("--rate '" << text << "'");
    const ParsedCommandLine p = parse({"--rate", text});
    CHECK(p.error.empty());
    CHECK(p.options.rate == value);
  }
}

TEST_CASE("serve_loop states each integer bound once: the parser and --help agree", "[serve_loop]") {
  // Issue 17: --budget said ">= 1" in --help, [1, 16777216] in one message and "at least 16" in another.
  const std::string help = spg::samples::serve_loop_help();
  for (const spg::samples::IntegerFlag& f : spg::samples::serve_loop_integer_flags()) {
    INFO(f.name);
    const std::string range = std::to_string(f.lo) + ".." + std::to_string(f.hi);
    CHECK(has(help, std::string("  ") + f.name + " "));
    CHECK(has(help, range));
    std::string bounds = "[";  // (in steps: GCC 12's -Wrestrict misfires on "[" + std::string&&)
    bounds += std::to_string(f.lo);
    bounds += ", ";
    bounds += std::to_string(f.hi);
    bounds += "]";
    CHECK(has(parse({f.name, std::to_string(f.hi + 1)}).error, bounds));
    if (f.lo > 0) CHECK(has(parse({f.name, std::to_string(f.lo - 1)}).error, bounds));
    // The lower bound alone is accepted, except where it breaks a cross-flag bound with the
    // defaults (--max-len below --min-len's 1024, --max-model-len below --max-len's 65536) or
    // needs another flag (--flat-steps: --one-launch).
    const std::string name = f.name;
    CHECK(parse({f.name, std::to_string(f.lo)}).error.empty() ==
          (name != "--max-len" && name != "--max-model-len" && name != "--flat-steps"));
  }
  CHECK(has(help, "--budget B           max_num_batched_tokens per step, 16..16777216"));
  CHECK(parse({"--budget", "15"}).error == "--budget = '15' must be a decimal integer in [16, 16777216]");
  CHECK(parse({"--budget", "16"}).options.budget == 16);
}

TEST_CASE("serve_loop flags: help, unknown flags, cross-flag bounds", "[serve_loop]") {
  CHECK(parse({"--help"}).help);
  CHECK(parse({"--steps", "5", "-h"}).help);
  CHECK(parse({"--bogus"}).error == "unknown flag '--bogus'");
  CHECK(parse({"--mode", "fast"}).error == "--mode = 'fast' must be graph or eager");
  CHECK(parse({"--mode"}).error == "--mode needs a value");
  CHECK(parse({"--json", ""}).error == "--json needs a file name");
  CHECK(parse({"--lengths", "gamma"}).error == "--lengths = 'gamma' must be uniform or log-normal");
  CHECK(parse({"--max-len", "9000", "--max-model-len", "8192"}).error ==
        "--max-len = 9000 must be at most --max-model-len = 8192");
  CHECK(parse({"--min-len", "5000", "--max-len", "4000"}).error == "--min-len = 5000 must be at most --max-len = 4000");
  CHECK_FALSE(parse({}).options.allow_faults);  // by default any device fault fails the run
  CHECK(parse({"--allow-faults"}).options.allow_faults);
  CHECK(spg::samples::serve_loop_help().find("--allow-faults") != std::string::npos);
  const ParsedCommandLine p = parse({"--steps", "20", "--mode", "eager", "--derive-slots", "--arrivals", "poisson"});
  CHECK(p.error.empty());
  CHECK(p.options.steps == 20);
  CHECK(p.options.eager);
  CHECK(p.options.derive_slots);
  CHECK(p.options.arrivals == spg::scheduler::ArrivalPattern::poisson);
}

TEST_CASE("serve_loop --one-launch takes whole steps, checksummed and verified", "[serve_loop]") {
  const ParsedCommandLine p = parse({"--one-launch", "--step-requests", "128", "--budget", "16384"});
  REQUIRE(p.error.empty());
  CHECK(p.options.one_launch);
  CHECK(p.options.step_requests == 128);
  CHECK(parse({}).options.step_requests == 64);
  CHECK(!parse({}).options.one_launch);
  // --checksum and --verify check whole steps with --one-launch (docs/graphs.md, Steps).
  const ParsedCommandLine checked = parse({"--one-launch", "--checksum", "--verify", "3", "--mode", "eager"});
  REQUIRE(checked.error.empty());
  CHECK(checked.options.one_launch);
  CHECK(checked.options.checksum);
  CHECK(checked.options.verify == 3);
  CHECK(checked.options.eager);
  CHECK(has(parse({"--one-launch", "--verify", "100001"}).error, "--verify = '100001' must be a decimal integer in [0, 100000]"));
  const std::string help = spg::samples::serve_loop_help();
  CHECK(help.find("cannot") == std::string::npos);
  CHECK(help.find("with --one-launch N sampled steps, each of their chunks") != std::string::npos);
  CHECK(help.find("with --one-launch of every step's rows") != std::string::npos);
  CHECK(has(parse({"--one-launch", "--budget", "2000000"}).error, "--budget = 2000000 must be at most 1048576"));
  CHECK(has(parse({"--step-requests", "4097"}).error, "[1, 4096]"));
  // Flat step graphs: with --one-launch; padded ones with --flat-steps.
  const ParsedCommandLine flat = parse({"--one-launch", "--flat-steps", "16", "--flat-pad"});
  REQUIRE(flat.error.empty());
  CHECK(flat.options.flat_steps == 16);
  CHECK(flat.options.flat_pad);
  CHECK(parse({}).options.flat_steps == 0);
  CHECK(!parse({}).options.flat_pad);
  CHECK(has(parse({"--flat-steps", "4"}).error, "--flat-steps needs --one-launch"));
  CHECK(has(parse({"--one-launch", "--flat-pad"}).error, "--flat-pad needs --flat-steps"));
  CHECK(has(parse({"--one-launch", "--flat-steps", "1"}).error, "--flat-steps = '1' must be a decimal integer in [2, 4096]"));
  CHECK(help.find("--flat-pad") != std::string::npos);
}

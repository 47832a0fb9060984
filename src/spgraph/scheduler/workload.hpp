// Workload: seeded synthetic traffic for the serving loop (prompt lengths and arrival steps).
//
// The same config gives the same requests on every machine: the random mappings are the
// project's own, not the standard library's distributions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "spgraph/scheduler/request.hpp"

namespace spg::scheduler {

enum class LengthDistribution { uniform, log_normal };
enum class ArrivalPattern { all_at_once, poisson };

/// Poisson arrival rates (mean arrivals per step) a workload accepts.
inline constexpr double kMinArrivalRate = 1e-6;
inline constexpr double kMaxArrivalRate = 1e6;
/// The last step a workload may start at (2^62), so that its arrival steps fit an int64.
inline constexpr std::int64_t kMaxFirstStep = std::int64_t{1} << 62;

/// @brief What traffic to make. Plain fields so a command line maps onto it one flag per field.
struct WorkloadConfig {
  std::uint64_t seed{1};
  int num_requests{1000};
  int min_prompt_len{1024};
  int max_prompt_len{65536};
  LengthDistribution lengths{LengthDistribution::uniform};
  /// Log-normal only: sigma of ln(length), whose median is sqrt(min * max); lengths are clamped
  /// to [min, max]. 0 picks (ln max - ln min) / 4, so that +-2 sigma spans the range.
  double log_normal_sigma{0.0};
  ArrivalPattern arrivals{ArrivalPattern::all_at_once};
  double arrival_rate{1.0};  ///< Poisson only: mean arrivals per step, in [kMinArrivalRate, kMaxArrivalRate]
  std::int64_t first_step{0};  ///< all-at-once requests arrive here; Poisson arrivals start here

  /// @throws InvalidArgument naming the first field out of bounds, with its value and bounds.
  void validate() const;
  /// One line: "1000 requests, prompt lengths uniform in [1024, 65536], all arriving at step 0, seed 1".
  [[nodiscard]] std::string describe() const;
};

/// @brief The requests of a workload: ids 0 .. num_requests - 1 in arrival order, arrivals non-decreasing.
/// @throws InvalidArgument when the config is invalid.
[[nodiscard]] std::vector<Request> make_workload(const WorkloadConfig& config);

/// "uniform" or "log-normal" ("lognormal" too).
/// @throws InvalidArgument naming the text and the accepted names.
[[nodiscard]] LengthDistribution parse_length_distribution(std::string_view text);
/// "all" or "poisson".
/// @throws InvalidArgument naming the text and the accepted names.
[[nodiscard]] ArrivalPattern parse_arrival_pattern(std::string_view text);
[[nodiscard]] std::string_view to_string(LengthDistribution d) noexcept;
[[nodiscard]] std::string_view to_string(ArrivalPattern a) noexcept;

}  // namespace spg::scheduler

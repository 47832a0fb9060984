// Synthetic serving traffic: see workload.hpp.
#include "spgraph/scheduler/workload.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "spgraph/core/error.hpp"
#include "spgraph/scheduler/detail/seeded_random.hpp"

namespace spg::scheduler {

namespace {

double auto_sigma(const WorkloadConfig& c) {
  if (c.log_normal_sigma > 0.0) {
    return c.log_normal_sigma;
  }
  return (std::log(static_cast<double>(c.max_prompt_len)) - std::log(static_cast<double>(c.min_prompt_len))) / 4.0;
}

}  // namespace

void WorkloadConfig::validate() const {
  SPG_EXPECTS(num_requests >= 0, "num_requests = " << num_requests << " must be at least 0");
  SPG_EXPECTS(min_prompt_len >= 1, "min_prompt_len = " << min_prompt_len << " must be at least 1");
  SPG_EXPECTS(max_prompt_len >= min_prompt_len,
              "max_prompt_len = " << max_prompt_len << " must be at least min_prompt_len = " << min_prompt_len);
  SPG_EXPECTS(std::isfinite(log_normal_sigma) && log_normal_sigma >= 0.0,
              "log_normal_sigma = " << log_normal_sigma << " must be finite and at least 0 (0: automatic)");
  // Bounded so that every arrival step fits an int64: gaps are at most ~37 / arrival_rate steps
  // (the exponential of a 53-bit uniform), and at most 2^31 requests follow first_step.
  SPG_EXPECTS(arrivals != ArrivalPattern::poisson || (arrival_rate >= kMinArrivalRate && arrival_rate <= kMaxArrivalRate),
              "arrival_rate = " << arrival_rate << " must be in [" << kMinArrivalRate << ", " << kMaxArrivalRate
                                << "] arrivals per step for Poisson arrivals");
  SPG_EXPECTS(first_step >= 0 && first_step <= kMaxFirstStep,
              "first_step = " << first_step << " must be in [0, 2^62]");
}

std::string WorkloadConfig::describe() const {
  std::ostringstream os;
  os << num_requests << " requests, prompt lengths ";
  if (lengths == LengthDistribution::uniform) {
    os << "uniform in [" << min_prompt_len << ", " << max_prompt_len << "]";
  } else {
    os << "log-normal (median " << static_cast<long long>(std::lround(std::sqrt(
                                        static_cast<double>(min_prompt_len) * static_cast<double>(max_prompt_len))))
       << ", sigma " << std::setprecision(3) << auto_sigma(*this) << ") clamped to [" << min_prompt_len << ", "
       << max_prompt_len << "]";
  }
  if (arrivals == ArrivalPattern::all_at_once) {
    os << ", all arriving at step " << first_step;
  } else {
    os << ", Poisson arrivals at " << std::setprecision(4) << arrival_rate << " per step from step " << first_step;
  }
  os << ", seed " << seed;
  return os.str();
}

std::vector<Request> make_workload(const WorkloadConfig& config) {
  config.validate();
  detail::SeededRandom rng(config.seed);
  const double log_min = std::log(static_cast<double>(config.min_prompt_len));
  const double log_max = std::log(static_cast<double>(config.max_prompt_len));
  const double mu = 0.5 * (log_min + log_max);
  const double sigma = auto_sigma(config);

  std::vector<Request> out;
  out.reserve(static_cast<std::size_t>(config.num_requests));
  double clock = static_cast<double>(config.first_step);
  for (int i = 0; i < config.num_requests; ++i) {
    Request r;
    r.id = i;
    if (config.lengths == LengthDistribution::uniform) {
      r.prompt_len = static_cast<int>(rng.uniform_int(config.min_prompt_len, config.max_prompt_len));
    } else {
      const double len = std::round(std::exp(mu + sigma * rng.normal()));
      r.prompt_len = static_cast<int>(
          std::clamp(len, static_cast<double>(config.min_prompt_len), static_cast<double>(config.max_prompt_len)));
    }
    if (config.arrivals == ArrivalPattern::poisson) {
      // Exponential gaps make the count per step Poisson with mean arrival_rate.
      clock += rng.exponential(config.arrival_rate);
      // validate()'s bounds keep the clock below 2^63; the conversion is checked all the same.
      SPG_EXPECTS(clock < 9.0e18, "arrival step " << clock << " of request " << i << " does not fit an int64");
      r.arrival_step = static_cast<std::int64_t>(std::floor(clock));
    } else {
      r.arrival_step = config.first_step;
    }
    out.push_back(r);
  }
  return out;
}

LengthDistribution parse_length_distribution(std::string_view text) {
  if (text == "uniform") {
    return LengthDistribution::uniform;
  }
  SPG_EXPECTS(text == "log-normal" || text == "lognormal",
              "prompt length distribution '" << text << "' is unknown: use uniform or log-normal");
  return LengthDistribution::log_normal;
}

ArrivalPattern parse_arrival_pattern(std::string_view text) {
  if (text == "all") {
    return ArrivalPattern::all_at_once;
  }
  SPG_EXPECTS(text == "poisson", "arrival pattern '" << text << "' is unknown: use all or poisson");
  return ArrivalPattern::poisson;
}

std::string_view to_string(LengthDistribution d) noexcept {
  return d == LengthDistribution::uniform ? "uniform" : "log-normal";
}

std::string_view to_string(ArrivalPattern a) noexcept { return a == ArrivalPattern::all_at_once ? "all" : "poisson"; }

}  // namespace spg::scheduler

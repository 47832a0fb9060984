// BucketSet: see buckets.hpp.
#include "spgraph/graphs/buckets.hpp"

#include <sstream>

#include "spgraph/core/error.hpp"

namespace spg::graphs {

namespace {
void check_list(const std::vector<int>& v, const char* what, int max) {
  SPG_EXPECTS(!v.empty(), what << " is empty; it must end at " << max);
  SPG_EXPECTS(v.size() <= 64, what << " holds " << v.size() << " buckets, at most 64");
  for (std::size_t i = 0; i < v.size(); ++i) {
    SPG_EXPECTS(v[i] >= 1 && v[i] <= max, what << "[" << i << "] = " << v[i] << " must be in [1, " << max << "]");
    SPG_EXPECTS(i == 0 || v[i] > v[i - 1],
                what << "[" << i << "] = " << v[i] << " must be larger than " << what << "[" << i - 1 << "] = " << v[i - 1]);
  }
  SPG_EXPECTS(v.back() == max, what << " ends at " << v.back() << " but must end at the maximum " << max
                                    << " so that every chunk has a bucket");
}

std::vector<std::int16_t> make_index(const std::vector<int>& buckets) {
  std::vector<std::int16_t> idx(static_cast<std::size_t>(buckets.back()) + 1);
  std::size_t b = 0;
  for (int n = 0; n <= buckets.back(); ++n) {
    while (buckets[b] < n) ++b;
    idx[static_cast<std::size_t>(n)] = static_cast<std::int16_t>(b);
  }
  return idx;
}
}  // namespace

BucketSet BucketSet::make_default(int max_requests, int max_tokens) {
  std::vector<int> r;
  for (int v : {1, 2, 4}) {
    if (v < max_requests) r.push_back(v);
  }
  r.push_back(max_requests);
  std::vector<int> t;
  for (int p = 16; p < max_tokens; p *= 2) {
    t.push_back(p);
    const int mid = p + p / 2;
    if (mid < max_tokens) t.push_back(mid);
  }
  t.push_back(max_tokens);
  return BucketSet(std::move(r), std::move(t), max_requests, max_tokens);
}

BucketSet::BucketSet(std::vector<int> r_buckets, std::vector<int> t_buckets, int max_requests, int max_tokens)
    : r_(std::move(r_buckets)), t_(std::move(t_buckets)) {
  check_list(r_, "r_buckets", max_requests);
  check_list(t_, "t_buckets", max_tokens);
  r_index_ = make_index(r_);
  t_index_ = make_index(t_);
}

std::string BucketSet::describe() const {
  std::ostringstream os;
  os << "R buckets {";
  for (std::size_t i = 0; i < r_.size(); ++i) os << (i ? ", " : "") << r_[i];
  os << "} x T buckets {";
  for (std::size_t i = 0; i < t_.size(); ++i) os << (i ? ", " : "") << t_[i];
  os << "} = " << size() << " chunk shapes";
  return os.str();
}

}  // namespace spg::graphs

// The counting pass over named slots: see pool_plan.hpp.
#include "spgraph/memory/pool_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <sstream>

#include "spgraph/core/error.hpp"

namespace spg::memory {

namespace {
constexpr std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }
constexpr int kind_index(MemoryKind k) { return k == MemoryKind::device ? 0 : 1; }
const char* kind_name(MemoryKind k) { return k == MemoryKind::device ? "device" : "pinned"; }
}  // namespace

const Slot& PoolPlan::add(SlotSpec spec) {
  SPG_EXPECTS(!spec.name.empty(), "slot name must not be empty");
  SPG_EXPECTS(find(spec.name) == nullptr, "slot '" << spec.name << "' is already in the plan");
  SPG_EXPECTS(spec.bytes > 0, "slot '" << spec.name << "': bytes = 0, must be at least 1");
  const std::size_t a = spec.alignment;
  SPG_EXPECTS(a >= 1 && a <= kBaseAlignment && (a & (a - 1)) == 0,
              "slot '" << spec.name << "': alignment = " << a << " must be a power of two in [1, " << kBaseAlignment
                       << "]");
  // Sizes come from configs and callers: a slot that would carry the plan past SIZE_MAX (or past
  // the base alignment's last multiple) is refused, never wrapped to a small offset.
  std::size_t& end = end_[kind_index(spec.kind)];
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max() / 2;
  SPG_EXPECTS_AS(CapacityError, spec.bytes <= kMax - kBaseAlignment && end <= kMax - kBaseAlignment - spec.bytes,
                 "slot '" << spec.name << "': bytes = " << spec.bytes << " after " << end
                          << " B already planned does not fit a pool (at most " << kMax << " B)");
  const std::size_t offset = round_up(end, a);
  end = offset + spec.bytes;
  slots_.push_back(Slot{std::move(spec), offset});
  return slots_.back();
}

const Slot* PoolPlan::find(std::string_view name) const noexcept {
  const auto it = std::find_if(slots_.begin(), slots_.end(), [&](const Slot& s) { return s.spec.name == name; });
  return it == slots_.end() ? nullptr : &*it;
}

const Slot& PoolPlan::slot(std::string_view name) const {
  const Slot* s = find(name);
  SPG_EXPECTS(s != nullptr, "the pool plan has no slot named '" << name << "'");
  return *s;
}

std::size_t PoolPlan::bytes(MemoryKind kind) const noexcept {
  return round_up(end_[kind_index(kind)], kBaseAlignment);
}

std::string format_bytes(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  }
  return buf;
}

std::string PoolPlan::table() const {
  std::size_t name_w = 4;
  std::size_t shape_w = 5;
  for (const Slot& s : slots_) {
    name_w = std::max(name_w, s.spec.name.size());
    shape_w = std::max(shape_w, s.spec.shape.size());
  }
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "%-*s  %-6s  %-*s  %14s  %12s  %14s\n", static_cast<int>(name_w), "slot", "kind",
                static_cast<int>(shape_w), "shape", "bytes", "", "offset");
  os << line;
  for (const Slot& s : slots_) {
    std::snprintf(line, sizeof line, "%-*s  %-6s  %-*s  %14zu  %12s  %14zu\n", static_cast<int>(name_w),
                  s.spec.name.c_str(), kind_name(s.spec.kind), static_cast<int>(shape_w), s.spec.shape.c_str(),
                  s.spec.bytes, format_bytes(s.spec.bytes).c_str(), s.offset);
    os << line;
  }
  os << "total device: " << device_bytes() << " B (" << format_bytes(device_bytes()) << "), pinned host: "
     << pinned_bytes() << " B (" << format_bytes(pinned_bytes()) << "), " << slots_.size() << " slots\n";
  return os.str();
}

}  // namespace spg::memory

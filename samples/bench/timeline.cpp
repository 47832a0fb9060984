// See timeline.hpp.
#include "samples/bench/timeline.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <vector>

#include "samples/bench/report.hpp"

namespace spg::bench {

namespace {

using CtaRecord = kernels::WgmmaTimelineRecord;

bool complete(const CtaRecord& r) noexcept {
  return r.start != 0 && r.first_qk != 0 && r.last_pv[0] != 0 && r.last_pv[1] != 0 && r.end[0] != 0 && r.end[1] != 0 &&
         r.producer_end != 0;
}

double diff(unsigned long long later, unsigned long long earlier) noexcept {
  return static_cast<double>(later) - static_cast<double>(earlier);
}

}  // namespace

TimelineSummary summarize_timeline(std::span<const kernels::WgmmaTimelineRecord> records) {
  std::vector<double> start, loop, tail, cta, gap, slack, mhz, first_fill, q_left, epi_sync, epi_stage, epi_drain, setup,
      launch_gap, first_panel, per_panel, end_skew;
  std::size_t wg1_last = 0;
  std::map<unsigned long long, std::vector<const CtaRecord*>> per_sm;
  for (const CtaRecord& r : records) {
    if (!complete(r)) continue;
    const unsigned long long last_pv = std::max(r.last_pv[0], r.last_pv[1]);
    const unsigned long long end = std::max(r.end[0], r.end[1]);
    start.push_back(diff(r.first_qk, r.start));
    loop.push_back(diff(last_pv, r.first_qk));
    tail.push_back(diff(end, last_pv));
    cta.push_back(diff(end, r.start));
    end_skew.push_back(diff(r.end[1], r.end[0]));
    if (r.end[1] > r.end[0]) ++wg1_last;
    slack.push_back(diff(last_pv, r.producer_end));
    if (r.gt_end > r.gt_start) mhz.push_back(diff(r.end[0], r.start) * 1e3 / diff(r.gt_end, r.gt_start));
    // The parts, where recorded, each in order (a record out of order is a bad one and left out).
    if (r.first_fill > r.start) first_fill.push_back(diff(r.first_fill, r.start));
    if (r.q_left > r.start) q_left.push_back(diff(r.q_left, r.start));
    if (r.entry != 0 && r.entry <= r.start) setup.push_back(diff(r.start, r.entry));
    // The panels WG0 staged (4, or 2 in the split-dv kernel), each after the one before.
    int panels = 0;
    while (panels < 4 && r.epi_panel[panels] != 0 && (panels == 0 || r.epi_panel[panels] >= r.epi_panel[panels - 1])) ++panels;
    if (panels > 0 && r.epi_sync != 0 && r.epi_panel[0] >= r.epi_sync) {
      first_panel.push_back(diff(r.epi_panel[0], r.epi_sync));
      if (panels > 1) per_panel.push_back(diff(r.epi_panel[panels - 1], r.epi_panel[0]) / (panels - 1));
    }
    if (r.epi_sync >= last_pv && r.epi_issued >= r.epi_sync && r.end[0] >= r.epi_issued) {
      epi_sync.push_back(diff(r.epi_sync, last_pv));
      epi_stage.push_back(diff(r.epi_issued, r.epi_sync));
      epi_drain.push_back(diff(r.end[0], r.epi_issued));
    }
    per_sm[r.smid].push_back(&r);
  }
  TimelineSummary s;
  s.ctas = start.size();
  for (auto& [sm, ctas] : per_sm) {
    std::sort(ctas.begin(), ctas.end(), [](const CtaRecord* a, const CtaRecord* b) { return a->start < b->start; });
    for (std::size_t i = 1; i < ctas.size(); ++i) {
      const unsigned long long prev_end = std::max(ctas[i - 1]->end[0], ctas[i - 1]->end[1]);
      if (ctas[i]->start < prev_end) {
        ++s.overlaps;
        continue;
      }
      gap.push_back(diff(ctas[i]->start, prev_end));
      if (ctas[i]->entry >= prev_end && ctas[i]->entry <= ctas[i]->start) launch_gap.push_back(diff(ctas[i]->entry, prev_end));
    }
  }
  s.gaps = gap.size();
  s.start = median(std::move(start));
  s.loop = median(std::move(loop));
  s.tail = median(std::move(tail));
  s.cta = median(std::move(cta));
  s.gap = median(std::move(gap));
  s.producer_slack = median(std::move(slack));
  s.sm_mhz = median(std::move(mhz));
  s.first_fill = median(std::move(first_fill));
  s.q_left = median(std::move(q_left));
  s.epi_sync = median(std::move(epi_sync));
  s.epi_stage = median(std::move(epi_stage));
  s.epi_drain = median(std::move(epi_drain));
  s.setup = median(std::move(setup));
  s.launch_gap = median(std::move(launch_gap));
  s.epi_first_panel = median(std::move(first_panel));
  s.epi_per_panel = median(std::move(per_panel));
  s.end_skew = median(std::move(end_skew));
  s.wg1_ends_last = s.ctas > 0 ? static_cast<double>(wg1_last) / static_cast<double>(s.ctas)
                               : std::numeric_limits<double>::quiet_NaN();
  return s;
}

}  // namespace spg::bench

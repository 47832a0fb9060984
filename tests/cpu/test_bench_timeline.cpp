// Table A's CTA timelines (samples/bench/timeline.hpp): the phases of each CTA and the gap
// between CTAs that ran one after the other on an SM, from records in any order, with the records
// a CTA did not complete and the pairs that overlap (a bad record) left out.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/catch.hpp"
#include "samples/bench/timeline.hpp"

using spg::bench::summarize_timeline;
using spg::bench::TimelineSummary;
using spg::kernels::WgmmaTimelineRecord;

namespace {

/// A CTA on SM `sm` from `start`: start phase `s`, loop `l` (the later warpgroup's last P V at
/// start + s + l, the other one 100 cycles earlier), tail `t` (the later end; the other 50
/// earlier); the producer done 300 cycles before the last P V; 2 cycles a global-timer ns (2 GHz).
WgmmaTimelineRecord cta(unsigned sm, unsigned long long start, unsigned long long s, unsigned long long l,
                        unsigned long long t) {
  WgmmaTimelineRecord r{};
  r.smid = sm;
  r.start = start;
  r.first_qk = start + s;
  const unsigned long long last_pv = start + s + l;
  r.last_pv[0] = last_pv - 100;
  r.last_pv[1] = last_pv;
  r.end[0] = last_pv + t;
  r.end[1] = last_pv + t - 50;
  r.producer_end = last_pv - 300;
  r.gt_start = 1'000'000 + start / 2;
  r.gt_end = r.gt_start + (r.end[0] - r.start) / 2;
  return r;
}

}  // namespace

TEST_CASE("bench timeline: phases and gaps of CTAs in any order", "[bench][timeline]") {
  std::vector<WgmmaTimelineRecord> recs;
  // SM 3: three CTAs back to back, gaps 400 and 600 after each CTA's later end.
  recs.push_back(cta(3, 10'000, 1'000, 20'000, 3'000));                // ends 34'000
  recs.push_back(cta(3, 34'400, 1'200, 21'000, 3'100));                // ends 59'700
  recs.push_back(cta(3, 60'300, 1'100, 22'000, 2'900));
  // SM 7: two CTAs, gap 500.
  recs.push_back(cta(7, 5'000, 900, 19'000, 3'300));                   // ends 28'200
  recs.push_back(cta(7, 28'700, 1'300, 20'500, 3'200));
  // A CTA that never reached its epilogue (an item without blocks): left out of everything.
  WgmmaTimelineRecord partial = cta(7, 100'000, 5, 5, 5);
  partial.end[1] = 0;
  recs.push_back(partial);
  std::shuffle(recs.begin(), recs.end(), std::mt19937(7));
  const TimelineSummary t = summarize_timeline(recs);
  CHECK(t.ctas == 5);
  CHECK(t.gaps == 3);
  CHECK(t.overlaps == 0);
  CHECK(t.start == 1'100);   // 900, 1000, 1100, 1200, 1300
  CHECK(t.loop == 20'500);   // 19000, 20000, 20500, 21000, 22000
  CHECK(t.tail == 3'100);    // 2900, 3000, 3100, 3200, 3300
  CHECK(t.gap == 500);       // 400, 500, 600
  CHECK(t.producer_slack == 300);
  CHECK(t.cta == 25'000);    // 23200, 24000, 25000, 25300, 26000
  CHECK(std::abs(t.sm_mhz - 2'000.0) < 1.0);
  CHECK(t.end_skew == -50);  // cta(): WG1 ends 50 cycles before WG0
  CHECK(t.wg1_ends_last == 0.0);
}

TEST_CASE("bench timeline: an overlapping pair on one SM is counted apart, not as a gap", "[bench][timeline]") {
  std::vector<WgmmaTimelineRecord> recs;
  recs.push_back(cta(0, 1'000, 100, 1'000, 100));   // ends 2'200
  recs.push_back(cta(0, 2'000, 100, 1'000, 100));   // starts before the first ends
  recs.push_back(cta(0, 3'500, 100, 1'000, 100));   // 300 after the second's end (3'200)
  const TimelineSummary t = summarize_timeline(recs);
  CHECK(t.ctas == 3);
  CHECK(t.overlaps == 1);
  CHECK(t.gaps == 1);
  CHECK(t.gap == 300);
}

TEST_CASE("bench timeline: no complete record gives NaN medians and no counts", "[bench][timeline]") {
  std::vector<WgmmaTimelineRecord> recs(4);  // all zero: no CTA recorded (a build without the timeline)
  const TimelineSummary t = summarize_timeline(recs);
  CHECK(t.ctas == 0);
  CHECK(t.gaps == 0);
  CHECK(std::isnan(t.start));
  CHECK(std::isnan(t.gap));
  CHECK(std::isnan(t.sm_mhz));
  CHECK(std::isnan(t.first_fill));
  CHECK(std::isnan(t.epi_drain));
  CHECK(std::isnan(t.setup));
  CHECK(std::isnan(t.launch_gap));
  CHECK(std::isnan(t.epi_first_panel));
  CHECK(std::isnan(t.epi_per_panel));
  CHECK(std::isnan(t.end_skew));
  CHECK(std::isnan(t.wg1_ends_last));
}

TEST_CASE("bench timeline: the start and the tail in parts", "[bench][timeline]") {
  std::vector<WgmmaTimelineRecord> recs;
  for (unsigned long long k = 0; k < 3; ++k) {
    WgmmaTimelineRecord r = cta(static_cast<unsigned>(k), 1'000, 2'000, 10'000, 3'000);  // last P V 13'000, WG0 ends 16'000
    r.first_fill = r.start + 900 + 100 * k;   // 900, 1000, 1100
    r.q_left = r.start + 1'500 + 10 * k;      // 1500, 1510, 1520
    r.epi_sync = 13'000 + 200 * (k + 1);      // 200, 400, 600 after the later last P V
    r.epi_issued = r.epi_sync + 1'000 + k;    // 1000, 1001, 1002
    recs.push_back(r);                        // drain: 3000 - sync - stage = 1800, 1599, 1398
  }
  // Parts out of order (a bad record): the CTA still counts, its tail parts do not.
  WgmmaTimelineRecord bad = cta(9, 1'000, 2'000, 10'000, 3'000);
  bad.epi_sync = 12'000;  // before the last P V
  bad.epi_issued = 15'000;
  recs.push_back(bad);
  const TimelineSummary t = summarize_timeline(recs);
  CHECK(t.ctas == 4);
  CHECK(t.first_fill == 1'000);  // the bad record has none: 900, 1000, 1100
  CHECK(t.q_left == 1'510);
  CHECK(t.epi_sync == 400);
  CHECK(t.epi_stage == 1'001);
  CHECK(t.epi_drain == 1'599);
}

TEST_CASE("bench timeline: the gap in parts, the hardware's launch and the CTA's set-up", "[bench][timeline]") {
  std::vector<WgmmaTimelineRecord> recs;
  // SM 2: CTAs back to back, each entering `launch` cycles after the previous one's later end and
  // starting `setup` cycles after its entry.
  unsigned long long entry = 1'000;
  const unsigned long long launch[] = {0, 250, 350, 300};
  const unsigned long long setup[] = {80, 120, 100, 90};
  for (int k = 0; k < 4; ++k) {
    entry += launch[k];
    WgmmaTimelineRecord r = cta(2, entry + setup[k], 1'000, 5'000, 2'000);  // ends 8'000 after its start
    r.entry = entry;
    recs.push_back(r);
    entry = std::max(r.end[0], r.end[1]);
  }
  // A record without its entry (a build before it) keeps its gap but gives no parts.
  WgmmaTimelineRecord old = cta(2, entry + 700, 1'000, 5'000, 2'000);
  recs.push_back(old);
  // An entry after the start is a bad record: no set-up from it.
  WgmmaTimelineRecord bad = cta(5, 1'000, 1'000, 5'000, 2'000);
  bad.entry = 1'500;
  recs.push_back(bad);
  std::shuffle(recs.begin(), recs.end(), std::mt19937(3));
  const TimelineSummary t = summarize_timeline(recs);
  CHECK(t.ctas == 6);
  CHECK(t.gaps == 4);
  CHECK(t.gap == 420);         // 370, 450, 390, 700: the gap holds the set-up
  CHECK(t.launch_gap == 300);  // 250, 350, 300
  CHECK(t.setup == 95);        // 80, 90, 100, 120
}

TEST_CASE("bench timeline: the epilogue's panels", "[bench][timeline]") {
  std::vector<WgmmaTimelineRecord> recs;
  // Four panels (the single pass): first staged `first` cycles after the row-sum barrier, then
  // one every `each` cycles.
  const unsigned long long first[] = {700, 500, 600};
  const unsigned long long each[] = {300, 500, 400};
  for (int k = 0; k < 3; ++k) {
    WgmmaTimelineRecord r = cta(static_cast<unsigned>(k), 1'000, 2'000, 10'000, 3'000);  // later last P V at 13'000
    r.epi_sync = 13'100;
    for (int pn = 0; pn < 4; ++pn) r.epi_panel[pn] = r.epi_sync + first[k] + each[k] * static_cast<unsigned long long>(pn);
    r.epi_issued = r.epi_panel[3] + 10;
    recs.push_back(r);
  }
  // Two panels (the split-dv kernel): 900 after the barrier, then 200.
  WgmmaTimelineRecord two = cta(7, 1'000, 2'000, 10'000, 3'000);
  two.epi_sync = 13'100;
  two.epi_panel[0] = 14'000;
  two.epi_panel[1] = 14'200;
  recs.push_back(two);
  // Panels out of order (a bad record): none of its panel parts count.
  WgmmaTimelineRecord bad = cta(8, 1'000, 2'000, 10'000, 3'000);
  bad.epi_sync = 13'100;
  bad.epi_panel[0] = 13'000;  // before the barrier
  bad.epi_panel[1] = 13'500;
  recs.push_back(bad);
  const TimelineSummary t = summarize_timeline(recs);
  CHECK(t.ctas == 5);
  CHECK(t.epi_first_panel == 650);  // 500, 600, 700, 900
  CHECK(t.epi_per_panel == 350);    // 200, 300, 400, 500
}

TEST_CASE("bench timeline: which warpgroup ends the CTA", "[bench][timeline]") {
  std::vector<WgmmaTimelineRecord> recs;
  const long long skew[] = {-50, 120, 300, 80};  // WG1's end minus WG0's
  for (int k = 0; k < 4; ++k) {
    WgmmaTimelineRecord r = cta(static_cast<unsigned>(k), 1'000, 2'000, 10'000, 3'000);
    r.end[1] = static_cast<unsigned long long>(static_cast<long long>(r.end[0]) + skew[k]);
    recs.push_back(r);
  }
  const TimelineSummary t = summarize_timeline(recs);
  CHECK(t.ctas == 4);
  CHECK(t.end_skew == 100);         // -50, 80, 120, 300
  CHECK(t.wg1_ends_last == 0.75);   // three of four
}

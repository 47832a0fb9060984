// Fuzzes the chunked-prefill scheduler: a small random layer program and cache, a random scheduler
// config, and a random stream of submissions (good and bad) and steps. Properties: submit()
// refuses only with InvalidArgument; schedule() never throws; every step stays within its budget
// and every chunk within R and T; blocks in use plus promised never exceed a pool; and every chunk
// the scheduler plans is accepted by the executor's encoder as it stands, with its slot lists and
// with the slots left to the device (the slot lists agree with the block tables, every block id is
// inside its cache and no block holds new rows of two requests).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "fuzz/fuzz_check.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/scheduler/prefill_scheduler.hpp"

using namespace spg;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  model::PipelineConfig c;
  c.max_requests = in.ConsumeIntegralInRange(1, 6);
  c.max_tokens = in.ConsumeIntegralInRange(16, 256);
  c.max_model_len = in.ConsumeIntegralInRange(1, 4000);
  const int window = in.ConsumeIntegralInRange(1, 200);
  const int which = in.ConsumeIntegralInRange(1, 7);
  if (which & 1) c.layers.push_back(model::LayerConfig{64, 512, 512, window, 1, 0, 0.0F, false});
  if (which & 2) c.layers.push_back(model::LayerConfig{64, 512, 512, window, 4, 512, 0.0F, true});
  if (which & 4) c.layers.push_back(model::LayerConfig{64, 512, 512, window, 128, 64, 0.0F, true});
  c.cache.swa_block_size = in.ConsumeIntegralInRange(1, 64);
  c.cache.block_tokens = 128 * in.ConsumeIntegralInRange(1, 2);
  c.cache.swa_blocks = std::max(1, c.swa_blocks_per_request() * in.ConsumeIntegralInRange(1, 3) + in.ConsumeIntegralInRange(-1, 5));
  c.cache.compressed_blocks =
      std::max(1, c.compressed_blocks_per_request() * in.ConsumeIntegralInRange(1, 3) + in.ConsumeIntegralInRange(-1, 5));
  scheduler::SchedulerConfig sc;
  sc.max_num_batched_tokens = in.ConsumeIntegralInRange(1, 1024);
  sc.max_tokens_per_request = in.ConsumeIntegralInRange(0, 300);
  sc.max_chunks_per_step = in.ConsumeIntegralInRange(0, 4);

  std::unique_ptr<scheduler::PrefillScheduler> sched;
  try {
    c.validate();
    sched = std::make_unique<scheduler::PrefillScheduler>(c, sc);
  } catch (const InvalidArgument&) {
    return 0;  // a config the scheduler refuses, with a message
  }
  int mask = 0;
  for (const auto& l : c.layers) mask |= 1 << graphs::ratio_index(l.compress_ratio);
  graphs::ChunkEncoder enc(c, true);
  std::int64_t next_id = 0;
  for (int step = 0; step < 200 && in.remaining_bytes() > 0; ++step) {
    for (int k = in.ConsumeIntegralInRange(0, 3); k > 0; --k) {
      scheduler::Request r;
      r.id = in.ConsumeIntegralInRange(0, 15) == 0 ? next_id - 1 : next_id;  // sometimes a duplicate id
      ++next_id;
      r.prompt_len = in.ConsumeIntegralInRange(0, 15) == 0 ? in.ConsumeIntegral<int>() : in.ConsumeIntegralInRange(1, c.max_model_len);
      r.arrival_step = sched->next_step() + in.ConsumeIntegralInRange(-1, 5);
      try {
        sched->submit(r);
      } catch (const InvalidArgument&) {
      }
    }
    const scheduler::StepPlan plan = sched->schedule();
    SPG_FUZZ_CHECK(plan.num_tokens() <= sc.max_num_batched_tokens, "step of %d tokens, budget %d", plan.num_tokens(),
                   sc.max_num_batched_tokens);
    for (const scheduler::ChunkPlan& cp : plan.chunks) {
      SPG_FUZZ_CHECK(cp.num_requests <= c.max_requests && cp.num_tokens <= c.max_tokens, "chunk of %d requests, %d tokens",
                     cp.num_requests, cp.num_tokens);
      for (const bool lists : {true, false}) {
        const graphs::ChunkCheck ck = enc.check(cp.input(lists), mask);
        SPG_FUZZ_CHECK(ck.status == graphs::RunStatus::ok, "the encoder refused a planned chunk (%s): %s, request %d: %s",
                       lists ? "slot lists" : "derived slots", ck.bad_field != nullptr ? ck.bad_field : "-", ck.bad_request,
                       ck.bad_reason != nullptr ? ck.bad_reason : graphs::run_status_name(ck.status));
      }
    }
    for (std::size_t kind = 0; kind < sched->cache_kinds().size(); ++kind) {
      const scheduler::BlockAllocator& a = sched->allocator(kind);
      SPG_FUZZ_CHECK(a.in_use() + sched->promised_blocks(kind) <= a.total(), "kind %zu: %d in use + %d promised > %d", kind,
                     a.in_use(), sched->promised_blocks(kind), a.total());
    }
  }
  return 0;
}

// BufferPool on a real device: one device allocation, every slot writable and readable back.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/catch.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/graphs/pipeline_pool.hpp"
#include "spgraph/memory/buffer_pool.hpp"

using namespace spg::memory;
using namespace spg::model;
using spg::graphs::plan_pipeline_pool;
namespace slots = spg::graphs::slots;

TEST_CASE("the pipeline pool makes two allocations and every slot holds its bytes", "[gpu][pool]") {
  LayerConfig c4{};
  PipelineConfig config = PipelineConfig::single_layer(c4, 2, 97, 4099);
  config.layers.push_back(LayerConfig{64, 512, 512, 128, 1, 0, 0.0F, false});
  config.cache.swa_blocks = 37;
  config.cache.compressed_blocks = 11;
  BufferPool pool(plan_pipeline_pool(config), 1 << 20);
  CHECK(pool.allocation_calls() == 2);
  CHECK(pool.device_bytes() >= pool.plan().device_bytes() + (1 << 20));

  // Poison everything, then give each slot its own pattern and read every byte back.
  SPG_CUDA_TRY(cudaMemset(pool.device_base(), 0xA5, pool.device_bytes()));
  for (const Slot& s : pool.plan().slots()) {
    if (s.spec.kind != MemoryKind::device) continue;
    const auto pattern = static_cast<std::uint8_t>((s.offset / 256) * 31 + s.spec.bytes);
    SPG_CUDA_TRY(cudaMemset(pool.bytes(s.spec.name, s.spec.bytes), pattern, s.spec.bytes));
  }
  std::vector<std::uint8_t> host(pool.plan().device_bytes());
  SPG_CUDA_TRY(cudaMemcpy(host.data(), pool.device_base(), host.size(), cudaMemcpyDeviceToHost));
  for (const Slot& s : pool.plan().slots()) {
    if (s.spec.kind != MemoryKind::device) continue;
    const auto pattern = static_cast<std::uint8_t>((s.offset / 256) * 31 + s.spec.bytes);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < s.spec.bytes; ++i) bad += host[s.offset + i] != pattern;
    INFO("slot " << s.spec.name);
    CHECK(bad == 0);
  }
  // Pinned slots are plain host memory the CPU can write and the device can copy from.
  auto staging = pool.span<std::int32_t>(slots::kStaging[1]);
  for (std::size_t i = 0; i < staging.size(); ++i) staging[i] = static_cast<std::int32_t>(i * 7 + 1);
  auto meta = pool.span<std::int32_t>(slots::kChunkMeta);
  REQUIRE(meta.size() >= staging.size());
  SPG_CUDA_TRY(cudaMemcpy(meta.data(), staging.data(), staging.size_bytes(), cudaMemcpyHostToDevice));
  std::vector<std::int32_t> back(staging.size());
  SPG_CUDA_TRY(cudaMemcpy(back.data(), meta.data(), staging.size_bytes(), cudaMemcpyDeviceToHost));
  CHECK(std::equal(back.begin(), back.end(), staging.begin()));
}

TEST_CASE("a pool larger than the device is refused before allocating", "[gpu][pool]") {
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  SPG_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total));
  PoolPlan plan;
  plan.add(SlotSpec{"huge", total * 2});
  try {
    BufferPool pool(plan);
    FAIL("expected CapacityError");
  } catch (const spg::CapacityError& e) {
    CHECK(std::string(e.what()).find("only") != std::string::npos);
  }
  std::size_t after = 0;
  SPG_CUDA_TRY(cudaMemGetInfo(&after, &total));
  CHECK(after + (64u << 20) >= free_bytes);  // nothing was taken
}

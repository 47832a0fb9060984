# The public headers: what `cmake --install` puts under include/ and a find_package(spgraph)
# consumer may include. Everything else in the tree is internal: device code (*_kernel.cuh and
# the other .cuh), src/spgraph/graphs/pipeline.hpp (the executor's recording), src/spgraph/scheduler/detail, the
# launchers' helpers, and the test and sample support (cmake/spgraph_support.cmake). Paths are
# relative to the include root src/ (as a consumer writes them: #include <spgraph/graphs/executor.hpp>);
# tests/ compiles each on its own (spgraph_header_check).
set(SPGRAPH_PUBLIC_HEADERS
  spgraph/memory/buffer_pool.hpp
  spgraph/model/cache_format.hpp
  spgraph/core/error.hpp
  spgraph/model/pipeline_config.hpp
  spgraph/memory/pool_plan.hpp
  spgraph/core/resources.hpp
  spgraph/kernels/chunk.hpp
  spgraph/core/device_info.hpp
  spgraph/core/divisor.hpp
  spgraph/core/host_device.hpp
  spgraph/kernels/step_status.hpp
  spgraph/kernels/combine_indices/combine_indices.hpp
  spgraph/kernels/kv_cache/kv_cache.hpp
  spgraph/kernels/sparse_mla/sparse_mla.hpp
  spgraph/kernels/stage_in/stage_in.hpp
  spgraph/kernels/step_loop/step_loop.hpp
  spgraph/graphs/buckets.hpp
  spgraph/graphs/chunk_format.hpp
  spgraph/graphs/chunk_split.hpp
  spgraph/graphs/executor.hpp
  spgraph/graphs/graph.hpp
  spgraph/graphs/layer_buffers.hpp
  spgraph/graphs/pipeline_pool.hpp
  spgraph/graphs/run_status.hpp
  spgraph/graphs/step.hpp
  spgraph/scheduler/block_allocator.hpp
  spgraph/scheduler/cache_kind.hpp
  spgraph/scheduler/chunk_plan.hpp
  spgraph/scheduler/prefill_scheduler.hpp
  spgraph/scheduler/request.hpp
  spgraph/scheduler/workload.hpp)

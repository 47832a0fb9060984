# The public headers: what `cmake --install` puts under include/ and a find_package(spgraph)
# consumer may include. Everything else in the tree is internal: device code (*_kernel.cuh and
# the other .cuh), graphs/pipeline.hpp (the executor's recording), scheduler/detail, the
# launchers' helpers, and the test and sample support (cmake/spgraph_support.cmake). Paths are
# relative to the include root; tests/ compiles each on its own (spgraph_header_check).
set(SPGRAPH_PUBLIC_HEADERS
  memory/buffer_pool.hpp
  memory/cache_format.hpp
  memory/error.hpp
  memory/pipeline_config.hpp
  memory/pool_plan.hpp
  memory/resources.hpp
  kernels/chunk.hpp
  kernels/device_info.hpp
  kernels/host_device.hpp
  kernels/step_status.hpp
  kernels/combine_indices/combine_indices.hpp
  kernels/kv_cache/kv_cache.hpp
  kernels/sparse_mla/sparse_mla.hpp
  kernels/stage_in/stage_in.hpp
  kernels/step_loop/step_loop.hpp
  graphs/buckets.hpp
  graphs/chunk_format.hpp
  graphs/chunk_split.hpp
  graphs/executor.hpp
  graphs/graph.hpp
  graphs/layer_buffers.hpp
  graphs/pipeline_pool.hpp
  graphs/run_status.hpp
  graphs/step.hpp
  scheduler/block_allocator.hpp
  scheduler/cache_kind.hpp
  scheduler/chunk_plan.hpp
  scheduler/prefill_scheduler.hpp
  scheduler/request.hpp
  scheduler/workload.hpp)

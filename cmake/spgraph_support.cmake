# spgraph_support: what tests, samples, the bench and the Python extension need beside the library,
# and what an engine does not: the CPU references and accuracy bars (src/spgraph/kernels/reference), the
# model front that stands in for a real model (src/spgraph/kernels/synthetic_front), the output checksum
# (src/spgraph/kernels/checksum), the spin kernel that keeps a device busy (src/spgraph/kernels/spin)
# and the CUPTI allocation counter (src/spgraph/memory/allocation_counter). It is never
# installed, and it alone links CUPTI: a find_package(spgraph) consumer links neither (the
# install_consumer test checks).
#
# spgraph_add_support_library(<source root>) defines it against an existing spgraph::spgraph: the
# project's own build, or an installed library (the Python extension built against an install
# compiles these few sources itself; python/CMakeLists.txt).
function(spgraph_add_support_library root)
  add_library(spgraph_support STATIC
    ${root}/src/spgraph/kernels/checksum/checksum.cu
    ${root}/src/spgraph/kernels/reference/accuracy.cpp
    ${root}/src/spgraph/kernels/reference/combine_indices_reference.cpp
    ${root}/src/spgraph/kernels/reference/kv_cache_reference.cpp
    ${root}/src/spgraph/kernels/reference/pipeline_reference.cpp
    ${root}/src/spgraph/kernels/reference/sparse_mla_reference.cpp
    ${root}/src/spgraph/kernels/spin/spin.cu
    ${root}/src/spgraph/kernels/synthetic_front/synthetic_front.cu
    ${root}/src/spgraph/memory/allocation_counter.cpp)
  add_library(spgraph::support ALIAS spgraph_support)
  target_include_directories(spgraph_support PUBLIC $<BUILD_INTERFACE:${root}/src>)
  # CUPTI is PRIVATE: no header of the target names it (a static library still hands it to the
  # final link).
  target_link_libraries(spgraph_support PUBLIC spgraph::spgraph PRIVATE CUDA::cupti)
  set_target_properties(spgraph_support PROPERTIES EXPORT_NAME support POSITION_INDEPENDENT_CODE ON
                                                   CUDA_SEPARABLE_COMPILATION OFF)
  if(COMMAND spgraph_set_warnings)
    spgraph_set_warnings(spgraph_support)
  endif()
endfunction()

# Warnings as errors for spgraph's own code, host and device.
function(spgraph_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-missing-field-initializers -Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings --expt-relaxed-constexpr -Xcompiler=-Wall,-Wextra,-Werror>)
endfunction()

# Implicit narrowing and sign changes are errors in the library's own host sources (its .cpp files
# and the headers they include). Not for the CUDA sources (nvcc's host pass sees CCCL and the
# kernels' index arithmetic), nor for tests, samples and the support target: docs/testing.md,
# "Conversion warnings", has the count and the reason.
function(spgraph_set_conversion_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wconversion -Wsign-conversion>)
endfunction()

# Warnings as errors for spgraph's own code, host and device.
function(spgraph_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-missing-field-initializers -Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings --expt-relaxed-constexpr -Xcompiler=-Wall,-Wextra,-Werror>)
endfunction()

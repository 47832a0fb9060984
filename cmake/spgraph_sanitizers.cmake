# Sanitizer and fuzzer instrumentation of the host C++ sources (the asan preset, docs/testing.md).
# Only C++ is instrumented: nvcc compiles the .cu files with its own host compiler, whose
# sanitizer runtime would not match Clang's; executables link through the C++ compiler, which
# brings the runtime in.
if(SPGRAPH_SANITIZE)
  add_compile_options(
    "$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${SPGRAPH_SANITIZE};-fno-sanitize-recover=all;-fno-omit-frame-pointer>")
  add_link_options("$<$<LINK_LANGUAGE:CXX>:-fsanitize=${SPGRAPH_SANITIZE}>")
endif()
if(SPGRAPH_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "SPGRAPH_BUILD_FUZZERS needs Clang (libFuzzer); CMAKE_CXX_COMPILER is ${CMAKE_CXX_COMPILER_ID}")
  endif()
  # Coverage for the fuzzers' guidance in every host source; the fuzz targets add -fsanitize=fuzzer.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>")
endif()

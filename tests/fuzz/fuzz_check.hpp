// What a fuzz target asserts: a property that fails prints what failed and aborts, which libFuzzer
// reports as a crash (and saves the input). Used instead of assert() so release builds keep it.
#pragma once

#include <cstdio>
#include <cstdlib>

#define SPG_FUZZ_CHECK(cond, ...)                                                        \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                 \
      std::fprintf(stderr, "\n");                                                        \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

// Argument-check tests: a call refused with spg::InvalidArgument whose message names the argument.
#pragma once

#include <string>

#include "common/catch.hpp"
#include "spgraph/core/error.hpp"

namespace spg::test {

/// `check(a)` must throw InvalidArgument with `needle` in its message.
template <class Args, class Check>
void expect_rejected(const Args& a, Check check, const char* needle) {
  INFO(needle);
  try {
    check(a);
    FAIL("accepted");
  } catch (const spg::InvalidArgument& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

}  // namespace spg::test

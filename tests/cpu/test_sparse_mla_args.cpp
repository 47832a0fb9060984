// Argument checking of sparse MLA attention (SparseMla::can_implement), which needs no device:
// every bound it enforces is named in its InvalidArgument message.
#include <cstdint>
#include <limits>
#include <string>

#include "common/catch.hpp"
#include "common/sparse_mla_shape_args.hpp"
#include "kernels/sparse_mla/sparse_mla.hpp"
#include "memory/error.hpp"

namespace {

namespace k = spg::kernels;
using spg::test::mla::shape_only_args;

}  // namespace

TEST_CASE("sparse_mla: can_implement names what the kernels do not implement", "[sparse_mla]") {
  const k::SparseMlaArgs a = shape_only_args(100, 128, 5, 128, 512);
  REQUIRE_NOTHROW(k::SparseMla::can_implement(a));
  auto rejects = [&](auto mutate, const char* name) {
    k::SparseMlaArgs b = a;
    mutate(b);
    INFO(name);
    try {
      k::SparseMla::can_implement(b);
      FAIL("accepted");
    } catch (const spg::InvalidArgument& e) {
      CHECK(std::string(e.what()).find(name) != std::string::npos);
    }
  };
  rejects([](k::SparseMlaArgs& b) { b.h_q = 96; }, "h_q");
  rejects([](k::SparseMlaArgs& b) { b.d_qk = 128; b.kv_row_stride = 128; }, "d_qk");
  rejects([](k::SparseMlaArgs& b) { b.topk = 100; }, "topk");
  rejects([](k::SparseMlaArgs& b) { b.topk = 0; }, "topk");
  rejects([](k::SparseMlaArgs& b) { b.s_q = 0; }, "s_q");
  rejects([](k::SparseMlaArgs& b) { b.kv_row_stride = 500; }, "kv_row_stride");
  rejects([](k::SparseMlaArgs& b) { b.kv_row_stride = 516; }, "kv_row_stride");
  rejects([](k::SparseMlaArgs& b) { b.q = reinterpret_cast<const __nv_bfloat16*>(std::uintptr_t{0x10008}); }, "q");
  rejects([](k::SparseMlaArgs& b) { b.kv = nullptr; }, "kv");
  rejects([](k::SparseMlaArgs& b) { b.num_splits = 3; }, "num_splits");
  rejects([](k::SparseMlaArgs& b) { b.s_q = 20'000'000; b.h_q = 128; }, "output rows");
  rejects([](k::SparseMlaArgs& b) { b.sm_scale = std::numeric_limits<float>::infinity(); }, "sm_scale");
}

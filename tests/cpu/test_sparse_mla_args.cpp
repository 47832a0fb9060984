// Argument checking of sparse MLA attention (SparseMla::can_implement), which needs no device:
// every bound it enforces is named in its InvalidArgument message.
#include <cstdint>
#include <limits>
#include <string>

#include "common/catch.hpp"
#include "common/sparse_mla_shape_args.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/kernels/sparse_mla/sparse_mla.hpp"

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
  rejects([](k::SparseMlaArgs& b) { b.s_q = -1; }, "s_q");
  rejects([](k::SparseMlaArgs& b) { b.kv_row_stride = 500; }, "kv_row_stride");
  rejects([](k::SparseMlaArgs& b) { b.kv_row_stride = 516; }, "kv_row_stride");
  rejects([](k::SparseMlaArgs& b) { b.q = reinterpret_cast<const __nv_bfloat16*>(std::uintptr_t{0x10008}); }, "q");
  rejects([](k::SparseMlaArgs& b) { b.kv = nullptr; }, "kv");
  rejects([](k::SparseMlaArgs& b) { b.num_splits = 3; }, "num_splits");
  rejects([](k::SparseMlaArgs& b) { b.s_q = 20'000'000; b.h_q = 128; }, "output rows");
  rejects([](k::SparseMlaArgs& b) { b.sm_scale = std::numeric_limits<float>::infinity(); }, "sm_scale");
  rejects([](k::SparseMlaArgs& b) { b.kv_row_stride = std::int64_t{1} << 39; }, "kv_row_stride");
}

TEST_CASE("sparse_mla: can_implement bounds the q and out token strides", "[sparse_mla]") {
  // h_q 128, d_qk 576: contiguous q tokens are 73728 elements apart, out tokens 65536.
  k::SparseMlaArgs a = shape_only_args(100, 128, 5, 128, 576);
  a.kv_row_stride = 576;
  auto accepts = [&](std::int64_t q_stride, std::int64_t out_stride) {
    k::SparseMlaArgs b = a;
    b.q_token_stride = q_stride;
    b.out_token_stride = out_stride;
    INFO("q_token_stride " << q_stride << ", out_token_stride " << out_stride);
    CHECK_NOTHROW(k::SparseMla::can_implement(b));
  };
  accepts(0, 0);
  accepts(73728, 65536);           // the contiguous sizes, spelled out
  accepts(73728 + 8, 65536 + 8);   // 16-byte padding
  accepts(200000, 131072);
  // Every refusal names the argument, its value and the bound it breaks.
  auto rejects = [&](const char* name, std::int64_t q_stride, std::int64_t out_stride, const char* value,
                     const char* bound) {
    k::SparseMlaArgs b = a;
    b.q_token_stride = q_stride;
    b.out_token_stride = out_stride;
    INFO(name << " = " << value);
    try {
      k::SparseMla::can_implement(b);
      FAIL("accepted");
    } catch (const spg::InvalidArgument& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find(name) != std::string::npos);
      CHECK(what.find(value) != std::string::npos);
      CHECK(what.find(bound) != std::string::npos);
    }
  };
  rejects("q_token_stride", 73720, 0, "73720", "73728");          // below the contiguous size
  rejects("q_token_stride", -8, 0, "-8", "73728");                // negative
  rejects("q_token_stride", 73728 + 4, 0, "73732", "multiple of 8");
  rejects("q_token_stride", std::int64_t{1} << 39, 0, "549755813888", "2^40 bytes");
  rejects("out_token_stride", 0, 65535, "65535", "65536");
  rejects("out_token_stride", 0, -65536, "-65536", "65536");
  rejects("out_token_stride", 0, 65536 + 12, "65548", "multiple of 8");
  rejects("out_token_stride", 0, std::int64_t{1} << 39, "549755813888", "2^40 bytes");
  // h_q 64: the contiguous sizes halve.
  k::SparseMlaArgs h64 = shape_only_args(100, 128, 5, 64, 512);
  h64.q_token_stride = 32768;
  h64.out_token_stride = 32768;
  CHECK_NOTHROW(k::SparseMla::can_implement(h64));
  h64.q_token_stride = 32760;
  CHECK_THROWS_AS(k::SparseMla::can_implement(h64), spg::InvalidArgument);
}

TEST_CASE("sparse_mla: initialize checks the arguments before it asks the device", "[sparse_mla]") {
  // No GPU here: an InvalidArgument naming the argument proves can_implement ran first (a device
  // query would have thrown CudaError).
  k::SparseMlaArgs a = shape_only_args(100, 128, 5, 128, 512);
  a.h_q = 96;
  try {
    (void)k::SparseMla::initialize(a, nullptr);
    FAIL("accepted");
  } catch (const spg::InvalidArgument& e) {
    CHECK(std::string(e.what()).find("h_q") != std::string::npos);
  }
}

TEST_CASE("sparse_mla: an empty prepared launch launches nothing", "[sparse_mla]") {
  const k::SparseMlaLaunch empty;
  CHECK(empty.empty());
  CHECK(empty.run(nullptr) == cudaErrorInvalidValue);
  CHECK_FALSE(empty.plan().split);
  CHECK(empty.plan().num_splits == 1);
}

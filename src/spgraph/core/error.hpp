// spgraph's error types and the two macros that raise them.
//
// Set-up code (planning, warm-up, capture) throws; the replay path never does (it returns a
// status). See docs/errors.md for the two tiers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace spg {

/// @brief Base of every exception spgraph throws; the message starts with "file:line: ".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// @brief A CUDA runtime call failed; carries the cudaError_t.
class CudaError : public Error {
 public:
  CudaError(cudaError_t status, const std::string& what) : Error(what), status_(status) {}
  [[nodiscard]] cudaError_t status() const noexcept { return status_; }

 private:
  cudaError_t status_;
};

/// @brief An argument is outside what an op or planner supports; the message names it and its bounds.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// @brief A request for more memory than a slot, pool or device holds.
class CapacityError : public Error {
 public:
  using Error::Error;
};

/// @brief An operation that the object's current state forbids (a sealed pool, a capture in flight).
class StateError : public Error {
 public:
  using Error::Error;
};

namespace detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  std::ostringstream os;
  os << file << ':' << line << ": CUDA call `" << call << "` failed with " << cudaGetErrorName(status) << " ("
     << cudaGetErrorString(status) << ')';
  throw CudaError(status, os.str());
}

template <class E>
[[noreturn]] void throw_expects(const char* cond, const std::string& msg, const char* file, int line) {
  std::ostringstream os;
  os << file << ':' << line << ": " << msg << " [failed: " << cond << ']';
  throw E(os.str());
}

/// Builds a message from streamable parts: SPG_EXPECTS(x > 0, "top_k = " << k << " must be ...").
struct MessageBuilder {
  std::ostringstream os;
  template <class T>
  MessageBuilder& operator<<(const T& v) {
    os << v;
    return *this;
  }
  std::string str() const { return os.str(); }
};

}  // namespace detail
}  // namespace spg

/// Throws spg::CudaError (with file:line, the call and the CUDA error name) unless `call` returns
/// cudaSuccess. Set-up code only: the replay path checks statuses without throwing.
#define SPG_CUDA_TRY(call)                                                       \
  do {                                                                           \
    const cudaError_t spg_status_ = (call);                                      \
    if (spg_status_ != cudaSuccess) {                                            \
      (void)cudaGetLastError();                                                  \
      ::spg::detail::throw_cuda_error(spg_status_, #call, __FILE__, __LINE__);   \
    }                                                                            \
  } while (0)

/// Throws `error_type` (default spg::InvalidArgument) with a streamed message unless `cond` holds:
///   SPG_EXPECTS(h_q == 64 || h_q == 128, "h_q = " << h_q << " must be 64 or 128");
#define SPG_EXPECTS_AS(error_type, cond, msg)                                                     \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      ::spg::detail::throw_expects<error_type>(#cond, (::spg::detail::MessageBuilder{} << msg).str(), \
                                               __FILE__, __LINE__);                               \
    }                                                                                             \
  } while (0)

#define SPG_EXPECTS(cond, msg) SPG_EXPECTS_AS(::spg::InvalidArgument, cond, msg)

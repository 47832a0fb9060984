// CPU reference of sparse MLA attention in double precision: the oracle of the GPU tests.
//
// Implements docs/pipeline.md, "Sparse attention semantics", literally (masking, natural-log lse
// without the sink, the sink in the normalizer, empty rows), for any h_q and any d_qk >= 512.
// Work is spread over tokens with std::thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace spg::kernels::reference {

/// @brief Host inputs of the reference; bf16 tensors are passed widened to float.
struct SparseMlaReferenceInputs {
  std::span<const float> q;                   ///< [s_q, h_q, d_qk]
  std::span<const float> kv;                  ///< [s_kv, d_qk] (dense rows)
  std::span<const std::int32_t> indices;      ///< [s_q, topk]
  std::span<const std::int32_t> topk_length;  ///< [s_q] or empty
  std::span<const float> attn_sink;           ///< [h_q] or empty
  int s_q{0};
  int s_kv{0};
  int h_q{0};
  int d_qk{0};
  int topk{0};
  double sm_scale{0.0};
  int num_tokens{-1};  ///< tokens at or past it are empty rows; -1: none
  /// Optional map from a token to the row of `q` that holds its query (for tests that repeat a
  /// pattern of query rows over many tokens); empty: token i uses row i.
  std::span<const std::int32_t> q_row_of_token;
};

/// @brief Reference outputs for the tokens asked for, in that order.
struct SparseMlaReferenceOutputs {
  std::vector<double> out;         ///< [tokens, h_q, 512]
  std::vector<double> max_logits;  ///< [tokens, h_q]
  std::vector<double> lse;         ///< [tokens, h_q]
};

/// @brief Runs the reference for `tokens` (all tokens when empty) on `threads` threads
///        (0: std::thread::hardware_concurrency()).
/// @throws InvalidArgument when the spans are shorter than the shape needs, d_qk < 512, or a
///         token is out of range.
SparseMlaReferenceOutputs sparse_mla_reference(const SparseMlaReferenceInputs& in, std::span<const int> tokens = {},
                                               int threads = 0);

}  // namespace spg::kernels::reference

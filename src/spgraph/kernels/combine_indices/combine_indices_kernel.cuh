// Device code of stage 3: one warp per token writes its combined index row and length.
//
// Each CTA first reads the chunk's per-request metadata into shared memory and checks it, so a
// token finds its request with a binary search over query_start_loc. Formulas: docs/pipeline.md,
// "Stages of one chunk", stage 3.
#pragma once

#include <cstdint>
#include <limits>

#include "spgraph/kernels/chunk.hpp"
#include "spgraph/kernels/combine_indices/combine_indices.hpp"
#include "spgraph/kernels/step_status.hpp"

namespace spg::kernels::detail {

inline constexpr int kCombineThreads = 256;
inline constexpr int kCombineWarps = kCombineThreads / 32;
/// int4 top-k loads a lane has in flight (512 entries a warp per pass).
inline constexpr int kCombineVectors = 4;
static_assert(kCombineThreads > kMaxRequestsBucket, "one thread per query_start_loc entry");

struct CombineParams {
  const std::int32_t* topk;
  int top_k;
  int compress_ratio;
  int window;
  ChunkArrays chunk;
  int tokens_bucket;
  int requests_bucket;
  std::int32_t* combined;
  int combined_width;
  std::int32_t* lens;
  StepStatus* status;
  int topk_stride;  // elements between two tokens' top-k rows
  const std::int32_t* token_offset;  // null: 0
  std::int64_t topk_rows;
  ScalarArg n_rows;  // standalone calls (chunk.scalars null)
  ScalarArg m_rows;
};

/// Per-lane tally of bad top-k entries; the warp reports them with one atomic.
struct TopkFaults {
  std::uint32_t count{0};
  int first_value{0};

  __device__ __forceinline__ int map(int v, int rows, int offset) {
    if (v == -1) return -1;
    if (v >= 0 && v < rows) return v + offset;
    if (count == 0) first_value = v;
    ++count;
    return -1;
  }
};

__global__ void __launch_bounds__(kCombineThreads) combine_indices_kernel(CombineParams p) {
  __shared__ int s_qsl[kMaxRequestsBucket + 1];
  __shared__ int s_seq[kMaxRequestsBucket];
  __shared__ int s_window_start[kMaxRequestsBucket];  // seq_len - gather_len
  __shared__ int s_ok[kMaxRequestsBucket];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int t = static_cast<int>(blockIdx.x) * kCombineWarps + tid / 32;
  // Everything below is in bounds whatever the step's values (arrays are sized by the buckets), so
  // it is loaded at once, before the scalars are known: the metadata, and the token's first
  // kCombineVectors top-k vectors. A chunk of a step (token_offset) loads its top-k rows only once
  // num_tokens says the token is real: past it lie other chunks' rows, or the buffer's end.
  const bool in_step = p.token_offset != nullptr;
  const int first_row = in_step ? __ldg(p.token_offset) : 0;
  const bool vector_path = p.topk != nullptr && p.top_k % 4 == 0 && p.topk_stride % 4 == 0;
  const std::int32_t* __restrict__ in =
      p.topk != nullptr ? p.topk + (static_cast<std::int64_t>(first_row) + t) * p.topk_stride : nullptr;
  int4 first_vectors[kCombineVectors];
#pragma unroll
  for (int k = 0; k < kCombineVectors; ++k) {
    const int j = 4 * lane + 128 * k;
    first_vectors[k] = !in_step && vector_path && t < p.tokens_bucket && j < p.top_k
                           ? __ldcs(reinterpret_cast<const int4*>(in + j))
                           : make_int4(-1, -1, -1, -1);
  }
  int qsl = 0;
  int seq = 0;
  int gather = 0;
  if (tid <= p.requests_bucket) qsl = __ldg(p.chunk.query_start_loc + tid);
  if (tid < p.requests_bucket) {
    seq = __ldg(p.chunk.seq_lens + tid);
    gather = __ldg(p.chunk.gather_lens + tid);
  }
  // A standalone call (CombineIndicesArgs) has every request of the bucket, N and M as arguments,
  // query_start_loc relative to its first entry, and as many tokens as query_start_loc spans.
  const bool standalone = p.chunk.scalars == nullptr;
  ChunkScalars sc{};
  unsigned qsl_base = 0;
  if (standalone) {
    sc.num_requests = p.requests_bucket;
    sc.n_rows = p.n_rows.device != nullptr ? __ldg(p.n_rows.device) : p.n_rows.value;
    sc.m_rows = p.m_rows.device != nullptr ? __ldg(p.m_rows.device) : p.m_rows.value;
    qsl_base = static_cast<unsigned>(__ldg(p.chunk.query_start_loc));
  } else {
    sc = *p.chunk.scalars;
  }
  if (tid <= p.requests_bucket) s_qsl[tid] = static_cast<int>(static_cast<unsigned>(qsl) - qsl_base);
  __syncthreads();
  if (standalone) sc.num_tokens = s_qsl[p.requests_bucket];
  bool chunk_ok = sc.num_requests >= 0 && sc.num_requests <= p.requests_bucket && sc.num_tokens >= 0 &&
                  sc.num_tokens <= p.tokens_bucket && sc.n_rows >= 0 && sc.n_rows <= sc.m_rows &&
                  sc.m_rows <= std::numeric_limits<std::int32_t>::max() / p.requests_bucket &&
                  (!in_step || p.topk == nullptr ||
                   (first_row >= 0 && static_cast<std::int64_t>(first_row) + sc.num_tokens <= p.topk_rows));
  const int nr = chunk_ok ? sc.num_requests : 0;
  // query_start_loc must rise from 0 to num_tokens: every thread checks one step.
  bool step_ok = true;
  if (chunk_ok) {
    if (tid < nr) step_ok = s_qsl[tid] <= s_qsl[tid + 1];
    if (tid == 0) step_ok = step_ok && s_qsl[0] == 0 && s_qsl[nr] == sc.num_tokens;
  }
  chunk_ok = __syncthreads_and(chunk_ok && step_ok) != 0;
  if (!chunk_ok && blockIdx.x == 0 && tid == 0) {
    record_fault(p.status, Fault::scalars, 1, -1, -1, sc.num_requests);
  }
  if (chunk_ok && tid < nr) {
    const int qlen = s_qsl[tid + 1] - s_qsl[tid];
    // Tokens need pos >= 0, the window rows they index gathered, and all rows inside M.
    const int needed = min(seq, qlen + p.window - 1);
    const bool ok = qlen == 0 || (qlen <= seq && gather >= needed && gather <= seq &&
                                  sc.n_rows + gather <= sc.m_rows &&
                                  (p.compress_ratio == 1 || seq / p.compress_ratio <= sc.n_rows));
    s_ok[tid] = ok ? 1 : 0;
    s_seq[tid] = seq;
    s_window_start[tid] = seq - gather;
    if (!ok && blockIdx.x == 0) record_fault(p.status, Fault::seq_len, 1, tid, gather, seq);
  }
  __syncthreads();

  if (t >= p.tokens_bucket) return;
  if (!chunk_ok || t >= sc.num_tokens) {
    if (lane == 0) p.lens[t] = 0;
    return;
  }
  // The request b with qsl[b] <= t < qsl[b + 1] (empty requests share a start; take the last).
  int lo = 0;
  int hi = nr;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (s_qsl[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int b = lo;
  if (s_ok[b] == 0) {
    if (lane == 0) p.lens[t] = 0;
    return;
  }
  if (in_step && vector_path) {  // a real token of a step's chunk: its row is in the buffer
#pragma unroll
    for (int k = 0; k < kCombineVectors; ++k) {
      const int j = 4 * lane + 128 * k;
      if (j < p.top_k) first_vectors[k] = __ldcs(reinterpret_cast<const int4*>(in + j));
    }
  }
  const int seq_len = s_seq[b];
  const int qstart = s_qsl[b];
  const int qlen = s_qsl[b + 1] - qstart;
  const int pos = seq_len - qlen + (t - qstart);
  const int r = p.compress_ratio;
  const int topk_len = r > 1 ? min((pos + 1) / r, p.top_k) : 0;
  const int swa_len = min(pos + 1, p.window);
  const int offset = sc.m_rows * b;
  const int window_base = offset + sc.n_rows + (pos - swa_len + 1 - s_window_start[b]);
  if (lane == 0) p.lens[t] = topk_len + swa_len;

  std::int32_t* __restrict__ out = p.combined + static_cast<std::int64_t>(t) * p.combined_width;
  TopkFaults faults;
  if (topk_len > 0) {
    const int rows = seq_len / r;
    if (vector_path) {
      // Each pass loads kCombineVectors int4 per lane before it maps and stores any of them.
      for (int base = 0; base < topk_len; base += 128 * kCombineVectors) {
        int4 v[kCombineVectors];
#pragma unroll
        for (int k = 0; k < kCombineVectors; ++k) {
          const int j = base + 4 * lane + 128 * k;
          v[k] = base == 0 ? first_vectors[k]
                           : (j < topk_len ? __ldcs(reinterpret_cast<const int4*>(in + j)) : make_int4(-1, -1, -1, -1));
        }
#pragma unroll
        for (int k = 0; k < kCombineVectors; ++k) {
          const int j = base + 4 * lane + 128 * k;
          if (j >= topk_len) continue;
          const int4 m = make_int4(faults.map(v[k].x, rows, offset),
                                   j + 1 < topk_len ? faults.map(v[k].y, rows, offset) : -1,
                                   j + 2 < topk_len ? faults.map(v[k].z, rows, offset) : -1,
                                   j + 3 < topk_len ? faults.map(v[k].w, rows, offset) : -1);
          if (j + 4 <= topk_len) {
            *reinterpret_cast<int4*>(out + j) = m;
          } else {
            // The last partial vector: entries from topk_len on belong to the window part.
            out[j] = m.x;
            if (j + 1 < topk_len) out[j + 1] = m.y;
            if (j + 2 < topk_len) out[j + 2] = m.z;
          }
        }
      }
    } else {
      for (int j = lane; j < topk_len; j += 32) out[j] = faults.map(__ldcs(in + j), rows, offset);
    }
  }
  for (int j = lane; j < swa_len; j += 32) out[topk_len + j] = window_base + j;

  const unsigned faulty = __ballot_sync(0xFFFFFFFFU, faults.count != 0);
  if (faulty != 0) {
    const std::uint32_t total = __reduce_add_sync(0xFFFFFFFFU, faults.count);
    if (lane == __ffs(static_cast<int>(faulty)) - 1) {
      record_fault(p.status, Fault::topk_index, total, b, t, faults.first_value);
    }
  }
}

}  // namespace spg::kernels::detail

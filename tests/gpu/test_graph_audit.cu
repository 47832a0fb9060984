// The graph audit: every kernel node of every step graph the executor captures reads and writes
// only inside the executor's pool (its device memory and pinned staging) or a buffer the caller
// bound, points its per-step metadata arguments only into the chunk metadata block, and each graph
// holds exactly the kernels the config implies (docs/graphs.md; docs/memory.md, "Engine-owned
// buffers"). The graphs are walked as warm-up captured them (Executor::record_graph); each node's
// kernel is named by its device symbol and its arguments decoded with the launchers' own parameter
// structs, and each pointer's byte range is computed from the static arguments beside it. The range
// logic is plain host code, exercised with deliberately bad ranges by the "[graph-audit]" case at
// the end, which needs no device.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/catch.hpp"
#include "executor_test_util.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/graphs/layer_buffers.hpp"
#include "spgraph/graphs/pipeline.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/kernels/sparse_mla/sparse_mla.hpp"
#include "spgraph/kernels/sparse_mla/sparse_mla_device.cuh"
#include "spgraph/kernels/stage_in/stage_in.hpp"
#include "spgraph/kernels/step_status.hpp"

// The parameter structs live beside their kernels, and those kernels are non-template __global__
// functions: a second definition in this file would clash with the library's host stubs at link
// time. So this file's copies are renamed (and never launched); only the structs are shared.
#define kv_insert_kernel graph_audit_unused_kv_insert_kernel
#define kv_gather_kernel graph_audit_unused_kv_gather_kernel
#include "spgraph/kernels/kv_cache/kv_cache_kernel.cuh"
#undef kv_gather_kernel
#undef kv_insert_kernel
#define combine_indices_kernel graph_audit_unused_combine_indices_kernel
#include "spgraph/kernels/combine_indices/combine_indices_kernel.cuh"
#undef combine_indices_kernel
#define sparse_mla_merge_kernel graph_audit_unused_sparse_mla_merge_kernel
#include "spgraph/kernels/sparse_mla/sparse_mla_kernel.cuh"
#undef sparse_mla_merge_kernel

using namespace spg;

namespace {

namespace d = spg::kernels::detail;
using bf16 = __nv_bfloat16;

// ------------------------------------------------------------------ byte ranges (host logic)

/// A block of memory kernel arguments may point into.
struct Region {
  std::string name;
  std::uintptr_t begin{0};
  std::size_t bytes{0};
};

/// Whether [begin, begin + bytes) lies inside `r`, without overflow for any input.
bool contains(const Region& r, std::uintptr_t begin, std::size_t bytes) noexcept {
  if (begin < r.begin) return false;
  const std::uintptr_t offset = begin - r.begin;
  return offset <= r.bytes && bytes <= r.bytes - offset;
}

bool overlaps(const Region& a, const Region& b) noexcept {
  return a.begin < b.begin + b.bytes && b.begin < a.begin + a.bytes;
}

/// Where an argument must point besides an allowed region: nowhere in particular, the chunk
/// metadata block (per-step values), or the pinned staging memory (the stage-in's source).
enum class Home { any, chunk_meta, staging };

/// The bytes one pointer argument lets its kernel touch, bounded by the static arguments.
struct ArgRange {
  std::string name;
  std::uintptr_t begin{0};
  std::size_t bytes{0};
  bool required{true};  ///< false: null is allowed (an optional input)
  Home home{Home::any};
};

/// `count` elements of `element` bytes; a negative or overflowing count gives the largest size,
/// which no region holds, so a bad static argument fails the audit rather than passing it.
std::size_t bytes_of(std::int64_t count, std::size_t element) noexcept {
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  if (count < 0 || static_cast<std::uint64_t>(count) > kMax / element) return kMax;
  return static_cast<std::size_t>(count) * element;
}

template <class T>
ArgRange arg_range(std::string name, const T* p, std::int64_t count, bool required = true, Home home = Home::any) {
  return ArgRange{std::move(name), reinterpret_cast<std::uintptr_t>(p), bytes_of(count, sizeof(T)), required, home};
}

/// Everywhere a step's kernels may point, and the two blocks some arguments must stay inside.
struct AllowedMemory {
  std::vector<Region> regions;  ///< the pool's device memory, its pinned memory, then every bound buffer
  Region chunk_meta;            ///< the device metadata block (found from the stage-in node)
  Region staging;               ///< the pool's pinned memory
};

std::string describe(const std::string& name, std::uintptr_t begin, std::size_t bytes) {
  std::ostringstream os;
  os << name << " [0x" << std::hex << begin << std::dec << ", +" << bytes << " B)";
  return os.str();
}
std::string describe(const ArgRange& a) { return describe(a.name, a.begin, a.bytes); }
std::string describe(const Region& r) { return describe(r.name, r.begin, r.bytes); }

/// One message per argument outside what it may touch; hits[i] counts the arguments found in
/// allowed.regions[i] (the first region that holds them).
std::vector<std::string> audit_ranges(const std::vector<ArgRange>& args, const AllowedMemory& allowed,
                                      std::vector<int>& hits) {
  std::vector<std::string> problems;
  if (hits.size() < allowed.regions.size()) hits.resize(allowed.regions.size(), 0);
  for (const ArgRange& a : args) {
    if (a.begin == 0) {
      if (a.required) problems.push_back(a.name + " is null");
      continue;
    }
    if (a.home == Home::chunk_meta && !contains(allowed.chunk_meta, a.begin, a.bytes)) {
      problems.push_back(describe(a) + " is not inside the " + describe(allowed.chunk_meta));
    }
    if (a.home == Home::staging && !contains(allowed.staging, a.begin, a.bytes)) {
      problems.push_back(describe(a) + " is not inside the " + describe(allowed.staging));
    }
    bool found = false;
    for (std::size_t i = 0; i < allowed.regions.size() && !found; ++i) {
      if (contains(allowed.regions[i], a.begin, a.bytes)) {
        ++hits[i];
        found = true;
      }
    }
    if (!found) problems.push_back(describe(a) + " lies in no allowed region (the pool or a bound buffer)");
  }
  return problems;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += (s.empty() ? "" : "; ") + l;
  return s;
}

// ------------------------------------------------------------------ the kernels, by name

enum class Kernel { stage_in, kv_insert, kv_gather, combine_indices, attention_wgmma, attention_mma, attention_merge };

const char* kernel_label(Kernel k) noexcept {
  switch (k) {
    case Kernel::stage_in: return "stage-in";
    case Kernel::kv_insert: return "kv insert";
    case Kernel::kv_gather: return "kv gather";
    case Kernel::combine_indices: return "combine indices";
    case Kernel::attention_wgmma: return "sparse MLA wgmma";
    case Kernel::attention_mma: return "sparse MLA mma.sync";
    case Kernel::attention_merge: return "sparse MLA merge";
  }
  return "?";
}

/// A kernel and, for the attention kernels, their template argument (d_qk).
struct KernelId {
  Kernel kernel{Kernel::stage_in};
  int d{0};
};

std::string demangled(const char* symbol) {
  int status = 0;
  const std::unique_ptr<char, decltype(&std::free)> out(abi::__cxa_demangle(symbol, nullptr, nullptr, &status),
                                                         &std::free);
  return status == 0 && out != nullptr ? std::string(out.get()) : std::string(symbol);
}

/// The op kernel a demangled device symbol names: an unqualified kernel name of the ops inside
/// spg::kernels, followed by its parameter list or template arguments. Anything else is unknown.
std::optional<KernelId> identify(const std::string& symbol) {
  struct Known {
    std::string_view name;
    Kernel kernel;
  };
  static constexpr Known kKnown[] = {{"stage_in_kernel", Kernel::stage_in},
                                     {"kv_insert_kernel", Kernel::kv_insert},
                                     {"kv_gather_kernel", Kernel::kv_gather},
                                     {"combine_indices_kernel", Kernel::combine_indices},
                                     {"sparse_mla_wgmma_kernel", Kernel::attention_wgmma},
                                     {"sparse_mla_kernel", Kernel::attention_mma},
                                     {"sparse_mla_merge_kernel", Kernel::attention_merge}};
  if (symbol.rfind("spg::kernels::", 0) != 0 && symbol.find(" spg::kernels::") == std::string::npos) return std::nullopt;
  for (const Known& k : kKnown) {
    for (std::size_t at = symbol.find(k.name); at != std::string::npos; at = symbol.find(k.name, at + 1)) {
      const std::size_t end = at + k.name.size();
      const char next = end < symbol.size() ? symbol[end] : '\0';
      if (at < 2 || symbol.compare(at - 2, 2, "::") != 0 || (next != '(' && next != '<')) continue;
      KernelId id{k.kernel, 0};
      if (next == '<') id.d = std::atoi(symbol.c_str() + end + 1);
      return id;
    }
  }
  return std::nullopt;
}

// ------------------------------------------------------------------ decoding kernelParams

/// Argument i of a node, copied out of the node's argument storage.
template <class T>
T arg(void* const* params, int i) {
  T v{};
  std::memcpy(&v, params[i], sizeof(T));
  return v;
}

/// One kernel node's arguments: the ranges its pointers may touch and the bounds they rest on.
struct DecodedNode {
  std::vector<ArgRange> ranges;
  std::vector<std::string> problems;  ///< static arguments that would let the kernel leave its ranges
  std::uintptr_t status{0};           ///< the StepStatus it counts faults in (0: the kernel has none)
  Region chunk_meta;                  ///< stage-in only: the metadata block it fills
  d::SparseMlaParams attention{};     ///< the wgmma and mma.sync kernels: their parameters
};

/// A cache's range is num_blocks * block_stride only when a block holds its rows and scale rows.
void check_block_stride(const std::string& cache, int block_size, std::int64_t block_stride,
                        std::vector<std::string>& problems) {
  if (block_size < 1 || block_stride < kernels::CacheLayout::min_block_stride(block_size)) {
    problems.push_back(cache + ": block_stride " + std::to_string(block_stride) + " is below what " +
                       std::to_string(block_size) + " rows need");
  }
}

void add_chunk(const kernels::ChunkArrays& c, std::int64_t requests, bool needs_qsl, bool needs_gather_lens,
               std::vector<ArgRange>& ranges) {
  ranges.push_back(arg_range("chunk.scalars", c.scalars, 1, true, Home::chunk_meta));
  ranges.push_back(arg_range("chunk.query_start_loc", c.query_start_loc, requests + 1, needs_qsl, Home::chunk_meta));
  ranges.push_back(arg_range("chunk.seq_lens", c.seq_lens, requests, true, Home::chunk_meta));
  ranges.push_back(arg_range("chunk.gather_lens", c.gather_lens, requests, needs_gather_lens, Home::chunk_meta));
}

/// The ranges of every pointer argument of kernel `id`, from its parameter layout: the stage-in
/// takes (staging, meta, vectors, status block, staging release) (stage_in.cu); the insert, gather and combine kernels
/// one parameter struct; the wgmma kernel SparseMlaParams then out's CUtensorMap (checked apart,
/// check_out_map); the mma.sync kernel SparseMlaParams; the merge kernel SparseMlaMergeParams.
DecodedNode decode(const KernelId& id, void* const* kp, const dim3& grid) {
  DecodedNode n;
  std::vector<ArgRange>& r = n.ranges;
  switch (id.kernel) {
    case Kernel::stage_in: {
      const auto* staging = arg<const uint4*>(kp, 0);
      const auto* meta = arg<uint4*>(kp, 1);
      const int vectors = arg<int>(kp, 2);
      const auto* status = arg<kernels::StatusBlock*>(kp, 3);  // the step's counters and the run's totals
      const auto release = arg<kernels::StagingRelease>(kp, 4);  // the executor's: pinned words, device counter
      r.push_back(arg_range("staging", staging, vectors, true, Home::staging));
      r.push_back(arg_range("release.sequence", release.sequence, 1, true, Home::staging));
      r.push_back(arg_range("release.released", release.released, 1, true, Home::staging));
      r.push_back(arg_range("release.arrivals", release.arrivals, 1));
      r.push_back(arg_range("meta", meta, vectors));
      r.push_back(arg_range("status", status, 1));
      n.status = reinterpret_cast<std::uintptr_t>(status);
      n.chunk_meta = Region{"chunk metadata block", reinterpret_cast<std::uintptr_t>(meta), bytes_of(vectors, 16)};
      break;
    }
    case Kernel::kv_insert: {
      const auto p = arg<d::InsertParams>(kp, 0);
      const bool derives = p.derive != nullptr;  // the block table and lengths are read only then
      r.push_back(arg_range("rows", p.rows, std::int64_t{p.rows_bucket} * kernels::kKvDim));
      r.push_back(arg_range("slot_mapping", p.slot_mapping, p.rows_bucket, true, Home::chunk_meta));
      r.push_back(arg_range("num_rows", p.num_rows, 1, true, Home::chunk_meta));
      r.push_back(arg_range("cache", p.cache, std::int64_t{p.num_blocks} * p.block_stride));
      r.push_back(arg_range("status", p.status, 1));
      r.push_back(arg_range("derive", p.derive, 1, false, Home::chunk_meta));
      r.push_back(arg_range("block_table", p.block_table, std::int64_t{p.requests_bucket} * p.block_table_stride, derives,
                            Home::chunk_meta));
      r.push_back(arg_range("query_start_loc", p.query_start_loc, std::int64_t{p.requests_bucket} + 1, derives,
                            Home::chunk_meta));
      r.push_back(arg_range("seq_lens", p.seq_lens, p.requests_bucket, derives, Home::chunk_meta));
      r.push_back(arg_range("num_requests", p.num_requests, 1, derives, Home::chunk_meta));
      check_block_stride("cache", p.block_size, p.block_stride, n.problems);
      n.status = reinterpret_cast<std::uintptr_t>(p.status);
      break;
    }
    case Kernel::kv_gather: {
      const auto p = arg<d::GatherParams>(kp, 0);
      const std::int64_t requests = p.requests_bucket;
      // A single-part launch passes its one cache as both sources.
      for (const auto& [part, s] : {std::pair{"compressed", p.compressed}, std::pair{"window", p.window}}) {
        const std::string name = part;
        r.push_back(arg_range(name + ".cache", s.cache, std::int64_t{s.num_blocks} * s.block_stride));
        r.push_back(
            arg_range(name + ".block_table", s.block_table, requests * s.block_table_stride, true, Home::chunk_meta));
        check_block_stride(name + ".cache", s.block_size, s.block_stride, n.problems);
      }
      add_chunk(p.chunk, requests, false, p.with_window, r);
      r.push_back(arg_range("kv", p.kv, requests * p.max_rows * kernels::kKvDim));
      r.push_back(arg_range("status", p.status, 1));
      n.status = reinterpret_cast<std::uintptr_t>(p.status);
      break;
    }
    case Kernel::combine_indices: {
      const auto p = arg<d::CombineParams>(kp, 0);
      const std::int64_t tokens = p.tokens_bucket;
      r.push_back(arg_range("topk_indices", p.topk, tokens * p.top_k, p.compress_ratio > 1));
      add_chunk(p.chunk, p.requests_bucket, true, true, r);
      r.push_back(arg_range("combined", p.combined, tokens * p.combined_width));
      r.push_back(arg_range("lens", p.lens, tokens));
      r.push_back(arg_range("status", p.status, 1));
      if (p.combined_width < p.top_k + p.window) {
        n.problems.push_back("combined_width " + std::to_string(p.combined_width) + " is below top_k + window");
      }
      n.status = reinterpret_cast<std::uintptr_t>(p.status);
      break;
    }
    case Kernel::attention_wgmma:
    case Kernel::attention_mma: {
      const auto p = arg<d::SparseMlaParams>(kp, 0);
      const std::int64_t s_q = p.s_q;
      const std::int64_t h = p.h_q;
      const std::int64_t rows = s_q * h;
      const std::int64_t splits = p.num_splits;
      r.push_back(arg_range("q", p.q, (s_q - 1) * p.q_token_stride + h * id.d));
      r.push_back(arg_range("kv", p.kv, std::int64_t{p.s_kv} * p.kv_row_stride));
      r.push_back(arg_range("indices", p.indices, s_q * p.topk));
      r.push_back(arg_range("topk_length", p.topk_length, s_q, false));
      r.push_back(arg_range("attn_sink", p.attn_sink, h, false));
      r.push_back(arg_range("num_tokens", p.num_tokens, 1, false, Home::chunk_meta));
      r.push_back(arg_range("out", p.out, (s_q - 1) * p.out_token_stride + h * kernels::kSparseMlaDv));
      r.push_back(arg_range("max_logits", p.max_logits, rows));
      r.push_back(arg_range("lse", p.lse, rows));
      r.push_back(arg_range("part_o", p.part_o, splits * rows * kernels::kSparseMlaDv, p.write_partials));
      r.push_back(arg_range("part_ml", p.part_ml, splits * rows, p.write_partials));
      if (id.d != 512 && id.d != 576) n.problems.push_back("d_qk " + std::to_string(id.d) + " is not 512 or 576");
      if (p.kv_row_stride < id.d) n.problems.push_back("kv_row_stride is below d_qk: kv rows overlap past s_kv rows");
      // An item is (token, 64 heads, slice), run by dv_parts CTAs (2: the split-dv pass): the
      // ranges above hold only the items of s_q tokens.
      if (p.dv_parts != 1 && !(p.dv_parts == 2 && id.kernel == Kernel::attention_wgmma && !p.write_partials)) {
        n.problems.push_back("dv_parts " + std::to_string(p.dv_parts) + " outside the wgmma single pass's 1 or 2");
      }
      const std::int64_t items = s_q * (h / kernels::kSparseMlaHeadsPerCta) * splits * p.dv_parts;
      const std::int64_t ctas = std::int64_t{grid.x} * grid.y * grid.z;
      if (p.num_items != items) {
        n.problems.push_back("num_items " + std::to_string(p.num_items) + " is not " + std::to_string(items));
      }
      // The wgmma kernel runs item blockIdx.x (no bound check); the mma.sync one walks items < num_items.
      if ((id.kernel == Kernel::attention_wgmma) ? (ctas != p.num_items) : (ctas > p.num_items)) {
        n.problems.push_back("a grid of " + std::to_string(ctas) + " CTAs for " + std::to_string(p.num_items) + " items");
      }
      n.attention = p;
      break;
    }
    case Kernel::attention_merge: {
      const auto m = arg<d::SparseMlaMergeParams>(kp, 0);
      const std::int64_t s_q = m.s_q;
      const std::int64_t h = m.h_q;
      const std::int64_t rows = s_q * h;
      r.push_back(arg_range("part_o", m.part_o, std::int64_t{m.num_splits} * rows * kernels::kSparseMlaDv));
      r.push_back(arg_range("part_ml", m.part_ml, std::int64_t{m.num_splits} * rows));
      r.push_back(arg_range("attn_sink", m.attn_sink, h, false));
      r.push_back(arg_range("out", m.out, (s_q - 1) * m.out_token_stride + h * kernels::kSparseMlaDv));
      r.push_back(arg_range("max_logits", m.max_logits, rows));
      r.push_back(arg_range("lse", m.lse, rows));
      break;
    }
  }
  return n;
}

/// The wgmma single pass stores out through a tensor map, which is opaque: it must be, byte for
/// byte, the map of out's own range ({512, h_q, s_q} with out's token stride, as sparse_mla.cu
/// encodes it), so its stores stay inside the range checked for `out`. The split path passes no
/// map (all zero: its out is written by the merge kernel).
std::string check_out_map(void* const* kp, const d::SparseMlaParams& p) {
  const auto got = arg<CUtensorMap>(kp, 1);
  CUtensorMap want{};
  if (!p.write_partials) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    SPG_CUDA_TRY(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) return "the driver gives no cuTensorMapEncodeTiled";
    const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kernels::kSparseMlaDv), static_cast<cuuint64_t>(p.h_q),
                                static_cast<cuuint64_t>(p.s_q)};
    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(kernels::kSparseMlaDv) * sizeof(bf16),
                                   static_cast<cuuint64_t>(p.out_token_stride) * sizeof(bf16)};
    const cuuint32_t box[3] = {64, 64, 1};
    const cuuint32_t element_strides[3] = {1, 1, 1};
    if (encode(&want, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, p.out, dims, strides, box, element_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      return "out's range cannot be encoded as a tensor map";
    }
  }
  if (std::memcmp(&got, &want, sizeof(CUtensorMap)) == 0) return {};
  return p.write_partials ? "the split kernel was given a tensor map (expected none)"
                          : "the out tensor map is not the map of out's range";
}

// ------------------------------------------------------------------ what a step graph must hold

/// The attention plan of a layer at a bucket, from the same static arguments the pipeline plans from.
kernels::SparseMlaPlan attention_plan(const model::PipelineConfig& c, const model::LayerConfig& l, int r_bucket,
                                      int t_bucket) {
  kernels::SparseMlaArgs a{};
  a.kv_row_stride = model::kHeadDim;
  a.s_kv = static_cast<int>(std::int64_t{r_bucket} * c.max_kv_rows(l));
  a.topk = l.combined_width();
  a.s_q = t_bucket;
  a.h_q = l.h_q;
  a.d_qk = l.d_qk;
  a.sm_scale = l.scale();
  return kernels::SparseMla::plan(a);
}

/// Kernel nodes of one step: the stage-in, then per layer gather, combine and attention, the
/// insert stage's one (SWA) or two (and compressed, r > 1) kernels, and a merge kernel where the
/// attention splits its top-k range.
int expected_node_count(const model::PipelineConfig& c, const std::vector<int>& layers, int r_bucket, int t_bucket,
                        bool insert) {
  int n = 1;
  for (const int i : layers) {
    const model::LayerConfig& l = c.layers[static_cast<std::size_t>(i)];
    n += 3 + (insert ? 1 + (l.compress_ratio > 1 ? 1 : 0) : 0) + (attention_plan(c, l, r_bucket, t_bucket).split ? 1 : 0);
  }
  return n;
}

struct ExpectedNode {
  Kernel kernel{Kernel::stage_in};
  int layer{-1};  ///< -1: the stage-in
  std::string stage;
  kernels::SparseMlaPlan plan{};  ///< the attention and merge nodes
};

/// The nodes in recording order (Pipeline::record): the stage-in, then each layer's stages.
std::vector<ExpectedNode> expected_nodes(const model::PipelineConfig& c, const std::vector<int>& layers, int r_bucket,
                                         int t_bucket, bool insert) {
  using graphs::Stage;
  std::vector<ExpectedNode> e{{Kernel::stage_in, -1, "stage-in", {}}};
  for (const int i : layers) {
    const model::LayerConfig& l = c.layers[static_cast<std::size_t>(i)];
    if (insert) e.push_back({Kernel::kv_insert, i, graphs::stage_name(Stage::insert_swa), {}});
    if (insert && l.compress_ratio > 1) {
      e.push_back({Kernel::kv_insert, i, graphs::stage_name(Stage::insert_compressed), {}});
    }
    e.push_back({Kernel::kv_gather, i, graphs::stage_name(Stage::gather), {}});
    e.push_back({Kernel::combine_indices, i, graphs::stage_name(Stage::combine), {}});
    const kernels::SparseMlaPlan plan = attention_plan(c, l, r_bucket, t_bucket);
    const bool wgmma = plan.kernel == kernels::SparseMlaKernel::wgmma_single_pass ||
                       plan.kernel == kernels::SparseMlaKernel::wgmma_split_topk ||
                       plan.kernel == kernels::SparseMlaKernel::wgmma_split_dv;
    e.push_back({wgmma ? Kernel::attention_wgmma : Kernel::attention_mma, i, graphs::stage_name(Stage::attention), plan});
    if (plan.split) e.push_back({Kernel::attention_merge, i, "attention merge", plan});
  }
  return e;
}

/// The graph's nodes in dependency order. A step is recorded on one stream, so its graph is a
/// chain: one root, and at most one dependent per node.
std::vector<cudaGraphNode_t> chain_of(cudaGraph_t g) {
  std::size_t count = 0;
  SPG_CUDA_TRY(cudaGraphGetNodes(g, nullptr, &count));
  std::vector<cudaGraphNode_t> all(count);
  SPG_CUDA_TRY(cudaGraphGetNodes(g, all.data(), &count));
  std::size_t roots = 0;
  SPG_CUDA_TRY(cudaGraphGetRootNodes(g, nullptr, &roots));
  REQUIRE(roots == 1);
  cudaGraphNode_t node = nullptr;
  SPG_CUDA_TRY(cudaGraphGetRootNodes(g, &node, &roots));
  std::vector<cudaGraphNode_t> chain;
  while (node != nullptr && chain.size() < count) {
    chain.push_back(node);
    // Edge data too: the gather's programmatic (PDL) edges are not default edges.
    cudaGraphNode_t next[2]{};
    cudaGraphEdgeData edges[2]{};
    std::size_t n = 2;
    SPG_CUDA_TRY(cudaGraphNodeGetDependentNodes(node, next, edges, &n));
    REQUIRE(n <= 1);
    node = n == 1 ? next[0] : nullptr;
  }
  REQUIRE(node == nullptr);
  REQUIRE(chain.size() == count);
  for (const cudaGraphNode_t c : chain) REQUIRE(std::find(all.begin(), all.end(), c) != all.end());
  return chain;
}

// ------------------------------------------------------------------ the audit of an executor

/// The bound buffers' spans, named by layer and buffer.
std::vector<Region> bound_regions(const std::vector<graphs::LayerBuffers>& buffers) {
  std::vector<Region> regions;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const graphs::LayerBuffers& b = buffers[i];
    auto add = [&](graphs::LayerBuffer which, std::uintptr_t begin, std::size_t bytes) {
      if (begin != 0) {
        regions.push_back({"layer " + std::to_string(i) + " " + graphs::layer_buffer_name(which), begin, bytes});
      }
    };
    auto view = [&](graphs::LayerBuffer which, const auto& v) {
      add(which, reinterpret_cast<std::uintptr_t>(v.data_handle()), graphs::span_bytes(v));
    };
    using B = graphs::LayerBuffer;
    view(B::q, b.q);
    view(B::topk_indices, b.topk_indices);
    view(B::k_rows, b.k_rows);
    view(B::compressed_k_rows, b.compressed_k_rows);
    add(B::swa_cache, reinterpret_cast<std::uintptr_t>(b.swa_cache.data), b.swa_cache.bytes());
    add(B::compressed_cache, reinterpret_cast<std::uintptr_t>(b.compressed_cache.data), b.compressed_cache.bytes());
    view(B::attn_sink, b.attn_sink);
    view(B::out, b.out);
    view(B::lse, b.lse);
    view(B::max_logits, b.max_logits);
  }
  return regions;
}

/// regions[0]: the pool's device memory; [1]: its pinned memory; then the bound buffers.
AllowedMemory allowed_memory(const graphs::Executor& ex, const std::vector<graphs::LayerBuffers>& bound) {
  AllowedMemory m;
  const memory::BufferPool& pool = ex.pool();
  m.regions.push_back({"pool (device)", reinterpret_cast<std::uintptr_t>(pool.device_base()), pool.device_bytes()});
  m.regions.push_back({"pool (pinned)", reinterpret_cast<std::uintptr_t>(pool.pinned_base()), pool.pinned_bytes()});
  m.staging = m.regions[1];
  for (Region& r : bound_regions(bound)) m.regions.push_back(std::move(r));
  return m;
}

struct AuditTally {
  std::vector<int> hits;  ///< per allowed region: the arguments found in it
  int graphs{0};
  int nodes{0};
};

/// Audits the graph of (program, bucket, staging); returns the staging block its stage-in reads.
std::uintptr_t audit_graph(const graphs::Executor& ex, int program, int bucket, int staging, bool insert,
                           AllowedMemory allowed, AuditTally& tally) {
  const model::PipelineConfig& cfg = ex.config();
  const std::vector<int>& layers = ex.program_layers(program);
  const int r_bucket = ex.buckets().r_of(bucket);
  const int t_bucket = ex.buckets().t_of(bucket);
  INFO("program " << program << ", bucket " << bucket << " (R" << r_bucket << " T" << t_bucket << "), staging block "
                  << staging);
  const graphs::Graph graph = ex.record_graph(program, bucket, staging);
  const std::vector<cudaGraphNode_t> nodes = chain_of(graph.get());
  const std::vector<ExpectedNode> expected = expected_nodes(cfg, layers, r_bucket, t_bucket, insert);
  const int count = expected_node_count(cfg, layers, r_bucket, t_bucket, insert);
  CHECK(static_cast<int>(expected.size()) == count);
  CHECK(static_cast<int>(nodes.size()) == count);
  CHECK(static_cast<int>(graph.node_count()) == count);
  CHECK(ex.pipeline(program, bucket).kernel_launches() == count);
  ++tally.graphs;

  std::uintptr_t status = 0;
  std::uintptr_t staging_block = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const ExpectedNode want = i < expected.size() ? expected[i] : ExpectedNode{Kernel::stage_in, -1, "(none expected)", {}};
    INFO("node " << i << ": expected layer " << want.layer << " " << want.stage);
    cudaGraphNodeType type{};
    SPG_CUDA_TRY(cudaGraphNodeGetType(nodes[i], &type));
    REQUIRE(type == cudaGraphNodeTypeKernel);
    cudaKernelNodeParams params{};
    SPG_CUDA_TRY(cudaGraphKernelNodeGetParams(nodes[i], &params));
    const char* raw = nullptr;
    SPG_CUDA_TRY(cudaFuncGetName(&raw, params.func));
    REQUIRE(raw != nullptr);
    const std::string symbol = demangled(raw);
    INFO("kernel " << symbol);
    const std::optional<KernelId> id = identify(symbol);
    REQUIRE(id.has_value());  // a kernel the audit does not know cannot be checked: fail
    REQUIRE(params.kernelParams != nullptr);
    CHECK(std::string(kernel_label(id->kernel)) == kernel_label(want.kernel));
    if (id->kernel == Kernel::attention_wgmma || id->kernel == Kernel::attention_mma) {
      REQUIRE(want.layer >= 0);
      CHECK(id->d == cfg.layers[static_cast<std::size_t>(want.layer)].d_qk);
    }
    const DecodedNode n = decode(*id, params.kernelParams, params.gridDim);
    ++tally.nodes;
    if (i == 0) {
      REQUIRE(id->kernel == Kernel::stage_in);
      allowed.chunk_meta = n.chunk_meta;
      CHECK(n.chunk_meta.bytes == graphs::ChunkMetaLayout::make(cfg).bytes());
      CHECK(contains(allowed.regions[0], n.chunk_meta.begin, n.chunk_meta.bytes));  // in the pool, never bound memory
      status = n.status;
      staging_block = n.ranges[0].begin;
    } else if (n.status != 0) {
      CHECK(n.status == status);  // every fault lands in the counters the stage-in reset
    }
    std::vector<std::string> problems = n.problems;
    for (std::string& p : audit_ranges(n.ranges, allowed, tally.hits)) problems.push_back(std::move(p));
    if (id->kernel == Kernel::attention_wgmma) {
      if (std::string map = check_out_map(params.kernelParams, n.attention); !map.empty()) problems.push_back(map);
    }
    if (id->kernel == Kernel::attention_wgmma || id->kernel == Kernel::attention_mma) {
      CHECK(n.attention.num_splits == want.plan.num_splits);
      CHECK(n.attention.write_partials == want.plan.split);
      CHECK(n.attention.dv_parts == want.plan.dv_parts);
    }
    CHECK(joined(problems) == "");
  }
  return staging_block;
}

/// Every (program, bucket, staging block) graph of a warmed-up executor.
AuditTally audit_executor(const graphs::Executor& ex, bool insert, const AllowedMemory& allowed) {
  AuditTally tally;
  const std::size_t meta_bytes = graphs::ChunkMetaLayout::make(ex.config()).bytes();
  for (int p = 0; p < ex.programs(); ++p) {
    for (int b = 0; b < ex.buckets().size(); ++b) {
      const std::uintptr_t block0 = audit_graph(ex, p, b, 0, insert, allowed, tally);
      const std::uintptr_t block1 = audit_graph(ex, p, b, 1, insert, allowed, tally);
      // The two graphs of a shape read the two staging blocks, which never overlap.
      INFO("program " << p << ", bucket " << b);
      CHECK_FALSE(overlaps(Region{"staging 0", block0, meta_bytes}, Region{"staging 1", block1, meta_bytes}));
    }
  }
  return tally;
}

/// A caller's buffers for every layer, each from its own cudaMalloc as an engine would hold them:
/// q and out with padded token strides, caches with padded blocks at a non-zero offset inside a
/// larger allocation. Layer 1 binds only its cache and leaves the rest to the pool.
class CallerBuffers {
 public:
  explicit CallerBuffers(const model::PipelineConfig& config) {
    using B = graphs::LayerBuffer;
    const auto T = static_cast<std::size_t>(config.max_tokens);
    for (std::size_t i = 0; i < config.layers.size(); ++i) {
      const model::LayerConfig& l = config.layers[i];
      const auto h = static_cast<std::size_t>(l.h_q);
      const auto d_qk = static_cast<std::size_t>(l.d_qk);
      graphs::LayerBuffers b;
      for (const B cb : {B::swa_cache, B::compressed_cache}) {
        if (!graphs::layer_uses(l, cb, true)) continue;
        const kernels::CacheLayout least = graphs::required_cache(config, l, cb);
        graphs::PagedCache& c = cb == B::swa_cache ? b.swa_cache : b.compressed_cache;
        c.layout = kernels::CacheLayout::make(least.block_size, least.num_blocks, least.block_stride + kernels::kKvRowBytes);
        c.data = allocate<std::uint8_t>(c.layout.bytes(), kCacheOffset, kCacheTail);
      }
      if (i != 1) {
        const std::size_t q_stride = h * d_qk + 72;
        b.q = graphs::strided_view<bf16, 3>(allocate<bf16>(T * q_stride), {T, h, d_qk}, {q_stride, d_qk, 1});
        if (graphs::layer_uses(l, B::topk_indices, true)) {
          const auto k = static_cast<std::size_t>(l.top_k);
          b.topk_indices = graphs::contiguous_view<std::int32_t, 2>(allocate<std::int32_t>(T * k), {T, k});
        }
        b.k_rows = graphs::contiguous_view<bf16, 2>(allocate<bf16>(T * 512), {T, std::size_t{512}});
        if (graphs::layer_uses(l, B::compressed_k_rows, true)) {
          const std::size_t rows = graphs::required_rows(config, l, B::compressed_k_rows);
          b.compressed_k_rows = graphs::contiguous_view<bf16, 2>(allocate<bf16>(rows * 512), {rows, std::size_t{512}});
        }
        if (l.attn_sink) b.attn_sink = graphs::contiguous_view<float, 1>(allocate<float>(h), {h});
        const std::size_t out_stride = h * 512 + 136;
        b.out = graphs::strided_view<bf16, 3>(allocate<bf16>(T * out_stride), {T, h, std::size_t{512}},
                                              {out_stride, std::size_t{512}, 1});
        b.lse = graphs::contiguous_view<float, 2>(allocate<float>(T * h), {T, h});
        b.max_logits = graphs::contiguous_view<float, 2>(allocate<float>(T * h), {T, h});
      }
      bindings_.push_back(b);
    }
  }

  [[nodiscard]] const std::vector<graphs::LayerBuffers>& bindings() const noexcept { return bindings_; }

 private:
  static constexpr std::size_t kCacheOffset = 4096 + 48;  // 16-byte aligned, not 256
  static constexpr std::size_t kCacheTail = 8192;

  template <class T>
  T* allocate(std::size_t elems, std::size_t offset = 0, std::size_t tail = 0) {
    owned_.emplace_back(offset + elems * sizeof(T) + tail);
    return reinterpret_cast<T*>(static_cast<std::byte*>(owned_.back().data()) + offset);
  }

  std::vector<core::DeviceBuffer> owned_;
  std::vector<graphs::LayerBuffers> bindings_;
};

graphs::ExecutorOptions two_programs(std::vector<graphs::LayerBuffers> buffers = {}) {
  graphs::ExecutorOptions o;
  o.insert = true;
  o.programs = {{0, 1, 2}, {2, 0}};
  o.buffers = std::move(buffers);
  return o;
}

}  // namespace

TEST_CASE("every kernel node of every captured graph stays inside the pool, and each graph holds the expected kernels",
          "[gpu][executor]") {
  graphs::Executor ex(test::small_program(), two_programs());
  ex.warmup();
  const AllowedMemory allowed = allowed_memory(ex, {});
  REQUIRE(allowed.regions.size() == 2);
  const AuditTally tally = audit_executor(ex, true, allowed);
  CHECK(tally.graphs == 2 * 2 * ex.buckets().size());
  CHECK(tally.hits[0] > 0);
  // The pinned memory: only each stage-in's staging block and its two release words.
  CHECK(tally.hits[1] == 3 * tally.graphs);
}

TEST_CASE("with caller-bound buffers every kernel node stays inside the pool or a bound buffer, and uses each one",
          "[gpu][executor]") {
  const model::PipelineConfig cfg = test::small_program();
  const CallerBuffers caller(cfg);
  graphs::Executor ex(cfg, two_programs(caller.bindings()));
  ex.warmup();
  const AllowedMemory allowed = allowed_memory(ex, caller.bindings());
  REQUIRE(allowed.regions.size() > 2);
  // The pool holds none of the caller's memory, so an argument found in a bound span is the caller's.
  for (std::size_t i = 2; i < allowed.regions.size(); ++i) {
    INFO(describe(allowed.regions[i]));
    CHECK_FALSE(overlaps(allowed.regions[0], allowed.regions[i]));
    CHECK_FALSE(overlaps(allowed.regions[1], allowed.regions[i]));
  }
  CHECK(ex.layer(0).q.data_handle() == caller.bindings()[0].q.data_handle());
  CHECK(ex.layer(1).swa_cache.data == caller.bindings()[1].swa_cache.data);
  CHECK(ex.layer(1).q.data_handle() != nullptr);  // layer 1's q is the pool's

  const AuditTally tally = audit_executor(ex, true, allowed);
  CHECK(tally.graphs == 2 * 2 * ex.buckets().size());
  CHECK(tally.hits[0] > 0);
  for (std::size_t i = 2; i < allowed.regions.size(); ++i) {
    INFO(allowed.regions[i].name << " is bound but no kernel argument points into it");
    CHECK(tally.hits[i] > 0);
  }
}

// No device needed: the range logic and the decoding on made-up addresses (never dereferenced).
TEST_CASE("graph audit: an argument outside the pool, the metadata block or a bound buffer is caught",
          "[executor][graph-audit]") {
  constexpr std::uintptr_t kPool = std::uintptr_t{0x7f00} << 32;
  constexpr std::size_t kPoolBytes = std::size_t{1} << 20;
  constexpr std::uintptr_t kPinned = kPool + (std::size_t{4} << 20);
  constexpr std::uintptr_t kQ = kPool + (std::size_t{8} << 20);
  constexpr std::size_t kQBytes = std::size_t{256} << 10;
  constexpr std::uintptr_t kCache = kPool + (std::size_t{16} << 20);
  const kernels::CacheLayout cache = kernels::CacheLayout::make(64, 3);
  AllowedMemory allowed;
  allowed.regions = {Region{"pool (device)", kPool, kPoolBytes}, Region{"pool (pinned)", kPinned, 65536},
                     Region{"bound q", kQ, kQBytes}, Region{"bound cache", kCache, cache.bytes()}};
  allowed.staging = allowed.regions[1];
  allowed.chunk_meta = Region{"chunk metadata block", kPool, 4096};
  std::vector<int> hits;
  auto problems = [&](const std::vector<ArgRange>& args) { return audit_ranges(args, allowed, hits); };
  auto at = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };

  SECTION("ranges at the edges of a region") {
    const Region& pool = allowed.regions[0];
    CHECK(contains(pool, kPool, kPoolBytes));
    CHECK_FALSE(contains(pool, kPool, kPoolBytes + 1));  // one byte past the end
    CHECK_FALSE(contains(pool, kPool - 1, 2));           // one byte before the start
    CHECK(contains(pool, kPool + kPoolBytes, 0));
    CHECK_FALSE(contains(pool, kPool + 16, std::numeric_limits<std::size_t>::max()));  // no wrap-around
    CHECK(bytes_of(-1, 2) == std::numeric_limits<std::size_t>::max());
    CHECK(bytes_of(std::numeric_limits<std::int64_t>::max(), 4) == std::numeric_limits<std::size_t>::max());
  }
  SECTION("null, metadata-block, staging and region rules") {
    CHECK(problems({ArgRange{"optional", 0, 64, false, Home::any}}).empty());
    CHECK(problems({ArgRange{"required", 0, 64, true, Home::any}}).size() == 1);
    CHECK(problems({ArgRange{"meta", kPool + 64, 64, true, Home::chunk_meta}}).empty());
    CHECK(problems({ArgRange{"meta past the block", kPool + 4096 - 8, 16, true, Home::chunk_meta}}).size() == 1);
    CHECK(problems({ArgRange{"staging in device memory", kPool, 64, true, Home::staging}}).size() == 1);
    CHECK(problems({ArgRange{"in q", kQ, kQBytes, true, Home::any}}).empty());
    CHECK(problems({ArgRange{"q overrun by 16 B", kQ + 16, kQBytes, true, Home::any}}).size() == 1);
    CHECK(problems({ArgRange{"between regions", kPool + (std::size_t{2} << 20), 16, true, Home::any}}).size() == 1);
    // Found where they lie, even when they break their block's rule: three in the pool, one in q.
    CHECK(hits == std::vector<int>{3, 0, 1, 0});
  }
  SECTION("a decoded insert whose cache runs one block past its buffer is caught") {
    d::InsertParams p{};
    p.rows = static_cast<const bf16*>(at(kPool + 65536));
    p.slot_mapping = static_cast<const std::int32_t*>(at(kPool + 256));
    p.num_rows = static_cast<const std::int32_t*>(at(kPool + 128));
    p.rows_bucket = 16;
    p.cache = static_cast<std::uint8_t*>(at(kCache));
    p.block_stride = cache.block_stride;
    p.block_size = cache.block_size;
    p.num_blocks = cache.num_blocks;
    p.status = static_cast<kernels::StepStatus*>(at(kPool + 8192));
    void* kp[] = {&p};
    CHECK(joined(problems(decode({Kernel::kv_insert, 0}, kp, dim3(2)).ranges)) == "");
    p.num_blocks = cache.num_blocks + 1;
    const std::vector<std::string> bad = problems(decode({Kernel::kv_insert, 0}, kp, dim3(2)).ranges);
    REQUIRE(bad.size() == 1);
    CHECK(bad[0].rfind("cache ", 0) == 0);
    p.num_blocks = cache.num_blocks;
    p.slot_mapping = static_cast<const std::int32_t*>(at(kPool + 4096));  // in the pool, past the metadata block
    CHECK(problems(decode({Kernel::kv_insert, 0}, kp, dim3(2)).ranges).size() == 1);
    p.block_stride = cache.block_stride - kernels::kKvRowBytes;  // blocks too short for their scale rows
    CHECK(decode({Kernel::kv_insert, 0}, kp, dim3(2)).problems.size() == 1);
  }
  SECTION("a decoded attention whose q token stride runs past q's buffer, or whose grid exceeds its items, is caught") {
    d::SparseMlaParams p{};
    p.s_q = 2;
    p.h_q = 64;
    p.q_token_stride = 64 * 512 + 65536;  // two tokens: exactly kQBytes
    p.q = static_cast<const bf16*>(at(kQ));
    p.kv = static_cast<const bf16*>(at(kPool + 65536));
    p.kv_row_stride = 512;
    p.s_kv = 64;
    p.indices = static_cast<const std::int32_t*>(at(kPool + 196608));
    p.topk = 64;
    p.num_tokens = static_cast<const std::int32_t*>(at(kPool + 32));
    p.out = static_cast<bf16*>(at(kPool + 262144));
    p.out_token_stride = 64 * 512;
    p.max_logits = static_cast<float*>(at(kPool + 524288));
    p.lse = static_cast<float*>(at(kPool + 532480));
    p.num_splits = 1;
    p.num_items = 2;
    p.dv_parts = 1;
    void* kp[] = {&p, nullptr};
    const KernelId wgmma{Kernel::attention_wgmma, 512};
    const DecodedNode good = decode(wgmma, kp, dim3(2));
    CHECK(joined(good.problems) == "");
    CHECK(joined(problems(good.ranges)) == "");
    p.q_token_stride += 8;  // one 16-byte step more per token
    const std::vector<std::string> bad = problems(decode(wgmma, kp, dim3(2)).ranges);
    REQUIRE(bad.size() == 1);
    CHECK(bad[0].rfind("q ", 0) == 0);
    CHECK(decode(wgmma, kp, dim3(3)).problems.size() == 1);  // a CTA for an item past s_q
    CHECK(decode({Kernel::attention_mma, 512}, kp, dim3(1)).problems.empty());  // persistent: fewer CTAs than items
    p.q_token_stride -= 8;
    p.dv_parts = 2;  // the split-dv pass: two CTAs per item
    CHECK(decode(wgmma, kp, dim3(2)).problems.size() == 1);  // num_items 2 is not 2 items x 2 CTAs
    p.num_items = 4;
    CHECK(joined(decode(wgmma, kp, dim3(4)).problems) == "");
    p.write_partials = true;  // the split-dv pass writes no partials
    CHECK(decode(wgmma, kp, dim3(4)).problems.size() == 1);
  }
  SECTION("kernels are known by their device symbols; any other kernel is unknown") {
    struct Case {
      const char* symbol;
      Kernel kernel;
      int d;
    };
    // As the library's objects name them (the stage-in's anonymous namespace carries a per-file hash).
    const Case cases[] = {
        {"_ZN3spg7kernels44_GLOBAL__N__967e4542_11_stage_in_cu_aaa7585015stage_in_kernelEPK5uint4PS2_iPNS0_11StatusBlockE",
         Kernel::stage_in, 0},
        {"_ZN3spg7kernels6detail16kv_insert_kernelENS1_12InsertParamsE", Kernel::kv_insert, 0},
        {"_ZN3spg7kernels6detail16kv_gather_kernelENS1_12GatherParamsE", Kernel::kv_gather, 0},
        {"_ZN3spg7kernels6detail22combine_indices_kernelENS1_13CombineParamsE", Kernel::combine_indices, 0},
        {"_ZN3spg7kernels6detail23sparse_mla_wgmma_kernelILi576ELb0EEEvNS1_15SparseMlaParamsE14CUtensorMap_st",
         Kernel::attention_wgmma, 576},
        {"_ZN3spg7kernels6detail23sparse_mla_wgmma_kernelILi512ELb1EEEvNS1_15SparseMlaParamsE14CUtensorMap_st",
         Kernel::attention_wgmma, 512},
        {"_ZN3spg7kernels6detail17sparse_mla_kernelILi512EEEvNS1_15SparseMlaParamsE", Kernel::attention_mma, 512},
        {"_ZN3spg7kernels6detail23sparse_mla_merge_kernelENS1_20SparseMlaMergeParamsE", Kernel::attention_merge, 0}};
    for (const Case& c : cases) {
      INFO(c.symbol << " -> " << demangled(c.symbol));
      const std::optional<KernelId> id = identify(demangled(c.symbol));
      REQUIRE(id.has_value());
      CHECK(std::string(kernel_label(id->kernel)) == kernel_label(c.kernel));
      CHECK(id->d == c.d);
    }
    CHECK_FALSE(identify(demangled("_ZN3spg7kernels6detail15checksum_kernelEPKhmPm")).has_value());
    CHECK_FALSE(identify(demangled("_Z16kv_insert_kernelv")).has_value());  // not the library's
    CHECK_FALSE(identify("spg::kernels::detail::kv_insert_kernel_v2(int)").has_value());
  }
}

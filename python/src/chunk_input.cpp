// Reading a Python chunk into a ChunkInput without allocating: see chunk_input.hpp.
#include "chunk_input.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "array_arg.hpp"

namespace spg::python {

namespace {

constexpr std::int64_t kInt32Min = std::numeric_limits<std::int32_t>::min();
constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
constexpr int kDLCPU = 1;

/// Where a value sits, spelled out only when a message needs it (no string is built otherwise).
struct Where {
  const char* field;
  int key{-1};
  int row{-1};
  int col{-1};
  const char* root{"chunk"};  // "chunk" or "step"
  [[nodiscard]] std::string str() const {
    std::string s = std::string(root) + "." + field;
    for (int i : {key, row, col}) {
      if (i >= 0) s += "[" + std::to_string(i) + "]";
    }
    return s;
  }
};

const char* const kChunkFields[] = {"query_lens",     "query_start_loc", "seq_lens",        "swa_block_table",
                                    "compressed_block_tables", "swa_slots",  "compressed_slots"};

/// chunk[name] for a dict, chunk.name otherwise; None when absent.
nb::handle field(nb::handle chunk, const char* name, nb::object& keep) {
  if (PyDict_Check(chunk.ptr())) {
    PyObject* v = PyDict_GetItemString(chunk.ptr(), name);  // borrowed
    return v == nullptr ? nb::handle(Py_None) : nb::handle(v);
  }
  PyObject* v = PyObject_GetAttrString(chunk.ptr(), name);
  if (v == nullptr) {
    PyErr_Clear();
    return Py_None;
  }
  keep = nb::steal(v);
  return keep;
}

void check_dict_keys(nb::handle chunk, const char* root) {
  for (auto [key, value] : nb::borrow<nb::dict>(chunk)) {
    (void)value;
    bool known = false;
    if (PyUnicode_Check(key.ptr())) {
      const char* k = PyUnicode_AsUTF8(key.ptr());
      for (const char* f : kChunkFields) known |= k != nullptr && std::string_view(k) == f;
    }
    if (!known) {
      std::string all;
      for (const char* f : kChunkFields) all += std::string(all.empty() ? "" : ", ") + f;
      throw nb::value_error(("the " + std::string(root) + " has the key " + std::string(nb::repr(key).c_str()) +
                             "; its fields are " + all)
                                .c_str());
    }
  }
}

std::int32_t int32_of(PyObject* o, const Where& w) {
  if (PyLong_CheckExact(o)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow == 0 && v >= kInt32Min && v <= kInt32Max) return static_cast<std::int32_t>(v);
    throw nb::value_error((w.str() + " = " + std::string(nb::repr(nb::handle(o)).c_str()) + " does not fit in int32")
                              .c_str());
  }
  const std::string what = w.str();
  return checked_int(what.c_str(), int_value(nb::handle(o), what), kInt32Min, kInt32Max);
}

/// A host integer array of rank 1 or 2 as read in place: its first element, extents, strides in
/// elements and element size (int32 or int64).
struct HostArray {
  const void* data{nullptr};
  int ndim{0};
  std::int64_t shape[2]{};
  std::int64_t stride[2]{};
  int bits{0};

  [[nodiscard]] std::int32_t at(std::int64_t offset, const Where& w) const {
    if (bits == 32) return static_cast<const std::int32_t*>(data)[offset];
    const std::int64_t v = static_cast<const std::int64_t*>(data)[offset];
    if (v < kInt32Min || v > kInt32Max) {
      throw nb::value_error((w.str() + " = " + std::to_string(v) + " does not fit in int32").c_str());
    }
    return static_cast<std::int32_t>(v);
  }
};

/// The element type a buffer-protocol format names, as the frameworks print it.
std::string format_name(const char* format, Py_ssize_t itemsize) {
  std::string f = format != nullptr ? format : "B";
  while (!f.empty() && std::string("@=<>!").find(f[0]) != std::string::npos) f.erase(0, 1);
  const std::string bits = std::to_string(8 * itemsize);
  if (f.size() == 1) {
    if (std::string("bhilqn").find(f[0]) != std::string::npos) return "int" + bits;
    if (std::string("BHILQN").find(f[0]) != std::string::npos) return "uint" + bits;
    if (std::string("efd").find(f[0]) != std::string::npos) return "float" + bits;
    if (f[0] == '?') return "bool";
  }
  return "format '" + f + "'";
}

void check_rank(const Where& w, int ndim, int rank, const char* form) {
  if (ndim != rank) {
    throw nb::value_error((w.str() + " has " + std::to_string(ndim) + " dims; it must be " + form).c_str());
  }
}

/// A host integer array (int32 or int64) of the given rank, or a refusal naming it: through the
/// buffer protocol where the object has it (NumPy: no DLPack capsule per call), else DLPack.
HostArray host_array(nb::handle v, const Where& w, int rank, const char* form, HeldArrays& held) {
  HostArray h;
  Py_buffer* view = PyObject_CheckBuffer(v.ptr()) == 1 ? held.slot() : nullptr;
  if (view != nullptr && PyObject_GetBuffer(v.ptr(), view, PyBUF_RECORDS_RO) == 0) {
    held.taken();  // released with the others, whatever happens below
    const std::string type = format_name(view->format, view->itemsize);
    if (type != "int32" && type != "int64") {
      throw nb::type_error((w.str() + ".dtype = " + type + " must be int32 or int64").c_str());
    }
    check_rank(w, view->ndim, rank, form);
    h.data = view->buf;
    h.ndim = view->ndim;
    h.bits = static_cast<int>(8 * view->itemsize);
    std::int64_t contiguous = 1;
    for (int i = h.ndim - 1; i >= 0; --i) {
      h.shape[i] = view->shape[i];
      const std::int64_t bytes = view->strides != nullptr ? view->strides[i] : contiguous * view->itemsize;
      if (bytes % view->itemsize != 0) {
        throw nb::value_error((w.str() + " has a stride of " + std::to_string(bytes) +
                               " bytes, not a whole number of elements")
                                  .c_str());
      }
      h.stride[i] = bytes / view->itemsize;
      contiguous *= h.shape[i];
    }
    return h;
  }
  if (view != nullptr) PyErr_Clear();
  nb::ndarray<nb::ro> a = import_array<nb::ro>(v, w.str());
  const nb::dlpack::dtype d = a.dtype();
  if (a.device_type() != kDLCPU) {
    throw nb::value_error((w.str() + " is device memory (DLPack device type " + std::to_string(a.device_type()) +
                           "); a chunk's lengths, block tables and slots are host data (lists, NumPy or CPU tensors)")
                              .c_str());
  }
  if (d.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) || (d.bits != 32 && d.bits != 64) || d.lanes != 1) {
    throw nb::type_error((w.str() + ".dtype = " + dtype_name(d) + " must be int32 or int64").c_str());
  }
  check_rank(w, static_cast<int>(a.ndim()), rank, form);
  h.data = a.data();
  h.ndim = static_cast<int>(a.ndim());
  h.bits = d.bits;
  std::int64_t contiguous = 1;
  for (int i = h.ndim - 1; i >= 0; --i) {
    h.shape[i] = static_cast<std::int64_t>(a.shape(static_cast<std::size_t>(i)));
    h.stride[i] = a.stride_ptr() != nullptr ? a.stride(static_cast<std::size_t>(i)) : contiguous;
    contiguous *= h.shape[i];
  }
  held.keep(std::move(a));
  return h;
}

/// A list, tuple or other sequence of ints: PySequence_Fast's items (a new list only for the rare
/// other sequence).
struct Items {
  nb::object fast;
  PyObject** items{nullptr};
  std::size_t size{0};
};
bool sequence_items(nb::handle v, Items& out, bool exact_only) {
  if (PyList_Check(v.ptr())) {
    out.items = PySequence_Fast_ITEMS(v.ptr());
    out.size = static_cast<std::size_t>(PyList_GET_SIZE(v.ptr()));
    return true;
  }
  if (PyTuple_Check(v.ptr())) {
    out.items = PySequence_Fast_ITEMS(v.ptr());
    out.size = static_cast<std::size_t>(PyTuple_GET_SIZE(v.ptr()));
    return true;
  }
  if (exact_only || PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()) || PyDict_Check(v.ptr()) ||
      PySequence_Check(v.ptr()) == 0) {
    return false;
  }
  out.fast = nb::steal(PySequence_Fast(v.ptr(), "not a sequence"));
  if (!out.fast.is_valid()) throw nb::python_error();
  out.items = PySequence_Fast_ITEMS(out.fast.ptr());
  out.size = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(out.fast.ptr()));
  return true;
}

/// What a read of one integer list gave: the entries (in place or converted) and the list's length.
struct Ints {
  const std::int32_t* data{nullptr};
  std::size_t size{0};    // entries the span holds: the length, or at most `cap` when converted
  std::size_t length{0};  // the list's own length
};

/// Reads a list of ints or a 1-D integer host array. An int32 array of unit stride is taken in
/// place (and held); otherwise entries [lo, hi) (clamped to the length and `cap`) are converted
/// into dst and the span is min(length, cap) long: entries outside [lo, hi) are never read.
Ints read_ints(nb::handle v, const Where& w, std::int32_t* dst, std::size_t cap, std::size_t lo, std::size_t hi,
               HeldArrays& held) {
  Ints r;
  Items items;
  // Lists and tuples, then arrays (NumPy arrays are sequences too, read in place), then other sequences.
  const bool array = !PyList_Check(v.ptr()) && !PyTuple_Check(v.ptr()) && is_array(v);
  if (!array && sequence_items(v, items, false)) {
    r.length = items.size;
    r.size = std::min(items.size, cap);
    hi = std::min(hi, r.size);
    for (std::size_t j = lo; j < hi; ++j) {
      Where e = w;
      (e.row < 0 ? e.row : e.col) = static_cast<int>(j);
      dst[j] = int32_of(items.items[j], e);
    }
    r.data = dst;
    return r;
  }
  if (array) {
    const HostArray a = host_array(v, w, 1, "1-D", held);
    r.length = static_cast<std::size_t>(a.shape[0]);
    if (a.bits == 32 && (a.stride[0] == 1 || r.length <= 1)) {
      r.data = static_cast<const std::int32_t*>(a.data);
      r.size = r.length;
      return r;
    }
    r.size = std::min(r.length, cap);
    hi = std::min(hi, r.size);
    for (std::size_t j = lo; j < hi; ++j) {
      Where e = w;
      (e.row < 0 ? e.row : e.col) = static_cast<int>(j);
      dst[j] = a.at(static_cast<std::int64_t>(j) * a.stride[0], e);
    }
    r.data = dst;
    return r;
  }
  throw nb::type_error((w.str() + " must be a list of ints or a 1-D integer array, not " + py_type_name(v)).c_str());
}

int ratio_key(nb::handle key, const char* what, const char* root) {
  const int r = int_value(key, std::string(root) + "." + what + " key", kInt32Min, kInt32Max);
  if (r != 4 && r != 128) {
    throw nb::value_error((std::string(root) + "." + what + " has the key " + std::to_string(r) +
                           "; the compression ratios are 4 and 128")
                              .c_str());
  }
  return r;
}

}  // namespace

ChunkReader::ChunkReader(const model::PipelineConfig& config, int max_requests, bool step)
    : what_(step ? "step" : "chunk"),
      step_(step),
      max_requests_(std::max(max_requests, 0)),
      max_model_len_(config.max_model_len),
      window_(config.window()),
      swa_block_size_(config.cache.swa_block_size),
      block_tokens_(config.cache.block_tokens),
      swa_width_(static_cast<std::size_t>(config.swa_blocks_per_request())),
      compressed_width_(static_cast<std::size_t>(config.compressed_blocks_per_request())),
      held_(4 * (static_cast<std::size_t>(std::max(max_requests, 0)) + 1) + 8) {
  const auto slots = static_cast<std::size_t>(max_requests_) + 1;
  requests_.resize(slots);
  for (auto& l : lens_) l.resize(slots + 1);  // query_start_loc takes one more
  swa_tables_.resize(static_cast<std::size_t>(max_requests_) * swa_width_);
  swa_slots_.resize(static_cast<std::size_t>(config.max_tokens) + 1);
  for (int i = 1; i < graphs::kNumRatios; ++i) {
    compressed_tables_[i].resize(static_cast<std::size_t>(max_requests_) * compressed_width_);
    compressed_slots_[i].resize(
        static_cast<std::size_t>(graphs::ChunkMetaLayout::compressed_slot_capacity(config, graphs::kRatios[i])) + 1);
  }
}

HeldArrays::HeldArrays(std::size_t capacity) : buffers_(new Py_buffer[capacity]), capacity_(capacity) {
  arrays_.reserve(capacity);
}

void HeldArrays::release() noexcept {
  for (std::size_t i = 0; i < used_; ++i) PyBuffer_Release(&buffers_[i]);
  used_ = 0;
  arrays_.clear();
}

namespace {

/// Request b of a scheduler plan: its lengths, and its block tables as spans into the plan.
graphs::RequestInput plan_request(const scheduler::ChunkPlan& p, std::size_t b) {
  graphs::RequestInput r;
  r.query_len = p.query_lens[b];
  r.seq_len = p.seq_lens[b];
  for (const scheduler::ChunkCachePlan& c : p.caches) {
    if (b >= c.block_tables.size()) continue;
    (c.ratio == 1 ? r.swa_blocks : r.compressed_blocks[graphs::ratio_index(c.ratio)]) = c.block_tables[b];
  }
  return r;
}

}  // namespace

void ChunkReader::read_plan(const PlannedChunk& chunk) {
  const scheduler::ChunkPlan& p = chunk.plan;
  if (p.num_requests > max_requests_) {  // a plan of another config: the encoder's no_bucket
    for (auto& r : requests_) r = graphs::RequestInput{};
    input_.requests = std::span<const graphs::RequestInput>(requests_.data(), requests_.size());
    return;
  }
  const auto n = static_cast<std::size_t>(p.num_requests);
  for (std::size_t b = 0; b < n; ++b) requests_[b] = plan_request(p, b);
  if (chunk.slot_lists && !step_) {  // a step carries no slot lists
    for (const scheduler::ChunkCachePlan& c : p.caches) {
      const int i = graphs::ratio_index(c.ratio);
      (c.ratio == 1 ? input_.swa_slots : input_.compressed_slots[i]) = c.slot_mapping;
    }
  }
  input_.requests = std::span<const graphs::RequestInput>(requests_.data(), n);
}

void ChunkReader::read_planned_step(const PlannedStep& step) {
  std::size_t n = 0;
  std::int64_t last_id = -1;
  const auto cap = static_cast<std::size_t>(max_requests_);
  for (nb::handle h : step.chunks) {
    if (!nb::isinstance<PlannedChunk>(h)) {
      throw nb::type_error(("step.chunks holds a " + py_type_name(h) + "; a StepPlan's chunks are ChunkPlans").c_str());
    }
    const scheduler::ChunkPlan& p = nb::inst_ptr<PlannedChunk>(h)->plan;
    for (std::size_t b = 0; b < static_cast<std::size_t>(p.num_requests); ++b) {
      const graphs::RequestInput r = plan_request(p, b);
      // A request continues from one chunk into the next only as the last piece of the one and
      // the first of the other (the split rule): merging neighbours restores the request.
      if (b == 0 && n > 0 && p.request_ids[b] == last_id) {
        const int query_len = requests_[n - 1].query_len + r.query_len;
        requests_[n - 1] = r;
        requests_[n - 1].query_len = query_len;
      } else if (n == cap) {  // more requests than a step holds: the split's step.requests, read no further
        for (auto& q : requests_) q = graphs::RequestInput{};
        input_.requests = std::span<const graphs::RequestInput>(requests_.data(), cap + 1);
        return;
      } else {
        requests_[n++] = r;
      }
      last_id = p.request_ids[b];
    }
  }
  input_.requests = std::span<const graphs::RequestInput>(requests_.data(), n);
}

const graphs::StepInput& ChunkReader::read_step(nb::handle step) {
  if (nb::isinstance<PlannedStep>(step)) {
    held_.release();
    input_ = graphs::ChunkInput{};
    read_planned_step(*nb::inst_ptr<PlannedStep>(step));
  } else {
    if (!nb::isinstance<PlannedChunk>(step)) {
      for (const char* name : {"swa_slots", "compressed_slots"}) {
        nb::object keep;
        if (!field(step, name, keep).is_none()) {
          throw nb::value_error(("step." + std::string(name) +
                                 " is given; a step carries no slot lists (the device derives the insert slots from "
                                 "the block tables)")
                                    .c_str());
        }
      }
    }
    read(step);
  }
  step_input_.requests = input_.requests;
  return step_input_;
}

void ChunkReader::read_table(nb::handle table, const char* what, int ratio, int requests) {
  const int i = graphs::ratio_index(ratio);
  std::vector<std::int32_t>& storage = ratio == 1 ? swa_tables_ : compressed_tables_[i];
  const std::size_t width = ratio == 1 ? swa_width_ : compressed_width_;
  auto span_of = [&](int b) -> std::span<const std::int32_t>& {
    graphs::RequestInput& r = requests_[static_cast<std::size_t>(b)];
    return ratio == 1 ? r.swa_blocks : r.compressed_blocks[i];
  };
  // The entries of request b's row the encoder reads: the SWA blocks of its window positions, or
  // every compressed block of its rows; none for lengths the encoder refuses before reading.
  auto range = [&](int b, std::size_t& lo, std::size_t& hi) {
    const graphs::RequestInput& r = requests_[static_cast<std::size_t>(b)];
    lo = hi = 0;
    if (r.query_len < 0 || r.seq_len < r.query_len || r.seq_len > max_model_len_) return;
    if (ratio == 1) {
      const int gather = graphs::gather_len(r.seq_len, r.query_len, window_);
      lo = static_cast<std::size_t>((r.seq_len - gather) / swa_block_size_);
      hi = static_cast<std::size_t>(graphs::blocks_for_rows(r.seq_len, swa_block_size_));
    } else {
      hi = static_cast<std::size_t>(
          graphs::blocks_for_rows(graphs::compressed_rows(r.seq_len, ratio), block_tokens_ / ratio));
    }
  };
  const int key = ratio == 1 ? -1 : ratio;
  if (table.is_none()) return;
  Items items;
  const bool array = !PyList_Check(table.ptr()) && !PyTuple_Check(table.ptr()) && is_array(table);
  if (!array && sequence_items(table, items, false)) {
    if (items.size < static_cast<std::size_t>(requests)) {
      throw nb::value_error((Where{what, key, -1, -1, what_}.str() + " has " + std::to_string(items.size) + " rows; the " + what_ + " has " +
                             std::to_string(requests) + " requests")
                                .c_str());
    }
    for (int b = 0; b < requests; ++b) {
      std::size_t lo = 0;
      std::size_t hi = 0;
      range(b, lo, hi);
      const Ints row = read_ints(items.items[b], Where{what, key, b, -1, what_}, storage.data() + static_cast<std::size_t>(b) * width,
                                 width, lo, hi, held_);
      span_of(b) = std::span<const std::int32_t>(row.data, row.size);
    }
    return;
  }
  if (!array) {
    throw nb::type_error((Where{what, key, -1, -1, what_}.str() + " must be a 2-D integer array [requests, width] or a list of "
                                                   "per-request lists, not " +
                          py_type_name(table))
                             .c_str());
  }
  const HostArray a = host_array(table, Where{what, key, -1, -1, what_}, 2, "2-D [requests, width]", held_);
  if (a.shape[0] < requests) {
    throw nb::value_error((Where{what, key, -1, -1, what_}.str() + " has " + std::to_string(a.shape[0]) + " rows; the " + what_ + " has " +
                           std::to_string(requests) + " requests")
                              .c_str());
  }
  const auto cols = static_cast<std::size_t>(a.shape[1]);
  if (a.bits == 32 && (a.stride[1] == 1 || cols <= 1)) {
    const auto* base = static_cast<const std::int32_t*>(a.data);
    for (int b = 0; b < requests; ++b) span_of(b) = std::span<const std::int32_t>(base + b * a.stride[0], cols);
    return;
  }
  for (int b = 0; b < requests; ++b) {
    std::size_t lo = 0;
    std::size_t hi = 0;
    range(b, lo, hi);
    const std::size_t size = std::min(cols, width);
    std::int32_t* dst = storage.data() + static_cast<std::size_t>(b) * width;
    for (std::size_t j = lo; j < std::min(hi, size); ++j) {
      dst[j] = a.at(b * a.stride[0] + static_cast<std::int64_t>(j) * a.stride[1], Where{what, key, b, static_cast<int>(j), what_});
    }
    span_of(b) = std::span<const std::int32_t>(dst, size);
  }
}

void ChunkReader::read_slots(nb::handle slots, const char* what, int ratio, std::vector<std::int32_t>& storage,
                             std::span<const std::int32_t>& out) {
  if (slots.is_none()) return;
  const Ints s = read_ints(slots, Where{what, ratio == 1 ? -1 : ratio, -1, -1, what_}, storage.data(), storage.size(), 0,
                           storage.size(), held_);
  out = std::span<const std::int32_t>(s.data, s.size);
}

const graphs::ChunkInput& ChunkReader::read(nb::handle chunk) {
  held_.release();
  input_ = graphs::ChunkInput{};
  if (nb::isinstance<PlannedChunk>(chunk)) {
    read_plan(*nb::inst_ptr<PlannedChunk>(chunk));
    return input_;
  }
  if (PyDict_Check(chunk.ptr())) check_dict_keys(chunk, what_);
  const auto cap = static_cast<std::size_t>(max_requests_) + 1;
  nb::object k0, k1, k2;
  const nb::handle seq = field(chunk, "seq_lens", k0);
  nb::handle lens = field(chunk, "query_lens", k1);
  const bool from_starts = lens.is_none();
  if (from_starts) lens = field(chunk, "query_start_loc", k2);
  if (seq.is_none() || lens.is_none()) {
    throw nb::type_error(("a " + std::string(what_) + " needs seq_lens and query_lens (or query_start_loc); got a " + py_type_name(chunk) +
                          " without " + (seq.is_none() ? "seq_lens" : "query_lens"))
                             .c_str());
  }
  const Ints s = read_ints(seq, Where{"seq_lens", -1, -1, -1, what_}, lens_[1].data(), cap, 0, cap, held_);
  const Ints q = read_ints(lens, Where{from_starts ? "query_start_loc" : "query_lens", -1, -1, -1, what_}, lens_[0].data(), cap + 1, 0,
                           cap + 1, held_);
  const std::size_t requests = from_starts ? (q.length > 0 ? q.length - 1 : 0) : q.length;
  if (s.length != requests) {
    throw nb::value_error((std::string(what_) + ".seq_lens has " + std::to_string(s.length) + " entries but " + what_ + "." +
                           (from_starts ? "query_start_loc has " + std::to_string(q.length) + " (requests + 1)"
                                        : "query_lens has " + std::to_string(q.length)))
                              .c_str());
  }
  if (requests > static_cast<std::size_t>(max_requests_)) {  // the encoder's no_bucket, read no further
    for (auto& r : requests_) r = graphs::RequestInput{};
    input_.requests = std::span<const graphs::RequestInput>(requests_.data(), cap);
    return input_;
  }
  const int n = static_cast<int>(requests);
  for (int b = 0; b < n; ++b) {
    graphs::RequestInput& r = requests_[static_cast<std::size_t>(b)];
    r = graphs::RequestInput{};
    r.query_len = from_starts ? q.data[b + 1] - q.data[b] : q.data[b];
    r.seq_len = s.data[b];
  }
  nb::object k3, k4, k5, k6;
  read_table(field(chunk, "swa_block_table", k3), "swa_block_table", 1, n);
  const nb::handle compressed = field(chunk, "compressed_block_tables", k4);
  if (!compressed.is_none()) {
    if (!PyDict_Check(compressed.ptr())) {
      throw nb::type_error((std::string(what_) + ".compressed_block_tables must be a dict {ratio: table}, not " + py_type_name(compressed))
                               .c_str());
    }
    for (auto [key, table] : nb::borrow<nb::dict>(compressed)) {
      read_table(table, "compressed_block_tables", ratio_key(key, "compressed_block_tables", what_), n);
    }
  }
  read_slots(field(chunk, "swa_slots", k5), "swa_slots", 1, swa_slots_, input_.swa_slots);
  const nb::handle cslots = field(chunk, "compressed_slots", k6);
  if (!cslots.is_none()) {
    if (!PyDict_Check(cslots.ptr())) {
      throw nb::type_error((std::string(what_) + ".compressed_slots must be a dict {ratio: slots}, not " + py_type_name(cslots)).c_str());
    }
    for (auto [key, slots] : nb::borrow<nb::dict>(cslots)) {
      const int r = ratio_key(key, "compressed_slots", what_);
      const int i = graphs::ratio_index(r);
      read_slots(slots, "compressed_slots", r, compressed_slots_[i], input_.compressed_slots[i]);
    }
  }
  input_.requests = std::span<const graphs::RequestInput>(requests_.data(), requests);
  return input_;
}

}  // namespace spg::python

// The executor from Python: see executor.hpp.
#include "executor.hpp"

#include <cuda_runtime_api.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "array_arg.hpp"
#include "buffers.hpp"
#include "chunk_input.hpp"
#include "config.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/kernels/step_status.hpp"

namespace spg::python {

namespace {

PyObject* g_run_error = nullptr;  // spgraph.RunError, a RuntimeError

/// The status as its enumerator's name ("bad_chunk"); run_status_name() gives the sentence.
const char* status_key(graphs::RunStatus s) noexcept {
  switch (s) {
    case graphs::RunStatus::ok: return "ok";
    case graphs::RunStatus::no_bucket: return "no_bucket";
    case graphs::RunStatus::bad_chunk: return "bad_chunk";
    case graphs::RunStatus::bad_program: return "bad_program";
    case graphs::RunStatus::not_warmed_up: return "not_warmed_up";
    case graphs::RunStatus::cuda_error: return "cuda_error";
    case graphs::RunStatus::not_staged: return "not_staged";
  }
  return "unknown";
}

/// A run's RunResult with its bucket's shape (R_bucket, T_bucket: -1 without a bucket); `step`
/// for run_step()'s (a whole step), `call` naming a stage_step() / run_staged() one, `no_steps`
/// when that executor has no step options.
struct StepResult {
  graphs::RunResult r;
  int r_bucket{-1};
  int t_bucket{-1};
  bool step{false};
  const char* call{nullptr};
  bool no_steps{false};
};

std::string describe(const StepResult& s) {
  const char* call = s.call != nullptr ? s.call : s.step ? "run_step" : "run";
  std::string m = std::string(call) + ": " + status_key(s.r.status) + ": " + graphs::run_status_name(s.r.status);
  // bad_chunk, and a step over its maxima (no_bucket naming step.requests / step.tokens).
  const bool over_step = s.r.status == graphs::RunStatus::no_bucket && s.r.bad_field != nullptr;
  if (s.r.status == graphs::RunStatus::bad_chunk || over_step) {
    m += " (";
    if (s.r.bad_chunk >= 0) m += "chunk " + std::to_string(s.r.bad_chunk) + ", ";
    if (s.r.bad_request >= 0) {
      m += "request " + std::to_string(s.r.bad_request) + ", ";
    } else {
      m += s.step && s.r.bad_chunk < 0 ? "step-wide, " : "chunk-wide, ";
    }
    m += std::string("field ") + (s.r.bad_field != nullptr ? s.r.bad_field : "?");
    if (s.r.bad_reason != nullptr) m += std::string(": ") + s.r.bad_reason;
    m += ")";
  } else if (s.r.status == graphs::RunStatus::no_bucket && s.step && s.r.bad_chunk >= 0) {
    m += " (chunk " + std::to_string(s.r.bad_chunk) + ")";
  } else if (s.r.status == graphs::RunStatus::cuda_error) {
    m += std::string(" (") + cudaGetErrorName(s.r.cuda) + ": " + cudaGetErrorString(s.r.cuda) + ")";
  } else if (s.r.status == graphs::RunStatus::not_warmed_up) {
    m += s.no_steps ? " (the executor has no steps: give it max_step_requests and max_step_tokens)"
                    : " (call warmup() first; " + std::string(call) + "() also needs capture=True)";
  }
  return m;
}

[[noreturn]] void raise_run_error(const StepResult& s) {
  const nb::object result = nb::cast(s);
  const std::string message = describe(s);
  const nb::object exc = nb::steal(PyObject_CallFunction(g_run_error, "s", message.c_str()));
  if (!exc.is_valid()) throw nb::python_error();
  if (PyObject_SetAttrString(exc.ptr(), "result", result.ptr()) != 0) throw nb::python_error();
  PyErr_SetObject(g_run_error, exc.ptr());
  throw nb::python_error();
}

/// None (the executor's own stream), an int cudaStream_t, or a stream object (__cuda_stream__,
/// cuda_stream, ptr).
cudaStream_t stream_arg(nb::handle s, cudaStream_t own) {
  if (s.is_none()) return own;
  PyObject* o = s.ptr();
  if (PyLong_CheckExact(o)) {
    const unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr) throw nb::python_error();
    return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(v));
  }
  if (PyBool_Check(o)) throw nb::type_error("stream must be a stream or an int handle, not a bool");
  if (PyObject_HasAttrString(o, "__cuda_stream__") == 1) {
    const nb::object t = s.attr("__cuda_stream__")();
    return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(int_value(t[1], "stream.__cuda_stream__()[1]")));
  }
  for (const char* attr : {"cuda_stream", "ptr"}) {
    if (PyObject_HasAttrString(o, attr) == 1) {
      return reinterpret_cast<cudaStream_t>(
          static_cast<std::uintptr_t>(int_value(s.attr(attr), std::string("stream.") + attr)));
    }
  }
  if (PyIndex_Check(o) != 0) return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(int_value(s, "stream")));
  throw nb::type_error(("stream must be None, an int handle or a CUDA stream object, not " + py_type_name(s)).c_str());
}

std::vector<int> int_list(nb::handle v, const std::string& what) {
  if (PyUnicode_Check(v.ptr()) || PyObject_HasAttrString(v.ptr(), "__iter__") == 0) {
    throw nb::type_error((what + " must be a list of ints, not " + py_type_name(v)).c_str());
  }
  std::vector<int> out;
  int i = 0;
  for (nb::handle x : v) out.push_back(int_value(x, what + "[" + std::to_string(i++) + "]", -2147483648LL, 2147483647LL));
  return out;
}

const char* const kOptions[] = {"r_buckets",       "t_buckets",       "programs",        "insert",
                                "capture",         "time_host_phases", "device",         "max_step_requests",
                                "max_step_tokens", "flat_step_chunks", "flat_step_pad"};

/// ExecutorOptions from the keyword options of spgraph.Executor (a dict); `device` set when given.
graphs::ExecutorOptions executor_options(nb::handle options, int& device) {
  graphs::ExecutorOptions o;
  if (options.is_none()) return o;
  if (!PyDict_Check(options.ptr())) throw nb::type_error("options must be a dict");
  for (auto [key, value] : nb::borrow<nb::dict>(options)) {
    const std::string k = nb::cast<std::string>(nb::str(key));
    if (k == "r_buckets") {
      o.r_buckets = int_list(value, k);
    } else if (k == "t_buckets") {
      o.t_buckets = int_list(value, k);
    } else if (k == "programs") {
      if (PyUnicode_Check(value.ptr()) || PyObject_HasAttrString(value.ptr(), "__iter__") == 0) {
        throw nb::type_error(("programs must be a list of layer lists, not " + py_type_name(value)).c_str());
      }
      int p = 0;
      for (nb::handle layers : value) o.programs.push_back(int_list(layers, "programs[" + std::to_string(p++) + "]"));
    } else if (k == "insert") {
      o.insert = bool_value(value, k);
    } else if (k == "capture") {
      o.capture = bool_value(value, k);
    } else if (k == "time_host_phases") {
      o.time_host_phases = bool_value(value, k);
    } else if (k == "max_step_requests") {
      o.max_step_requests = int_value(value, k, -2147483648LL, 2147483647LL);  // bounds: check_options
    } else if (k == "max_step_tokens") {
      o.max_step_tokens = int_value(value, k, -2147483648LL, 2147483647LL);
    } else if (k == "flat_step_chunks") {
      o.flat_step_chunks = int_value(value, k, -2147483648LL, 2147483647LL);
    } else if (k == "flat_step_pad") {
      o.flat_step_pad = bool_value(value, k);
    } else if (k == "device") {
      if (!value.is_none()) device = int_value(value, k, 0, 1 << 16);
    } else {
      std::string all;
      for (const char* n : kOptions) all += std::string(all.empty() ? "" : ", ") + n;
      throw nb::type_error(("Executor() got the unknown option '" + k + "'; the options are " + all).c_str());
    }
  }
  return o;
}

nb::dict status_dict(const kernels::StepStatus& s) {
  nb::dict d;
  for (int f = 0; f < kernels::kFaultKinds; ++f) d[kernels::fault_name(static_cast<kernels::Fault>(f))] = s.counts[f];
  if (s.recorded != 0) {
    const int kind = s.first.kind;
    const nb::object name = kind >= 0 && kind < kernels::kFaultKinds
                                ? nb::cast(kernels::fault_name(static_cast<kernels::Fault>(kind)))
                                : nb::cast(std::to_string(kind));
    d["first"] = nb::make_tuple(name, s.first.request, s.first.position, s.first.value);
  } else {
    d["first"] = nb::none();
  }
  d["total"] = s.total();
  return d;
}

/// One thread inside an executor at a time (it is not thread-safe; the GIL is released while it waits).
class BusyGuard {
 public:
  explicit BusyGuard(std::atomic<bool>& busy) : busy_(busy) {
    if (busy_.exchange(true)) {
      throw std::runtime_error("spgraph.Executor is in use by another thread; an executor serves one thread at a time");
    }
  }
  ~BusyGuard() { busy_.store(false); }
  BusyGuard(const BusyGuard&) = delete;
  BusyGuard& operator=(const BusyGuard&) = delete;

 private:
  std::atomic<bool>& busy_;
};

class Executor {
 public:
  Executor(nb::handle config, nb::handle buffers, nb::handle options)
      : config_(pipeline_config(config)), reader_(valid(config_)) {
    int device = -1;
    graphs::ExecutorOptions o = executor_options(options, device);
    bound_ = bound_buffers(config_, buffers);
    o.buffers = bound_.layers;
    // Every host-side refusal before the first CUDA call (CPU-testable).
    graphs::Executor::check_options(config_, o);
    if (bound_.device >= 0 && device >= 0 && device != bound_.device) {
      throw nb::value_error(("device = " + std::to_string(device) + " but the bound buffers are on cuda:" +
                             std::to_string(bound_.device))
                                .c_str());
    }
    if (device < 0) device = bound_.device;
    if (device < 0) SPG_CUDA_TRY(cudaGetDevice(&device));
    device_ = device;
    // Sized once for the largest step (nothing allocated per run_step).
    step_reader_ = std::make_unique<ChunkReader>(config_, o.max_step_requests, true);
    const DeviceScope scope(device_);
    ex_ = std::make_unique<graphs::Executor>(config_, std::move(o));
  }

  nb::dict warmup() {
    BusyGuard busy(busy_);
    graphs::WarmupReport w;
    {
      const nb::gil_scoped_release release;
      const DeviceScope scope(device_);
      w = ex_->warmup();
    }
    nb::dict d;
    d["graphs"] = w.graphs;
    d["step_graphs"] = w.step_graphs;
    d["one_chunk_step_graphs"] = w.one_chunk_step_graphs;
    d["flat_step_graphs"] = w.flat_step_graphs;
    d["staged_step_graphs"] = w.staged_step_graphs;
    d["staged_one_chunk_graphs"] = w.staged_one_chunk_graphs;
    d["buckets"] = w.buckets;
    d["programs"] = w.programs;
    d["eager_ms"] = w.eager_ms;
    d["capture_ms"] = w.capture_ms;
    d["graph_device_bytes"] = w.graph_device_bytes;
    d["pool_device_bytes"] = w.pool_device_bytes;
    d["pool_pinned_bytes"] = w.pool_pinned_bytes;
    d["pool_allocation_calls"] = w.pool_allocation_calls;
    d["kernel_launches_per_step"] = w.kernel_launches_per_step;
    return d;
  }

  StepResult run(nb::handle chunk, nb::handle stream, int program, bool check, bool eager) {
    BusyGuard busy(busy_);
    const graphs::ChunkInput& input = reader_.read(chunk);
    const cudaStream_t s = stream_arg(stream, ex_->stream());
    StepResult out;
    {
      const nb::gil_scoped_release release;
      const DeviceScope scope(device_);
      out.r = eager ? ex_->run_eager(input, program, s) : ex_->run(input, program, s);
    }
    reader_.release();
    if (out.r.bucket >= 0) {
      out.r_bucket = ex_->buckets().r_of(out.r.bucket);
      out.t_bucket = ex_->buckets().t_of(out.r.bucket);
    }
    if (check && !out.r.ok()) raise_run_error(out);
    return out;
  }

  /// A whole step in one launch (graphs::Executor::run(StepInput)): read like a chunk, any size
  /// up to the step options.
  StepResult run_step(nb::handle step, nb::handle stream, int program, bool check, bool eager) {
    BusyGuard busy(busy_);
    const graphs::StepInput& input = step_reader_->read_step(step);
    const cudaStream_t s = stream_arg(stream, ex_->stream());
    StepResult out;
    out.step = true;
    {
      const nb::gil_scoped_release release;
      const DeviceScope scope(device_);
      out.r = eager ? ex_->run_eager(input, program, s) : ex_->run(input, program, s);
    }
    step_reader_->release();
    return settle_step(out, check);
  }

  /// A step call's result as it is returned: marked when the executor has no steps at all (its
  /// message then says which options it lacks), raised with `check` unless ok.
  StepResult settle_step(StepResult& out, bool check) const {
    out.no_steps = out.r.status == graphs::RunStatus::not_warmed_up && ex_->step_layout().max_chunks == 0;
    if (check && !out.r.ok()) raise_run_error(out);
    return out;
  }

  /// graphs::Executor::stage: the step read as run_step() reads it, checked and staged, no launch.
  StepResult stage_step(nb::handle step, bool check) {
    BusyGuard busy(busy_);
    const graphs::StepInput& input = step_reader_->read_step(step);
    StepResult out;
    out.step = true;
    out.call = "stage_step";
    {
      const nb::gil_scoped_release release;
      const DeviceScope scope(device_);
      out.r = ex_->stage(input);
    }
    step_reader_->release();
    return settle_step(out, check);
  }

  /// graphs::Executor::run_staged / run_staged_eager: the staged step for `program`.
  StepResult run_staged(nb::handle stream, int program, bool check, bool eager) {
    BusyGuard busy(busy_);
    const cudaStream_t s = stream_arg(stream, ex_->stream());
    StepResult out;
    out.step = true;
    out.call = eager ? "run_staged_eager" : "run_staged";
    {
      const nb::gil_scoped_release release;
      const DeviceScope scope(device_);
      out.r = eager ? ex_->run_staged_eager(program, s) : ex_->run_staged(program, s);
    }
    return settle_step(out, check);
  }

  void synchronize() {
    BusyGuard busy(busy_);
    const nb::gil_scoped_release release;
    const DeviceScope scope(device_);
    ex_->synchronize();
  }

  nb::dict read_status() {
    BusyGuard busy(busy_);
    kernels::StepStatus s{};
    {
      const nb::gil_scoped_release release;
      const DeviceScope scope(device_);
      s = ex_->read_status();
    }
    return status_dict(s);
  }

  nb::dict layer(nb::handle self, std::int64_t l, nb::handle tensors) const {
    const Framework fw = framework_arg(tensors);
    const auto n = static_cast<std::int64_t>(config_.layers.size());
    if (l < -n || l >= n) {
      throw nb::index_error(("layer " + std::to_string(l) + " of a program of " + std::to_string(n) + " layers").c_str());
    }
    return layer_views(ex_->layer(static_cast<std::size_t>(l < 0 ? l + n : l)), self, device_, fw);
  }

  nb::dict workspace(nb::handle self, nb::handle tensors) const {
    return workspace_views(ex_->workspace(), self, device_, framework_arg(tensors));
  }

  [[nodiscard]] const graphs::Executor& ex() const { return *ex_; }
  [[nodiscard]] const model::PipelineConfig& config() const { return config_; }
  [[nodiscard]] int device() const { return device_; }

 private:
  static const model::PipelineConfig& valid(const model::PipelineConfig& c) {
    c.validate();  // before the reader sizes its storage from it
    return c;
  }

  model::PipelineConfig config_;
  ChunkReader reader_;
  std::unique_ptr<ChunkReader> step_reader_;
  BoundBuffers bound_;  // declared before ex_: the executor is destroyed (and synchronized) first
  int device_{0};
  std::unique_ptr<graphs::Executor> ex_;
  std::atomic<bool> busy_{false};
};

nb::dict check_chunk(nb::handle config, nb::handle chunk, nb::handle layers, bool insert) {
  model::PipelineConfig c = pipeline_config(config);
  c.validate();
  int mask = 0;
  if (layers.is_none()) {
    for (const model::LayerConfig& l : c.layers) mask |= 1 << graphs::ratio_index(l.compress_ratio);
  } else {
    for (int l : int_list(layers, "layers")) {
      if (l < 0 || l >= static_cast<int>(c.layers.size())) {
        throw nb::value_error(("layers names layer " + std::to_string(l) + "; layers are 0 .. " +
                               std::to_string(c.layers.size() - 1))
                                  .c_str());
      }
      mask |= 1 << graphs::ratio_index(c.layers[static_cast<std::size_t>(l)].compress_ratio);
    }
  }
  ChunkReader reader(c);
  graphs::ChunkEncoder encoder(c, insert);  // check() uses scratch the encoder owns
  const graphs::ChunkCheck k = encoder.check(reader.read(chunk), mask);
  nb::dict d;
  d["status"] = status_key(k.status);
  d["requests"] = k.requests;
  d["tokens"] = k.tokens;
  d["new_compressed_rows"] = nb::make_tuple(k.new_rows[1], k.new_rows[2]);
  d["derive_slots"] = k.derive_slots;
  d["bad_request"] = k.bad_request;
  d["bad_field"] = k.bad_field != nullptr ? nb::cast(k.bad_field) : nb::none();
  return d;
}

/// What run_step() would refuse, without a GPU: plan_executor() with these options (every host
/// check of the constructor), then the executor's own step check (graphs::StepStager::check).
StepResult check_step(nb::handle config, nb::handle step, nb::handle options, int program) {
  model::PipelineConfig c = pipeline_config(config);
  c.validate();
  int device = -1;
  const graphs::ExecutorOptions o = executor_options(options, device);
  const graphs::ExecutorPlan plan = graphs::plan_executor(c, o);
  StepResult out;
  out.step = true;
  if (plan.step.max_chunks == 0) {
    out.r.status = graphs::RunStatus::not_warmed_up;
    out.no_steps = true;
    return out;
  }
  if (program < 0 || program >= static_cast<int>(plan.programs.size())) {
    out.r.status = graphs::RunStatus::bad_program;
    return out;
  }
  ChunkReader reader(c, o.max_step_requests, true);
  graphs::ChunkEncoder encoder(c, o.insert);
  graphs::StepStager stager(c, plan.step, plan.buckets, encoder);
  const graphs::StepCheck checked =
      stager.check(reader.read_step(step), plan.program_ratios[static_cast<std::size_t>(program)]);
  out.r.status = checked.status;
  out.r.chunks = checked.chunks;
  out.r.bad_chunk = checked.bad_chunk;
  out.r.bad_request = checked.bad_request;
  out.r.bad_field = checked.bad_field;
  out.r.bad_reason = checked.bad_reason;
  return out;
}

/// The executor's host-side plan for these options and bindings (plan_executor), without a GPU.
nb::dict plan_executor_dict(nb::handle config, nb::handle buffers, nb::handle options) {
  model::PipelineConfig c = pipeline_config(config);
  c.validate();
  int device = -1;
  graphs::ExecutorOptions o = executor_options(options, device);
  const BoundBuffers bound = bound_buffers(c, buffers);
  o.buffers = bound.layers;
  const graphs::ExecutorPlan plan = graphs::plan_executor(c, o);
  nb::dict step;
  step["max_step_requests"] = plan.step.max_requests;
  step["max_step_tokens"] = plan.step.max_tokens;
  step["max_chunks"] = plan.step.max_chunks;
  step["staging_bytes"] = plan.step.bytes();
  nb::list buckets;
  for (int b = 0; b < plan.buckets.size(); ++b) buckets.append(nb::make_tuple(plan.buckets.r_of(b), plan.buckets.t_of(b)));
  nb::dict d;
  d["buckets"] = buckets;
  d["programs"] = plan.programs;
  d["insert"] = o.insert;
  d["capture"] = o.capture;
  d["time_host_phases"] = o.time_host_phases;
  d["step"] = step;
  d["pool"] = plan_dict(plan.pool);
  return d;
}

}  // namespace

void bind_executor(nb::module_& m) {
  using namespace nb::literals;
  g_run_error = PyErr_NewExceptionWithDoc("spgraph.RunError",
                                          "Executor.run() / run_step() with check=True refused or failed a step; "
                                          "`result` holds the RunResult (status, bad_request, bad_field, cuda).",
                                          PyExc_RuntimeError, nullptr);
  m.attr("RunError") = nb::handle(g_run_error);

  nb::class_<StepResult>(m, "RunResult",
                         "What one Executor.run() / run_eager() / run_step() / run_step_eager() reported (never "
                         "raised unless check=True).")
      .def_prop_ro("status", [](const StepResult& s) { return status_key(s.r.status); },
                   "'ok', 'no_bucket', 'bad_chunk', 'bad_program', 'not_warmed_up', 'cuda_error' or 'not_staged'.")
      .def_prop_ro("message", [](const StepResult& s) { return describe(s); }, "The status in words.")
      .def_prop_ro("ok", [](const StepResult& s) { return s.r.ok(); }, "status == 'ok'.")
      .def_prop_ro("bucket", [](const StepResult& s) { return s.r.bucket; }, "Index of the bucket run: run(), and run_step() of one chunk (-1: none, or a step of several chunks).")
      .def_prop_ro("r_bucket", [](const StepResult& s) { return s.r_bucket; }, "R_bucket of the graph run (-1: none).")
      .def_prop_ro("t_bucket", [](const StepResult& s) { return s.t_bucket; },
                   "T_bucket of the graph run (-1: none): run() wrote that many rows of out/lse/max_logits, "
                   "run_step() only the step's tokens.")
      .def_prop_ro("bad_request", [](const StepResult& s) { return s.r.bad_request; },
                   "bad_chunk: the request at fault (-1 for a chunk-wide field).")
      .def_prop_ro("bad_field",
                   [](const StepResult& s) { return s.r.bad_field != nullptr ? nb::cast(s.r.bad_field) : nb::none(); },
                   "bad_chunk: the field at fault ('seq_len', 'swa_blocks', ...), else None.")
      .def_prop_ro("cuda",
                   [](const StepResult& s) {
                     return s.r.cuda != cudaSuccess ? nb::cast(cudaGetErrorName(s.r.cuda)) : nb::none();
                   },
                   "cuda_error: the CUDA error's name, else None.")
      .def_prop_ro("chunks", [](const StepResult& s) { return s.r.chunks; },
                   "run_step: the chunks the step was split into (0 for a step of no requests, or one the split refused).")
      .def_prop_ro("bad_chunk", [](const StepResult& s) { return s.r.bad_chunk; },
                   "run_step: the chunk at fault (-1: none, or the whole step); bad_request is then the step's index.")
      .def_prop_ro("bad_reason",
                   [](const StepResult& s) { return s.r.bad_reason != nullptr ? nb::cast(s.r.bad_reason) : nb::none(); },
                   "What is wrong with bad_field, in words, else None.")
      .def_prop_ro("waited_us", [](const StepResult& s) { return s.r.waited_us; },
                   "Microseconds the host waited for the device to release a staging block.")
      .def_prop_ro("staging_us", [](const StepResult& s) { return s.r.phases.staging_us; },
                   "Host microseconds checking and staging the chunk, waited_us excluded "
                   "(time_host_phases=True only).")
      .def_prop_ro("launch_us", [](const StepResult& s) { return s.r.phases.launch_us; },
                   "Host microseconds in cudaGraphLaunch or the eager launches (time_host_phases=True only).")
      .def_prop_ro("record_us", [](const StepResult& s) { return s.r.phases.record_us; },
                   "Host microseconds in events: ordering after a stream change, and the event after a launch on "
                   "a caller's stream (about 0 on the executor's own stream; time_host_phases=True only).")
      .def("raise_for_status", [](const StepResult& s) { if (!s.r.ok()) raise_run_error(s); },
           "Raises spgraph.RunError unless the step ran.")
      .def("__bool__", [](const StepResult& s) { return s.r.ok(); })
      .def("__repr__", [](const StepResult& s) {
        std::string text = "RunResult(status='" + std::string(graphs::run_status_name(s.r.status)) + "'";
        if (s.r.bucket >= 0) {
          text += ", bucket=" + std::to_string(s.r.bucket) + " (R " + std::to_string(s.r_bucket) + ", T " +
               std::to_string(s.t_bucket) + ")";
        }
        if (s.r.bad_field != nullptr) {
          text += ", bad_request=" + std::to_string(s.r.bad_request) + ", bad_field='" + s.r.bad_field + "'";
        }
        if (s.r.cuda != cudaSuccess) text += std::string(", cuda='") + cudaGetErrorName(s.r.cuda) + "'";
        return text + ")";
      });

  nb::class_<Executor>(m, "Executor", "graphs::Executor over engine-owned arrays; use spgraph.Executor.")
      .def(nb::init<nb::handle, nb::handle, nb::handle>(), "config"_a, "buffers"_a.none(), "options"_a.none(),
           "Checks the config, options and bound arrays (host-side first), then plans and allocates the pool.")
      .def("warmup", &Executor::warmup, "Eager run and capture of every bucket; the report as a dict.")
      .def(
          "run",
          [](Executor& ex, nb::handle chunk, nb::handle stream, int program, bool check) {
            return ex.run(chunk, stream, program, check, false);
          },
          "chunk"_a, "stream"_a.none() = nb::none(), "program"_a = 0, "check"_a = false,
          "Replays the chunk's graph on `stream` (None: the executor's stream); a RunResult.")
      .def(
          "run_eager",
          [](Executor& ex, nb::handle chunk, nb::handle stream, int program, bool check) {
            return ex.run(chunk, stream, program, check, true);
          },
          "chunk"_a, "stream"_a.none() = nb::none(), "program"_a = 0, "check"_a = false,
          "The same recording launched kernel by kernel; a RunResult.")
      .def(
          "run_step",
          [](Executor& ex, nb::handle step, nb::handle stream, int program, bool check) {
            return ex.run_step(step, stream, program, check, false);
          },
          "step"_a, "stream"_a.none() = nb::none(), "program"_a = 0, "check"_a = false,
          "Every request of a step in one launch of the step graph on `stream` (None: the executor's stream); "
          "a RunResult with `chunks`.")
      .def(
          "run_step_eager",
          [](Executor& ex, nb::handle step, nb::handle stream, int program, bool check) {
            return ex.run_step(step, stream, program, check, true);
          },
          "step"_a, "stream"_a.none() = nb::none(), "program"_a = 0, "check"_a = false,
          "The same step launched from a host loop, chunk by chunk; a RunResult.")
      .def("stage_step", &Executor::stage_step, "step"_a, "check"_a = false,
           "Checks and stages a step once for every program, launching nothing; a RunResult with `chunks`.")
      .def(
          "run_staged",
          [](Executor& ex, nb::handle stream, int program, bool check) {
            return ex.run_staged(stream, program, check, false);
          },
          "stream"_a.none() = nb::none(), "program"_a = 0, "check"_a = false,
          "Launches the staged step for `program` on `stream` (None: the executor's stream); a RunResult.")
      .def(
          "run_staged_eager",
          [](Executor& ex, nb::handle stream, int program, bool check) {
            return ex.run_staged(stream, program, check, true);
          },
          "stream"_a.none() = nb::none(), "program"_a = 0, "check"_a = false,
          "The staged step launched from a host loop; a RunResult.")
      .def("synchronize", &Executor::synchronize, "Waits for every submitted step.")
      .def("read_status", &Executor::read_status,
           "The last completed step's fault counts (waits for it): {kind: count, 'first': ..., 'total': n}.")
      .def(
          "layer_views",
          [](nb::handle self, std::int64_t l, nb::handle tensors) {
            return nb::cast<const Executor&>(self).layer(self, l, tensors);
          },
          "layer"_a, "tensors"_a = "dlpack",
          "Every buffer of a layer, {name: array or None}, zero-copy views that keep the executor alive.")
      .def(
          "workspace_views",
          [](nb::handle self, nb::handle tensors) { return nb::cast<const Executor&>(self).workspace(self, tensors); },
          "tensors"_a = "dlpack", "The step workspace {kv, combined_indices, combined_lens}, zero-copy views.")
      .def("config_dict", [](const Executor& ex) { return config_dict(ex.config()); },
           "The executor's config as the keyword arguments of spgraph.PipelineConfig.")
      .def("pool_plan", [](const Executor& ex) { return plan_dict(ex.ex().pool().plan()); },
           "The pool's plan: what the executor holds beyond the bound buffers.")
      .def_prop_ro("buckets",
                   [](const Executor& ex) {
                     nb::list l;
                     for (int b = 0; b < ex.ex().buckets().size(); ++b) {
                       l.append(nb::make_tuple(ex.ex().buckets().r_of(b), ex.ex().buckets().t_of(b)));
                     }
                     return l;
                   },
                   "The buckets as (R_bucket, T_bucket), by index.")
      .def_prop_ro("stream", [](const Executor& ex) { return reinterpret_cast<std::uintptr_t>(ex.ex().stream()); },
                   "The executor's own stream (cudaStream_t as an int).")
      .def_prop_ro("device", &Executor::device, "The CUDA device the executor runs on.")
      .def_prop_ro("max_step_requests", [](const Executor& ex) { return ex.ex().step_layout().max_requests; },
                   "The most requests run_step() takes (0: no steps).")
      .def_prop_ro("max_step_tokens", [](const Executor& ex) { return ex.ex().step_layout().max_tokens; },
                   "The most tokens run_step() takes (0: no steps).")
      .def_prop_ro("max_step_chunks", [](const Executor& ex) { return ex.ex().step_layout().max_chunks; },
                   "The most chunks a step splits into (0: no steps).")
      .def_prop_ro("programs", [](const Executor& ex) { return ex.ex().programs(); }, "Number of layer programs.")
      .def("program_layers", [](const Executor& ex, int p) { return ex.ex().program_layers(p); }, "program"_a,
           "The layers of program p.")
      .def_prop_ro("steps", [](const Executor& ex) { return ex.ex().steps(); }, "Steps launched so far.")
      .def_prop_ro("flat_steps", [](const Executor& ex) { return ex.ex().flat_steps(); },
                   "Steps launched as a flat step graph (the options flat_step_chunks, flat_step_pad).")
      .def_prop_ro("staged_chunks", [](const Executor& ex) { return ex.ex().staged_chunks(); },
                   "Chunks of the staged step (-1: none staged).")
      .def_prop_ro("staged_reruns", [](const Executor& ex) { return ex.ex().staged_reruns(); },
                   "Launches of a staged step that ran what an earlier launch had loaded.")
      .def_prop_ro("host_waits", [](const Executor& ex) { return ex.ex().host_waits(); },
                   "Launches that waited for the device to release a staging block.");

  m.def("check_step", &check_step, "config"_a, "step"_a, "options"_a.none(), "program"_a,
        "What Executor.run_step would refuse, without a GPU: a RunResult ('ok' with `chunks`, or the refusal).");
  m.def("plan_executor", &plan_executor_dict, "config"_a, "buffers"_a.none(), "options"_a.none(),
        "The executor's host-side plan for these options and bindings, without a GPU: {'buckets', 'programs', "
        "'insert', 'capture', 'time_host_phases', 'step', 'pool'}.");
  m.def("check_chunk", &check_chunk, "config"_a, "chunk"_a, "layers"_a.none(), "insert"_a,
        "The executor's chunk checks without a GPU: {'status', 'requests', 'tokens', 'new_compressed_rows', "
        "'derive_slots', 'bad_request', 'bad_field'}.");
}

}  // namespace spg::python

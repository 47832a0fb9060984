// The configs and the planner of the Python package: see config.hpp.
#include "config.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <functional>
#include <string>
#include <vector>

#include "array_arg.hpp"
#include "spgraph/graphs/buckets.hpp"
#include "spgraph/graphs/layer_buffers.hpp"
#include "spgraph/graphs/pipeline_pool.hpp"
#include "spgraph/graphs/step.hpp"
#include "spgraph/memory/pool_plan.hpp"

namespace spg::python {

namespace {

constexpr std::int64_t kInt32Max = 2147483647;

int int_attr(nb::handle obj, const char* name, const std::string& what) {
  return int_value(required_attr(obj, name, what), what + "." + name, -kInt32Max - 1, kInt32Max);
}

nb::dict layer_dict(const model::LayerConfig& l) {
  nb::dict d;
  d["h_q"] = l.h_q;
  d["d_qk"] = l.d_qk;
  d["d_v"] = l.d_v;
  d["window"] = l.window;
  d["compress_ratio"] = l.compress_ratio;
  d["top_k"] = l.top_k;
  d["sm_scale"] = static_cast<double>(l.sm_scale);
  d["attn_sink"] = l.attn_sink;
  return d;
}

nb::dict cache_dict(const model::CacheConfig& c) {
  nb::dict d;
  d["swa_block_size"] = c.swa_block_size;
  d["block_tokens"] = c.block_tokens;
  d["swa_blocks"] = c.swa_blocks;
  d["compressed_blocks"] = c.compressed_blocks;
  return d;
}

model::LayerConfig layer_config(nb::handle obj, const std::string& what) {
  model::LayerConfig l;
  l.h_q = int_attr(obj, "h_q", what);
  l.d_qk = int_attr(obj, "d_qk", what);
  l.d_v = int_attr(obj, "d_v", what);
  l.window = int_attr(obj, "window", what);
  l.compress_ratio = int_attr(obj, "compress_ratio", what);
  l.top_k = int_attr(obj, "top_k", what);
  l.sm_scale = static_cast<float>(float_value(required_attr(obj, "sm_scale", what), what + ".sm_scale"));
  l.attn_sink = bool_value(required_attr(obj, "attn_sink", what), what + ".attn_sink");
  return l;
}

nb::dict scheduler_dict(const scheduler::SchedulerConfig& c) {
  nb::dict d;
  d["max_num_batched_tokens"] = c.max_num_batched_tokens;
  d["max_tokens_per_request"] = c.max_tokens_per_request;
  d["max_chunks_per_step"] = c.max_chunks_per_step;
  return d;
}

nb::dict workload_dict(const scheduler::WorkloadConfig& c) {
  nb::dict d;
  d["seed"] = c.seed;
  d["num_requests"] = c.num_requests;
  d["min_prompt_len"] = c.min_prompt_len;
  d["max_prompt_len"] = c.max_prompt_len;
  d["lengths"] = std::string(scheduler::to_string(c.lengths));
  d["log_normal_sigma"] = c.log_normal_sigma;
  d["arrivals"] = std::string(scheduler::to_string(c.arrivals));
  d["arrival_rate"] = c.arrival_rate;
  d["first_step"] = c.first_step;
  return d;
}

const char* kind_name(memory::MemoryKind k) { return k == memory::MemoryKind::device ? "device" : "pinned_host"; }

/// plan(config, bound, insert): `bound` is True/False (every buffer of every layer the engine's,
/// or none) or a collection of buffer names bound in every layer ("swa_cache", ...).
nb::dict plan_pool(nb::handle config, nb::handle bound, bool insert, int max_step_requests, int max_step_tokens) {
  const model::PipelineConfig c = pipeline_config(config);
  const bool steps = max_step_requests != 0 || max_step_tokens != 0;
  if (steps) c.validate();  // before the step layout is sized from it
  // The step layout checks the step options (and its slots follow the layer buffers, as the executor plans them).
  const graphs::StepLayout layout = steps ? graphs::StepLayout::make(c, max_step_requests, max_step_tokens)
                                          : graphs::StepLayout{};
  std::vector<bool> names(std::size(graphs::kLayerBuffers), false);
  if (PyBool_Check(bound.ptr())) {
    names.assign(names.size(), bound.ptr() == Py_True);
  } else {
    if (PyUnicode_Check(bound.ptr()) || PyObject_HasAttrString(bound.ptr(), "__iter__") == 0) {
      throw nb::type_error(("engine_buffers must be a bool or a collection of buffer names, not " + py_type_name(bound)).c_str());
    }
    for (nb::handle item : bound) {
      if (!PyUnicode_Check(item.ptr())) {
        throw nb::type_error(("engine_buffers holds a " + py_type_name(item) + "; it takes buffer names (str)").c_str());
      }
      const std::string name = nb::cast<std::string>(item);
      bool found = false;
      for (std::size_t i = 0; i < std::size(graphs::kLayerBuffers); ++i) {
        if (name == graphs::layer_buffer_name(graphs::kLayerBuffers[i])) {
          names[i] = true;
          found = true;
        }
      }
      if (!found) {
        std::string all;
        for (graphs::LayerBuffer b : graphs::kLayerBuffers) all += std::string(all.empty() ? "" : ", ") + graphs::layer_buffer_name(b);
        throw nb::value_error(("engine_buffers names '" + name + "'; the buffers of a layer are " + all).c_str());
      }
    }
  }
  memory::PoolPlan plan = graphs::plan_pipeline_pool(
      c, [&](std::size_t, graphs::LayerBuffer b) { return static_cast<bool>(names[static_cast<std::size_t>(b)]); },
      insert, graphs::StepBounds{max_step_requests, max_step_tokens});
  if (steps) graphs::plan_step_slots(plan, layout);
  return plan_dict(plan);
}

nb::dict bucket_dict(const graphs::BucketSet& b) {
  nb::dict d;
  d["r_buckets"] = b.r_buckets();
  d["t_buckets"] = b.t_buckets();
  d["describe"] = b.describe();
  return d;
}

}  // namespace

/// The plan as a dict: its slots (name, kind, shape, bytes, offset, alignment), the totals and the table text.
nb::dict plan_dict(const memory::PoolPlan& plan) {
  nb::list slots;
  for (const memory::Slot& s : plan.slots()) {
    nb::dict d;
    d["name"] = s.spec.name;
    d["kind"] = kind_name(s.spec.kind);
    d["shape"] = s.spec.shape;
    d["bytes"] = s.spec.bytes;
    d["offset"] = s.offset;
    d["alignment"] = s.spec.alignment;
    slots.append(d);
  }
  nb::dict d;
  d["slots"] = slots;
  d["device_bytes"] = plan.device_bytes();
  d["pinned_bytes"] = plan.pinned_bytes();
  d["table"] = plan.table();
  return d;
}

model::PipelineConfig pipeline_config(nb::handle obj) {
  model::PipelineConfig c;
  const std::string what = "config";
  c.max_requests = int_attr(obj, "max_requests", what);
  c.max_tokens = int_attr(obj, "max_tokens", what);
  c.max_model_len = int_attr(obj, "max_model_len", what);
  const nb::object layers = required_attr(obj, "layers", what);
  if (PyUnicode_Check(layers.ptr()) || PySequence_Check(layers.ptr()) == 0) {
    throw nb::type_error(("config.layers must be a sequence of LayerConfig, not " + py_type_name(layers)).c_str());
  }
  const Py_ssize_t n = PySequence_Size(layers.ptr());
  if (n < 0) throw nb::python_error();
  for (Py_ssize_t i = 0; i < n; ++i) {
    const nb::object layer = nb::steal(PySequence_GetItem(layers.ptr(), i));
    if (!layer.is_valid()) throw nb::python_error();
    c.layers.push_back(layer_config(layer, "config.layers[" + std::to_string(i) + "]"));
  }
  const nb::object cache = required_attr(obj, "cache", what);
  c.cache.swa_block_size = int_attr(cache, "swa_block_size", "config.cache");
  c.cache.block_tokens = int_attr(cache, "block_tokens", "config.cache");
  c.cache.swa_blocks = int_attr(cache, "swa_blocks", "config.cache");
  c.cache.compressed_blocks = int_attr(cache, "compressed_blocks", "config.cache");
  return c;
}

nb::dict config_dict(const model::PipelineConfig& c) {
  nb::dict d;
  d["max_requests"] = c.max_requests;
  d["max_tokens"] = c.max_tokens;
  d["max_model_len"] = c.max_model_len;
  nb::list layers;
  for (const model::LayerConfig& l : c.layers) layers.append(layer_dict(l));
  d["layers"] = layers;
  d["cache"] = cache_dict(c.cache);
  return d;
}

scheduler::SchedulerConfig scheduler_config(nb::handle obj) {
  scheduler::SchedulerConfig c;
  const std::string what = "scheduler_config";
  c.max_num_batched_tokens = int_attr(obj, "max_num_batched_tokens", what);
  c.max_tokens_per_request = int_attr(obj, "max_tokens_per_request", what);
  c.max_chunks_per_step = int_attr(obj, "max_chunks_per_step", what);
  return c;
}

scheduler::WorkloadConfig workload_config(nb::handle obj) {
  scheduler::WorkloadConfig c;
  const std::string what = "workload";
  const std::int64_t seed = int_value(required_attr(obj, "seed", what), "workload.seed");
  if (seed < 0) throw nb::value_error(("workload.seed = " + std::to_string(seed) + " must be >= 0").c_str());
  c.seed = static_cast<std::uint64_t>(seed);
  c.num_requests = int_attr(obj, "num_requests", what);
  c.min_prompt_len = int_attr(obj, "min_prompt_len", what);
  c.max_prompt_len = int_attr(obj, "max_prompt_len", what);
  const nb::object lengths = required_attr(obj, "lengths", what);
  const nb::object arrivals = required_attr(obj, "arrivals", what);
  if (!PyUnicode_Check(lengths.ptr()) || !PyUnicode_Check(arrivals.ptr())) {
    throw nb::type_error("workload.lengths and workload.arrivals must be str ('uniform' / 'log-normal', 'all' / 'poisson')");
  }
  c.lengths = scheduler::parse_length_distribution(nb::cast<std::string>(lengths));
  c.arrivals = scheduler::parse_arrival_pattern(nb::cast<std::string>(arrivals));
  c.log_normal_sigma = float_value(required_attr(obj, "log_normal_sigma", what), "workload.log_normal_sigma");
  c.arrival_rate = float_value(required_attr(obj, "arrival_rate", what), "workload.arrival_rate");
  c.first_step = int_value(required_attr(obj, "first_step", what), "workload.first_step");
  return c;
}

void bind_config(nb::module_& m) {
  using namespace nb::literals;
  m.def(
      "config_defaults",
      [] {
        nb::dict d;
        d["layer"] = layer_dict(model::LayerConfig{});
        d["cache"] = cache_dict(model::CacheConfig{});
        const model::PipelineConfig p{};
        nb::dict pipeline;
        pipeline["max_requests"] = p.max_requests;
        pipeline["max_tokens"] = p.max_tokens;
        pipeline["max_model_len"] = p.max_model_len;
        d["pipeline"] = pipeline;
        d["scheduler"] = scheduler_dict(scheduler::SchedulerConfig{});
        d["workload"] = workload_dict(scheduler::WorkloadConfig{});
        return d;
      },
      "The C++ defaults of every config field: {'layer', 'cache', 'pipeline', 'scheduler', 'workload'}.");
  m.def(
      "v4_default_config", [] { return config_dict(model::PipelineConfig::v4_default()); },
      "PipelineConfig::v4_default() as the keyword arguments of spgraph.PipelineConfig.");
  m.def(
      "single_layer_config",
      [](nb::handle layer, int max_requests, int max_tokens, int max_model_len) {
        return config_dict(model::PipelineConfig::single_layer(layer_config(layer, "layer"), max_requests, max_tokens,
                                                                max_model_len));
      },
      "layer"_a, "max_requests"_a, "max_tokens"_a, "max_model_len"_a,
      "PipelineConfig::single_layer(...) as the keyword arguments of spgraph.PipelineConfig.");
  m.def(
      "validate_config", [](nb::handle config) { pipeline_config(config).validate(); }, "config"_a,
      "PipelineConfig::validate(): raises ValueError naming the first field out of bounds.");
  m.def(
      "config_derived",
      [](nb::handle config) {
        const model::PipelineConfig c = pipeline_config(config);
        nb::dict d;
        d["window"] = c.window();
        d["swa_blocks_per_request"] = c.swa_blocks_per_request();
        d["compressed_blocks_per_request"] = c.compressed_blocks_per_request();
        nb::list rows;
        nb::list widths;
        nb::list labels;
        for (const model::LayerConfig& l : c.layers) {
          rows.append(c.max_kv_rows(l));
          widths.append(l.combined_width());
          labels.append(l.label());
        }
        d["max_kv_rows"] = rows;
        d["combined_widths"] = widths;
        d["labels"] = labels;
        return d;
      },
      "config"_a, "Values derived from a config: window, block-table widths, M_max, combined widths, labels.");
  m.def("plan_pool", &plan_pool, "config"_a, "engine_buffers"_a, "insert"_a, "max_step_requests"_a = 0,
        "max_step_tokens"_a = 0,
        "The pool plan_pipeline_pool lays out (no GPU needed), with the step options the step-sized buffers and "
        "the step slots: {'slots', 'device_bytes', 'pinned_bytes', 'table'}.");
  m.def(
      "bucket_set",
      [](nb::handle config, const std::vector<int>& r_buckets, const std::vector<int>& t_buckets) {
        const model::PipelineConfig c = pipeline_config(config);
        c.validate();
        const graphs::BucketSet d = graphs::BucketSet::make_default(c.max_requests, c.max_tokens);
        if (r_buckets.empty() && t_buckets.empty()) return bucket_dict(d);
        return bucket_dict(graphs::BucketSet(r_buckets.empty() ? d.r_buckets() : r_buckets,
                                             t_buckets.empty() ? d.t_buckets() : t_buckets, c.max_requests,
                                             c.max_tokens));
      },
      "config"_a, "r_buckets"_a, "t_buckets"_a,
      "The chunk-shape buckets an executor captures for: {'r_buckets', 't_buckets', 'describe'}.");
}

}  // namespace spg::python

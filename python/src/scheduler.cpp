// The scheduler and the synthetic workload from Python (spgraph.PrefillScheduler, StepPlan,
// ChunkPlan, Request, make_workload): the same chunks, block ids and slot mappings serve_loop
// hands its executor, so a Python loop replays serve_loop's trace exactly. docs/python.md,
// "The executor".
#include "scheduler.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "array_arg.hpp"
#include "chunk_input.hpp"
#include "config.hpp"
#include "spgraph/scheduler/prefill_scheduler.hpp"
#include "spgraph/scheduler/workload.hpp"

namespace spg::python {

namespace {

const scheduler::ChunkCachePlan& cache_of(const PlannedChunk& c, int ratio) { return c.plan.cache(ratio); }

nb::list table_list(const std::vector<std::vector<std::int32_t>>& tables) {
  nb::list l;
  for (const auto& row : tables) l.append(nb::cast(row));
  return l;
}

std::vector<scheduler::Request> requests_arg(nb::handle requests) {
  std::vector<scheduler::Request> out;
  if (nb::isinstance<scheduler::Request>(requests)) {
    out.push_back(nb::cast<scheduler::Request>(requests));
    return out;
  }
  if (PyObject_HasAttrString(requests.ptr(), "__iter__") == 0) {
    throw nb::type_error(("submit() takes a Request or a list of them, not " + py_type_name(requests)).c_str());
  }
  for (nb::handle r : requests) {
    if (!nb::isinstance<scheduler::Request>(r)) {
      throw nb::type_error(("submit() takes Requests; got a " + py_type_name(r)).c_str());
    }
    out.push_back(nb::cast<scheduler::Request>(r));
  }
  return out;
}

}  // namespace

void bind_scheduler(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<scheduler::Request>(m, "Request", "A prompt to prefill: id, prompt_len, arrival_step.")
      .def(
          "__init__",
          [](scheduler::Request* r, std::int64_t id, int prompt_len, std::int64_t arrival_step) {
            new (r) scheduler::Request{id, prompt_len, arrival_step};
          },
          "id"_a, "prompt_len"_a, "arrival_step"_a = 0)
      .def_rw("id", &scheduler::Request::id)
      .def_rw("prompt_len", &scheduler::Request::prompt_len)
      .def_rw("arrival_step", &scheduler::Request::arrival_step)
      .def("__repr__", [](const scheduler::Request& r) {
        return "Request(id=" + std::to_string(r.id) + ", prompt_len=" + std::to_string(r.prompt_len) +
               ", arrival_step=" + std::to_string(r.arrival_step) + ")";
      });

  m.def(
      "make_workload", [](nb::handle config) { return scheduler::make_workload(workload_config(config)); }, "config"_a,
      "The requests of a seeded synthetic workload (serve_loop's): ids 0 .. n - 1, arrivals non-decreasing.");
  m.def(
      "describe_workload", [](nb::handle config) { return workload_config(config).describe(); }, "config"_a,
      "One line describing a workload, as serve_loop prints it.");

  nb::class_<PlannedChunk>(m, "ChunkPlan",
                           "One chunk of a scheduler step; pass it to Executor.run as it is (nothing is converted).")
      .def_prop_ro("num_requests", [](const PlannedChunk& c) { return c.plan.num_requests; })
      .def_prop_ro("num_tokens", [](const PlannedChunk& c) { return c.plan.num_tokens; })
      .def_prop_ro("window", [](const PlannedChunk& c) { return c.plan.window; })
      .def_prop_ro("request_ids", [](const PlannedChunk& c) { return c.plan.request_ids; })
      .def_prop_ro("query_lens", [](const PlannedChunk& c) { return c.plan.query_lens; })
      .def_prop_ro("seq_lens", [](const PlannedChunk& c) { return c.plan.seq_lens; })
      .def_prop_ro("gather_lens", [](const PlannedChunk& c) { return c.plan.gather_lens; })
      .def_prop_ro("query_start_loc", [](const PlannedChunk& c) { return c.plan.query_start_loc; })
      .def_prop_ro("ratios",
                   [](const PlannedChunk& c) {
                     std::vector<int> r;
                     for (const auto& k : c.plan.caches) r.push_back(k.ratio);
                     return r;
                   },
                   "The cache kinds of the plan: 1 (SWA) first, then each compression ratio.")
      .def_rw("slot_lists", &PlannedChunk::slot_lists,
              "Executor.run hands the executor the scheduler's insert slot mappings (True) or lets the device "
              "derive the same slots from the block tables (False, the default: the host copies less).")
      .def("n_rows", [](const PlannedChunk& c, int r) { return c.plan.n_rows(r); }, "ratio"_a,
           "N for ratio r: max_b seq_len_b // r (0 for r = 1).")
      .def("m_rows", [](const PlannedChunk& c, int r) { return c.plan.m_rows(r); }, "ratio"_a,
           "The least M for ratio r: n_rows(r) + max_b gather_len_b.")
      .def("new_rows", [](const PlannedChunk& c, int r) { return cache_of(c, r).num_new_rows(); }, "ratio"_a,
           "Cache rows the chunk completes in the cache of ratio r (1: one per token).")
      .def("block_tables", [](const PlannedChunk& c, int r) { return table_list(cache_of(c, r).block_tables); },
           "ratio"_a, "Each request's physical block ids in the cache of ratio r (1 = SWA), as lists.")
      .def("slot_mapping", [](const PlannedChunk& c, int r) { return cache_of(c, r).slot_mapping; }, "ratio"_a,
           "The slot of each row the chunk completes in the cache of ratio r.")
      .def("__repr__", [](const PlannedChunk& c) {
        return "ChunkPlan(num_requests=" + std::to_string(c.plan.num_requests) +
               ", num_tokens=" + std::to_string(c.plan.num_tokens) + ")";
      });

  nb::class_<PlannedStep>(m, "StepPlan",
                           "One scheduler step: its chunks, in the order they must run (Executor.run_step takes it whole).")
      .def_ro("step", &PlannedStep::step)
      .def_ro("chunks", &PlannedStep::chunks)
      .def_ro("started", &PlannedStep::started)
      .def_ro("finished", &PlannedStep::finished)
      .def_ro("num_tokens", &PlannedStep::num_tokens);

  nb::class_<scheduler::PrefillScheduler>(m, "PrefillScheduler",
                                          "Chunked prefill over a stream of requests with paged cache blocks.")
      .def(
          "__init__",
          [](scheduler::PrefillScheduler* s, nb::handle pipeline, nb::handle config) {
            new (s) scheduler::PrefillScheduler(pipeline_config(pipeline), scheduler_config(config));
          },
          "pipeline"_a, "config"_a)
      .def(
          "submit",
          [](scheduler::PrefillScheduler& s, nb::handle requests) {
            const std::vector<scheduler::Request> r = requests_arg(requests);
            s.submit(std::span<const scheduler::Request>(r));
          },
          "requests"_a, "Queues a Request or a list of them (ids unique among those held).")
      .def(
          "schedule",
          [](scheduler::PrefillScheduler& s) {
            scheduler::StepPlan plan = s.schedule();
            PlannedStep step;
            step.step = plan.step;
            step.num_tokens = plan.num_tokens();
            step.started = std::move(plan.started);
            step.finished = std::move(plan.finished);
            for (scheduler::ChunkPlan& c : plan.chunks) {
              step.chunks.append(nb::cast(PlannedChunk{std::move(c), false}, nb::rv_policy::move));
            }
            return step;
          },
          "Forms the next step (its plans stay valid until the next call releases finished requests' blocks).")
      .def_prop_ro("done", &scheduler::PrefillScheduler::done)
      .def_prop_ro("next_step", &scheduler::PrefillScheduler::next_step)
      .def_prop_ro("num_waiting", &scheduler::PrefillScheduler::num_waiting)
      .def_prop_ro("num_running", &scheduler::PrefillScheduler::num_running)
      .def_prop_ro("window", &scheduler::PrefillScheduler::window)
      .def("describe", [](const scheduler::PrefillScheduler& s) { return s.config().describe(); });
}

}  // namespace spg::python

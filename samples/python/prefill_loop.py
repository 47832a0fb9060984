#!/usr/bin/env python3
"""prefill_loop: serve_loop's main job written the way a Python engine would write it.

The loop owns its caches and activation tensors in torch (allocated by torch's allocator, bound
into a ``spgraph.torch.Executor``), drives the scheduler's chunks through ``Executor.run`` (one
graph launch per chunk) on its own torch stream, fills q, the top-k indices and the new K rows
with serve_loop's synthetic model front, and prints serve_loop's report fields. On the same trace
and options its ``--checksum`` equals ``serve_loop --checksum`` (and ``serve_loop --checksum
--engine-buffers``): the flags that shape the trace are serve_loop's, with serve_loop's defaults
(--steps, --seed, --requests, --min-len, --max-len, --lengths, --arrivals, --rate, --budget,
--max-requests, --max-tokens, --max-model-len, --mode, --derive-slots); the output-only flags
(--json, --no-progress, --no-alloc-count, --checksum) change nothing in the outputs.

With ``--one-launch`` (as serve_loop's) each scheduler step is one ``Executor.run_step``: one graph
launch per step over step-sized tensors (``--step-requests`` x ``--budget`` rows), the model front
once per step for the step's rows, and the report's host time per launch is per step.

Needs a CUDA device, torch and the spgraph package (PYTHONPATH=build/python). Without a device it
prints the planned pool, as serve_loop does. docs/python.md, "The executor".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional

import spgraph
from spgraph import synthetic


def add_trace_arguments(p: argparse.ArgumentParser, steps: int = 1000) -> None:
    """serve_loop's flags that shape the trace, with its defaults (the --steps default is the
    caller's); check them with :func:`check_trace_arguments`."""
    a = p.add_argument
    a("--steps", type=int, default=steps, help=f"scheduler steps to run, 1..10000000 (default {steps})")
    a("--seed", type=int, default=1, help="workload and model-front seed (default 1)")
    a("--requests", type=int, default=256,
      help="requests per workload batch (default 256; a new batch arrives whenever the previous one has finished)")
    a("--min-len", type=int, default=1024, help="shortest prompt (default 1024)")
    a("--max-len", type=int, default=65536, help="longest prompt (default 65536)")
    a("--lengths", choices=("uniform", "log-normal", "lognormal"), default="log-normal",
      help="prompt length distribution (default log-normal)")
    a("--arrivals", choices=("all", "poisson"), default="all", help="arrival pattern (default all)")
    a("--rate", type=float, default=1.0, help="Poisson arrivals per step, > 0 (default 1)")
    a("--budget", type=int, default=8192, help="max_num_batched_tokens per step, >= 16 (default 8192)")
    a("--max-requests", type=int, default=4, help="requests per chunk, 1..64 (default 4)")
    a("--max-tokens", type=int, default=2048, help="tokens per chunk, 16..65536 (default 2048)")
    a("--max-model-len", type=int, default=65536, help="longest sequence (default 65536)")


def check_trace_arguments(p: argparse.ArgumentParser, o: argparse.Namespace) -> None:
    """Refuses (``p.error``, exit code 2) a trace flag out of its bounds, naming it."""
    for name, lo, hi in (("steps", 1, 10_000_000), ("requests", 1, 1_000_000), ("min_len", 1, 1 << 20),
                         ("max_len", 1, 1 << 20), ("budget", 16, 1 << 24), ("max_requests", 1, 64),
                         ("max_tokens", 16, 65536), ("max_model_len", 1, 1 << 20)):
        v = getattr(o, name)
        if not lo <= v <= hi:
            p.error(f"--{name.replace('_', '-')} = {v} must be in [{lo}, {hi}]")
    if o.max_len > o.max_model_len:
        p.error(f"--max-len = {o.max_len} must be at most --max-model-len = {o.max_model_len}")
    if o.min_len > o.max_len:
        p.error(f"--min-len = {o.min_len} must be at most --max-len = {o.max_len}")
    if not (o.rate > 0 and math.isfinite(o.rate)):
        p.error(f"--rate = {o.rate} must be > 0")


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="prefill_loop.py",
        description="Prefills a synthetic stream of prompts through the V4 layer program (4 C4A, 2 C128A, 2 SWA "
                    "layers) from Python: torch-owned caches and tensors bound into spgraph.torch.Executor, one "
                    "CUDA graph launch per chunk; reports throughput and step times as serve_loop does.")
    add_trace_arguments(p)
    a = p.add_argument
    a("--mode", choices=("graph", "eager"), default="graph",
      help="replay captured graphs (default) or launch the same kernels eagerly")
    a("--json", metavar="FILE", help="also write the report as JSON records (docs/results format)")
    a("--plan", action="store_true", help="print the layer program, buckets and pool plan, then exit (no GPU needed)")
    a("--checksum", action="store_true",
      help="print a checksum of every chunk's outputs (equal to serve_loop --checksum on the same trace)")
    a("--derive-slots", action="store_true",
      help="hand the executor no insert slot mappings: the device derives the same slots from the block tables")
    a("--pooled", action="store_true",
      help="let the executor's pool own every buffer (its views are used) instead of binding torch tensors")
    a("--no-alloc-count", action="store_true",
      help="do not count CUDA allocation calls: CUPTI stays unloaded, so host times are not inflated by its "
           "subscriber")
    a("--one-launch", action="store_true",
      help="launch each scheduler step whole, Executor.run_step: one graph launch per step (eager mode: the same "
           "kernels from a host loop); the model front runs once per step, for the step's rows; not with "
           "--checksum (it checks one chunk at a time; docs/graphs.md, Steps)")
    a("--step-requests", type=int, default=64,
      help="most requests in a step with --one-launch, 1..4096 (default 64; max_step_requests)")
    a("--require-gpu", action="store_true", help="exit with code 77 (skipped) instead of planning without a GPU")
    a("--no-progress", action="store_true", help="no progress bar")
    o = p.parse_args(argv)
    check_trace_arguments(p, o)
    if not 1 <= o.step_requests <= 4096:
        p.error(f"--step-requests = {o.step_requests} must be in [1, 4096]")
    if o.one_launch and o.checksum:
        p.error("--one-launch cannot be combined with --checksum: it checks one chunk at a time")
    if o.one_launch and o.budget > (1 << 20):
        p.error(f"--budget = {o.budget} must be at most 1048576 with --one-launch (max_step_tokens)")
    return o


def step_options(o: argparse.Namespace) -> Dict[str, int]:
    """The executor's step options with --one-launch (serve_loop's): the step's requests and budget."""
    return {"max_step_requests": o.step_requests, "max_step_tokens": o.budget} if o.one_launch else {}


def make_config(o: argparse.Namespace) -> spgraph.PipelineConfig:
    """serve_loop's make_config: the V4 program at these limits, caches for 2 x R prompts."""
    c = spgraph.PipelineConfig.v4_default()
    c.max_requests, c.max_tokens, c.max_model_len = o.max_requests, o.max_tokens, o.max_model_len
    c.cache.swa_blocks = 2 * c.max_requests * c.swa_blocks_per_request()
    c.cache.compressed_blocks = 2 * c.max_requests * c.compressed_blocks_per_request()
    return c


def percentile(values: List[float], p: float) -> float:
    """serve_loop's percentile: the element at min(n - 1, floor(p * n)) of the sorted values."""
    if not values:
        return math.nan
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))]


class Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.last = total, enabled, -1
        self.tty = sys.stderr.isatty()

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        pct = 100 * done // self.total
        if pct == self.last or (not self.tty and pct % 10 != 0):
            return
        self.last = pct
        if self.tty:
            fill = pct * 40 // 100
            sys.stderr.write(f"\r[{'#' * fill}{' ' * (40 - fill)}] {pct:3d}% ({done}/{self.total} steps)")
            if done == self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(f"progress: {pct}% ({done}/{self.total} steps)\n")
        sys.stderr.flush()


class PromptStream:
    """The synthetic prompt stream (serve_loop's PromptStream): a new batch of requests whenever the
    scheduler has run dry, each batch seeded from the run's seed and its index, request ids counting
    up over the run."""

    def __init__(self, seed: int, wc: "spgraph.WorkloadConfig") -> None:
        self.seed = seed
        self.wc = wc
        self.batch = 0
        self.next_id = 0

    def refill(self, sched: "spgraph.PrefillScheduler") -> None:
        if not sched.done:
            return
        self.wc.seed = (self.seed * 1000003 + self.batch) & (2**64 - 1)
        self.batch += 1
        self.wc.first_step = sched.next_step
        reqs = spgraph.make_workload(self.wc)
        for r in reqs:
            r.id = self.next_id
            self.next_id += 1
        sched.submit(reqs)


def engine_tensors(torch: Any, config: spgraph.PipelineConfig, insert: bool = True,
                   step: Optional[Dict[str, int]] = None) -> List[Dict[str, Any]]:
    """What an engine brings: every buffer of every layer from torch's allocator, contiguous, at the
    config's sizes (serve_loop --engine-buffers' model front, in torch), with ``step`` (the step
    options) at a step's rows: max(T, S) rows, compressed K rows max(T / r + R, S / r + Q). Zeroed,
    so nothing depends on what the allocator's memory held before."""
    dev = torch.device("cuda")
    T, R = config.max_tokens, config.max_requests
    S, Q = (step["max_step_tokens"], step["max_step_requests"]) if step else (0, 0)
    out = []
    for layer in config.layers:
        h, r = layer.h_q, layer.compress_ratio
        compressed_rows = max(T // r + R, S // r + Q)
        T = max(config.max_tokens, S)
        b = {"q": torch.zeros((T, h, layer.d_qk), dtype=torch.bfloat16, device=dev),
             "out": torch.zeros((T, h, layer.d_v), dtype=torch.bfloat16, device=dev),
             "lse": torch.zeros((T, h), dtype=torch.float32, device=dev),
             "max_logits": torch.zeros((T, h), dtype=torch.float32, device=dev)}
        swa_stride = spgraph.cache_block_stride(config.cache.swa_block_size)
        b["swa_cache"] = torch.zeros((config.cache.swa_blocks, swa_stride), dtype=torch.uint8, device=dev)
        if insert:
            b["k_rows"] = torch.zeros((T, 512), dtype=torch.bfloat16, device=dev)
        if r > 1:
            b["topk_indices"] = torch.zeros((T, layer.top_k), dtype=torch.int32, device=dev)
            stride = spgraph.cache_block_stride(config.cache.block_tokens // r)
            b["compressed_cache"] = torch.zeros((config.cache.compressed_blocks, stride), dtype=torch.uint8,
                                                device=dev)
            if insert:
                b["compressed_k_rows"] = torch.zeros((compressed_rows, 512), dtype=torch.bfloat16, device=dev)
        if layer.attn_sink:
            b["attn_sink"] = torch.zeros((h,), dtype=torch.float32, device=dev)
        out.append(b)
    return out


def print_plan(config: spgraph.PipelineConfig, engine_buffers: bool, step: Optional[Dict[str, int]] = None) -> None:
    print(f"layer program: {len(config.layers)} layers (R = {config.max_requests}, T = {config.max_tokens}, "
          f"max_model_len = {config.max_model_len})")
    for i, layer in enumerate(config.layers):
        print(f"  layer {i}: {layer.label()}")
    print(f"buckets: {config.buckets()['describe']}")
    if engine_buffers:
        print("every layer buffer is the engine's (torch tensors): the pool plans spgraph's own slots")
    print()
    print(spgraph.plan(config, engine_buffers, **(step or {})), end="")


def run(o: argparse.Namespace) -> Dict[str, Any]:
    """The loop; returns the report (every field serve_loop prints, by its JSON metric name)."""
    import torch

    import spgraph.torch as sgt

    config = make_config(o)
    config.validate()
    counter = None if o.no_alloc_count else spgraph.allocation_counter()
    eager = o.mode == "eager"
    print(f"prefill_loop: {o.mode} mode, {o.steps} steps, budget {o.budget} tokens/step, chunks of <= "
          f"{config.max_requests} requests x {config.max_tokens} tokens, "
          f"{'pooled buffers' if o.pooled else 'torch-owned buffers'}"
          + (", one launch per step" if o.one_launch else ""))
    steps = step_options(o)
    tensors = None if o.pooled else engine_tensors(torch, config, step=steps)
    torch.cuda.synchronize()  # the zero fills ran on torch's stream; the executor's warm-up runs on its own
    ex = sgt.Executor(config, buffers=tensors, **steps)
    warm = ex.warmup()
    engine_bytes = sum(t.numel() * t.element_size() for b in (tensors or []) for t in b.values())
    step_graphs = (f" + {warm['step_graphs']} step graphs + {warm['one_chunk_step_graphs']} one-chunk step graphs"
                   if warm["step_graphs"] else "")
    print(f"warm-up: {warm['graphs']} graphs ({warm['buckets']} shapes x 2 staging blocks){step_graphs} captured in "
          f"{warm['capture_ms']:.1f} ms; graphs hold {warm['graph_device_bytes'] / 2**20:.1f} MiB, pool "
          f"{warm['pool_device_bytes'] / 2**30:.2f} GiB device + {warm['pool_pinned_bytes'] / 1024:.1f} KiB pinned in "
          f"{warm['pool_allocation_calls']} allocations"
          + (f", torch buffers {engine_bytes / 2**30:.2f} GiB" if tensors else ""))

    stream = torch.cuda.Stream()
    handle = stream.cuda_stream
    views = [ex.layer(l) for l in range(len(config.layers))]
    with torch.cuda.stream(stream):
        # The model front's fixed part: query rows (random, once) and the sinks.
        for l, (layer, v) in enumerate(zip(config.layers, views)):
            synthetic.fill_query(v.q, o.seed, l, handle)
            if layer.attn_sink:
                v.attn_sink.copy_(torch.tensor(synthetic.sink_values(o.seed, l, layer.h_q), dtype=torch.float32))
        front = synthetic.SyntheticFront(synthetic.front_layers(config, views))
        acc = torch.zeros(1, dtype=torch.int64, device="cuda")
    stream.synchronize()

    sc = spgraph.SchedulerConfig(max_num_batched_tokens=o.budget)
    if o.one_launch:  # a chunk holds at most R requests: capping the chunks caps a step's requests
        sc.max_chunks_per_step = max(1, o.step_requests // o.max_requests)
    sched = spgraph.PrefillScheduler(config, sc)
    wc = spgraph.WorkloadConfig(num_requests=o.requests, min_prompt_len=o.min_len, max_prompt_len=o.max_len,
                                lengths=o.lengths, arrivals=o.arrivals, arrival_rate=o.rate)
    print(f"workload: {wc.describe()}")
    ring = 64  # GPU-time events: read back 64 launches later, never waited on early
    ev_start = [torch.cuda.Event(enable_timing=True) for _ in range(ring)]
    ev_stop = [torch.cuda.Event(enable_timing=True) for _ in range(ring)]
    outs = [(v.out, v.lse, v.max_logits) for v in views]
    host_us: List[float] = []
    step_host_us: List[float] = []
    gpu_us: List[float] = []
    chunks = launches = tokens = padded = graph_hits = eager_runs = finished = 0
    t_buckets = sorted({t for _, t in ex.buckets})
    waited_us = 0.0
    prompts = PromptStream(o.seed, wc)
    slot_lists = not o.derive_slots
    progress = Progress(o.steps, not o.no_progress)
    reserved_before = torch.cuda.memory_reserved()
    allocated_before = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
    run_chunk = ex.run_eager if eager else ex.run
    run_step = ex.run_step_eager if eager else ex.run_step
    clock = time.perf_counter_ns

    def start_gpu_timer() -> int:
        slot = launches % ring
        if launches >= ring:
            ev_stop[slot].synchronize()
            gpu_us.append(1000.0 * ev_start[slot].elapsed_time(ev_stop[slot]))
        ev_start[slot].record(stream)
        return slot

    if counter is not None:
        counter.reset()
    t_start = time.perf_counter()
    with torch.cuda.stream(stream):
        for step in range(o.steps):
            s0 = clock()
            prompts.refill(sched)
            plan = sched.schedule()
            finished += len(plan.finished)
            if o.one_launch and plan.chunks:  # the whole step: one front, one run_step, one launch
                front.run(plan, o.seed, launches, handle)
                slot = start_gpu_timer()
                h0 = clock()
                r = run_step(plan, handle)
                h1 = clock()
                if not r.ok:
                    raise RuntimeError(f"prefill_loop: step {step} failed: {r.message}")
                ev_stop[slot].record(stream)
                host_us.append((h1 - h0) / 1000.0 - r.waited_us)
                waited_us += r.waited_us
                eager_runs += eager
                graph_hits += not eager
                for cp in plan.chunks:
                    padded += next(t for t in t_buckets if t >= cp.num_tokens) - cp.num_tokens
                    tokens += cp.num_tokens
                chunks += r.chunks
                launches += 1
            for cp in plan.chunks if not o.one_launch else ():
                cp.slot_lists = slot_lists
                front.run(cp, o.seed, chunks, handle)
                slot = start_gpu_timer()
                h0 = clock()
                r = run_chunk(cp, handle)
                h1 = clock()
                if r.status == "no_bucket" and not eager:
                    r = ex.run_eager(cp, handle)  # never expected: the largest bucket is the chunk limit
                    eager_runs += 1
                elif eager:
                    eager_runs += 1
                else:
                    graph_hits += 1
                if not r.ok:
                    raise RuntimeError(f"prefill_loop: step {step} chunk failed: {r.message}")
                ev_stop[slot].record(stream)
                host_us.append((h1 - h0) / 1000.0 - r.waited_us)
                waited_us += r.waited_us
                t_bucket = r.t_bucket
                padded += t_bucket - cp.num_tokens
                tokens += cp.num_tokens
                if o.checksum:
                    for l, (out, lse, ml) in enumerate(outs):
                        salt = (chunks << 32) | (l << 8)
                        synthetic.checksum_accumulate(out[:t_bucket], salt, acc, handle)
                        synthetic.checksum_accumulate(lse[:t_bucket], salt + 1, acc, handle)
                        synthetic.checksum_accumulate(ml[:t_bucket], salt + 2, acc, handle)
                chunks += 1
                launches += 1
            step_host_us.append((clock() - s0) / 1000.0)
            progress.update(step + 1)
    ex.synchronize()
    stream.synchronize()
    wall_s = time.perf_counter() - t_start
    for c in range(max(0, launches - ring), launches):
        gpu_us.append(1000.0 * ev_start[c % ring].elapsed_time(ev_stop[c % ring]))
    allocations = counter.count() if counter is not None else None
    status = ex.read_status()
    reserved_growth = torch.cuda.memory_reserved() - reserved_before
    torch_allocs = torch.cuda.memory_stats().get("allocation.all.allocated", 0) - allocated_before

    rep: Dict[str, Any] = {
        "mode": o.mode, "one_launch": o.one_launch, "steps": o.steps, "chunks": chunks, "launches": launches,
        "finished": finished, "tokens": tokens, "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s,
        "host_us_p50": percentile(host_us, 0.5), "host_us_p99": percentile(host_us, 0.99),
        "step_host_us_p50": percentile(step_host_us, 0.5), "step_host_us_p99": percentile(step_host_us, 0.99),
        "host_waits": ex.host_waits, "waited_s": waited_us / 1e6,
        "gpu_us_p50": percentile(gpu_us, 0.5), "gpu_us_p99": percentile(gpu_us, 0.99),
        "graph_hits": graph_hits, "eager_runs": eager_runs,
        "padding_waste": padded / tokens if tokens else 0.0, "padded": padded,
        "alloc_calls": allocations, "torch_reserved_growth": reserved_growth, "torch_allocations": torch_allocs,
        "capture_ms": warm["capture_ms"], "graph_mib": warm["graph_device_bytes"] / 2**20,
        "pool_gib": warm["pool_device_bytes"] / 2**30, "pool_pinned_kib": warm["pool_pinned_bytes"] / 1024,
        "faults": status["total"],
        "checksum": f"{int(acc.item()) & (2**64 - 1):016x}" if o.checksum else None,
        "watched_callbacks": counter.watched_callbacks if counter is not None else None,
    }
    return rep


def print_report(o: argparse.Namespace, rep: Dict[str, Any]) -> None:
    print(f"\n== prefill_loop report ({rep['mode']} mode) ==")
    print(f"  steps                      {rep['steps']} ({rep['chunks']} chunks in {rep['launches']} launches, "
          f"{rep['finished']} requests finished)")
    print(f"  prompt tokens              {rep['tokens']} in {rep['wall_s']:.2f} s: {rep['tokens_per_s']:.0f} tokens/s")
    what, call = ("step", "Executor.run_step") if rep["one_launch"] else ("chunk", "Executor.run")
    print(f"  host time per {what + ' launch':<12} p50 {rep['host_us_p50']:.2f} us, p99 {rep['host_us_p99']:.2f} us "
          f"({call} from Python, waits excluded)")
    print(f"  host time per step         p50 {rep['step_host_us_p50']:.2f} us, p99 {rep['step_host_us_p99']:.2f} us "
          "(scheduler + model front + launches,\n                             waits for the device included)")
    print(f"  host waits for the device  {rep['host_waits']} of {rep['launches']} launches, {rep['waited_s']:.2f} s in all "
          "(the GPU is the bottleneck)")
    print(f"  GPU time per {what:<14}p50 {rep['gpu_us_p50']:.1f} us, p99 {rep['gpu_us_p99']:.1f} us")
    print(f"  graph hits / eager runs    {rep['graph_hits']} / {rep['eager_runs']}")
    print(f"  padding waste              {100 * rep['padding_waste']:.2f}% ({rep['padded']} padded / {rep['tokens']} "
          "real tokens)")
    if rep["alloc_calls"] is not None:
        print(f"  CUDA allocation calls      {rep['alloc_calls']} after warm-up (CUPTI, {rep['watched_callbacks']} "
              "callbacks watched; host times include\n                             CUPTI's cost: --no-alloc-count "
              "for clean ones)")
    else:
        print("  CUDA allocation calls      not counted (--no-alloc-count)")
    print(f"  torch allocator            {rep['torch_allocations']} allocations, reserved memory grew "
          f"{rep['torch_reserved_growth']} B over the loop")
    print(f"  pool                       {rep['pool_gib']:.2f} GiB device, {rep['pool_pinned_kib']:.1f} KiB pinned; "
          f"graphs {rep['graph_mib']:.1f} MiB; capture {rep['capture_ms']:.1f} ms")
    print(f"  device faults (last step)  {rep['faults']}")
    if rep["checksum"] is not None:
        print(f"  output checksum            {rep['checksum']}")


def write_json(o: argparse.Namespace, rep: Dict[str, Any]) -> None:
    name = "prefill_loop/default" if rep["alloc_calls"] is not None else "prefill_loop/no-cupti"
    variant = (f"spgraph-python-{rep['mode']}" + ("" if o.pooled else "-torch-buffers")
               + ("-one-launch" if o.one_launch else ""))
    commit = os.environ.get("SPGRAPH_COMMIT", "unknown")
    date = time.strftime("%Y-%m-%d", time.gmtime())
    metrics = ["steps", "tokens_per_s", "host_us_p50", "host_us_p99", "step_host_us_p50", "step_host_us_p99",
               "host_waits", "gpu_us_p50", "gpu_us_p99", "graph_hits", "eager_runs", "padding_waste", "alloc_calls",
               "torch_reserved_growth", "capture_ms", "graph_mib", "pool_gib", "faults"]
    records = [{"suite": "executor", "name": name, "variant": variant, "metric": m, "value": rep[m], "commit": commit,
                "date": date} for m in metrics if rep[m] is not None]
    with open(o.json, "w") as f:
        json.dump(records, f, indent=1)


def main(argv: Optional[List[str]] = None) -> int:
    o = parse(argv)
    config = make_config(o)
    try:
        config.validate()
    except ValueError as e:
        print(f"prefill_loop: invalid configuration: {e}", file=sys.stderr)
        return 2
    if o.plan:
        print_plan(config, not o.pooled, step_options(o))
        return 0
    try:
        import torch
        have_gpu = torch.cuda.is_available()
    except ImportError:
        have_gpu = False
    if not have_gpu:
        if o.require_gpu:
            print("prefill_loop: no CUDA device (or no torch) found; skipping (exit code 77)")
            return 77
        print("prefill_loop: no CUDA device (or no torch) found; running the CPU-side planner instead.\n")
        print_plan(config, not o.pooled, step_options(o))
        return 0
    rep = run(o)
    print_report(o, rep)
    if o.json:
        write_json(o, rep)
    ok = (rep["alloc_calls"] in (None, 0)) and rep["torch_reserved_growth"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The Python package's benchmark (H200; a measurement, not a test): each op called from Python
against the same kernel timed by `bench`, the Python call overhead per op, and the host time of
Executor.run from Python.

Ops: the rows of bench's tables A and C at the same shapes and the same timing (CUDA events around
each call on one stream, inputs rotating over several sets so no call starts with its data in L2,
the clocks warmed first): attention V4-C2/32768 and small-h128-k1152/8192/sq64 (sustained: 25 ms
warm-up, >= 100 ms timed, as table A), insert/large, dequant-gather/large/window and /compressed,
combine/large (single launches and 8 back to back, as table C), and each op's device time with
the host out of it (queued: the launches enqueued behind a spin, against bench's chained and
back-to-back figures). Host time per call (p50 of 300
calls, wall clock around the call alone) through each layer: spgraph.torch (drop-in, current
stream), torch.ops.spgraph (the custom op), spgraph (framework-neutral, int stream) and the
extension itself.

Executor: the V4 program (serve_loop's config and workload, torch-owned buffers) and a one-layer
program, host time per Executor.run from Python (p50/p99, waits for the device excluded, CUPTI
never loaded) with the chunk as a ChunkPlan (slot lists or derived slots), as NumPy int32 arrays
and as lists; the ChunkPlan call split up (the extension's method called directly, on the torch
stream and on the executor's own stream); and the C++ part of the same call (time_host_phases:
staging, launch, record; staging excludes the wait for a staging block, as the call time does).
The -idle-device variants synchronize before each call (outside the timing): the call onto an idle
device, against the others' calls queued behind the device's work. The call floors time the
pieces of a call alone: the torch layer's stream query, one call into the extension, an empty
Python call.
With --one-launch also Executor.run_step: the same programs with the step options (64 requests,
--budget tokens), host time per run_step from Python over serve_loop's scheduler steps (the
scheduler capping a step at 16 chunks), the step as a StepPlan and as NumPy arrays, and the chunks
per step; and staged steps with one program per layer: stage_step once a step, then run_staged per
layer (the first call of a step and the later ones apart), queued and onto an idle device.

  python3 scripts/python_bench.py [--json FILE] [--compare BENCH_JSON] [--quick] [--executor-only | --ops-only]
                                  [--one-launch [--budget N]]

--compare takes `bench --json` output (tables A and C) and prints each op's ratio to it. Records
(docs/results format: suite/name/variant/metric/value/commit/date) go to --json; SPGRAPH_COMMIT
names the commit. A short table is printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

import spgraph
import spgraph.torch as sgt
from spgraph import _spgraph as _C
from spgraph import synthetic

DEV = "cuda"
RECORDS: List[Dict[str, Any]] = []


def record(suite: str, name: str, variant: str, metric: str, value: float) -> None:
    RECORDS.append({"suite": suite, "name": name, "variant": variant, "metric": metric, "value": float(value)})


def pct(values: List[float], p: float) -> float:
    """serve_loop's percentile (the element at min(n - 1, floor(p * n)) of the sorted values)."""
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))] if v else math.nan


class Warmer:
    """bench's ClockWarmer: ~15 ms of device copies so the clocks are up when a timed section starts."""

    def __init__(self) -> None:
        self.src = torch.full((256 << 20,), 0x2D, dtype=torch.uint8, device=DEV)
        self.dst = torch.empty_like(self.src)

    def warm(self, stream: torch.cuda.Stream) -> None:
        with torch.cuda.stream(stream):
            for _ in range(120):
                self.dst.copy_(self.src)
        stream.synchronize()


def gpu_median_us(stream: torch.cuda.Stream, launch: Callable[[int], None], sets: int, warmup: int, reps: int,
                  per_rep: int = 1, warmup_ms: float = 0.0, min_timed_ms: float = 0.0) -> float:
    """bench's median_gpu_us: each repetition of `per_rep` launches between two events, rotating sets."""
    with torch.cuda.stream(stream):
        start = time.perf_counter()
        i = 0
        while i < warmup or (time.perf_counter() - start) * 1e3 < warmup_ms:
            launch(i % sets)
            i += 1
            if i % 64 == 0:
                stream.synchronize()
        stream.synchronize()
        times: List[float] = []
        timed = 0.0
        k = 0
        while len(times) < reps or timed < min_timed_ms:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(stream)
            for j in range(per_rep):
                launch((k * per_rep + j) % sets)
            e1.record(stream)
            e1.synchronize()
            ms = e0.elapsed_time(e1)
            times.append(1000.0 * ms / per_rep)
            timed += ms
            k += 1
    return statistics.median(times)


def queued_gpu_us(stream: torch.cuda.Stream, launch: Callable[[int], None], sets: int, per_rep: int = 16,
                  reps: int = 15) -> float:
    """Device time per launch with the host out of it: each repetition's start event and `per_rep`
    launches are enqueued behind a ~2 ms spin (torch.cuda._sleep) on the stream, so the device runs
    them back to back whatever the Python call costs (bench's `--launch chain` for table A; its
    table C launches queue behind each other on their own, C++ being faster than these kernels)."""
    cycles = int(2e-3 * torch.cuda.get_device_properties(stream.device).clock_rate * 1e3)
    with torch.cuda.stream(stream):
        for i in range(2 * sets):
            launch(i % sets)
        stream.synchronize()
        times: List[float] = []
        for k in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(cycles)
            e0.record(stream)
            for j in range(per_rep):
                launch((k * per_rep + j) % sets)
            e1.record(stream)
            e1.synchronize()
            times.append(1000.0 * e0.elapsed_time(e1) / per_rep)
    return statistics.median(times)


def host_p50_us(call: Callable[[int], None], sets: int, n: int, stream: torch.cuda.Stream) -> float:
    """Wall time around each call alone (the device queue never fills: n calls of these sizes)."""
    clock = time.perf_counter_ns
    with torch.cuda.stream(stream):
        for i in range(20):
            call(i % sets)
        stream.synchronize()
        got = []
        for i in range(n):
            t0 = clock()
            call(i % sets)
            got.append((clock() - t0) / 1000.0)
            if i % 100 == 99:
                stream.synchronize()
        stream.synchronize()
    return pct(got, 0.5)


def layers_host(name: str, suite: str, calls: Dict[str, Callable[[int], None]], sets: int, n: int,
                stream: torch.cuda.Stream) -> Dict[str, float]:
    out = {}
    for variant, call in calls.items():
        out[variant] = host_p50_us(call, sets, n, stream)
        record(suite, name, variant, "host_us_p50", out[variant])
    return out


# ------------------------------------------------------------------------------------------ ops
def bench_attention(stream: torch.cuda.Stream, quick: bool, summary: List[tuple]) -> None:
    # (row, d_qk, h_q, topk, s_kv, s_q, topk_length): bench's table A rows of the same names.
    rows = [("V4-C2/32768", 512, 128, 1024, 32768, 4096, False),
            ("small-h128-k1152/8192/sq64", 512, 128, 1152, 8192, 64, True)]
    for name, d, h, topk, s_kv, s_q, lengths in rows:
        g = torch.Generator(device=DEV).manual_seed(s_kv * 131 + topk)
        q = (torch.randn((s_q, h, d), device=DEV, generator=g) * 0.1).to(torch.bfloat16)
        kv = (torch.randn((s_kv, 1, d), device=DEV, generator=g) * 0.1).to(torch.bfloat16)
        idx = torch.randint(0, s_kv, (s_q, 1, topk), device=DEV, generator=g, dtype=torch.int32)
        sink = (0.5 * torch.sin(torch.arange(h, device=DEV, dtype=torch.float32)))
        tl = torch.full((s_q,), topk, dtype=torch.int32, device=DEV) if lengths else None
        out = (torch.empty((s_q, h, 512), dtype=torch.bfloat16, device=DEV),
               torch.empty((s_q, h), dtype=torch.float32, device=DEV),
               torch.empty((s_q, h), dtype=torch.float32, device=DEV))
        ws_bytes = spgraph.sparse_mla_workspace_bytes(s_q, h, d, topk)
        ws = torch.empty((max(ws_bytes, 256),), dtype=torch.uint8, device=DEV)
        scale = d ** -0.5

        def run(_: int) -> None:
            sgt.sparse_mla_fwd(q, kv, idx, scale, attn_sink=sink, topk_length=tl, out=out, workspace=ws)

        small = s_q != 4096
        us = gpu_median_us(stream, run, 1, 10 if small else 3, 50 if small else 20, warmup_ms=25.0,
                           min_timed_ms=100.0 if not quick else 20.0)
        record("attention", name, "spgraph-python", "gpu_us", us)
        queued = queued_gpu_us(stream, run, 1, per_rep=8)
        record("attention", name, "spgraph-python-queued", "gpu_us", queued)
        handle = stream.cuda_stream
        calls = {
            "spgraph.torch": run,
            "torch.ops.spgraph": lambda _: torch.ops.spgraph.sparse_mla_fwd_out(q, kv, idx, scale, 512, sink, tl,
                                                                                 out[0], out[1], out[2], ws),
            "spgraph": lambda _: spgraph.sparse_mla_fwd(q, kv, idx, scale, attn_sink=sink, topk_length=tl, out=out,
                                                        stream=handle, workspace=ws),
            "_spgraph": lambda _: _C.sparse_mla_fwd(q, kv, idx, scale, 512, sink, tl, out[0], out[1], out[2], ws,
                                                    handle),
        }
        host = layers_host(name, "attention", calls, 1, 100 if not small else 300, stream)
        summary.append(("attention", name, us, host, queued))


def random_rows(n: int, g: torch.Generator) -> torch.Tensor:
    """K-like rows: normal values, each 64-value tile scaled by 2^k, k in [-8, 8] (bench's random_rows)."""
    x = torch.randn((n, 8, 64), device=DEV, generator=g)
    k = torch.randint(-8, 9, (n, 8, 1), device=DEV, generator=g).float()
    return (x * torch.pow(2.0, k)).reshape(n, 512).to(torch.bfloat16)


def bench_cache_kernels(stream: torch.cuda.Stream, warmer: Warmer, summary: List[tuple]) -> None:
    # bench's large workload: 4 requests x 2048 new tokens after a prefix of 32768, C4A, W 128.
    R, new, prefix, r, W, swa_bs, bt, L = 4, 2048, 32768, 4, 128, 64, 256, 65536
    seq = prefix + new
    comp_rows = seq // r                                   # 8704 per request
    comp_bs = bt // r                                      # 64 rows a block
    comp_used = -(-comp_rows // comp_bs)
    swa_used = -(-seq // swa_bs)
    gather = min(seq, new + W - 1)                         # 2175
    max_rows = L // r + min(L, new * R + W - 1)            # M_max for T = 4 x 2048
    g = torch.Generator(device=DEV).manual_seed(2024)
    sets = 4
    handle = stream.cuda_stream
    swa_stride, comp_stride = spgraph.cache_block_stride(swa_bs), spgraph.cache_block_stride(comp_bs)
    swa_blocks, comp_blocks = R * swa_used + 16, R * comp_used + 16
    caches = []
    for s in range(sets):
        swa = torch.empty((swa_blocks, swa_stride), dtype=torch.uint8, device=DEV)
        comp = torch.empty((comp_blocks, comp_stride), dtype=torch.uint8, device=DEV)
        with torch.cuda.stream(stream):  # real quantized rows, through the insert
            for cache, blocks, bs in ((swa, swa_blocks, swa_bs), (comp, comp_blocks, comp_bs)):
                rows = blocks * bs
                for first in range(0, rows, 16384):
                    n = min(16384, rows - first)
                    slots = torch.arange(first, first + n, dtype=torch.int32, device=DEV)
                    sgt.quantize_and_insert_k_cache(random_rows(n, g), cache, slots, bs)
        swa_table = torch.stack([torch.randperm(swa_blocks, device=DEV, generator=g)[:swa_used]
                                 for _ in range(R)]).int()
        comp_table = torch.stack([torch.randperm(comp_blocks, device=DEV, generator=g)[:comp_used]
                                  for _ in range(R)]).int()
        kv = torch.empty((R, max_rows, 512), dtype=torch.bfloat16, device=DEV)
        caches.append((swa, comp, swa_table, comp_table, kv))
    stream.synchronize()
    seq_lens = torch.full((R,), seq, dtype=torch.int32, device=DEV)
    gather_lens = torch.full((R,), gather, dtype=torch.int32, device=DEV)
    comp_lens = torch.full((R,), comp_rows, dtype=torch.int32, device=DEV)
    status = torch.zeros((spgraph.STATUS_WORDS,), dtype=torch.int32, device=DEV)

    def window(s: int) -> None:
        swa, _, swa_table, _, kv = caches[s]
        sgt.dequantize_and_gather_k_cache(kv, swa, seq_lens, gather_lens, swa_table, swa_bs, comp_rows, status=status)

    def compressed(s: int) -> None:
        _, comp, _, comp_table, kv = caches[s]
        sgt.dequantize_and_gather_k_cache(kv, comp, comp_lens, None, comp_table, comp_bs, 0, status=status)

    row_bytes = 576 + 8 + 2.0 * 512
    cases = {"dequant-gather/large/window": (window, R * gather * row_bytes),
             "dequant-gather/large/compressed": (compressed, R * comp_rows * row_bytes)}
    # insert/large: this step's 4 x 2048 rows into the SWA cache at their positions, 8 row sets.
    swa_table0 = caches[0][2].cpu()
    slots = torch.tensor([int(swa_table0[b, (prefix + k) // swa_bs]) * swa_bs + (prefix + k) % swa_bs
                          for b in range(R) for k in range(new)], dtype=torch.int32, device=DEV)
    row_sets = [random_rows(R * new, g) for _ in range(8)]

    def insert(s: int) -> None:
        sgt.quantize_and_insert_k_cache(row_sets[s], caches[0][0], slots, swa_bs, status=status)

    cases["insert/large"] = (insert, R * new * (2.0 * 512 + 4 + 576 + 8))
    # combine/large: 8192 tokens, top_k 1024, indices uniform over the request's rows, 3 sets.
    qsl = torch.arange(0, R * new + 1, new, dtype=torch.int32, device=DEV)
    topk_sets = [torch.randint(0, comp_rows, (R * new, 1024), dtype=torch.int32, device=DEV, generator=g)
                 for _ in range(3)]
    width = spgraph.combined_width(1024, W)
    combined = [torch.empty((R * new, width), dtype=torch.int32, device=DEV) for _ in range(3)]
    lens = torch.empty((R * new,), dtype=torch.int32, device=DEV)
    N, M = comp_rows, comp_rows + gather

    def combine(s: int) -> None:
        sgt.combine_topk_swa_indices(topk_sets[s], qsl, seq_lens, gather_lens, W, r, 1024, M, N,
                                     out=(combined[s], lens), status=status)

    cases["combine/large"] = (combine, None)
    n_sets = {"insert/large": 8, "combine/large": 3}
    neutral = {
        "dequant-gather/large/window": lambda s: spgraph.dequantize_and_gather_k_cache(
            caches[s][4], caches[s][0], seq_lens, gather_lens, caches[s][2], swa_bs, comp_rows, stream=handle),
        "dequant-gather/large/compressed": lambda s: spgraph.dequantize_and_gather_k_cache(
            caches[s][4], caches[s][1], comp_lens, None, caches[s][3], comp_bs, 0, stream=handle),
        "insert/large": lambda s: spgraph.quantize_and_insert_k_cache(row_sets[s], caches[0][0], slots, swa_bs,
                                                                      stream=handle),
        "combine/large": lambda s: spgraph.combine_topk_swa_indices(topk_sets[s], qsl, seq_lens, gather_lens, W, r,
                                                                    1024, M, N, out=(combined[s], lens),
                                                                    stream=handle),
    }
    raw = {
        "dequant-gather/large/window": lambda s: _C.dequantize_and_gather_k_cache(
            caches[s][4], caches[s][0], seq_lens, gather_lens, caches[s][2], swa_bs, comp_rows, None, handle),
        "dequant-gather/large/compressed": lambda s: _C.dequantize_and_gather_k_cache(
            caches[s][4], caches[s][1], comp_lens, None, caches[s][3], comp_bs, 0, None, handle),
        "insert/large": lambda s: _C.quantize_and_insert_k_cache(row_sets[s], caches[0][0], slots, swa_bs, None,
                                                                 handle),
        "combine/large": lambda s: _C.combine_topk_swa_indices(topk_sets[s], qsl, seq_lens, gather_lens, W, r, 1024,
                                                               M, N, combined[s], lens, None, handle),
    }
    for name, (launch, nbytes) in cases.items():
        k = n_sets.get(name, sets)
        warmer.warm(stream)
        single = gpu_median_us(stream, launch, k, 5, 30)
        b2b = gpu_median_us(stream, launch, k, 3, 20, per_rep=8)
        record("kernels", name, "spgraph-python", "gpu_us", single)
        record("kernels", name, "spgraph-python-back-to-back", "gpu_us", b2b)
        queued = queued_gpu_us(stream, launch, k)
        record("kernels", name, "spgraph-python-queued", "gpu_us", queued)
        if nbytes:
            record("kernels", name, "spgraph-python", "gbps", nbytes / (single * 1e-6) / 1e9)
        host = layers_host(name, "kernels", {"spgraph.torch": launch, "spgraph": neutral[name], "_spgraph": raw[name]},
                           k, 300, stream)
        summary.append(("kernels", name, single, host, queued))
    stream.synchronize()
    faults = spgraph.fault_counts(status.tolist())
    total = sum(v for key, v in faults.items() if key != "first")
    if total:
        raise RuntimeError(f"the cache kernels counted faults on valid input: {faults}")


# ------------------------------------------------------------------------------------- executor
def v4_config() -> spgraph.PipelineConfig:
    c = spgraph.PipelineConfig.v4_default()  # serve_loop's make_config at its defaults
    c.cache.swa_blocks = 2 * c.max_requests * c.swa_blocks_per_request()
    c.cache.compressed_blocks = 2 * c.max_requests * c.compressed_blocks_per_request()
    return c


def engine_buffers(config: spgraph.PipelineConfig) -> List[Dict[str, torch.Tensor]]:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(os.path.dirname(here), "samples", "python"))
    import prefill_loop  # the sample's engine tensors

    t = prefill_loop.engine_tensors(torch, config)
    torch.cuda.synchronize()
    return t


def scheduled_plans(config: spgraph.PipelineConfig, sc: Any, seed: int = 1) -> Iterator[Any]:
    """serve_loop's default workload through a scheduler of `sc`: its StepPlans, batch after batch."""
    sched = spgraph.PrefillScheduler(config, sc)
    wc = spgraph.WorkloadConfig(num_requests=256, min_prompt_len=1024, max_prompt_len=65536, lengths="log-normal")
    batch = next_id = 0
    while True:
        if sched.done:
            wc.seed = seed * 1000003 + batch
            batch += 1
            wc.first_step = sched.next_step
            reqs = spgraph.make_workload(wc)
            for r in reqs:
                r.id = next_id
                next_id += 1
            sched.submit(reqs)
        yield sched.schedule()


def schedule(config: spgraph.PipelineConfig, chunks: int, seed: int = 1) -> List[Any]:
    """serve_loop's trace (its default workload and budget), the first `chunks` chunks."""
    out: List[Any] = []
    for plan in scheduled_plans(config, spgraph.SchedulerConfig(max_num_batched_tokens=8192), seed):
        if len(out) >= chunks:
            break
        out.extend(plan.chunks)
    return out[:chunks]


def schedule_steps(config: spgraph.PipelineConfig, steps: int, budget: int, max_chunks: int,
                   seed: int = 1) -> List[Any]:
    """serve_loop --one-launch's trace (its default workload): the first `steps` StepPlans with chunks."""
    sc = spgraph.SchedulerConfig(max_num_batched_tokens=budget)
    sc.max_chunks_per_step = max_chunks
    out: List[Any] = []
    for plan in scheduled_plans(config, sc, seed):
        if len(out) >= steps:
            break
        if plan.chunks:
            out.append(plan)
    return out


def step_as_numpy(plan: Any, ratios: List[int]) -> spgraph.Chunk:
    """A StepPlan spelled as an engine would: its requests (pieces merged) as NumPy int32 arrays."""
    import numpy as np

    ql: List[int] = []
    sl: List[int] = []
    tables: Dict[int, List[List[int]]] = {r: [] for r in [1] + ratios}
    last = None
    for cp in plan.chunks:
        for b in range(cp.num_requests):
            rows = {r: cp.block_tables(r)[b] for r in tables}
            if b == 0 and last == cp.request_ids[0]:
                ql[-1] += cp.query_lens[0]
                sl[-1] = cp.seq_lens[0]
                for r in tables:
                    tables[r][-1] = rows[r]
            else:
                ql.append(cp.query_lens[b])
                sl.append(cp.seq_lens[b])
                for r in tables:
                    tables[r].append(rows[r])
            last = cp.request_ids[b]

    def table(rows: List[List[int]]) -> "np.ndarray":
        w = max((len(x) for x in rows), default=0)
        return np.array([x + [0] * (w - len(x)) for x in rows], dtype=np.int32)

    return spgraph.Chunk(np.array(ql, np.int32), np.array(sl, np.int32), table(tables[1]),
                         {r: table(tables[r]) for r in ratios})


def timed_call(call: Callable[[], Any], what: str) -> Tuple[float, Any]:
    """Host us of one executor call (its wait for the device excluded) and its RunResult; raises if it failed."""
    t0 = time.perf_counter_ns()
    r = call()
    t1 = time.perf_counter_ns()
    if not r.ok:
        raise RuntimeError(f"{what} failed: {r.message}")
    return (t1 - t0) / 1000.0 - r.waited_us, r


def bench_steps(name: str, config: spgraph.PipelineConfig, n: int, budget: int, summary: List[tuple]) -> None:
    """Host time per Executor.run_step from Python (waits excluded), a StepPlan and its NumPy spelling."""
    ratios = sorted({l.compress_ratio for l in config.layers if l.compress_ratio > 1})
    options = {"max_step_requests": 64, "max_step_tokens": budget}
    plans = schedule_steps(config, n, budget, 64 // config.max_requests)
    inputs = {"stepplan": plans, "numpy": [step_as_numpy(p, ratios) for p in plans],
              "stepplan-idle-device": plans}  # synchronized before each call, outside the timing
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(os.path.dirname(here), "samples", "python"))
    import prefill_loop  # the sample's engine tensors, step-sized

    tensors = prefill_loop.engine_tensors(torch, config, step=options)
    torch.cuda.synchronize()
    ex = sgt.Executor(config, buffers=tensors, **options)
    ex.warmup()
    stream = torch.cuda.Stream()
    for variant, items in inputs.items():
        host: List[float] = []
        chunks: List[int] = []
        with torch.cuda.stream(stream):
            for i, step in enumerate(items):
                if variant.endswith("-idle-device"):
                    ex.synchronize()
                us, r = timed_call(lambda: ex.run_step(step), f"{name}: step {i}")
                host.append(us)
                chunks.append(r.chunks)
        ex.synchronize()
        record("executor", f"python-run-step/{name}", variant, "host_us_p50", pct(host, 0.5))
        record("executor", f"python-run-step/{name}", variant, "host_us_p99", pct(host, 0.99))
        record("executor", f"python-run-step/{name}", variant, "chunks_per_step_mean", statistics.mean(chunks))
        summary.append(("executor", f"{name} run_step {variant}", None,
                        {"p50": pct(host, 0.5), "p99": pct(host, 0.99), "chunks": statistics.mean(chunks)}))
    del ex
    # Staged steps, the per-layer form: one program per layer; each step staged once (stage_step)
    # and run per layer program (run_staged: the first run of a step loads it, the later ones run
    # it again), queued behind the device's work or (idle-device) synchronized before each call.
    layers = len(config.layers)
    ex = sgt.Executor(config, buffers=tensors, programs=[[l] for l in range(layers)], **options)
    ex.warmup()
    reruns_before = ex.staged_reruns
    for variant in ("queued", "idle-device"):
        stage: List[float] = []
        first: List[float] = []
        again: List[float] = []
        with torch.cuda.stream(stream):
            for i, step in enumerate(plans):
                if variant == "idle-device":
                    ex.synchronize()
                stage.append(timed_call(lambda: ex.stage_step(step), f"{name}: staging step {i}")[0])
                for layer in range(layers):
                    if variant == "idle-device":
                        ex.synchronize()
                    us, _ = timed_call(lambda: ex.run_staged(program=layer), f"{name}: staged step {i}, layer {layer}")
                    (first if layer == 0 else again).append(us)
        ex.synchronize()
        row = f"python-run-staged/{name}"
        for metric, values in (("stage_step", stage), ("run_staged_first", first), ("run_staged_again", again)):
            if values:
                record("executor", row, variant, f"{metric}_host_us_p50", pct(values, 0.5))
                record("executor", row, variant, f"{metric}_host_us_p99", pct(values, 0.99))
        host = {"stage p50": pct(stage, 0.5), "first p50": pct(first, 0.5)}
        if again:
            host.update({"again p50": pct(again, 0.5), "again p99": pct(again, 0.99)})
        summary.append(("executor", f"{name} run_staged {variant}", None, host))
    expected = len(plans) * 2 * (layers - 1)
    if ex.staged_reruns - reruns_before != expected:
        raise RuntimeError(f"{name}: {ex.staged_reruns - reruns_before} staged reruns, expected {expected}")
    del ex, tensors
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def as_numpy(cp: Any, ratios: List[int]) -> spgraph.Chunk:
    import numpy as np

    def table(rows: List[List[int]]) -> "np.ndarray":
        w = max((len(x) for x in rows), default=0)
        return np.array([x + [0] * (w - len(x)) for x in rows], dtype=np.int32)

    return spgraph.Chunk(np.array(cp.query_lens, np.int32), np.array(cp.seq_lens, np.int32), table(cp.block_tables(1)),
                         {r: table(cp.block_tables(r)) for r in ratios})


def as_lists(cp: Any, ratios: List[int]) -> spgraph.Chunk:
    return spgraph.Chunk(list(cp.query_lens), list(cp.seq_lens), cp.block_tables(1),
                         {r: cp.block_tables(r) for r in ratios})


def call_floors(name: str, ex: Any, summary: List[tuple], n: int = 2000) -> None:
    """What the pieces of an Executor.run call cost on their own, p50 us: the torch layer's stream
    query, one call into the extension (a property read) and an empty Python call."""
    from spgraph.torch import _raw_stream

    device = ex.device
    clock = time.perf_counter_ns
    floors = {}
    for label, fn in (("raw-stream-query", lambda: _raw_stream(device)), ("extension-property", lambda: ex.host_waits),
                      ("python-call", lambda: None)):
        v = []
        for _ in range(n):
            t0 = clock()
            fn()
            v.append((clock() - t0) / 1000.0)
        floors[label] = pct(v, 0.5)
        record("executor", f"python-run/{name}", label, "host_us_p50", floors[label])
    summary.append(("executor", f"{name} call floors", None, floors))


def bench_executor(name: str, config: spgraph.PipelineConfig, n: int, summary: List[tuple]) -> None:
    ratios = sorted({l.compress_ratio for l in config.layers if l.compress_ratio > 1})
    chunks = schedule(config, n)
    inputs = {
        "chunkplan": chunks,
        "chunkplan-derived-slots": chunks,
        "numpy": [as_numpy(cp, ratios) for cp in chunks],
        "lists": [as_lists(cp, ratios) for cp in chunks],
        # where the time of a ChunkPlan call goes: the extension's method called directly (no
        # Python wrapper, no current-stream query), on the torch stream and on the executor's own
        "chunkplan-extension": chunks,
        "chunkplan-extension-own-stream": chunks,
        # the same call onto an idle device (synchronized before each call, outside the timing):
        # the call's own cost, with no launch queued behind a running one
        "chunkplan-idle-device": chunks,
        # the same without slot lists (the device derives the insert slots): the form whose
        # staging copies no per-token list; and that call through the extension's method on the
        # executor's own stream (no torch stream query, no event record after the launch)
        "chunkplan-derived-slots-idle-device": chunks,
        "chunkplan-derived-slots-extension-own-stream-idle-device": chunks,
    }
    stream = torch.cuda.Stream()
    for phases in (False, True):
        ex = sgt.Executor(config, buffers=engine_buffers(config), time_host_phases=phases)
        ex.warmup()
        raw_run = _C.Executor.run
        handles = {"chunkplan-extension": stream.cuda_stream, "chunkplan-extension-own-stream": ex.stream,
                   "chunkplan-derived-slots-extension-own-stream-idle-device": ex.stream}
        if not phases:
            call_floors(name, ex, summary)
        for variant, items in inputs.items():
            if phases and variant not in ("chunkplan", "chunkplan-idle-device", "chunkplan-derived-slots-idle-device"):
                continue
            idle = variant.endswith("-idle-device")
            for cp in chunks:
                cp.slot_lists = "derived-slots" not in variant and variant.startswith("chunkplan")
            handle = handles.get(variant)
            host, staging, launch, rec, waits = [], [], [], [], []
            clock = time.perf_counter_ns
            with torch.cuda.stream(stream):
                for i, chunk in enumerate(items):
                    if idle:
                        ex.synchronize()
                    t0 = clock()
                    r = ex.run(chunk) if handle is None else raw_run(ex, chunk, handle, 0, False)
                    t1 = clock()
                    if not r.ok:
                        raise RuntimeError(f"{name}: chunk {i} failed: {r.message}")
                    host.append((t1 - t0) / 1000.0 - r.waited_us)
                    waits.append(r.waited_us)
                    staging.append(r.staging_us)
                    launch.append(r.launch_us)
                    rec.append(r.record_us)
            ex.synchronize()
            if phases:
                pv = "cpp-phases" + ("-derived-slots" if "derived-slots" in variant else "") + ("-idle-device" if idle else "")
                for metric, v in (("staging_us_p50", staging), ("launch_us_p50", launch), ("record_us_p50", rec)):
                    record("executor", f"python-run/{name}", pv, metric, pct(v, 0.5))
                # staging excludes the wait for a staging block, as the call's host time does, so
                # call - (staging + launch + record) is what Python and the binding add per call
                outside = [h - (a + b + c) for h, a, b, c in zip(host, staging, launch, rec)]
                record("executor", f"python-run/{name}", pv, "host_us_p50", pct(host, 0.5))
                record("executor", f"python-run/{name}", pv, "outside_phases_us_p50", pct(outside, 0.5))
                summary.append(("executor", f"{name} C++ phases" + (", derived slots" if "derived-slots" in variant else "")
                                + (" idle device" if idle else ""), None,
                                {"staging": pct(staging, 0.5), "launch": pct(launch, 0.5), "record": pct(rec, 0.5),
                                 "call": pct(host, 0.5), "outside": pct(outside, 0.5)}))
            else:
                record("executor", f"python-run/{name}", variant, "host_us_p50", pct(host, 0.5))
                record("executor", f"python-run/{name}", variant, "host_us_p99", pct(host, 0.99))
                record("executor", f"python-run/{name}", variant, "host_waits", ex.host_waits)
                # the calls that waited for a staging block (the device behind) apart from the rest
                waited = [h for h, w in zip(host, waits) if w > 0.0]
                free = [h for h, w in zip(host, waits) if w == 0.0]
                summary.append(("executor", f"{name} {variant}", None,
                                {"p50": pct(host, 0.5), "p99": pct(host, 0.99), "p50-waited": pct(waited, 0.5),
                                 "p50-free": pct(free, 0.5), "free": len(free)}))
        del ex
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------- main
def bench_value(bench: List[Dict[str, Any]], suite: str, name: str, variant: str = "spgraph") -> Optional[float]:
    for r in bench:
        if r["suite"] == suite and r["name"] == name and r["variant"] == variant and r["metric"] == "gpu_us":
            return float(r["value"])
    return None


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the records here")
    p.add_argument("--compare", help="bench --json output (tables A and C) to compare each op's GPU time with")
    p.add_argument("--quick", action="store_true", help="fewer executor chunks, shorter attention timing")
    p.add_argument("--chunks", type=int, default=300, help="chunks timed per executor variant (default 300)")
    p.add_argument("--executor-only", action="store_true", help="time Executor.run only (no ops)")
    p.add_argument("--ops-only", action="store_true", help="time the ops only (no executor)")
    p.add_argument("--one-launch", action="store_true", help="also time Executor.run_step (whole steps)")
    p.add_argument("--budget", type=int, default=8192, help="tokens a step with --one-launch (default 8192)")
    o = p.parse_args(argv)
    if o.executor_only and o.ops_only:
        p.error("--executor-only and --ops-only exclude each other")
    if not torch.cuda.is_available():
        print("python_bench: no CUDA device; nothing to measure")
        return 0
    print(f"python_bench: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, spgraph from "
          f"{os.path.dirname(spgraph.__file__)}", flush=True)
    stream = torch.cuda.Stream()
    warmer = Warmer()
    summary: List[tuple] = []
    t0 = time.perf_counter()
    if not o.executor_only:
        bench_attention(stream, o.quick, summary)
        print(f"  attention done ({time.perf_counter() - t0:.0f} s)", flush=True)
        bench_cache_kernels(stream, warmer, summary)
        print(f"  kernels done ({time.perf_counter() - t0:.0f} s)", flush=True)
    del warmer
    torch.cuda.empty_cache()
    n = 100 if o.quick else o.chunks
    one = v4_config()
    one.layers = one.layers[:1]
    if not o.ops_only:
        bench_executor("v4-8-layers", v4_config(), n, summary)
        bench_executor("c4a-1-layer", one, n, summary)
        print(f"  executor done ({time.perf_counter() - t0:.0f} s)", flush=True)
    if o.one_launch and not o.ops_only:
        steps = 50 if o.quick else 200
        bench_steps("v4-8-layers", v4_config(), steps, o.budget, summary)
        bench_steps("c4a-1-layer", one, steps, o.budget, summary)
        print(f"  run_step done ({time.perf_counter() - t0:.0f} s)", flush=True)

    bench = json.load(open(o.compare)) if o.compare else []
    commit = os.environ.get("SPGRAPH_COMMIT", "unknown")
    date = time.strftime("%Y-%m-%d", time.gmtime())
    for r in RECORDS:
        r.update(commit=commit, date=date)
    if o.json:
        with open(o.json, "w") as f:
            json.dump(RECORDS, f, indent=1)
    print("\n== python_bench: ops from Python against bench (GPU us, median) and host us per call (p50) ==")
    print("   queued: launches behind a spin, so the device runs them back to back (against bench's")
    print("   `--launch chain` for attention, its back-to-back launches for the kernels)")
    print(f"{'op':34s} {'bench':>9s} {'python':>9s} {'ratio':>6s} {'b-queued':>9s} {'py-queued':>9s} {'ratio':>6s} "
          f"{'sp.torch':>9s} {'torch.ops':>9s} {'spgraph':>8s} {'_spgraph':>8s}")
    for row in summary:
        suite, name, us, host = row[:4]
        if suite == "executor":
            continue
        queued = row[4]
        ref = bench_value(bench, suite, name)
        qref = bench_value(bench, suite, name, "spgraph+chain" if suite == "attention" else "spgraph-back-to-back")
        ratio = f"{us / ref:6.3f}" if ref else "     -"
        qratio = f"{queued / qref:6.3f}" if qref else "     -"
        print(f"{name:34s} {ref or math.nan:9.2f} {us:9.2f} {ratio} {qref or math.nan:9.2f} {queued:9.2f} {qratio} "
              f"{host.get('spgraph.torch', math.nan):9.2f} {host.get('torch.ops.spgraph', math.nan):9.2f} "
              f"{host.get('spgraph', math.nan):8.2f} {host.get('_spgraph', math.nan):8.2f}")
    print("\n== Executor.run / run_step from Python: host us per call (waits excluded; CUPTI not loaded) ==")
    for row in summary:
        suite, name, _, host = row[:4]
        if suite == "executor":
            print(f"{name:40s} " + "  ".join(f"{k} {v:7.2f}" for k, v in host.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

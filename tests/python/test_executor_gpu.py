"""GPU: the executor from Python against the C++ executor and against itself.

* torch-owned buffers (padded token strides, padded block strides, caches at an offset inside a
  larger allocation) equal the pooled executor bit for bit on every chunk of a scheduler trace,
  graph and eager, with the chunk given as a ChunkPlan or spelled out as lists and NumPy arrays;
  guard bands around the bound buffers stay untouched;
* the sample's checksum equals ``serve_loop --checksum`` on the same trace (the C++ executor's
  outputs, bit for bit), pooled and torch-owned, with and without slot lists, graph and eager;
* zero CUDA allocation calls (CUPTI) and zero torch allocator growth over 1,000 Executor.run steps;
* caller streams (two torch streams alternating, the caller's q / K / top-k writes on the step's
  stream right before it) equal a single-stream run;
* views are zero-copy and keep the executor alive; refused steps are statuses (RunError only with
  check=True); misuse raises and leaves the executor usable.

Skipped (reported as skipped) without torch or a CUDA device.
"""

import gc
import importlib.util
import os
import re
import subprocess
import weakref

import pytest

from conftest import (HAVE_CUDA, allocation_control, assert_torch_allocator_unchanged, attached_allocation_counter,
                      torch_allocator_state)

pytestmark = pytest.mark.gpu

if HAVE_CUDA:
    import numpy as np
    import torch

    import spgraph
    import spgraph.torch as sgt
    from spgraph import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEED = 11


def small_config():
    """Three layers (C4A h64, C128A h64, SWA h128), R 2, T 128: 28 graphs, captured in well under a second.
    Odd block counts."""
    c = spgraph.PipelineConfig(max_requests=2, max_tokens=128, max_model_len=2048,
                               layers=[spgraph.LayerConfig(h_q=64, compress_ratio=4, top_k=512),
                                       spgraph.LayerConfig(h_q=64, compress_ratio=128, top_k=512),
                                       spgraph.LayerConfig(h_q=128, compress_ratio=1, top_k=0)])
    c.cache.swa_blocks = 2 * c.max_requests * c.swa_blocks_per_request() + 3
    c.cache.compressed_blocks = 2 * c.max_requests * c.compressed_blocks_per_request() + 1
    c.validate()
    return c


def trace(config, steps=40, budget=192, requests=6):
    """A scheduler trace: its chunks in the order they run (ChunkPlan objects)."""
    sched = spgraph.PrefillScheduler(config, spgraph.SchedulerConfig(max_num_batched_tokens=budget))
    sched.submit(spgraph.make_workload(spgraph.WorkloadConfig(seed=5, num_requests=requests, min_prompt_len=20,
                                                              max_prompt_len=1800, lengths="uniform")))
    chunks = []
    for _ in range(steps):
        if sched.done:
            break
        chunks.extend(sched.schedule().chunks)
    return chunks


def spelled(cp, config):
    """A ChunkPlan as an engine would spell it: NumPy int32 tables, int64 lengths, list slots."""
    ratios = sorted({l.compress_ratio for l in config.layers if l.compress_ratio > 1})
    width = lambda rows: max((len(r) for r in rows), default=0)  # noqa: E731
    pad = lambda rows: np.array([r + [0] * (width(rows) - len(r)) for r in rows], np.int32)  # noqa: E731
    return spgraph.Chunk(np.array(cp.query_lens, np.int64), list(cp.seq_lens), pad(cp.block_tables(1)),
                         {r: pad(cp.block_tables(r)) for r in ratios}, swa_slots=cp.slot_mapping(1),
                         compressed_slots={r: cp.slot_mapping(r) for r in ratios})


class Guarded:
    """Engine tensors with padding: q and out at padded token strides, caches at padded block strides
    or at an offset inside a larger allocation; every pad byte zero and checked at the end."""

    def __init__(self, config):
        dev = "cuda"
        T, R = config.max_tokens, config.max_requests
        self.pads = []  # (tensor, mask of bytes that must stay zero)
        self.layers = []
        for i, layer in enumerate(config.layers):
            h, r = layer.h_q, layer.compress_ratio
            b = {}
            for name, d in (("q", layer.d_qk), ("out", 512)):
                big = torch.zeros((T + 3, h * d + 64), dtype=torch.bfloat16, device=dev)
                b[name] = big[1:T + 1, :h * d].unflatten(1, (h, d))
                mask = torch.ones_like(big, dtype=torch.bool)
                mask[1:T + 1, :h * d] = False
                self.pads.append((big, mask))
            b["lse"] = torch.zeros((T, h), dtype=torch.float32, device=dev)
            b["max_logits"] = torch.zeros((T, h), dtype=torch.float32, device=dev)
            b["k_rows"] = torch.zeros((T, 512), dtype=torch.bfloat16, device=dev)
            kinds = [("swa_cache", config.cache.swa_blocks, config.cache.swa_block_size)]
            if r > 1:
                b["topk_indices"] = torch.zeros((T, layer.top_k), dtype=torch.int32, device=dev)
                b["compressed_k_rows"] = torch.zeros((T // r + R, 512), dtype=torch.bfloat16, device=dev)
                kinds.append(("compressed_cache", config.cache.compressed_blocks, config.cache.block_tokens // r))
            for name, blocks, block_size in kinds:
                stride = spgraph.cache_block_stride(block_size)
                if i % 2 == 0:  # a padded block stride
                    big = torch.zeros((blocks, stride + 576), dtype=torch.uint8, device=dev)
                    b[name] = big[:, :stride]
                    mask = torch.zeros_like(big, dtype=torch.bool)
                    mask[:, stride:] = True
                else:  # at an offset inside a larger allocation
                    big = torch.zeros((blocks * stride + 8192,), dtype=torch.uint8, device=dev)
                    b[name] = big[4096:4096 + blocks * stride].view(blocks, stride)
                    mask = torch.ones_like(big, dtype=torch.bool)
                    mask[4096:4096 + blocks * stride] = False
                self.pads.append((big, mask))
            if layer.attn_sink:
                b["attn_sink"] = torch.zeros((h,), dtype=torch.float32, device=dev)
            self.layers.append(b)
        torch.cuda.synchronize()

    def untouched(self):
        """No byte outside the bound views was written."""
        return not any(big.view(torch.int16 if big.element_size() == 2 else torch.uint8)[mask].any().item()
                       for big, mask in self.pads)


def fill_q(q, seed, layer, stream):
    """serve_loop's query values into q (a padded q through a contiguous copy)."""
    if q.is_contiguous():
        synthetic.fill_query(q, seed, layer, stream)
    else:
        tmp = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        synthetic.fill_query(tmp, seed, layer, stream)
        q.copy_(tmp)


def prepare(ex, config, stream):
    """serve_loop's fixed model front on an executor's buffers: q once, the sinks; the per-chunk front."""
    views = [ex.layer(l) for l in range(len(config.layers))]
    with torch.cuda.stream(stream):
        for l, (layer, v) in enumerate(zip(config.layers, views)):
            fill_q(v.q, SEED, l, stream)
            if layer.attn_sink:
                v.attn_sink.copy_(torch.tensor(synthetic.sink_values(SEED, l, layer.h_q), dtype=torch.float32))
    stream.synchronize()
    return views, synthetic.SyntheticFront(synthetic.front_layers(config, views))


def bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def test_torch_buffers_equal_pooled_graph_and_eager():
    config = small_config()
    chunks = trace(config)
    assert len(chunks) >= 20
    guarded = Guarded(config)
    runs = {
        "pooled graph": (sgt.Executor(config), "run", False),
        "torch graph": (sgt.Executor(config, buffers=guarded.layers), "run", False),
        "torch eager": (sgt.Executor(config, buffers=Guarded(config).layers), "run_eager", False),
        "spelled graph": (sgt.Executor(config, buffers=Guarded(config).layers), "run", True),
    }
    stream = torch.cuda.Stream()
    state = {}
    for name, (ex, method, _) in runs.items():
        ex.warmup()
        state[name] = prepare(ex, config, stream)
    # The bound views are the engine's tensors themselves.
    ex_t = runs["torch graph"][0]
    assert ex_t.layer(0).out.data_ptr() == guarded.layers[0]["out"].data_ptr()
    assert ex_t.layer(1).swa_cache.data_ptr() == guarded.layers[1]["swa_cache"].data_ptr()
    assert ex_t.layer(0).swa_cache.stride() == guarded.layers[0]["swa_cache"].stride()
    faults = 0
    with torch.cuda.stream(stream):
        for i, cp in enumerate(chunks):
            cp.slot_lists = i % 3 != 0  # slot lists and derived slots alternate
            outs = {}
            for name, (ex, method, spell) in runs.items():
                views, front = state[name]
                front.run(cp, SEED, i, stream)
                r = getattr(ex, method)(spelled(cp, config) if spell else cp)
                assert r.ok, (name, i, r)
                assert r.t_bucket >= cp.num_tokens and r.r_bucket >= cp.num_requests
                n = cp.num_tokens
                outs[name] = [(bits(v.out[:n]), bits(v.lse[:n]), bits(v.max_logits[:n])) for v in views]
            stream.synchronize()
            want = outs["pooled graph"]
            for name, got in outs.items():
                for l, (a, b) in enumerate(zip(want, got)):
                    for what, x, y in zip(("out", "lse", "max_logits"), a, b):
                        assert torch.equal(x, y), f"chunk {i}, layer {l}, {what}: {name} differs from the pool"
            faults += ex_t.read_status()["total"]
    # Real tokens of a valid trace: every output finite, no fault counted.
    assert faults == 0
    for v in state["torch graph"][0]:
        assert torch.isfinite(v.out.float()).all()
    # Every executor inserted the same cache bytes; none wrote outside its buffers.
    for (a, b) in zip(state["torch graph"][0], state["torch eager"][0]):
        assert torch.equal(a.swa_cache, b.swa_cache)
        if a.compressed_cache is not None:
            assert torch.equal(a.compressed_cache, b.compressed_cache)
    assert guarded.untouched()


def load_sample():
    spec = importlib.util.spec_from_file_location("prefill_loop", os.path.join(ROOT, "samples", "python",
                                                                               "prefill_loop.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRACE = ["--steps", "30", "--requests", "6", "--min-len", "64", "--max-len", "3000", "--max-model-len", "4096",
         "--max-tokens", "256", "--budget", "512", "--seed", "3"]


def serve_loop_checksum(args):
    binary = os.environ.get("SPGRAPH_SERVE_LOOP", os.path.join(ROOT, "build", "release", "samples", "serve_loop"))
    if not os.path.exists(binary):
        pytest.skip("serve_loop not built (set SPGRAPH_SERVE_LOOP to its path)")
    got = subprocess.run([binary, *args, "--checksum", "--no-progress", "--no-alloc-count"], capture_output=True,
                         text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    return re.search(r"output checksum\s+([0-9a-f]{16})", got.stdout).group(1)


@pytest.mark.parametrize("extra", [[], ["--derive-slots"], ["--mode", "eager"]], ids=["slots", "derived", "eager"])
def test_checksum_equals_serve_loop(extra, capsys):
    sample = load_sample()
    py = sample.run(sample.parse(TRACE + extra + ["--checksum", "--no-progress", "--no-alloc-count"]))
    pooled = sample.run(sample.parse(TRACE + extra + ["--checksum", "--no-progress", "--no-alloc-count", "--pooled"]))
    assert py["faults"] == 0 and py["graph_hits"] + py["eager_runs"] == py["chunks"]
    assert py["checksum"] == pooled["checksum"], "torch-owned buffers and the pool differ"
    assert py["torch_reserved_growth"] == 0
    cpp = serve_loop_checksum(TRACE + extra)
    assert py["checksum"] == cpp, f"prefill_loop.py {py['checksum']} != serve_loop {cpp}"
    if not extra:
        assert serve_loop_checksum(TRACE + ["--engine-buffers"]) == cpp


def test_no_cuda_allocation_over_1000_runs():
    config = small_config()
    chunks = trace(config, steps=20)
    inputs = chunks + [spelled(cp, config) for cp in chunks[:5]]
    ex = sgt.Executor(config, buffers=Guarded(config).layers)
    ex.warmup()
    stream = torch.cuda.Stream()
    _, front = prepare(ex, config, stream)
    counter = attached_allocation_counter()
    with torch.cuda.stream(stream):  # every kernel loaded and every input form read once before counting
        for chunk in inputs[:1] + inputs[-1:]:
            front.run(chunks[0], SEED, 0, stream)
            assert ex.run(chunk).ok
    torch.cuda.synchronize()
    allocator = torch_allocator_state()
    statuses = set()
    try:
        counter.reset()
        with torch.cuda.stream(stream):
            for i in range(1000):
                chunk = inputs[i % len(inputs)]
                if i % len(inputs) < len(chunks):
                    front.run(chunk, SEED, i, stream)
                statuses.add(ex.run(chunk).status)
        ex.synchronize()
        count, names = counter.count(), counter.names()
        after = torch_allocator_state()
        control = allocation_control(counter)
    finally:
        counter.detach()  # graph launches back on their fast path for the rest of the session
    assert statuses == {"ok"}
    assert count == 0, f"{count} CUDA allocation calls over 1000 runs: {names}"
    assert control > 0, "the counter saw no call for a real device allocation: its zero above proves nothing"
    assert_torch_allocator_unchanged(allocator, after)


def test_caller_streams_alternate():
    config = small_config()
    chunks = trace(config, steps=12)
    acc = {}
    sample = load_sample()
    for mode in ("one stream", "two streams"):
        tensors = sample.engine_tensors(torch, config)
        torch.cuda.synchronize()  # the zero fills ran on torch's stream
        ex = sgt.Executor(config, buffers=tensors)
        ex.warmup()
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        views, front = prepare(ex, config, streams[0])
        sums = torch.zeros(len(chunks), dtype=torch.int64, device="cuda")
        done = None  # the event after the previous step's readers
        for i, cp in enumerate(chunks):
            s = streams[i % 2] if mode == "two streams" else streams[0]
            with torch.cuda.stream(s):
                if done is not None:
                    s.wait_event(done)  # the caller orders its writes after the last step's reads
                # The caller's writes, on the step's stream, right before it: q, K rows, top-k.
                for l in range(len(config.layers)):
                    synthetic.fill_query(views[l].q, SEED + i, l, s)
                front.run(cp, SEED, i, s)
                # Even steps on the current stream (the default), odd ones with the stream object given.
                r = ex.run(cp) if i % 2 == 0 else ex.run(cp, stream=s)
                assert r.ok
                for l, v in enumerate(views):
                    n = cp.num_tokens
                    for j, t in enumerate((v.out[:n], v.lse[:n], v.max_logits[:n])):
                        synthetic.checksum_accumulate(t, (i << 32) | (l << 8) | j, sums[i:i + 1], s)
                done = torch.cuda.Event()
                done.record(s)
        torch.cuda.synchronize()
        acc[mode] = sums.cpu()
    assert torch.equal(acc["one stream"], acc["two streams"])
    assert (acc["one stream"] != 0).all()


def test_views_are_zero_copy_and_keep_the_executor_alive():
    config = small_config()
    ex = sgt.Executor(config)
    ref = weakref.ref(ex)
    out = ex.layer(0).out
    assert out.shape == (128, 64, 512) and out.dtype == torch.bfloat16 and out.is_cuda
    assert ex.layer(-1).topk_indices is None and ex.layer(2).compressed_cache is None
    assert ex.layer(1).compressed_cache.shape == (config.cache.compressed_blocks, spgraph.cache_block_stride(2))
    ws = ex.workspace()
    assert ws.kv.shape == (2, max(config.max_kv_rows(l) for l in range(3)), 512)
    assert ws.combined_indices.shape == (128, 640) and ws.combined_lens.shape == (128,)
    # The framework-neutral flavour returns DLPack arrays over the same memory.
    neutral = ex.layer_views(0, "dlpack")["out"]
    assert not isinstance(neutral, torch.Tensor)
    assert torch.from_dlpack(neutral).data_ptr() == out.data_ptr()
    with pytest.raises(IndexError):
        ex.layer(3)
    del ex, neutral, ws
    gc.collect()
    assert ref() is not None, "a view must keep its executor alive"
    out.fill_(1.0)
    torch.cuda.synchronize()
    assert out.float().sum().item() == out.numel()
    del out
    gc.collect()
    assert ref() is None


def test_refused_steps_are_statuses_and_misuse_raises():
    config = small_config()
    ex = sgt.Executor(config, time_host_phases=True)
    ok_chunk = spgraph.Chunk([4], [4], [[0]], {4: [[0]], 128: [[0]]})
    r = ex.run(ok_chunk)
    assert (r.status, r.ok, bool(r)) == ("not_warmed_up", False, False)
    with pytest.raises(spgraph.RunError) as info:
        ex.run(ok_chunk, check=True)
    assert info.value.result.status == "not_warmed_up" and "warmup()" in str(info.value)
    report = ex.warmup()
    assert report["graphs"] == 2 * report["buckets"] and report["programs"] == 1
    assert report["kernel_launches_per_step"] > 0 and report["pool_allocation_calls"] <= 2
    with pytest.raises(RuntimeError, match="already warmed up"):
        ex.warmup()
    r = ex.run(ok_chunk)
    assert r.ok and r.bucket >= 0 and (r.r_bucket, r.t_bucket) == (1, 16) and r.launch_us > 0
    bad = ex.run(spgraph.Chunk([5], [4], [[0]]))
    assert (bad.status, bad.bad_request, bad.bad_field) == ("bad_chunk", 0, "seq_len")
    with pytest.raises(spgraph.RunError, match="request 0, field seq_len"):
        bad.raise_for_status()
    assert ex.run(spgraph.Chunk([1, 1, 1], [1, 1, 1], [[0]] * 3)).status == "no_bucket"
    assert ex.run(ok_chunk, program=1).status == "bad_program"
    assert ex.run_eager(ok_chunk).ok
    with pytest.raises(TypeError, match=r"chunk\.query_lens\[0\] must be an int"):
        ex.run(spgraph.Chunk(["4"], [4], [[0]]))
    with pytest.raises(TypeError, match="stream must be"):
        ex.run(ok_chunk, stream="s")
    assert ex.run(ok_chunk, stream=torch.cuda.current_stream()).ok  # still usable after misuse
    ex.synchronize()
    status = ex.read_status()
    assert status["total"] == 0 and status["first"] is None
    eager_only = sgt.Executor(config, capture=False)
    eager_only.warmup()
    assert eager_only.run(ok_chunk).status == "not_warmed_up" and eager_only.run_eager(ok_chunk).ok


def test_host_phases_are_the_calls_own_microseconds():
    """time_host_phases: staging, launch and record are host microseconds inside the call, the wait
    for a staging block (waited_us) excluded. The device is kept behind (a spin before every step),
    so the host waits for staging blocks; the 9d15381 run counted those waits into staging_us
    ("11516 us" of staging in an 11.5 us call, the wait subtracted from the call only)."""
    import time

    config = small_config()
    chunks = trace(config, steps=10)
    ex = sgt.Executor(config, time_host_phases=True)
    ex.warmup()
    stream = torch.cuda.Stream()
    rows = []
    with torch.cuda.stream(stream):
        for i in range(40):
            torch.cuda._sleep(2_000_000)  # about a millisecond: the device falls two steps behind
            t0 = time.perf_counter_ns()
            r = ex.run(chunks[i % len(chunks)])
            wall = (time.perf_counter_ns() - t0) / 1000.0
            assert r.ok, r.message
            rows.append((wall, r.waited_us, r.staging_us, r.launch_us, r.record_us))
    ex.synchronize()
    waited = [w for _, w, *_ in rows if w > 100.0]
    assert len(waited) >= 10, f"the host waited in {len(waited)} of 40 steps: the test proves nothing"
    for wall, waited_us, *phases in rows:
        assert min(phases) >= 0.0, phases
        # the phases and the wait are disjoint parts of the call (0.5 us for the two clocks)
        assert sum(phases) + waited_us <= wall + 0.5, (wall, waited_us, phases)
    plain = sgt.Executor(config)  # without the option nothing is timed
    plain.warmup()
    r = plain.run(chunks[0])
    assert r.ok and (r.staging_us, r.launch_us, r.record_us) == (0.0, 0.0, 0.0)
    plain.synchronize()
    ex.synchronize()

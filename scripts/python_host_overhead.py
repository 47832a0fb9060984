#!/usr/bin/env python3
"""Host time of Executor.run from Python without a GPU: what Python and the binding add to a call.

Builds scripts/cudart_stub.cpp (a libcudart.so.13 in which every call succeeds at once and nothing
runs) and re-runs itself with it preloaded, then times ``Executor.run`` on a scheduler trace for a
1-layer and an 8-layer V4 program (small R and T, so the pooled host memory stays small), through
the Python class and through the extension's method directly, with ``time_host_phases``: the call's
p50, the p50 of the C++ phases (staging, launch, record) and of the call minus them, which is the
Python and binding part; then ``Executor.run_step`` over the scheduler's steps (8192-token budget, at
most 16 chunks a step) as StepPlans, and the per-layer form of a staged step (stage_step once a step,
run_staged per layer program). Under the stub the CUDA calls cost nothing, so the phases are the C++ host
logic alone; on a GPU cudaGraphLaunch and the event record add the driver's time (docs/benchmarks.md).

  PYTHONPATH=build/python python3 scripts/python_host_overhead.py [--chunks N] [--repeats N]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STUB = os.path.join(HERE, "cudart_stub.cpp")


def build_stub(out_dir: str) -> str:
    lib = os.path.join(out_dir, "libcudart_stub.so")
    script = os.path.join(out_dir, "cudart_stub.map")
    if os.path.exists(lib) and os.path.getmtime(lib) >= os.path.getmtime(STUB):
        return lib
    os.makedirs(out_dir, exist_ok=True)
    with open(script, "w") as f:
        f.write("libcudart.so.13 { global: *; };\n")  # the extension's references carry this version
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    subprocess.run([os.environ.get("CXX", "g++"), "-std=c++20", "-O2", "-shared", "-fPIC", f"-I{cuda}/include",
                    "-Wl,-soname,libcudart.so.13", f"-Wl,--version-script={script}", STUB, "-o", lib], check=True)
    return lib


def config(layers: int):
    import spgraph

    c = spgraph.PipelineConfig.v4_default()
    c.max_requests, c.max_tokens, c.max_model_len = 4, 512, 8192
    c.layers = c.layers[:layers]
    c.cache.swa_blocks = 2 * c.max_requests * c.swa_blocks_per_request()
    c.cache.compressed_blocks = 2 * c.max_requests * c.compressed_blocks_per_request()
    c.validate()
    return c


def trace(c, n: int):
    import spgraph

    sched = spgraph.PrefillScheduler(c, spgraph.SchedulerConfig(max_num_batched_tokens=2048))
    sched.submit(spgraph.make_workload(spgraph.WorkloadConfig(num_requests=64, min_prompt_len=256,
                                                              max_prompt_len=8000, lengths="uniform")))
    out = []
    while len(out) < n and not sched.done:
        out.extend(sched.schedule().chunks)
    for cp in out:
        cp.slot_lists = True
    return out[:n]


def step_trace(c, n: int):
    """The scheduler's steps (StepPlans with chunks) at an 8192-token budget, at most 16 chunks each."""
    import spgraph

    sc = spgraph.SchedulerConfig(max_num_batched_tokens=8192)
    sc.max_chunks_per_step = 64 // c.max_requests
    sched = spgraph.PrefillScheduler(c, sc)
    sched.submit(spgraph.make_workload(spgraph.WorkloadConfig(num_requests=256, min_prompt_len=256,
                                                              max_prompt_len=8000, lengths="uniform")))
    out = []
    while len(out) < n and not sched.done:
        plan = sched.schedule()
        if plan.chunks:
            out.append(plan)
    return out


def p50(v):
    return sorted(v)[len(v) // 2]


def timed(call, items, repeats: int):
    """p50 of the call, of its C++ phases (staging, launch, record) and of the call minus them, in us."""
    host, phases = [], []
    clock = time.perf_counter_ns
    for _ in range(repeats):
        for item in items:
            t0 = clock()
            r = call(item)
            t1 = clock()
            if not r.ok:
                raise RuntimeError(r.message)
            # Waits excluded, as on the GPU: under the stub no kernel writes a staging block's
            # release word, so a call whose block was used before waits until its periodic stream
            # query (which the stub answers "done") ends the wait.
            host.append((t1 - t0) / 1000.0 - r.waited_us)
            phases.append(r.staging_us + r.launch_us + r.record_us)
    return p50(host), p50(phases), p50([h - q for h, q in zip(host, phases)])


def stub_library():
    """The preloaded stub (ctypes), for its call counters."""
    lib = ctypes.CDLL(os.environ["SPGRAPH_CUDART_STUB_LIB"])
    lib.spgraph_stub_call_counts.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.spgraph_stub_call_counts.restype = ctypes.c_int
    return lib


def cuda_calls(stub, call, items) -> str:
    """The CUDA calls one call makes, averaged over `items`: "name n, ..." most frequent first. Under
    the stub a staging block used before is waited for by polling cudaStreamQuery (no kernel writes
    its release word), so that query's count includes the waits, which an idle GPU does not have."""
    stub.spgraph_stub_reset_call_counts()
    for item in items:
        call(item)
    size = stub.spgraph_stub_call_counts(None, 0)
    buf = ctypes.create_string_buffer(size)
    stub.spgraph_stub_call_counts(buf, size)
    counts = []
    for line in buf.value.decode().splitlines():
        name, n = line.rsplit(" ", 1)
        if int(n) > 0:
            counts.append((int(n) / len(items), name))
    counts.sort(key=lambda c: (-c[0], c[1]))
    return ", ".join(f"{name} {n:.2f}".rstrip("0").rstrip(".") for n, name in counts) or "none"


def measure(o) -> int:
    import spgraph
    from spgraph import _spgraph as _C

    stub = stub_library()
    print(f"{'program':10s} {'call through':26s} {'call p50':>9s} {'C++ phases':>11s} {'outside':>8s}  (us)")
    for layers in (1, 8):
        c = config(layers)
        ex = spgraph.Executor(c, time_host_phases=True)
        ex.warmup()
        chunks = trace(c, o.chunks)
        raw = _C.Executor.run
        # The default call: the executor's own stream (stream=None), as the host target counts it.
        for label, call in (("spgraph.Executor.run", lambda ch: ex.run(ch)),
                            ("_spgraph.Executor.run", lambda ch: raw(ex, ch, None, 0, False))):
            call_us, phases_us, outside_us = timed(call, chunks, o.repeats)
            print(f"{layers:2d} layer(s) {label:26s} {call_us:9.2f} {phases_us:11.2f} {outside_us:8.2f}")
            print(f"{'':11s}CUDA calls a call: {cuda_calls(stub, call, chunks)}")
        del ex
        # Whole steps: Executor.run_step over the scheduler's steps (16 chunks at the most).
        ex = spgraph.Executor(c, time_host_phases=True, max_step_requests=64, max_step_tokens=8192)
        ex.warmup()
        steps = step_trace(c, max(1, o.chunks // 8))
        call_us, phases_us, outside_us = timed(ex.run_step, steps, o.repeats)
        per_step = sum(len(st.chunks) for st in steps) / len(steps)
        print(f"{layers:2d} layer(s) {'Executor.run_step':26s} {call_us:9.2f} {phases_us:11.2f} {outside_us:8.2f}"
              f"  ({per_step:.1f} chunks a step)")
        print(f"{'':11s}CUDA calls a call: {cuda_calls(stub, ex.run_step, steps)}")
        del ex
        # Staged steps, the per-layer form: one program per layer, each step staged once
        # (stage_step) and run per program (run_staged: every run after the first a rerun).
        ex = spgraph.Executor(c, time_host_phases=True, max_step_requests=64, max_step_tokens=8192,
                              programs=[[l] for l in range(layers)])
        ex.warmup()
        stage_us, stage_phases, stage_outside = timed(ex.stage_step, steps, o.repeats)
        print(f"{layers:2d} layer(s) {'Executor.stage_step':26s} {stage_us:9.2f} {stage_phases:11.2f} "
              f"{stage_outside:8.2f}  (once a step)")
        ex.stage_step(steps[0], check=True)
        runs = [p for p in range(layers)] * max(1, 200 // layers)
        call_us, phases_us, outside_us = timed(lambda p: ex.run_staged(None, p), runs, o.repeats)
        print(f"{layers:2d} layer(s) {'Executor.run_staged':26s} {call_us:9.2f} {phases_us:11.2f} {outside_us:8.2f}"
              f"  (per layer call)")
        print(f"{'':11s}CUDA calls a call: {cuda_calls(stub, lambda p: ex.run_staged(None, p), runs)}")
        del ex
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--stub-dir", default="/tmp/spgraph-cudart-stub")
    o = p.parse_args()
    if os.environ.get("SPGRAPH_CUDART_STUB") != "1":
        lib = build_stub(o.stub_dir)
        env = dict(os.environ, LD_PRELOAD=lib, SPGRAPH_CUDART_STUB="1", SPGRAPH_CUDART_STUB_LIB=lib)
        return subprocess.run([sys.executable] + sys.argv, env=env).returncode
    return measure(o)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""tensor_parallel: the prefill step split over query heads, one spgraph.Executor per rank.

Each rank owns one GPU, its own caches (the same KV rows on every rank: engines replicate the
single KV head), q for its h_q / world of the heads and the matching attention-sink slice, all
torch tensors bound into its ``spgraph.torch.Executor``. Every rank runs prefill_loop's trace (the
scheduler's chunks, the synthetic model front): per chunk it replays its graph on its own stream,
then all-gathers ``out`` over heads through torch.distributed (NCCL, synchronous, so on the rank's
stream). The split and the gather are ``spgraph.tensor_parallel``'s.

    torchrun --nproc-per-node 2 samples/python/tensor_parallel.py [--check] [--json FILE]
    python3 samples/python/tensor_parallel.py --simulate 2 --check    # both ranks in one process, one GPU

``--check`` also runs the one-rank program of every head (on rank 0's GPU, its own executor and
caches) over the same chunks and compares the gathered out, lse and max_logits with it: bit for bit
where both attentions take the same plan, within docs/pipeline.md's bars where not. ``--simulate N``
runs N ranks in this process on one GPU, each on its own stream, gathered by copies (no NCCL).

NVLink multicast stays off: the sample sets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1
and NVSHMEM_DISABLE_NVLS=1 where unset and refuses to run (exit code 2) if any is set otherwise.
Needs torch, the spgraph package (PYTHONPATH=build/python) and a CUDA device per rank; without a
device it prints each rank's layer program and pool plan. docs/python.md, "Tensor parallel over heads".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import prefill_loop  # noqa: E402  serve_loop's trace flags, config, engine tensors, percentile, progress

import spgraph  # noqa: E402
from spgraph import synthetic  # noqa: E402

RING = 64  # GPU-time events per rank: read back 64 chunks later, never waited on early


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tensor_parallel.py",
        description="The V4 layer program's prefill split over query heads: one spgraph.torch.Executor per rank "
                    "(torchrun, one GPU a rank), the same caches on every rank, q and sinks sliced by head, out "
                    "all-gathered over heads through NCCL after each chunk. Reports the step time, tokens/s, host "
                    "time per rank, the all-gather's share and CUDA allocation calls; --check compares with a "
                    "one-rank run of every head.")
    prefill_loop.add_trace_arguments(p, steps=100)
    a = p.add_argument
    a("--check", action="store_true",
      help="also run every head on one rank (rank 0's GPU) and compare the gathered out, lse and max_logits with "
           "it: bit for bit where both attentions take the same plan, within the accuracy bars elsewhere")
    a("--simulate", type=int, default=0, metavar="N",
      help="run N ranks (1..2) in this process on one GPU, each on its own stream, gathered by copies instead of "
           "NCCL (not under torchrun)")
    a("--json", metavar="FILE", help="also write the report as JSON records (docs/results format; rank 0)")
    a("--no-alloc-count", action="store_true",
      help="do not count CUDA allocation calls (CUPTI stays unloaded: clean host times)")
    a("--require-gpu", action="store_true", help="exit with code 77 (skipped) instead of planning without a GPU")
    a("--no-progress", action="store_true", help="no progress bar")
    o = p.parse_args(argv)
    prefill_loop.check_trace_arguments(p, o)
    if not 0 <= o.simulate <= 2:
        p.error(f"--simulate = {o.simulate} must be in [1, 2] (128 heads split into shares of 64 or 128)")
    if o.simulate and "WORLD_SIZE" in os.environ:
        p.error("--simulate runs every rank in one process; it cannot run under torchrun (WORLD_SIZE is set)")
    return o


class Rank:
    """One rank: its heads of every layer over torch-owned buffers bound into its executor, the
    same caches as every other rank, its own stream, the synthetic front, and the gathers of its
    outputs (out always; lse and max_logits too when checking).

    Args:
        full: the one-rank config (every head).
        world, rank: this rank's place; world 1 is the one-rank run of every head.
        seed: the model front's seed.
        stats: whether lse and max_logits are gathered too (the check compares them).
        gather: whether this rank holds the gathered buffers (every rank under torchrun; in one
            process only the rank whose stream gathers).
    """

    def __init__(self, torch: Any, full: spgraph.PipelineConfig, world: int, rank: int, seed: int,
                 stats: bool, gather: bool = True) -> None:
        import spgraph.torch as sgt
        from spgraph import tensor_parallel as tp

        self.world, self.rank = world, rank
        self.config = tp.rank_config(full, world)
        self.tensors = prefill_loop.engine_tensors(torch, self.config)
        torch.cuda.synchronize()  # the zero fills ran on torch's stream; the warm-up runs on the executor's
        self.ex = sgt.Executor(self.config, buffers=self.tensors)
        self.warm = self.ex.warmup()
        self.stream = torch.cuda.Stream()
        self.handle = self.stream.cuda_stream
        self.views = [self.ex.layer(l) for l in range(len(self.config.layers))]
        tp.fill_rank_inputs(full, self.views, world, rank, seed, self.stream)
        self.front = synthetic.SyntheticFront(synthetic.front_layers(self.config, self.views))
        names = ("out", "lse", "max_logits") if stats else ("out",)
        self.gathers = ([[tp.HeadGather(getattr(v, n), world) for n in names] for v in self.views]
                        if world > 1 and gather else [])
        self.ev = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(RING)]
        self.done = torch.cuda.Event()  # this rank's gather issued: what the one-process gather waits on
        self.step_us: List[float] = []
        self.gather_us: List[float] = []
        self.launch_us: List[float] = []

    def outputs(self, layer: int) -> tuple:
        """(out, lse, max_logits) of every head: the gathered buffers (world > 1, when checking) or
        the rank's own (world 1)."""
        if self.world == 1:
            v = self.views[layer]
            return v.out, v.lse, v.max_logits
        return tuple(g.out for g in self.gathers[layer])

    def read_times(self, slot: int) -> None:
        start, ran, gathered = self.ev[slot]
        gathered.synchronize()
        self.step_us.append(1000.0 * start.elapsed_time(gathered))
        self.gather_us.append(1000.0 * ran.elapsed_time(gathered))


def warm_gathers(torch: Any, ranks: Sequence[Rank], distributed: bool) -> None:
    """A gather of every buffer at every T bucket before counting: NCCL sets up its communicator
    on the first collective and may connect a protocol's buffers on first use (chosen by size)."""
    t_buckets = sorted({t for _, t in ranks[0].ex.buckets})
    for rk in ranks:
        with torch.cuda.stream(rk.stream):
            for t in t_buckets:
                for l, gathers in enumerate(rk.gathers):
                    for g, part in zip(gathers, ("out", "lse", "max_logits")):
                        if distributed:
                            g.all_gather(getattr(rk.views[l], part), t)
                        else:
                            g.gather_local([getattr(r.views[l], part) for r in ranks], t)
        rk.stream.synchronize()


def run(o: argparse.Namespace, torch: Any, world: int, rank: int, distributed: bool) -> Dict[str, Any]:
    """The loop on this process's ranks (one under torchrun, ``world`` with --simulate); returns
    rank 0's report fields and this process's per-rank figures."""
    from spgraph import tensor_parallel as tp

    full = prefill_loop.make_config(o)
    full.validate()
    counter = None if o.no_alloc_count else spgraph.allocation_counter()
    if counter is not None and not counter.attached:
        counter.attach()  # a process that detached it earlier (a test session) would count nothing
    local = [rank] if distributed else list(range(world))
    ranks = [Rank(torch, full, world, r, o.seed, o.check, gather=distributed or r == local[0]) for r in local]
    reference = Rank(torch, full, 1, 0, o.seed, False) if o.check and rank == 0 else None
    lead = ranks[0]
    if rank == 0:
        w = lead.warm
        print(f"tensor_parallel: {world} rank(s) ({'torchrun, NCCL' if distributed else 'one process, one GPU'}), "
              f"{lead.config.layers[0].h_q} of {full.layers[0].h_q} heads a rank, {o.steps} steps, budget {o.budget} "
              f"tokens/step, chunks of <= {full.max_requests} x {full.max_tokens} tokens"
              + (", checked against a one-rank run of every head" if reference else ""))
        print(f"warm-up (a rank): {w['graphs']} graphs captured in {w['capture_ms']:.1f} ms; pool "
              f"{w['pool_device_bytes'] / 2**30:.2f} GiB device")
    warm_gathers(torch, ranks, distributed)
    check = None
    if reference is not None:
        t_buckets = sorted({t for _, t in reference.ex.buckets})
        check = tp.EquivalenceCheck(full, world, t_buckets, capacity=4096, device=torch.cuda.current_device())
        checked = torch.cuda.Event()
    if distributed:
        torch.distributed.barrier()

    sched = spgraph.PrefillScheduler(full, spgraph.SchedulerConfig(max_num_batched_tokens=o.budget))
    wc = spgraph.WorkloadConfig(num_requests=o.requests, min_prompt_len=o.min_len, max_prompt_len=o.max_len,
                                lengths=o.lengths, arrivals=o.arrivals, arrival_rate=o.rate)
    if rank == 0:
        print(f"workload: {wc.describe()}")
    step_host_us: List[float] = []
    chunks = tokens = finished = 0
    prompts = prefill_loop.PromptStream(o.seed, wc)
    progress = prefill_loop.Progress(o.steps, rank == 0 and not o.no_progress)
    reserved_before = torch.cuda.memory_reserved()
    clock = time.perf_counter_ns
    if counter is not None:
        counter.reset()
    t_start = time.perf_counter()
    for step in range(o.steps):
        s0 = clock()
        prompts.refill(sched)
        plan = sched.schedule()
        finished += len(plan.finished)
        for cp in plan.chunks:
            cp.slot_lists = True
            slot = chunks % RING
            t = 0
            for rk in ranks:
                if chunks >= RING:
                    rk.read_times(slot)
                rk.front.run(cp, o.seed, chunks, rk.handle)
                start, ran, _ = rk.ev[slot]
                start.record(rk.stream)
                h0 = clock()
                r = rk.ex.run(cp, rk.handle)
                rk.launch_us.append((clock() - h0) / 1000.0 - r.waited_us)
                if not r.ok:
                    raise RuntimeError(f"tensor_parallel: rank {rk.rank} step {step} chunk failed: {r.message}")
                ran.record(rk.stream)
                t = r.t_bucket
            if world > 1 and distributed:
                with torch.cuda.stream(lead.stream):
                    for l, gathers in enumerate(lead.gathers):
                        for g, part in zip(gathers, ("out", "lse", "max_logits")):
                            g.all_gather(getattr(lead.views[l], part), t)
            elif world > 1:
                # One process: rank 0's stream gathers every rank's buffers once each has run; the
                # other ranks' next writes of out wait for that gather.
                for rk in ranks[1:]:
                    lead.stream.wait_event(rk.ev[slot][1])
                with torch.cuda.stream(lead.stream):
                    for l, gathers in enumerate(lead.gathers):
                        for g, part in zip(gathers, ("out", "lse", "max_logits")):
                            g.gather_local([getattr(rk.views[l], part) for rk in ranks], t)
                lead.done.record(lead.stream)
                for rk in ranks[1:]:
                    rk.stream.wait_event(lead.done)
            for rk in ranks:
                rk.ev[slot][2].record(rk.stream)
            if reference is not None:
                reference.front.run(cp, o.seed, chunks, reference.handle)
                rr = reference.ex.run(cp, reference.handle)
                if not rr.ok or rr.t_bucket != t:
                    raise RuntimeError(f"tensor_parallel: the one-rank run of step {step}: {rr.status} {rr.message}")
                reference.stream.wait_event(lead.ev[slot][2])
                for l in range(len(full.layers)):
                    check.record(chunks, l, t, lead.outputs(l), reference.outputs(l), reference.stream)
                checked.record(reference.stream)
                lead.stream.wait_event(checked)  # the next gather overwrites what the check reads
            tokens += cp.num_tokens
            chunks += 1
        step_host_us.append((clock() - s0) / 1000.0)
        progress.update(step + 1)
    for rk in ranks:
        rk.ex.synchronize()
        rk.stream.synchronize()
    if reference is not None:
        reference.stream.synchronize()
    wall_s = time.perf_counter() - t_start
    for rk in ranks:
        for c in range(max(0, chunks - RING), chunks):
            rk.read_times(c % RING)
    allocations = counter.count() if counter is not None else None
    alloc_names = counter.names() if allocations else []
    faults = sum(rk.ex.read_status()["total"] for rk in ranks)
    verdict = check.finish() if check is not None else None
    reserved_growth = torch.cuda.memory_reserved() - reserved_before

    per_rank = [{"rank": rk.rank,
                 "step_us_p50": prefill_loop.percentile(rk.step_us, 0.5),
                 "step_us_p99": prefill_loop.percentile(rk.step_us, 0.99),
                 "gather_share": sum(rk.gather_us) / sum(rk.step_us) if rk.step_us and sum(rk.step_us) > 0 else 0.0,
                 "gather_us_p50": prefill_loop.percentile(rk.gather_us, 0.5),
                 "launch_host_us_p50": prefill_loop.percentile(rk.launch_us, 0.5),
                 "launch_host_us_p99": prefill_loop.percentile(rk.launch_us, 0.99),
                 "step_host_us_p50": prefill_loop.percentile(step_host_us, 0.5),
                 "step_host_us_p99": prefill_loop.percentile(step_host_us, 0.99),
                 "alloc_calls": allocations, "alloc_names": alloc_names, "torch_reserved_growth": reserved_growth, "faults": faults}
                for rk in ranks]
    return {"world": world, "distributed": distributed, "steps": o.steps, "chunks": chunks, "finished": finished,
            "tokens": tokens, "wall_s": wall_s, "tokens_per_s": tokens / wall_s, "per_rank": per_rank,
            "check": verdict, "counted": counter is not None}


def print_report(rep: Dict[str, Any]) -> None:
    mode = "torchrun, one GPU a rank" if rep["distributed"] else "one process, one GPU"
    print(f"\n== tensor_parallel report ({rep['world']} rank(s), {mode}) ==")
    print(f"  steps                      {rep['steps']} ({rep['chunks']} chunks, {rep['finished']} requests finished)")
    print(f"  prompt tokens              {rep['tokens']} in {rep['wall_s']:.2f} s: {rep['tokens_per_s']:.0f} tokens/s")
    for r in rep["per_rank"]:
        alloc = "not counted" if r["alloc_calls"] is None else f"{r['alloc_calls']} CUDA allocation calls after warm-up"
        print(f"  rank {r['rank']}: GPU time per chunk p50 {r['step_us_p50']:.1f} us, p99 {r['step_us_p99']:.1f} us "
              f"(graph + gather); all-gather {100 * r['gather_share']:.1f}% of it (p50 {r['gather_us_p50']:.1f} us)")
        print(f"          host time per step p50 {r['step_host_us_p50']:.1f} us, p99 {r['step_host_us_p99']:.1f} us; "
              f"per launch p50 {r['launch_host_us_p50']:.2f} us, p99 {r['launch_host_us_p99']:.2f} us")
        print(f"          {alloc}; torch reserved memory grew {r['torch_reserved_growth']} B; "
              f"device faults {r['faults']}")
        if r["alloc_names"]:
            print(f"          allocation calls seen: {', '.join(r['alloc_names'])}")
    if not rep["distributed"] and rep["world"] > 1:
        print("  (one GPU: the ranks share its SMs and the gather is a copy; these are not two-GPU figures)")
    if rep["counted"]:
        print("  (CUPTI's counter is attached: host times include its cost; --no-alloc-count for clean ones)")
    c = rep["check"]
    if c is not None:
        print(f"  check against one rank     {'PASSED' if c['ok'] else 'FAILED'}: {c['bitwise']} (chunk, layer) outputs "
              f"bit for bit (same attention plan), {c['barred']} within the bars (plans differ)")
        for f in c["failures"][:10]:
            print(f"    {f}")


def write_json(path: str, rep: Dict[str, Any]) -> None:
    name = "tensor_parallel/default" if rep["counted"] else "tensor_parallel/no-cupti"
    variant = f"spgraph-python-tp{rep['world']}" + ("" if rep["distributed"] else "-one-gpu")
    commit = os.environ.get("SPGRAPH_COMMIT", "unknown")
    date = time.strftime("%Y-%m-%d", time.gmtime())
    values: Dict[str, Any] = {"steps": rep["steps"], "tokens_per_s": rep["tokens_per_s"]}
    for r in rep["per_rank"]:
        for m in ("step_us_p50", "step_us_p99", "gather_share", "step_host_us_p50", "step_host_us_p99",
                  "launch_host_us_p50", "launch_host_us_p99", "alloc_calls", "faults"):
            if r[m] is not None:
                values[f"{m}_rank{r['rank']}"] = r[m]
    if rep["check"] is not None:
        values["check_failures"] = len(rep["check"]["failures"])
    records = [{"suite": "executor", "name": name, "variant": variant, "metric": m, "value": v, "commit": commit,
                "date": date} for m, v in values.items()]
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


def print_plan(full: spgraph.PipelineConfig, world: int) -> None:
    from spgraph import tensor_parallel as tp

    config = tp.rank_config(full, world)
    print(f"each of {world} rank(s) runs {config.layers[0].h_q} of {full.layers[0].h_q} heads:")
    prefill_loop.print_plan(config, True)


def main(argv: Optional[List[str]] = None) -> int:
    o = parse(argv)
    try:
        import torch

        from spgraph import tensor_parallel as tp
    except ImportError as e:
        print(f"tensor_parallel: needs torch ({e})", file=sys.stderr)
        return 77 if o.require_gpu else 2
    try:
        tp.multicast_off()
    except RuntimeError as e:
        print(f"tensor_parallel: {e}", file=sys.stderr)
        return 2
    distributed = "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if distributed else (o.simulate or 1)
    rank = int(os.environ.get("RANK", "0")) if distributed else 0
    full = prefill_loop.make_config(o)
    try:
        full.validate()
        tp.rank_config(full, world)
    except ValueError as e:
        print(f"tensor_parallel: invalid configuration for {world} rank(s): {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        if o.require_gpu:
            print("tensor_parallel: no CUDA device found; skipping (exit code 77)")
            return 77
        print("tensor_parallel: no CUDA device found; printing the per-rank plan instead.\n")
        print_plan(full, world)
        return 0
    if distributed:
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
        if local_rank >= torch.cuda.device_count():
            print(f"tensor_parallel: LOCAL_RANK = {local_rank} but this host has {torch.cuda.device_count()} "
                  "CUDA device(s); one GPU a rank", file=sys.stderr)
            return 2
        torch.cuda.set_device(local_rank)
        if world > 1:
            torch.distributed.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    try:
        rep = run(o, torch, world, rank, distributed and world > 1)
        rep["distributed"] = distributed
        if distributed and world > 1:
            everyone: List[Any] = [None] * world
            torch.distributed.all_gather_object(everyone, rep["per_rank"])  # after counting: may allocate
            rep["per_rank"] = [r for part in everyone for r in part]
    finally:
        if distributed and world > 1:
            torch.distributed.destroy_process_group()
    ok = all(r["alloc_calls"] in (None, 0) and r["torch_reserved_growth"] == 0 for r in rep["per_rank"])
    ok = ok and (rep["check"] is None or rep["check"]["ok"])
    if rank == 0:
        print_report(rep)
        if o.json:
            write_json(o.json, rep)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""GPU: tensor parallel over heads with two executors on ONE GPU equals a one-rank run of every head.

The sample's own loop (samples/python/tensor_parallel.py --simulate 2 --check) on the V4 layer
program at small limits (R 2, T 128, prompts of 20..1800 tokens, 100 scheduler steps of varying
lengths): two "ranks" in this process, each its own spgraph.torch.Executor over torch-owned buffers
(64 heads, the same caches) on its own stream, out / lse / max_logits gathered over heads by
spgraph.tensor_parallel.HeadGather, against a 128-head executor on the same chunks:

* bit for bit (checksums) wherever both attentions take the same plan (sparse_mla_plan), within
  docs/pipeline.md's bars where the smaller grid takes another top-k split; both kinds occur at
  these T buckets on an H200 (132 SMs);
* zero CUDA allocation calls (CUPTI) and no torch allocator growth after warm-up;
* the check fails when the ranks' heads are swapped (so it can fail for what it claims).

NCCL is not used here (that is the two-GPU run, docs/python.md). Skipped without torch or a device.
"""

import importlib.util
import os

import pytest

from conftest import HAVE_CUDA

pytestmark = pytest.mark.gpu

if HAVE_CUDA:
    import torch

    import spgraph
    from spgraph import tensor_parallel as tp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--max-requests", "2", "--max-tokens", "128", "--max-model-len", "2048", "--min-len", "20",
         "--max-len", "1800", "--lengths", "uniform", "--budget", "192", "--requests", "6", "--no-progress"]


def sample():
    spec = importlib.util.spec_from_file_location("tensor_parallel_sample",
                                                  os.path.join(ROOT, "samples", "python", "tensor_parallel.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_simulated(steps, *extra):
    s = sample()
    o = s.parse(["--simulate", "2", "--check", "--steps", str(steps), *SMALL, *extra])
    counter = spgraph.allocation_counter()
    try:
        rep = s.run(o, torch, 2, 0, False)  # attaches the counter if an earlier test detached it
        assert counter.attached
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        counter.reset()
        probe = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")  # larger than anything cached: a cudaMalloc
        assert counter.count() > 0
        del probe
    finally:
        counter.detach()  # graph launches back on their fast path for the rest of the session
    return rep


def test_plans_match_where_the_grids_agree():
    full = spgraph.PipelineConfig.v4_default()
    for l in range(len(full.layers)):
        assert tp.plans_match(full, l, 2048, 2)  # 2048 x 64 heads fill every SM: the single pass both ways
    c4 = full.layers[0]
    a = spgraph.sparse_mla_plan(16, 128, 512, c4.combined_width())
    b = spgraph.sparse_mla_plan(16, 64, 512, c4.combined_width())
    assert tp.plans_match(full, 0, 16, 2) == (a == b)


def test_two_executors_on_one_gpu_equal_one_rank_of_every_head():
    rep = run_simulated(100)
    check = rep["check"]
    assert check["failures"] == [], "\n".join(check["failures"][:10])
    assert check["ok"]
    layers = len(spgraph.PipelineConfig.v4_default().layers)
    assert check["bitwise"] + check["barred"] == rep["chunks"] * layers
    assert check["bitwise"] > 0  # the T >= 64 buckets take the single pass at 64 and 128 heads
    print(f"\n{rep['chunks']} chunks x {layers} layers: {check['bitwise']} bit for bit, {check['barred']} within the "
          f"bars; {rep['tokens']} tokens")
    for r in rep["per_rank"]:
        assert r["alloc_calls"] == 0, (f"rank {r['rank']}: {r['alloc_calls']} CUDA allocation calls after warm-up: "
                                       f"{r['alloc_names']}")
        assert r["torch_reserved_growth"] == 0


def test_the_check_fails_when_the_heads_are_swapped(monkeypatch):
    fill = tp.fill_rank_inputs

    def swapped(config, views, world, rank, seed, stream):
        return fill(config, views, world, world - 1 - rank if world > 1 else rank, seed, stream)

    monkeypatch.setattr(tp, "fill_rank_inputs", swapped)
    rep = run_simulated(8)
    assert not rep["check"]["ok"]
    assert any("differs from the one-rank run" in f or "outside the bar" in f for f in rep["check"]["failures"])

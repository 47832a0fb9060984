"""CPU: the head split and gather of spgraph.tensor_parallel, and the tensor-parallel sample's flags.

* the multicast guard sets the three variables where unset and refuses a variable set otherwise;
* rank r of world owns heads [r * h / world, (r + 1) * h / world): head_range, rank_config (every
  layer's h_q divided, the config otherwise unchanged) and shard_heads (q along dim 1, sinks along
  dim 0, views), with the refusals of shares the kernels do not run;
* HeadGather puts rank r's heads at [r * h_local, (r + 1) * h_local) of the gathered buffer, for
  out-shaped and lse-shaped buffers, any t, touching no row past t: in one process (gather_local)
  and through a real all-gather (torch.distributed, gloo, two processes);
* the bar checks agree with the test suite's references (tests/python/references.py);
* sparse_mla_plan refuses shapes the kernels do not implement before touching a device;
* samples/python/tensor_parallel.py: --help, refused flags and environment, the per-rank plan
  without a device.

Skipped without torch.
"""

import math
import os
import re
import subprocess
import sys

import pytest

from conftest import HAVE_CUDA, HAVE_TORCH

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

if HAVE_TORCH:
    import torch

    import references
    import spgraph
    from spgraph import tensor_parallel as tp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "samples", "python", "tensor_parallel.py")


# ------------------------------------------------------------------------------------ environment
def test_multicast_off_sets_what_is_unset():
    env = {"NCCL_NVLS_ENABLE": "0", "OTHER": "x"}
    assert tp.multicast_off(env) == ["TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"]
    assert env == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                   "OTHER": "x"}
    assert tp.multicast_off(env) == []


@pytest.mark.parametrize("name,value", [("NCCL_NVLS_ENABLE", "1"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0"),
                                        ("NVSHMEM_DISABLE_NVLS", ""), ("NCCL_NVLS_ENABLE", " 0")])
def test_multicast_off_refuses_another_value(name, value):
    env = {name: value}
    with pytest.raises(RuntimeError) as info:
        tp.multicast_off(env)
    assert f"{name}={value!r}" in str(info.value) and "must be" in str(info.value)
    assert env == {name: value}  # nothing set


# ------------------------------------------------------------------------------------------- split
def test_head_range():
    assert tp.head_range(128, 2, 0) == (0, 64)
    assert tp.head_range(128, 2, 1) == (64, 128)
    assert tp.head_range(128, 1, 0) == (0, 128)
    assert tp.head_range(64, 1, 0) == (0, 64)


@pytest.mark.parametrize("h_q,world,rank,pattern", [
    (128, 0, 0, "world = 0 must be at least 1"),
    (128, 2, 2, r"rank = 2 must be in \[0, 1\] \(world = 2\)"),
    (128, 2, -1, r"rank = -1 must be in \[0, 1\]"),
    (128, 4, 0, "h_q = 128 over world = 4 ranks gives 32 heads a rank; each rank must run 64 or 128 heads"),
    (64, 2, 0, "gives 32 heads a rank"),
    (96, 2, 0, "gives 48 heads a rank"),
    (128, 3, 0, "gives 42.6667 heads a rank"),
])
def test_head_range_refuses(h_q, world, rank, pattern):
    with pytest.raises(ValueError) as info:
        tp.head_range(h_q, world, rank)
    assert re.search(pattern, str(info.value)), str(info.value)


def test_rank_config_divides_every_layer_and_nothing_else():
    full = spgraph.PipelineConfig.v4_default()
    half = tp.rank_config(full, 2)
    assert [l.h_q for l in full.layers] == [128] * len(full.layers)  # the original is untouched
    assert [l.h_q for l in half.layers] == [64] * len(full.layers)
    for a, b in zip(full.layers, half.layers):
        assert (a.compress_ratio, a.top_k, a.window, a.d_qk, a.attn_sink, a.sm_scale) == \
            (b.compress_ratio, b.top_k, b.window, b.d_qk, b.attn_sink, b.sm_scale)
    assert (half.max_requests, half.max_tokens, half.max_model_len, half.cache) == \
        (full.max_requests, full.max_tokens, full.max_model_len, full.cache)
    assert tp.rank_config(full, 1) == full
    with pytest.raises(ValueError, match=r"layers\[0\]: h_q = 128 over world = 4 ranks gives 32 heads"):
        tp.rank_config(full, 4)


def test_shard_heads_slices_q_and_sinks_as_views():
    T, H, D = 5, 128, 8
    q = torch.arange(T * H * D, dtype=torch.float32).reshape(T, H, D)
    sink = torch.arange(H, dtype=torch.float32)
    for rank in (0, 1):
        part = tp.shard_heads(q, 2, rank, 1)
        assert part.shape == (T, 64, D)
        assert torch.equal(part, q[:, 64 * rank:64 * (rank + 1)])
        assert part.data_ptr() == q.data_ptr() + 64 * rank * D * q.element_size()  # a view, no copy
        s = tp.shard_heads(sink, 2, rank, 0)
        assert s.tolist() == list(range(64 * rank, 64 * (rank + 1)))
    assert torch.equal(torch.cat([tp.shard_heads(q, 2, r, 1) for r in (0, 1)], dim=1), q)
    with pytest.raises(ValueError, match="h_q = 5 over world = 2"):
        tp.shard_heads(q, 2, 0, 0)  # dim 0 holds tokens: 5 is no head count


# ------------------------------------------------------------------------------------------ gather
def rank_parts(world, T, h, tail, dtype=torch.float32):
    """Rank r's buffer: each value encodes (rank, token, head, column) so a misplaced one is named."""
    n = T * h * math.prod(tail)
    return [(torch.arange(n, dtype=torch.float64).reshape((T, h) + tail) + 1e6 * (r + 1)).to(dtype)
            for r in range(world)]


@pytest.mark.parametrize("tail", [(16,), ()], ids=["out", "lse"])
@pytest.mark.parametrize("t", [0, 1, 7, 11])
def test_gather_local_puts_rank_r_at_its_heads(tail, t):
    world, T, h = 2, 11, 64
    parts = rank_parts(world, T, h, tail)
    g = tp.HeadGather(parts[0], world)
    assert g.out.shape == (T, world * h) + tail
    g.out.fill_(float("nan"))
    got = g.gather_local(parts, t)
    assert got.shape == (t, world * h) + tail and (t == 0 or got.data_ptr() == g.out.data_ptr())
    want = torch.cat([p[:t] for p in parts], dim=1)
    assert torch.equal(got, want)
    for r in range(world):  # the head order spelled out: rank r's heads at [r * h, (r + 1) * h)
        assert torch.equal(got[:, r * h:(r + 1) * h], parts[r][:t])
    assert torch.isnan(g.out[t:]).all()  # rows past t untouched


def test_gather_is_repeatable_with_shrinking_t():
    parts = rank_parts(2, 9, 64, (4,))
    g = tp.HeadGather(parts[0], 2)
    g.gather_local(parts, 9)
    parts = [p + 0.5 for p in parts]
    got = g.gather_local(parts, 3)
    assert torch.equal(got, torch.cat([p[:3] for p in parts], dim=1))


def test_recv_is_what_an_all_gather_writes():
    """all_gather_into_tensor concatenates the ranks' inputs along dim 0: rank r's t tokens at rows
    [r * t, (r + 1) * t) of recv(t); finish() must turn that into head order."""
    world, T, h, t = 2, 6, 64, 4
    parts = rank_parts(world, T, h, (8,))
    g = tp.HeadGather(parts[0], world)
    g.recv(t).copy_(torch.cat([g.send(p, t) for p in parts], dim=0))
    assert g.recv(t).shape == (world * t, h, 8)
    assert torch.equal(g.finish(t), torch.cat([p[:t] for p in parts], dim=1))


def test_gather_refuses():
    like = torch.zeros(8, 64, 16)
    g = tp.HeadGather(like, 2)
    with pytest.raises(ValueError, match=r"t = 9 must be in \[0, 8\]"):
        g.recv(9)
    with pytest.raises(ValueError, match="1 parts given; the gather has 2 ranks"):
        g.gather_local([like], 1)
    with pytest.raises(ValueError, match=r"local has shape \(8, 32, 16\)"):
        g.send(torch.zeros(8, 32, 16), 4)
    with pytest.raises(ValueError, match="dtype torch.float64"):
        g.send(torch.zeros(8, 64, 16, dtype=torch.float64), 4)
    with pytest.raises(ValueError, match="all-gather needs contiguous rows"):
        g.send(torch.zeros(8, 16, 64).transpose(1, 2), 4)  # [8, 64, 16], heads not contiguous
    with pytest.raises(ValueError, match="must be \\[tokens, heads, ...\\]"):
        tp.HeadGather(torch.zeros(8), 2)


GLOO_RANK = r"""
import os, sys, torch, torch.distributed as dist
from spgraph import tensor_parallel as tp
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
T, h, t = 7, 64, 5
local = (torch.arange(T * h * 3, dtype=torch.float32).reshape(T, h, 3) + 1000 * rank)
g = tp.HeadGather(local, world)
got = g.all_gather(local, t)
want = torch.cat([torch.arange(T * h * 3, dtype=torch.float32).reshape(T, h, 3)[:t] + 1000 * r
                  for r in range(world)], dim=1)
print("rank", rank, "equal", bool(torch.equal(got, want)), flush=True)
dist.destroy_process_group()
"""


def test_all_gather_through_torch_distributed():
    """Two processes, gloo: HeadGather.all_gather (the sample's NCCL call) gives every rank the same
    head-ordered buffer as the one-process gather."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pkg = os.path.dirname(os.path.dirname(spgraph.__file__))
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                   PYTHONPATH=pkg + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen([sys.executable, "-c", GLOO_RANK], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err
        assert f"rank {rank} equal True" in out, out + err


# ------------------------------------------------------------------------------------------- bars
def test_bars_agree_with_the_references():
    ref = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0], dtype=torch.float64)
    cases = [ref.clone(), ref * (1 + 2e-2), ref + torch.tensor([0, 0, 0, 7e-4, 0], dtype=torch.float64),
             ref * (1 + 3e-2), ref + torch.tensor([0, 0, 0, 9e-4, 0], dtype=torch.float64),
             torch.tensor([1.0, -2.0, float("nan"), 0.0, 3.0], dtype=torch.float64)]
    verdicts = []
    for got in cases:
        try:
            references.check_out(got, ref)
            want = None
        except AssertionError:
            want = "fail"
        mine = tp.out_bar_failure(got, ref)
        assert (mine is None) == (want is None), (got, mine)
        verdicts.append(mine is None)
    assert verdicts == [True, True, True, False, False, False]

    inf = float("inf")
    sref = torch.tensor([1.0, -inf, inf, 100.0], dtype=torch.float64)
    stats = [sref.clone(), sref + torch.tensor([9e-5, 0, 0, 2.9e-3], dtype=torch.float64),
             sref + torch.tensor([2e-4, 0, 0, 0], dtype=torch.float64),
             torch.tensor([1.0, inf, inf, 100.0], dtype=torch.float64),
             torch.tensor([1.0, -inf, 5.0, 100.0], dtype=torch.float64),
             torch.tensor([float("nan"), -inf, inf, 100.0], dtype=torch.float64)]
    verdicts = []
    for got in stats:
        try:
            references.check_stat(got, sref, "lse")
            want = None
        except AssertionError:
            want = "fail"
        mine = tp.stat_bar_failure(got, sref)
        assert (mine is None) == (want is None), (got, mine)
        verdicts.append(mine is None)
    assert verdicts == [True, True, False, False, False, False]
    assert "1 elements outside the bar; worst at flat index 3" in tp.out_bar_failure(cases[4], ref)


@pytest.mark.parametrize("args,pattern", [
    ((0, 128, 512, 640), r"s_q = 0 must be in \[1, "),
    ((16, 65, 512, 640), "h_q = 65 must be 64 or 128"),
    ((16, 128, 520, 640), "d_qk = 520 must be 512 or 576"),
    ((16, 128, 512, 100), "topk = 100 must be a positive multiple of 64"),
])
def test_sparse_mla_plan_refuses_before_the_device(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        spgraph.sparse_mla_plan(*args)


# ------------------------------------------------------------------------------------------- sample
def run_sample(*args, **env_over):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(env_over)
    return subprocess.run([sys.executable, SAMPLE, *args], capture_output=True, text=True, env=env, timeout=120)


def test_sample_help_and_flags():
    got = run_sample("--help")
    assert got.returncode == 0
    for flag in ("--steps", "--check", "--simulate", "--json", "--no-progress", "--no-alloc-count", "--budget",
                 "--max-model-len", "--lengths", "--require-gpu"):
        assert flag in got.stdout, flag
    bad = run_sample("--simulate", "3")
    assert bad.returncode == 2 and "--simulate = 3 must be in [1, 2]" in bad.stderr
    bad = run_sample("--max-len", "70000")
    assert bad.returncode == 2 and "--max-len = 70000 must be at most --max-model-len = 65536" in bad.stderr
    bad = run_sample("--simulate", "2", WORLD_SIZE="2")
    assert bad.returncode == 2 and "cannot run under torchrun" in bad.stderr


def test_sample_refuses_multicast():
    """Before anything else (the guard's every case is tested above, in process)."""
    got = run_sample("--simulate", "2", NCCL_NVLS_ENABLE="1", NVSHMEM_DISABLE_NVLS="1")
    assert got.returncode == 2, got.stdout + got.stderr
    assert "NVLink multicast must stay off: NCCL_NVLS_ENABLE='1' (must be '0')" in got.stderr
    assert got.stdout == ""


@pytest.mark.skipif(HAVE_CUDA, reason="needs a machine without a CUDA device")
def test_sample_without_a_device_plans_each_rank():
    got = run_sample("--simulate", "2", "--max-tokens", "512")
    assert got.returncode == 0, got.stderr
    assert "each of 2 rank(s) runs 64 of 128 heads" in got.stdout and "C4A top_k 1024 h64" in got.stdout
    assert "total device: " in got.stdout
    assert run_sample("--require-gpu").returncode == 77
    got = run_sample(WORLD_SIZE="4", RANK="0")
    assert got.returncode == 2 and "h_q = 128 over world = 4 ranks gives 32 heads" in got.stderr

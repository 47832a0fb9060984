"""Tensor parallelism over query heads: each rank runs the whole step on ``h_q / world`` heads.

A layer has one KV head (MQA form), so its attention splits over query heads with nothing to
exchange before it: every rank holds the same caches (the same K rows inserted; engines replicate
the single KV head), q for its contiguous range of heads and the matching attention-sink slice, and
runs its own :class:`spgraph.Executor`; after the step the engine all-gathers ``out`` over heads.
The pieces here are that split and that gather, shared by ``samples/python/tensor_parallel.py``
(one process a GPU, torch.distributed with NCCL) and the one-GPU test (two executors in one
process), plus the check that the gathered output equals a one-rank run of every head:

* :func:`multicast_off`: the environment NCCL, PyTorch and NVSHMEM must see (NVLink multicast off);
* :func:`head_range`, :func:`rank_config`, :func:`shard_heads`: rank ``r`` of ``world`` owns heads
  ``[r * h_q / world, (r + 1) * h_q / world)`` of every layer;
* :class:`HeadGather`: the gathered ``[T, h_q, ...]`` buffer and the rank-major staging an
  all-gather fills, reordered into head order with one copy; nothing allocates after set-up;
* :func:`plans_match` and :class:`EquivalenceCheck`: which steps must agree bit for bit (both runs
  take the same attention plan) and which within docs/pipeline.md's accuracy bars.

Needs torch. docs/python.md, "Tensor parallel over heads".
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, MutableMapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import synthetic
from .config import PipelineConfig
from .ops import sparse_mla_plan

__all__ = ["MULTICAST_OFF", "OUT_BAR", "STAT_BAR", "multicast_off", "head_range", "rank_config", "shard_heads",
           "HeadGather", "fill_rank_inputs", "plans_match", "out_bar_failure", "stat_bar_failure", "EquivalenceCheck"]

#: NVLink multicast off in NCCL, PyTorch's symmetric memory and NVSHMEM: (variable, required value).
MULTICAST_OFF: Tuple[Tuple[str, str], ...] = (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                                              ("NVSHMEM_DISABLE_NVLS", "1"))

#: docs/pipeline.md's bars for out: |err| <= abs or |err| <= rel * |ref| per element, 1 - cos <= cos.
OUT_BAR = {"abs": 8e-4, "rel": 2.4e-2, "cos": 1e-5}
#: docs/pipeline.md's bars for lse and max_logits (infinities must match exactly).
STAT_BAR = {"abs": 1e-4, "rel": 3e-5}


def multicast_off(environ: Optional[MutableMapping[str, str]] = None) -> List[str]:
    """Sets every variable of :data:`MULTICAST_OFF` that is unset (before NCCL initializes).

    Returns:
        The names it set.

    Raises:
        RuntimeError: a variable is set to another value (named with its value and the one
            required); nothing is set then.
    """
    env = os.environ if environ is None else environ
    wrong = [f"{k}={env[k]!r} (must be {v!r})" for k, v in MULTICAST_OFF if k in env and env[k] != v]
    if wrong:
        raise RuntimeError("NVLink multicast must stay off: " + ", ".join(wrong) +
                           "; unset these variables or set them to the values shown")
    unset = [k for k, _ in MULTICAST_OFF if k not in env]
    for k, v in MULTICAST_OFF:
        if k in unset:
            env[k] = v
    return unset


def head_range(h_q: int, world: int, rank: int) -> Tuple[int, int]:
    """``(start, stop)``: the query heads rank ``rank`` of ``world`` owns, contiguous, rank-major.

    Raises:
        ValueError: world < 1, rank outside ``[0, world)``, h_q not a multiple of world, or a
            share that is not 64 or 128 heads (what the attention kernels implement).
    """
    if world < 1:
        raise ValueError(f"world = {world} must be at least 1")
    if not 0 <= rank < world:
        raise ValueError(f"rank = {rank} must be in [0, {world - 1}] (world = {world})")
    if h_q % world != 0 or h_q // world not in (64, 128):
        raise ValueError(f"h_q = {h_q} over world = {world} ranks gives {h_q / world:g} heads a rank; "
                         "each rank must run 64 or 128 heads")
    n = h_q // world
    return rank * n, (rank + 1) * n


def rank_config(config: PipelineConfig, world: int) -> PipelineConfig:
    """A copy of ``config`` with every layer's h_q divided by ``world`` (validated): what each
    rank's executor runs. Caches, chunk limits and everything else stay as they are."""
    c = config.copy()
    for i, layer in enumerate(c.layers):
        try:
            start, stop = head_range(layer.h_q, world, 0)
        except ValueError as e:
            raise ValueError(f"layers[{i}]: {e}") from None
        layer.h_q = stop - start
    c.validate()
    return c


def shard_heads(full: torch.Tensor, world: int, rank: int, dim: int) -> torch.Tensor:
    """Rank ``rank``'s heads of ``full`` along ``dim`` (a view): q ``[T, h_q, d]`` with dim 1,
    an attention sink ``[h_q]`` with dim 0."""
    start, stop = head_range(full.shape[dim], world, rank)
    return full.narrow(dim, start, stop - start)


class HeadGather:
    """The all-gather of one per-rank buffer over heads, into preallocated storage.

    ``like`` is a rank's buffer ``[T, h_local, *tail]`` (out ``[T, h_local, 512]``, lse or
    max_logits ``[T, h_local]``); the gathered buffer :attr:`out` is ``[T, world * h_local, *tail]``,
    rank r's heads at ``[r * h_local, (r + 1) * h_local)``. An all-gather of ``local[:t]`` fills
    the staging ``[world * t, h_local, *tail]`` rank-major (rank r's t tokens at rows ``r * t``, as
    ``torch.distributed.all_gather_into_tensor`` concatenates them); :meth:`finish` copies it into
    head order. Every launch goes to the current torch stream; nothing allocates after construction.
    """

    def __init__(self, like: torch.Tensor, world: int) -> None:
        if like.dim() < 2:
            raise ValueError(f"like has shape {tuple(like.shape)}; it must be [tokens, heads, ...]")
        if world < 1:
            raise ValueError(f"world = {world} must be at least 1")
        self.world = world
        self.rows, self.heads = int(like.shape[0]), int(like.shape[1])
        self.tail = tuple(int(d) for d in like.shape[2:])
        self.per_token = self.heads
        for d in self.tail:
            self.per_token *= d
        self.staging = torch.empty(world * self.rows * self.per_token, dtype=like.dtype, device=like.device)
        self.out = torch.empty((self.rows, world * self.heads) + self.tail, dtype=like.dtype, device=like.device)

    def _tokens(self, t: int) -> int:
        if not 0 <= t <= self.rows:
            raise ValueError(f"t = {t} must be in [0, {self.rows}] (the buffer's rows)")
        return t

    def send(self, local: torch.Tensor, t: int) -> torch.Tensor:
        """``local[:t]``, checked: what a rank hands the all-gather (contiguous, this shape)."""
        t = self._tokens(t)
        if tuple(local.shape[1:]) != (self.heads,) + self.tail or local.dtype != self.out.dtype:
            raise ValueError(f"local has shape {tuple(local.shape)} and dtype {local.dtype}; the gather was built "
                             f"for [*, {self.heads}{''.join(f', {d}' for d in self.tail)}] {self.out.dtype}")
        part = local[:t]
        if not part.is_contiguous():
            raise ValueError(f"local[:{t}] has strides {part.stride()}; the all-gather needs contiguous rows")
        return part

    def recv(self, t: int) -> torch.Tensor:
        """The staging of ``t`` tokens as the all-gather's output: ``[world * t, h_local, *tail]``,
        rank r's tokens at rows ``[r * t, (r + 1) * t)`` (a view of the flat storage)."""
        t = self._tokens(t)
        return self.staging[: self.world * t * self.per_token].view((self.world * t, self.heads) + self.tail)

    def finish(self, t: int) -> torch.Tensor:
        """Reorders the staging into head order; returns ``out[:t]`` (one copy kernel)."""
        staged = self.recv(t).view((self.world, t, self.heads) + self.tail)
        gathered = self.out[:t]
        gathered.view((t, self.world, self.heads) + self.tail).copy_(staged.transpose(0, 1))
        return gathered

    def all_gather(self, local: torch.Tensor, t: int, group: Any = None) -> torch.Tensor:
        """torch.distributed's all-gather of every rank's ``local[:t]`` (synchronous: on the current
        stream with NCCL), then :meth:`finish`; returns ``out[:t]``."""
        dist.all_gather_into_tensor(self.recv(t), self.send(local, t), group=group)
        return self.finish(t)

    def gather_local(self, parts: Sequence[torch.Tensor], t: int) -> torch.Tensor:
        """The same gather within one process: ``parts[r]`` is rank r's buffer (any device the
        current stream may read); returns ``out[:t]``."""
        if len(parts) != self.world:
            raise ValueError(f"{len(parts)} parts given; the gather has {self.world} ranks")
        staged = self.recv(t).view((self.world, t, self.heads) + self.tail)
        for r, p in enumerate(parts):
            staged[r].copy_(self.send(p, t))
        return self.finish(t)


def plans_match(config: PipelineConfig, layer: int, t_bucket: int, world: int, device: int = 0) -> bool:
    """Whether layer ``layer``'s attention takes the same plan at ``t_bucket`` tokens on one rank of
    all heads and on one of ``world`` ranks (its s_q is the bucket's T, its top-k the combined
    width). Where it does, every (token, 64 heads) tile computes the same bits, so the gathered
    output equals the one-rank output bit for bit; where not (a top-k split the smaller grid
    takes), the two agree within the accuracy bars."""
    l = config.layers[layer]
    full = sparse_mla_plan(t_bucket, l.h_q, l.d_qk, l.combined_width(), device)
    start, stop = head_range(l.h_q, world, 0)
    part = sparse_mla_plan(t_bucket, stop - start, l.d_qk, l.combined_width(), device)
    return full == part


def _worst(err: torch.Tensor, bad: torch.Tensor, got: torch.Tensor, ref: torch.Tensor) -> str:
    i = int(torch.argmax(torch.where(bad, err, torch.zeros_like(err)).reshape(-1)))
    return (f"{int(bad.sum())} elements outside the bar; worst at flat index {i}: got {float(got.reshape(-1)[i])}, "
            f"reference {float(ref.reshape(-1)[i])}")


def out_bar_failure(got: torch.Tensor, ref: torch.Tensor) -> Optional[str]:
    """docs/pipeline.md's out bar with ``ref`` as the reference: None if every element has
    |err| <= 8e-4 or |err| / |ref| <= 2.4e-2 (NaN never passes) and 1 - cos(got, ref) <= 1e-5
    over the whole tensor (where both norms are non-zero); else what failed."""
    g, r = got.double().reshape(-1), ref.double().reshape(-1)
    err = (g - r).abs()
    ok = ((err <= OUT_BAR["abs"]) | (err <= OUT_BAR["rel"] * r.abs())) & ~torch.isnan(g)
    if not bool(ok.all()):
        return _worst(torch.nan_to_num(err, nan=float("inf")), ~ok, g, r)
    denom = float(g.norm() * r.norm())
    if denom > 0:
        cos_diff = 1.0 - float(g.dot(r)) / denom
        if cos_diff > OUT_BAR["cos"]:
            return f"1 - cos = {cos_diff:.3g} > {OUT_BAR['cos']:g}"
    return None


def stat_bar_failure(got: torch.Tensor, ref: torch.Tensor) -> Optional[str]:
    """The lse / max_logits bar: None if every element has |err| <= 1e-4 or relative <= 3e-5 and
    infinities match exactly (sign included; NaN never passes); else what failed."""
    g, r = got.double().reshape(-1), ref.double().reshape(-1)
    finite = torch.isfinite(g) & torch.isfinite(r)
    same_inf = torch.isinf(g) & torch.isinf(r) & (g == r)
    err = torch.where(finite, (g - r).abs(), torch.zeros_like(g))
    ok = same_inf | (finite & ((err <= STAT_BAR["abs"]) | (err <= STAT_BAR["rel"] * r.abs())))
    if not bool(ok.all()):
        return _worst(torch.where(ok, err, torch.full_like(err, float("inf"))), ~ok, g, r)
    return None


class EquivalenceCheck:
    """Compares gathered outputs with a one-rank run of every head, chunk by chunk, allocating no
    device memory after construction.

    Per (chunk, layer), :meth:`record` takes the gathered and the reference buffers (out, lse,
    max_logits; their first t rows). Where :func:`plans_match` the two must be equal bit for bit:
    an order-sensitive 64-bit checksum of each (spgraph.synthetic's: an odd weight a 32-bit word,
    so any one differing word changes it) accumulates on the device, and :meth:`flush` (when the
    checksums' storage is full, and from :meth:`finish`) compares them. Elsewhere both are copied
    to pinned host buffers, the stream is synchronized and the bars are checked on the host.

    Args:
        config: the one-rank config (every head).
        world: ranks the heads are split over.
        t_buckets: the T buckets the executors run.
        capacity: (chunk, layer) checksum pairs held before a flush.
        device: the CUDA device (an index).
    """

    def __init__(self, config: PipelineConfig, world: int, t_buckets: Sequence[int], capacity: int = 4096,
                 device: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"capacity = {capacity} must be at least 1")
        self.config, self.world, self.device = config, world, device
        self.match = {(l, t): plans_match(config, l, t, world, device)
                      for l in range(len(config.layers)) for t in t_buckets}
        host_rows = max([t for (l, t), m in self.match.items() if not m], default=0)
        self.sums = torch.zeros((capacity, 2, 3), dtype=torch.int64, device=torch.device("cuda", device))
        self.pending: List[Tuple[int, int, int]] = []  # (chunk, layer, t) whose checksums are in sums
        self.stream: Any = None
        h = max((l.h_q for l in config.layers), default=0)
        self.host_out = [torch.empty((host_rows, h, 512), dtype=torch.bfloat16, pin_memory=True) for _ in range(2)]
        self.host_stat = [[torch.empty((host_rows, h), dtype=torch.float32, pin_memory=True) for _ in range(2)]
                          for _ in range(2)]
        self.bitwise = 0  # (chunk, layer) outputs compared by checksum
        self.barred = 0   # compared within the bars
        self.failures: List[str] = []

    def record(self, chunk: int, layer: int, t_bucket: int, got: Sequence[torch.Tensor], ref: Sequence[torch.Tensor],
               stream: Any) -> None:
        """Compares ``got`` = (out, lse, max_logits) with ``ref`` (each ``[>= t_bucket, h_q, ...]``,
        contiguous) on their first t_bucket rows; ``stream`` (a torch stream) is the one both are
        ready on, and the one the check's kernels and copies run on."""
        if (layer, t_bucket) not in self.match:
            raise ValueError(f"(layer {layer}, t_bucket {t_bucket}) is not one of the check's buckets")
        if self.match[(layer, t_bucket)]:
            if len(self.pending) == self.sums.shape[0]:
                self.flush()
            i = len(self.pending)
            handle = stream.cuda_stream
            for side, bufs in enumerate((got, ref)):
                for k, b in enumerate(bufs):
                    salt = (chunk << 32) | (layer << 8) | k
                    synthetic.checksum_accumulate(b[:t_bucket], salt, self.sums[i, side, k:k + 1], handle)
            self.pending.append((chunk, layer, t_bucket))
            self.stream = stream
            self.bitwise += 1
            return
        h = self.config.layers[layer].h_q
        with torch.cuda.stream(stream):
            for side, bufs in enumerate((got, ref)):
                self.host_out[side][:t_bucket, :h].copy_(bufs[0][:t_bucket], non_blocking=True)
                for k in (0, 1):
                    self.host_stat[k][side][:t_bucket, :h].copy_(bufs[1 + k][:t_bucket], non_blocking=True)
        stream.synchronize()
        where = f"chunk {chunk} layer {layer} (t {t_bucket}, plans differ)"
        fail = out_bar_failure(self.host_out[0][:t_bucket, :h], self.host_out[1][:t_bucket, :h])
        if fail:
            self.failures.append(f"{where}: out {fail}")
        for k, name in ((0, "lse"), (1, "max_logits")):
            fail = stat_bar_failure(self.host_stat[k][0][:t_bucket, :h], self.host_stat[k][1][:t_bucket, :h])
            if fail:
                self.failures.append(f"{where}: {name} {fail}")
        self.barred += 1

    def flush(self) -> None:
        """Waits for the recorded checksums, compares them and zeroes the storage (on the stream
        they were recorded on)."""
        if not self.pending:
            return
        self.stream.synchronize()
        sums = self.sums[: len(self.pending)].cpu()  # into a new host tensor: no device allocation
        names = ("out", "lse", "max_logits")
        for i, (chunk, layer, t) in enumerate(self.pending):
            for k in range(3):
                if int(sums[i, 0, k]) != int(sums[i, 1, k]):
                    self.failures.append(f"chunk {chunk} layer {layer} (t {t}, same plan): {names[k]} differs from "
                                         "the one-rank run (checksums)")
        with torch.cuda.stream(self.stream):
            self.sums.zero_()
        self.pending.clear()

    def finish(self) -> Dict[str, Any]:
        """Flushes; returns ``{'bitwise', 'barred', 'failures', 'ok'}``: how many (chunk, layer)
        outputs were compared each way and every failure, described."""
        self.flush()
        if self.stream is not None:
            self.stream.synchronize()
        return {"bitwise": self.bitwise, "barred": self.barred, "failures": list(self.failures),
                "ok": not self.failures and self.bitwise + self.barred > 0}


def fill_rank_inputs(config: PipelineConfig, views: Sequence[Any], world: int, rank: int, seed: int,
                     stream: Any) -> None:
    """The synthetic model front's fixed part for one rank: each layer's q (every head filled as a
    one-rank run fills it, then this rank's heads copied in) and its sink slice, on ``stream``.
    ``config`` is the one-rank config; ``views`` the rank's ``Executor.layer(l)`` views. Set-up
    only: allocates a full-head q once per layer."""
    handle = stream.cuda_stream
    with torch.cuda.stream(stream):
        for l, (layer, v) in enumerate(zip(config.layers, views)):
            full = torch.empty((v.q.shape[0], layer.h_q, layer.d_qk), dtype=torch.bfloat16, device=v.q.device)
            synthetic.fill_query(full, seed, l, handle)
            v.q.copy_(shard_heads(full, world, rank, 1))
            if layer.attn_sink:
                sink = torch.tensor(synthetic.sink_values(seed, l, layer.h_q), dtype=torch.float32)
                v.attn_sink.copy_(shard_heads(sink, world, rank, 0))
    stream.synchronize()


"""spgraph's ops for PyTorch: drop-in signatures, ``torch.library`` custom ops, the current stream.

Importing this module registers the ops ``torch.ops.spgraph.*`` (a ``torch.library.Library`` of
spgraph's own):

==================================================  =============================================
op                                                  mutates
==================================================  =============================================
``sparse_mla_fwd(q, kv, indices, sm_scale, d_v,     nothing (allocates out, max_logits, lse and,
attn_sink, topk_length) -> (out, max_logits, lse)`` where the plan uses one, a workspace)
``sparse_mla_fwd_out(..., out, max_logits, lse,     out, max_logits, lse, workspace
workspace)``
``combine_topk_swa_indices(..., M, N, M_device,     nothing (allocates combined_indices, filled
N_device) -> (combined_indices, combined_lens)``    with -1, and combined_lens)
``combine_topk_swa_indices_out(..., combined_       combined_indices, combined_lens, status
indices, combined_lens, status)``
``quantize_and_insert_k_cache(k, k_cache,           k_cache, status
slot_mapping, block_size, status)``
``dequantize_and_gather_k_cache(out, k_cache,       out, status
seq_lens, gather_lens, block_table, block_size,
offset, status)``
==================================================  =============================================

``spgraph.torch.Executor`` is :class:`spgraph.Executor` with torch tensors for its views and
``torch.cuda.current_stream()`` as its default stream.

Each has a fake (meta) implementation, so ``torch.compile(fullgraph=True)`` traces through them,
and launches on ``torch.cuda.current_stream()`` of its tensors' device, so ``torch.cuda.graph``
captures them. The functions below are the signatures engine code calls (FlashMLA's
``flash_mla_sparse_fwd``, vLLM's DeepSeek-V4 ops), each with ``out=``: given every output, a call
allocates nothing and never synchronizes. In plain eager mode (no torch.compile tracing, no
dispatch or function mode, no functorch transform, no profiler, plain tensors none of which
requires grad) these functions call the op's kernel directly, skipping the dispatcher, which
would only route the call there; anywhere else they call ``torch.ops.spgraph.*``. Both paths run
the same kernel and bump the version counter of every tensor the op writes. Bad arguments raise
``TypeError`` (a dtype) or ``ValueError`` with the C++ message (argument, value, bound).
Semantics: docs/pipeline.md; this layer: docs/python.md.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from . import _spgraph as _C
from . import executor as _executor

__all__ = [
    "Executor",
    "sparse_mla_fwd",
    "combine_topk_swa_indices",
    "quantize_and_insert_k_cache",
    "dequantize_and_gather_k_cache",
    "combined_width",
]

Tensor = torch.Tensor

try:  # the raw handle of the current stream without building a torch.cuda.Stream (~0.1 us, not ~1 us)
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # pragma: no cover - older or CPU-only builds
    def _raw_stream(device: int) -> int:
        return torch.cuda.current_stream(device).cuda_stream


def _stream(t: Tensor) -> int:
    """The current torch stream of t's device (0 for a host tensor, which the op then refuses)."""
    return _raw_stream(t.get_device()) if t.is_cuda else 0


# The ops live in a torch.library.Library of spgraph's own rather than behind
# torch.library.custom_op: the same schemas, mutation annotations and fake kernels, but a call
# through torch.ops.spgraph enters Python once (the CPU or CUDA kernel below), where custom_op adds
# its Python autograd and wrapper layers (3.3x the dispatch time on the build machine,
# docs/benchmark_history.md, "The torch layer's dispatch").
_LIB = torch.library.Library("spgraph", "DEF")


def _define(schema: str, fake):
    """Defines ``spgraph::<schema>`` with ``fake`` as its fake kernel; decorates its kernel, which
    serves CPU and CUDA tensors alike (on the host the op's own checks refuse them, with their
    message)."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    torch.library.register_fake(f"spgraph::{name}", fake, lib=_LIB)

    def register(kernel):
        _LIB.impl(name, kernel, "CPU")
        _LIB.impl(name, kernel, "CUDA")
        return kernel

    return register


# Where a call may skip the dispatcher (see _direct). Each probe is torch's own; a torch without
# one of them always dispatches.
_compiling = getattr(torch.compiler, "is_compiling", None)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
_function_modes = getattr(torch._C, "_is_torch_function_mode_enabled", None)
_profiling = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
_functorch_level = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)
_CAN_SKIP_DISPATCH = None not in (_compiling, _dispatch_modes, _function_modes, _profiling, _functorch_level)


def _direct(tensors: Sequence[Optional[Tensor]]) -> bool:
    """True where the public functions below call an op's kernel directly instead of through
    ``torch.ops.spgraph``: plain eager mode (not traced by torch.compile, no torch dispatch or
    function mode, no functorch transform, no profiler recording op events) on plain tensors none
    of which requires grad. There the dispatcher would only route the call to that same kernel;
    anywhere else (tracing, fake tensors, autograd, vmap, profiling) the call goes through it."""
    if not _CAN_SKIP_DISPATCH or _compiling() or _dispatch_modes() or _function_modes() or _profiling():
        return False
    if _functorch_level() is not None:
        return False
    for t in tensors:
        if t is not None and (type(t) is not Tensor or t.requires_grad):
            return False
    return True


def _written(*tensors: Optional[Tensor]) -> None:
    """Bumps the version counters of the tensors an op wrote, as torch does for an in-place op
    (autograd refuses a backward through a saved tensor changed since)."""
    torch.autograd.graph.increment_version([t for t in tensors if t is not None])


def _plain(t: Optional[Tensor]) -> Optional[Tensor]:
    """DLPack refuses tensors that require grad; the ops have no autograd, so drop the flag."""
    return t.detach() if t is not None and t.requires_grad else t


def _pair(t: Tensor) -> Tuple[int, int]:
    shape = tuple(t.shape) + (0, 0)
    return shape[0], shape[1]


def combined_width(topk: int, window_size: int) -> int:
    """Width of the combined index rows this layer allocates: ``round_up(topk + window_size, 128)``."""
    return int(_C.combined_width(int(topk), int(window_size)))


# ---------------------------------------------------------------------------------------- sparse_mla_fwd
def _sparse_mla_fwd_fake(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    s_q, h_q = _pair(q)
    return (q.new_empty((s_q, h_q, d_v), dtype=torch.bfloat16),
            q.new_empty((s_q, h_q), dtype=torch.float32),
            q.new_empty((s_q, h_q), dtype=torch.float32))


@_define("sparse_mla_fwd(Tensor q, Tensor kv, Tensor indices, float sm_scale, SymInt d_v, Tensor? attn_sink, "
         "Tensor? topk_length) -> (Tensor, Tensor, Tensor)", _sparse_mla_fwd_fake)
def _sparse_mla_fwd(
    q: Tensor,
    kv: Tensor,
    indices: Tensor,
    sm_scale: float,
    d_v: int,
    attn_sink: Optional[Tensor],
    topk_length: Optional[Tensor],
) -> Tuple[Tensor, Tensor, Tensor]:
    s_q, h_q = _pair(q)
    out = torch.empty((s_q, h_q, d_v), dtype=torch.bfloat16, device=q.device)
    max_logits = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    lse = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)

    def workspace(nbytes: int) -> Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=q.device)

    _C.sparse_mla_fwd(_plain(q), _plain(kv), _plain(indices), sm_scale, d_v, _plain(attn_sink), _plain(topk_length),
                      out, max_logits, lse, workspace, _stream(q))
    return out, max_logits, lse


def _nothing(*args) -> None:
    """The fake kernel of an op that only writes its arguments."""
    return None


@_define("sparse_mla_fwd_out(Tensor q, Tensor kv, Tensor indices, float sm_scale, SymInt d_v, Tensor? attn_sink, "
         "Tensor? topk_length, Tensor(a!) out, Tensor(b!) max_logits, Tensor(c!) lse, Tensor(d!)? workspace) -> ()",
         _nothing)
def _sparse_mla_fwd_out(
    q: Tensor,
    kv: Tensor,
    indices: Tensor,
    sm_scale: float,
    d_v: int,
    attn_sink: Optional[Tensor],
    topk_length: Optional[Tensor],
    out: Tensor,
    max_logits: Tensor,
    lse: Tensor,
    workspace: Optional[Tensor],
) -> None:
    _C.sparse_mla_fwd(_plain(q), _plain(kv), _plain(indices), sm_scale, d_v, _plain(attn_sink), _plain(topk_length),
                      out, max_logits, lse, workspace, _stream(q))
    _written(out, max_logits, lse, workspace)


def sparse_mla_fwd(
    q: Tensor,
    kv: Tensor,
    indices: Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: Optional[Tensor] = None,
    topk_length: Optional[Tensor] = None,
    out: Union[Tensor, Sequence[Tensor], None] = None,
    *,
    workspace: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Sparse MLA prefill attention: FlashMLA's ``flash_mla_sparse_fwd`` (semantics in
    :func:`spgraph.sparse_mla_fwd`), on the current torch stream.

    Args:
        q: ``[s_q, h_q, d_qk]`` bfloat16 CUDA tensor, contiguous; h_q 64 or 128, d_qk 512 or 576.
        kv: ``[s_kv, 1, d_qk]`` bfloat16 (rows may be padded to a multiple of 8 elements).
        indices: ``[s_q, 1, topk]`` int32, topk a multiple of 64; -1 (or any value outside
            ``[0, s_kv)``) is masked.
        sm_scale: softmax scale.
        d_v: must be 512.
        attn_sink: optional ``[h_q]`` float32 (may hold +-inf).
        topk_length: optional ``[s_q]`` int32.
        out: None (allocate), the output tensor alone (vLLM's fork; max_logits and lse are then
            allocated), or ``(out, max_logits, lse)``: with all three nothing is allocated.
        workspace: scratch for the split top-k path when ``out`` is given (a uint8 CUDA tensor of
            :func:`spgraph.sparse_mla_workspace_bytes` bytes); without it such a call runs the
            single pass. A call with ``out=None`` allocates its own where the plan uses one.

    Returns:
        ``(out [s_q, h_q, 512] bfloat16, max_logits [s_q, h_q] float32, lse [s_q, h_q] float32)``;
        lse is the natural-log sum of exp over valid indices, without the sink; a row with no valid
        index gives 0, -inf, +inf. s_q = 0 gives empty outputs.
    """
    if out is None:
        if _direct((q, kv, indices, attn_sink, topk_length)):
            return _sparse_mla_fwd(q, kv, indices, float(sm_scale), int(d_v), attn_sink, topk_length)
        return torch.ops.spgraph.sparse_mla_fwd(q, kv, indices, float(sm_scale), int(d_v), attn_sink, topk_length)
    if isinstance(out, torch.Tensor):
        s_q, h_q = _pair(q)
        outs = (out, q.new_empty((s_q, h_q), dtype=torch.float32), q.new_empty((s_q, h_q), dtype=torch.float32))
    else:
        if len(out) != 3:
            raise TypeError("out must be a tensor or a tuple (out, max_logits, lse)")
        outs = (out[0], out[1], out[2])
    op = (_sparse_mla_fwd_out if _direct((q, kv, indices, attn_sink, topk_length, *outs, workspace))
          else torch.ops.spgraph.sparse_mla_fwd_out)
    op(q, kv, indices, float(sm_scale), int(d_v), attn_sink, topk_length, outs[0], outs[1], outs[2], workspace)
    return outs


# ------------------------------------------------------------------------------ combine_topk_swa_indices
def _combine_fake(topk_indices, query_start_loc, seq_lens, gather_lens, window_size, compress_ratio, topk, M, N,
                  M_device, N_device):
    tokens = _pair(topk_indices)[0]
    return (topk_indices.new_empty((tokens, combined_width(topk, window_size)), dtype=torch.int32),
            topk_indices.new_empty((tokens,), dtype=torch.int32))


@_define("combine_topk_swa_indices(Tensor topk_indices, Tensor query_start_loc, Tensor seq_lens, Tensor gather_lens, "
         "SymInt window_size, SymInt compress_ratio, SymInt topk, SymInt M, SymInt N, Tensor? M_device, "
         "Tensor? N_device) -> (Tensor, Tensor)", _combine_fake)
def _combine(
    topk_indices: Tensor,
    query_start_loc: Tensor,
    seq_lens: Tensor,
    gather_lens: Tensor,
    window_size: int,
    compress_ratio: int,
    topk: int,
    M: int,
    N: int,
    M_device: Optional[Tensor],
    N_device: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    tokens = _pair(topk_indices)[0]
    combined = torch.full((tokens, combined_width(topk, window_size)), -1, dtype=torch.int32,
                          device=topk_indices.device)
    lens = torch.empty((tokens,), dtype=torch.int32, device=topk_indices.device)
    _C.combine_topk_swa_indices(topk_indices, query_start_loc, seq_lens, gather_lens, window_size, compress_ratio,
                                topk, M if M_device is None else M_device, N if N_device is None else N_device,
                                combined, lens, None, _stream(topk_indices))
    return combined, lens


@_define("combine_topk_swa_indices_out(Tensor topk_indices, Tensor query_start_loc, Tensor seq_lens, "
         "Tensor gather_lens, SymInt window_size, SymInt compress_ratio, SymInt topk, SymInt M, SymInt N, "
         "Tensor? M_device, Tensor? N_device, Tensor(a!) combined_indices, Tensor(b!) combined_lens, "
         "Tensor(c!)? status) -> ()", _nothing)
def _combine_out(
    topk_indices: Tensor,
    query_start_loc: Tensor,
    seq_lens: Tensor,
    gather_lens: Tensor,
    window_size: int,
    compress_ratio: int,
    topk: int,
    M: int,
    N: int,
    M_device: Optional[Tensor],
    N_device: Optional[Tensor],
    combined_indices: Tensor,
    combined_lens: Tensor,
    status: Optional[Tensor],
) -> None:
    _C.combine_topk_swa_indices(topk_indices, query_start_loc, seq_lens, gather_lens, window_size, compress_ratio,
                                topk, M if M_device is None else M_device, N if N_device is None else N_device,
                                combined_indices, combined_lens, status, _stream(topk_indices))
    _written(combined_indices, combined_lens, status)


def _scalar(name: str, v: Union[int, Tensor]) -> Tuple[int, Optional[Tensor]]:
    if isinstance(v, torch.Tensor):
        return 0, v
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"{name} must be an int or a one-element int32 device tensor, not {type(v).__name__}")
    return int(v), None


def combine_topk_swa_indices(
    topk_indices: Tensor,
    query_start_loc: Tensor,
    seq_lens: Tensor,
    gather_lens: Tensor,
    window_size: int,
    compress_ratio: int,
    topk: int,
    M: Union[int, Tensor],
    N: Union[int, Tensor],
    out: Optional[Tuple[Tensor, Tensor]] = None,
    *,
    status: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """vLLM's DeepSeek-V4 ``combine_topk_swa_indices`` (semantics in
    :func:`spgraph.combine_topk_swa_indices`), on the current torch stream.

    ``M`` and ``N`` may be ints or one-element int32 CUDA tensors (read by the kernel, so nothing
    is read back to the host and a captured call follows new values). ``out`` =
    ``(combined_indices [num_tokens, width] int32, combined_lens [num_tokens] int32)`` allocates
    nothing; without it ``combined_indices`` is allocated ``[num_tokens, combined_width(topk,
    window_size)]`` and filled with -1 first, as vLLM does. With ``out``, entries at or past
    ``combined_lens[t]`` keep what they held. ``status``: optional ``[10]`` int32 CUDA tensor that
    accumulates fault counts (:func:`spgraph.fault_counts`).

    Returns:
        ``(combined_indices, combined_lens)``.
    """
    m, m_device = _scalar("M", M)
    n, n_device = _scalar("N", N)
    inputs = (topk_indices, query_start_loc, seq_lens, gather_lens, m_device, n_device)
    if out is None and status is None:
        op = _combine if _direct(inputs) else torch.ops.spgraph.combine_topk_swa_indices
        return op(topk_indices, query_start_loc, seq_lens, gather_lens, int(window_size), int(compress_ratio),
                  int(topk), m, n, m_device, n_device)
    if out is None:
        tokens = _pair(topk_indices)[0]
        out = (torch.full((tokens, combined_width(topk, window_size)), -1, dtype=torch.int32,
                          device=topk_indices.device),
               torch.empty((tokens,), dtype=torch.int32, device=topk_indices.device))
    if len(out) != 2:
        raise TypeError("out must be a tuple (combined_indices, combined_lens)")
    op = _combine_out if _direct((*inputs, out[0], out[1], status)) else torch.ops.spgraph.combine_topk_swa_indices_out
    op(topk_indices, query_start_loc, seq_lens, gather_lens, int(window_size), int(compress_ratio), int(topk), m, n,
       m_device, n_device, out[0], out[1], status)
    return out[0], out[1]


# ------------------------------------------------------------------------------------ FP8 cache ops
@_define("quantize_and_insert_k_cache(Tensor k, Tensor(a!) k_cache, Tensor slot_mapping, SymInt block_size, "
         "Tensor(b!)? status) -> ()", _nothing)
def _insert(k: Tensor, k_cache: Tensor, slot_mapping: Tensor, block_size: int, status: Optional[Tensor]) -> None:
    _C.quantize_and_insert_k_cache(_plain(k), k_cache, slot_mapping, block_size, status, _stream(k))
    _written(k_cache, status)


def quantize_and_insert_k_cache(
    k: Tensor, k_cache: Tensor, slot_mapping: Tensor, block_size: int, *, status: Optional[Tensor] = None
) -> None:
    """Quantize ``k [num_tokens, 512]`` bfloat16 into the V4 FP8 cache ``k_cache`` (uint8, in place) at
    ``slot_mapping`` (int32; -1 skips), on the current torch stream. Format and rules:
    :func:`spgraph.quantize_and_insert_k_cache`."""
    op = _insert if _direct((k, k_cache, slot_mapping, status)) else torch.ops.spgraph.quantize_and_insert_k_cache
    op(k, k_cache, slot_mapping, int(block_size), status)


@_define("dequantize_and_gather_k_cache(Tensor(a!) out, Tensor k_cache, Tensor seq_lens, Tensor? gather_lens, "
         "Tensor block_table, SymInt block_size, SymInt offset, Tensor(b!)? status) -> ()", _nothing)
def _gather(
    out: Tensor,
    k_cache: Tensor,
    seq_lens: Tensor,
    gather_lens: Optional[Tensor],
    block_table: Tensor,
    block_size: int,
    offset: int,
    status: Optional[Tensor],
) -> None:
    _C.dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset, status,
                                     _stream(out))
    _written(out, status)


def dequantize_and_gather_k_cache(
    out: Tensor,
    k_cache: Tensor,
    seq_lens: Tensor,
    gather_lens: Optional[Tensor],
    block_table: Tensor,
    block_size: int,
    offset: int,
    *,
    status: Optional[Tensor] = None,
) -> None:
    """vLLM's DeepSeek-V4 ``dequantize_and_gather_k_cache``: request b's trailing ``gather_lens[b]``
    positions (all ``seq_lens[b]`` when None) into ``out[b, offset:]`` as bf16, on the current torch
    stream. Rules: :func:`spgraph.dequantize_and_gather_k_cache`."""
    op = (_gather if _direct((out, k_cache, seq_lens, gather_lens, block_table, status))
          else torch.ops.spgraph.dequantize_and_gather_k_cache)
    op(out, k_cache, seq_lens, gather_lens, block_table, int(block_size), int(offset), status)


# ------------------------------------------------------------------------------------------- executor
class Executor(_executor.Executor):
    """:class:`spgraph.Executor` for PyTorch: views are torch tensors (zero-copy, each keeping the
    executor alive) and ``run(chunk)`` / ``run_eager(chunk)`` (``run_step(step)`` / ``run_step_eager(step)`` and
    ``run_staged()`` / ``run_staged_eager()`` likewise) launch on ``torch.cuda.current_stream()`` of the executor's device unless a stream is given (a
    ``torch.cuda.Stream``, an int handle). Writes of q, top-k and the K rows made on the current
    stream before ``run`` are therefore ordered before the step, and the outputs are ready in the
    current stream's order after it (docs/graphs.md, "The caller's stream").

    Bind an engine's tensors as ``buffers=[{"swa_cache": cache0, "out": out0, ...}, ...]``: they
    are used in place for the executor's life (keep them; do not resize them).
    """

    _tensors = "torch"

    def run(self, chunk, stream=None, program: int = 0, check: bool = False):
        """Replays the chunk's graph on ``stream`` (default: the current torch stream); a RunResult."""
        return _C.Executor.run(self, chunk, _raw_stream(self.device) if stream is None else stream, program, check)

    def run_eager(self, chunk, stream=None, program: int = 0, check: bool = False):
        """The same recording launched kernel by kernel on ``stream`` (default: the current torch stream)."""
        return _C.Executor.run_eager(self, chunk, _raw_stream(self.device) if stream is None else stream, program,
                                     check)

    def run_step(self, step, stream=None, program: int = 0, check: bool = False):
        """A whole step in one graph launch on ``stream`` (default: the current torch stream); a RunResult
        (see :meth:`spgraph.Executor.run_step`)."""
        return _C.Executor.run_step(self, step, _raw_stream(self.device) if stream is None else stream, program,
                                    check)

    def run_step_eager(self, step, stream=None, program: int = 0, check: bool = False):
        """The same step launched from a host loop on ``stream`` (default: the current torch stream)."""
        return _C.Executor.run_step_eager(self, step, _raw_stream(self.device) if stream is None else stream,
                                          program, check)

    def run_staged(self, stream=None, program: int = 0, check: bool = False):
        """The staged step (:meth:`spgraph.Executor.stage_step`) for ``program`` on ``stream`` (default:
        the current torch stream); a RunResult (see :meth:`spgraph.Executor.run_staged`)."""
        return _C.Executor.run_staged(self, _raw_stream(self.device) if stream is None else stream, program, check)

    def run_staged_eager(self, stream=None, program: int = 0, check: bool = False):
        """The staged step launched from a host loop on ``stream`` (default: the current torch stream)."""
        return _C.Executor.run_staged_eager(self, _raw_stream(self.device) if stream is None else stream, program,
                                            check)

"""spgraph's ops over any DLPack arrays (PyTorch, CuPy, JAX, ...): zero-copy, every buffer explicit.

These functions allocate nothing and never synchronize: every output (and any scratch) is the
caller's, and each call launches on the stream the caller names, which is required. They are the
layer under :mod:`spgraph.torch`, which adds allocation, the current torch stream and the
``torch.library`` registration. Semantics of every op: docs/pipeline.md; this layer's contract:
docs/python.md.

Arguments are checked before anything is launched; a bad one raises ``TypeError`` (a dtype) or
``ValueError`` (anything else), with a message naming the argument, its value and its bound. The
checks read only the arrays' descriptors, so they behave the same on any device.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

from . import _spgraph as _C

__all__ = [
    "sparse_mla_fwd",
    "sparse_mla_plan",
    "sparse_mla_workspace_bytes",
    "combine_topk_swa_indices",
    "quantize_and_insert_k_cache",
    "dequantize_and_gather_k_cache",
    "cache_block_stride",
    "combined_width",
    "fault_counts",
    "stream_handle",
]

Array = Any  # any object exporting DLPack (__dlpack__), or a DLPack capsule
Stream = Any  # an int handle, or an object with __cuda_stream__ / cuda_stream / ptr


def stream_handle(stream: Stream) -> int:
    """The ``cudaStream_t`` of ``stream`` as an int.

    Takes an int (a raw handle), an object implementing the CUDA stream protocol
    (``__cuda_stream__()``, returning ``(version, handle)``), or an object with a ``cuda_stream``
    attribute (``torch.cuda.Stream``) or a ``ptr`` attribute (``cupy.cuda.Stream``). ``0`` is the
    legacy default stream: spgraph launches there only when the caller passes it (as PyTorch's
    default stream is).

    Raises:
        TypeError: ``stream`` is None or none of the above.
    """
    if stream is None:
        raise TypeError(
            "stream is required: pass the stream to launch on (an int handle, a torch.cuda.Stream, "
            "an object with __cuda_stream__); spgraph.torch uses torch.cuda.current_stream()"
        )
    if isinstance(stream, bool):
        raise TypeError("stream must be a stream or an int handle, not a bool")
    if isinstance(stream, int):
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        return int(protocol()[1])
    for attr in ("cuda_stream", "ptr"):
        handle = getattr(stream, attr, None)
        if isinstance(handle, int):
            return handle
    raise TypeError(f"stream must be an int handle or a CUDA stream object, not {type(stream).__name__}")


def sparse_mla_fwd(
    q: Array,
    kv: Array,
    indices: Array,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: Optional[Array] = None,
    topk_length: Optional[Array] = None,
    *,
    out: Tuple[Array, Array, Array],
    stream: Stream,
    workspace: Union[Array, Callable[[int], Array], None] = None,
) -> Tuple[Array, Array, Array]:
    """Sparse MLA attention (prefill), FlashMLA's ``flash_mla_sparse_fwd`` semantics.

    Every head of query token i attends to the kv rows ``indices[i]`` names (one kv head, MQA).
    Index j of token i counts iff ``0 <= indices[i, j] < s_kv`` and ``j < topk_length[i]`` (when
    given); any other value is masked and never read. With ``P = sm_scale * q . kv`` over all d_qk
    dims: ``max_logits = max_j P``, ``lse = ln(sum_j exp(P))`` (natural log, sink not included),
    ``out = sum_j exp(P - L) kv[:, :512]`` with ``L = ln(exp(lse) + exp(attn_sink[h]))`` when a sink
    is given, else ``lse``. A row with no valid index gives out 0, max_logits -inf, lse +inf.

    Args:
        q: ``[s_q, h_q, d_qk]`` bfloat16, contiguous; h_q 64 or 128, d_qk 512 or 576.
        kv: ``[s_kv, 1, d_qk]`` (or ``[s_kv, d_qk]``) bfloat16; rows may be padded (row stride a
            multiple of 8 elements), the last dim contiguous.
        indices: ``[s_q, 1, topk]`` (or ``[s_q, topk]``) int32, contiguous; topk a multiple of 64.
        sm_scale: softmax scale, finite.
        d_v: value width; must be 512.
        attn_sink: optional ``[h_q]`` float32; may hold +-inf (+inf makes out 0, -inf no effect).
        topk_length: optional ``[s_q]`` int32: entries at or past it are masked.
        out: ``(out [s_q, h_q, 512] bfloat16, max_logits [s_q, h_q] float32,
            lse [s_q, h_q] float32)``, contiguous, written by the call.
        stream: the stream to launch on (see :func:`stream_handle`).
        workspace: scratch for the split top-k path, used where it is faster (small s_q): a uint8
            array of at least :func:`sparse_mla_workspace_bytes` bytes, 256-byte aligned, or a
            callable ``nbytes -> array`` called only when the call needs one. Without it the call
            runs the single pass, which needs none (same semantics).

    Returns:
        The ``out`` tuple. With s_q = 0 nothing is launched.

    Raises:
        TypeError: a dtype is wrong.
        ValueError: a shape, stride, device or bound is wrong (the message names it).
        spgraph.CudaError: the launch failed.
    """
    o, m, l = _three(out)
    _C.sparse_mla_fwd(q, kv, indices, float(sm_scale), int(d_v), attn_sink, topk_length, o, m, l, workspace,
                      stream_handle(stream))
    return o, m, l


def _three(out: Sequence[Array]) -> Tuple[Array, Array, Array]:
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise TypeError("out must be a tuple (out, max_logits, lse)")
    return out[0], out[1], out[2]


def sparse_mla_workspace_bytes(s_q: int, h_q: int, d_qk: int, topk: int, device: int = 0) -> int:
    """Bytes of scratch :func:`sparse_mla_fwd` uses for this shape on CUDA device ``device``.

    0 where the single pass is chosen. Queries the device (its SM count) once; needs a CUDA device.
    """
    return int(_C.sparse_mla_workspace_bytes(int(s_q), int(h_q), int(d_qk), int(topk), int(device)))


def sparse_mla_plan(s_q: int, h_q: int, d_qk: int, topk: int, device: int = 0) -> Dict[str, Any]:
    """The launch plan :func:`sparse_mla_fwd` takes for this shape on CUDA device ``device``, the
    executor's attention included (its s_q is the step's T bucket, its topk the layer's combined
    width).

    Returns ``{'kernel': 'wgmma' | 'wgmma-split' | 'wgmma-split-dv' | ..., 'split', 'num_splits',
    'blocks_per_split', 'dv_parts'}`` (``dv_parts`` 2: each (token, 64 heads) tile's value columns
    split over two CTAs).
    Each (token, 64 heads) tile's result depends on the plan alone, so two calls with equal plans
    give the same bits for the same heads, whatever h_q (64 or 128) each runs. Queries the device
    (its SM count); needs a CUDA device.

    Raises:
        ValueError: s_q < 1, h_q not 64 or 128, d_qk not 512 or 576, topk not a positive multiple of 64.
    """
    return dict(_C.sparse_mla_plan(int(s_q), int(h_q), int(d_qk), int(topk), int(device)))


def combine_topk_swa_indices(
    topk_indices: Array,
    query_start_loc: Array,
    seq_lens: Array,
    gather_lens: Array,
    window_size: int,
    compress_ratio: int,
    topk: int,
    M: Union[int, Array],
    N: Union[int, Array],
    *,
    out: Tuple[Array, Array],
    stream: Stream,
    status: Optional[Array] = None,
) -> Tuple[Array, Array]:
    """Stage 3: each token's top-k compressed rows and sliding window as one index row.

    vLLM's DeepSeek-V4 argument list. For token t of request b at position
    ``pos = seq_len_b - query_len_b + (t - query_start_b)``: ``topk_len = min((pos + 1) // r, topk)``
    (0 for r = 1), ``swa_len = min(pos + 1, W)``; ``combined[t, j] = topk_indices[t, j] + M * b`` for
    ``j < topk_len`` (-1 stays -1, and an entry outside ``0 .. seq_len_b // r - 1`` is written as -1),
    then the window ``M * b + N + (pos - swa_len + 1 - (seq_len_b - gather_len_b)) + j`` for
    ``j < swa_len``; ``combined_lens[t] = topk_len + swa_len``. Entries at or past
    ``combined_lens[t]`` are not written. ``query_start_loc`` is taken relative to its first entry
    (a slice of a larger batch's works); tokens past ``query_start_loc[-1] - query_start_loc[0]`` get
    length 0. Requests whose lengths do not fit (query_len > seq_len, gather_len out of range,
    seq_len // r > N, N + gather_len > M) get length 0 for their tokens; N > M gives 0 everywhere.

    Args:
        topk_indices: ``[num_tokens, K]`` (or ``[num_tokens, 1, K]``) int32, K >= topk, rows
            contiguous (the row stride may exceed K). Ignored for compress_ratio 1 (topk 0).
        query_start_loc: ``[num_reqs + 1]`` int32.
        seq_lens: ``[num_reqs]`` int32, 1 <= num_reqs <= 128.
        gather_lens: ``[num_reqs]`` int32, ``min(seq_len, query_len + W - 1) <= gather_len <= seq_len``.
        window_size: W.
        compress_ratio: r, 1, 4 or 128.
        topk: indexer width used (0 when r = 1).
        M: kv workspace rows per request: an int, or a one-element int32 device tensor (read by
            the kernel: nothing is read on the host, and a captured call sees new values).
        N: rows of the compressed part (``max_b seq_len_b // r``), an int or device tensor as M.
        out: ``(combined_indices [num_tokens, width] int32, combined_lens [num_tokens] int32)``;
            width >= topk + W and a multiple of 4 (:func:`combined_width` gives vLLM's).
        stream: the stream to launch on.
        status: optional ``[10]`` int32 device array that accumulates the fault counts
            (docs/pipeline.md, "Bad input"; see :func:`fault_counts`); zero it yourself.

    Returns:
        The ``out`` tuple.
    """
    combined, lens = _two(out)
    _C.combine_topk_swa_indices(topk_indices, query_start_loc, seq_lens, gather_lens, int(window_size),
                                int(compress_ratio), int(topk), M, N, combined, lens, status,
                                stream_handle(stream))
    return combined, lens


def _two(out: Sequence[Array]) -> Tuple[Array, Array]:
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError("out must be a tuple (combined_indices, combined_lens)")
    return out[0], out[1]


def quantize_and_insert_k_cache(
    k: Array,
    k_cache: Array,
    slot_mapping: Array,
    block_size: int,
    *,
    stream: Stream,
    status: Optional[Array] = None,
) -> None:
    """Stage 0: quantize K rows into a paged FP8 cache in the V4 layout (in place).

    Row i goes to slot ``slot_mapping[i]`` (``block * block_size + offset``); slot -1 is skipped,
    a slot outside the cache is skipped (and counted in ``status``). Per 64-value tile of the 448
    NoPE values: ``e = ceil(log2(max(amax, 1e-4) / 448))``, byte ``e + 127``, values
    ``e4m3(x / 2^e)``; the 64 RoPE values are stored as bf16 (docs/pipeline.md, "FP8 paged KV cache").

    Args:
        k: ``[num_tokens, 512]`` bfloat16, contiguous.
        k_cache: uint8, ``[num_blocks, ...]`` with blocks ``cache_block_stride(block_size)`` bytes
            apart and each block's bytes contiguous, or flat bytes.
        slot_mapping: ``[num_tokens]`` int32.
        block_size: rows per cache block.
        stream: the stream to launch on.
        status: optional ``[10]`` int32 device array accumulating fault counts.
    """
    _C.quantize_and_insert_k_cache(k, k_cache, slot_mapping, int(block_size), status, stream_handle(stream))


def dequantize_and_gather_k_cache(
    out: Array,
    k_cache: Array,
    seq_lens: Array,
    gather_lens: Optional[Array],
    block_table: Array,
    block_size: int,
    offset: int,
    *,
    stream: Stream,
    status: Optional[Array] = None,
) -> None:
    """Stages 1-2: dequantize each request's trailing cache rows into ``out`` (vLLM's argument list).

    Request b's positions ``seq_len_b - gather_len_b .. seq_len_b - 1`` (all ``seq_len_b`` when
    ``gather_lens`` is None), read through ``block_table[b]``, land in
    ``out[b, offset : offset + gather_len_b]`` as bf16 (``e4m3 * 2^(byte - 127)`` rounded once; RoPE
    copied). Other rows of ``out`` are not touched. A block id outside the cache writes a zero row;
    a request whose rows do not fit its block table or ``out`` is skipped (both counted in
    ``status``). For the compressed cache pass the compressed rows' counts as ``seq_lens`` and
    ``gather_lens=None``.

    Args:
        out: ``[R, M, 512]`` bfloat16, contiguous, R >= num_reqs.
        k_cache: the cache (as in :func:`quantize_and_insert_k_cache`).
        seq_lens: ``[num_reqs]`` int32, num_reqs <= 128.
        gather_lens: ``[num_reqs]`` int32 or None.
        block_table: ``[num_reqs, max_blocks]`` int32, contiguous.
        block_size: rows per cache block.
        offset: first row of ``out[b]`` written, in ``[0, M]``.
        stream: the stream to launch on.
        status: optional ``[10]`` int32 device array accumulating fault counts.
    """
    _C.dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table, int(block_size),
                                     int(offset), status, stream_handle(stream))


def cache_block_stride(block_size: int) -> int:
    """Bytes of one V4 cache block of ``block_size`` rows: ``round_up(block_size * 584, 576)``."""
    return int(_C.cache_block_stride(int(block_size)))


def combined_width(topk: int, window_size: int) -> int:
    """Width of a combined index row as vLLM allocates it: ``round_up(topk + window_size, 128)``."""
    return int(_C.combined_width(int(topk), int(window_size)))


def fault_counts(status: Sequence[int]) -> dict:
    """Fault counts by kind from a status block's 10 int32 words (copied to the host by the caller).

    Returns ``{"scalars": n, "seq_len": n, "block_id": n, "slot": n, "topk_index": n,
    "first": (kind, request, position, value) or None}`` (docs/pipeline.md, "Bad input").
    """
    words = [int(w) & 0xFFFFFFFF for w in list(status)]
    if len(words) != _C.STATUS_WORDS:
        raise ValueError(f"status holds {len(words)} words; a status block has {_C.STATUS_WORDS}")
    counts = {name: words[i] for i, name in enumerate(_C.FAULT_KINDS)}

    def signed(w: int) -> int:
        return w - (1 << 32) if w >= 1 << 31 else w

    k = len(_C.FAULT_KINDS)
    counts["first"] = None
    if words[k] != 0:
        kind = signed(words[k + 1])
        name = _C.FAULT_KINDS[kind] if 0 <= kind < k else str(kind)
        counts["first"] = (name, signed(words[k + 2]), signed(words[k + 3]), signed(words[k + 4]))
    return counts

"""Type stubs of the extension module spgraph._spgraph (nanobind, DLPack arrays, zero-copy).

Every array argument is any object exporting DLPack (``__dlpack__``) or a DLPack capsule; the
functions take every output explicitly and the stream as an int ``cudaStream_t`` handle. Use the
documented wrappers in :mod:`spgraph` (all buffers explicit) and :mod:`spgraph.torch` (drop-in).
"""

from typing import Any, Callable, Optional, Tuple, Union

Array = Any

STATUS_WORDS: int
"""int32 words of a StepStatus block (5 fault counts, a recorded flag, the first fault's record)."""
COMBINED_ALIGNMENT: int
"""Combined index rows are padded to a multiple of this many entries (128)."""
KV_ROW_BYTES: int
"""Bytes of a cache data row: 448 e4m3 NoPE values, then 64 bf16 RoPE values (576)."""
KV_SCALE_BYTES: int
"""Bytes of a cache scale row: 7 UE8M0 tile exponents and a zero pad byte (8)."""
KV_DIM: int
"""Values of a K row and of a gathered kv row (512)."""
MAX_REQUESTS: int
"""Most requests one combine or gather call takes (128)."""
FAULT_KINDS: Tuple[str, ...]
"""Names of the fault counters of a status block, in order."""

class CudaError(RuntimeError):
    """A CUDA call made by spgraph failed; the message names the call and the CUDA error."""

def sparse_mla_fwd(
    q: Array,
    kv: Array,
    indices: Array,
    sm_scale: float,
    d_v: int,
    attn_sink: Optional[Array],
    topk_length: Optional[Array],
    out: Array,
    max_logits: Array,
    lse: Array,
    workspace: Union[Array, Callable[[int], Array], None],
    stream: int,
) -> None:
    """Sparse MLA attention into caller-given out/max_logits/lse on `stream` (see spgraph.sparse_mla_fwd)."""

def sparse_mla_workspace_bytes(s_q: int, h_q: int, d_qk: int, topk: int, device: int) -> int:
    """Bytes of scratch the split top-k path needs for this shape on `device` (0: none)."""

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
    combined_indices: Array,
    combined_lens: Array,
    status: Optional[Array],
    stream: int,
) -> None:
    """Stage 3 (top-k + window index rows) into caller-given arrays (see spgraph.combine_topk_swa_indices)."""

def quantize_and_insert_k_cache(
    k: Array, k_cache: Array, slot_mapping: Array, block_size: int, status: Optional[Array], stream: int
) -> None:
    """Stage 0: quantize K rows into a V4 FP8 cache (see spgraph.quantize_and_insert_k_cache)."""

def dequantize_and_gather_k_cache(
    out: Array,
    k_cache: Array,
    seq_lens: Array,
    gather_lens: Optional[Array],
    block_table: Array,
    block_size: int,
    offset: int,
    status: Optional[Array],
    stream: int,
) -> None:
    """Stages 1-2: dequantize cache rows into out (see spgraph.dequantize_and_gather_k_cache)."""

def cache_block_stride(block_size: int) -> int:
    """Bytes of one V4 cache block of `block_size` rows: round_up(block_size * 584, 576)."""

def combined_width(topk: int, window_size: int) -> int:
    """Width of a combined index row: round_up(topk + window_size, 128)."""

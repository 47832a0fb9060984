"""spgraph from Python: the sparse-attention prefill ops of DeepSeek-V4-style models.

Two layers (docs/python.md):

* ``spgraph`` (this module): the ops over any DLPack arrays (PyTorch, CuPy, JAX), zero-copy, with
  every output and the stream given by the caller; nothing allocates, nothing synchronizes.
* ``spgraph.torch`` (``import spgraph.torch``): the drop-in signatures engines already call
  (FlashMLA's ``flash_mla_sparse_fwd``, vLLM's DeepSeek-V4 ops), registered as ``torch.library``
  custom ops (``torch.ops.spgraph.*``) on the current torch stream, with ``out=`` variants that
  allocate nothing, fake implementations for ``torch.compile`` and capture by ``torch.cuda.graph``.

The executor (whole-step CUDA graphs over engine-owned buffers) is not bound yet.
"""

from ._spgraph import (  # noqa: F401
    COMBINED_ALIGNMENT,
    FAULT_KINDS,
    KV_DIM,
    KV_ROW_BYTES,
    KV_SCALE_BYTES,
    MAX_REQUESTS,
    STATUS_WORDS,
    CudaError,
)
from .ops import (  # noqa: F401
    cache_block_stride,
    combine_topk_swa_indices,
    combined_width,
    dequantize_and_gather_k_cache,
    fault_counts,
    quantize_and_insert_k_cache,
    sparse_mla_fwd,
    sparse_mla_workspace_bytes,
    stream_handle,
)

__version__ = "0.1.0"

__all__ = [
    "CudaError",
    "COMBINED_ALIGNMENT",
    "FAULT_KINDS",
    "KV_DIM",
    "KV_ROW_BYTES",
    "KV_SCALE_BYTES",
    "MAX_REQUESTS",
    "STATUS_WORDS",
    "cache_block_stride",
    "combine_topk_swa_indices",
    "combined_width",
    "dequantize_and_gather_k_cache",
    "fault_counts",
    "quantize_and_insert_k_cache",
    "sparse_mla_fwd",
    "sparse_mla_workspace_bytes",
    "stream_handle",
]

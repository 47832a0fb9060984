"""spgraph from Python: the sparse-attention prefill ops of DeepSeek-V4-style models.

Two layers (docs/python.md):

* ``spgraph`` (this module): the ops over any DLPack arrays (PyTorch, CuPy, JAX), zero-copy, with
  every output and the stream given by the caller; nothing allocates, nothing synchronizes.
* ``spgraph.torch`` (``import spgraph.torch``): the drop-in signatures engines already call
  (FlashMLA's ``flash_mla_sparse_fwd``, vLLM's DeepSeek-V4 ops), registered as ``torch.library``
  custom ops (``torch.ops.spgraph.*``) on the current torch stream, with ``out=`` variants that
  allocate nothing, fake implementations for ``torch.compile`` and capture by ``torch.cuda.graph``.

The executor (``spgraph.Executor``: whole-step CUDA graphs over engine-owned buffers), its
configs (:class:`PipelineConfig`), the planner without a GPU (:func:`plan`), serve_loop's scheduler
and synthetic workload (:class:`PrefillScheduler`, :func:`make_workload`), the synthetic model
front and checksum (``spgraph.synthetic``) and the CUPTI allocation counter
(:func:`allocation_counter`) live here too; ``spgraph.torch.Executor`` is the torch flavour.
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
from .config import CacheConfig, LayerConfig, PipelineConfig, SchedulerConfig, WorkloadConfig  # noqa: F401
from .executor import (  # noqa: F401
    BUFFER_NAMES,
    Chunk,
    Executor,
    LayerBuffers,
    PoolPlan,
    RunError,
    RunResult,
    StepWorkspace,
    check_buffers,
    check_chunk,
    check_step,
    plan,
    plan_executor,
)
from .scheduler import ChunkPlan, PrefillScheduler, Request, StepPlan, make_workload  # noqa: F401
from .ops import (  # noqa: F401
    cache_block_stride,
    combine_topk_swa_indices,
    combined_width,
    dequantize_and_gather_k_cache,
    fault_counts,
    quantize_and_insert_k_cache,
    sparse_mla_fwd,
    sparse_mla_plan,
    sparse_mla_workspace_bytes,
    stream_handle,
)

__version__ = "0.1.0"


class AllocationCounter:
    """The process's CUDA allocation counter (CUPTI; memory::AllocationCounter).

    Counts every CUDA allocation and free call of the process (runtime and driver: cudaMalloc*,
    cudaFree*, cuMemAlloc*, cuMemCreate, ..., torch's allocator's included). A runtime call counts
    once for the runtime and again for the driver call beneath it; any non-zero count after
    warm-up is a failure of spgraph's promise. While attached, every cudaGraphLaunch leaves the
    driver's fast path (about 0.2 us a node): detach before timing host work.
    """

    def __init__(self) -> None:
        from . import _cupti  # loads CUPTI: only a process that counts pays for its subscriber

        _cupti.subscribe()
        self._c = _cupti

    def count(self) -> int:
        """Allocation and free calls counted since the last :meth:`reset`."""
        return int(self._c.count())

    def reset(self) -> None:
        """Zeroes the count."""
        self._c.reset()

    def names(self) -> list:
        """The API functions counted since the last reset (first 16 distinct)."""
        return list(self._c.names())

    @property
    def attached(self) -> bool:
        """Whether CUPTI is subscribed (counting)."""
        return bool(self._c.attached())

    @property
    def watched_callbacks(self) -> int:
        """How many CUDA API callbacks the counter watches."""
        return int(self._c.watched_callbacks())

    def detach(self) -> None:
        """Unsubscribes CUPTI (graph launches return to their fast path); counts made while
        detached are lost, :meth:`count` keeps its value."""
        self._c.detach()

    def attach(self) -> None:
        """Subscribes CUPTI again."""
        self._c.attach()


_counter = None


def allocation_counter() -> AllocationCounter:
    """The process-wide :class:`AllocationCounter` (subscribes CUPTI on first use).

    Raises:
        RuntimeError: CUPTI cannot subscribe (another tool, e.g. a profiler, holds it).
        ImportError: the counter module was not built or CUPTI cannot be loaded.
    """
    global _counter
    if _counter is None:
        _counter = AllocationCounter()
    return _counter


__all__ = [
    "AllocationCounter",
    "BUFFER_NAMES",
    "CacheConfig",
    "Chunk",
    "ChunkPlan",
    "Executor",
    "LayerBuffers",
    "LayerConfig",
    "PipelineConfig",
    "PoolPlan",
    "PrefillScheduler",
    "Request",
    "RunError",
    "RunResult",
    "SchedulerConfig",
    "StepPlan",
    "StepWorkspace",
    "WorkloadConfig",
    "allocation_counter",
    "check_buffers",
    "check_chunk",
    "check_step",
    "make_workload",
    "plan",
    "plan_executor",
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
    "sparse_mla_plan",
    "sparse_mla_workspace_bytes",
    "stream_handle",
]

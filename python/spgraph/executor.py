"""The executor from Python: whole-step CUDA graphs over an engine's own tensors.

``spgraph.Executor(config, buffers=..., **options)`` is the C++ ``graphs::Executor``: it plans a
pool for what the caller did not bind, captures one graph per (program, chunk shape, staging
block) at :meth:`Executor.warmup`, and replays the chunk's graph on :meth:`Executor.run` -- one
graph launch per chunk, no allocation, no host sync. With the step options (``max_step_requests``,
``max_step_tokens``) :meth:`Executor.run_step` runs every request of a step in one launch of the
step graph, each chunk on its own rows of the step-sized buffers. Engine-owned buffers (DLPack arrays: torch
tensors, CuPy, JAX) are bound in place; every buffer, bound or pooled, comes back as a zero-copy
view (:meth:`Executor.layer`, :meth:`Executor.workspace`) that keeps the executor alive.

This module is the framework-neutral layer: views are DLPack arrays, ``run(stream=None)`` uses the
executor's own stream. ``spgraph.torch.Executor`` returns torch tensors and runs on
``torch.cuda.current_stream()``. Contract: docs/python.md, "The executor"; the bindings:
docs/memory.md, "Engine-owned buffers"; streams: docs/graphs.md, "The caller's stream".
"""

from __future__ import annotations

from typing import Any, Collection, Dict, List, NamedTuple, Optional, Sequence, Union

from . import _spgraph as _C
from .config import PipelineConfig

__all__ = [
    "Executor",
    "Chunk",
    "LayerBuffers",
    "StepWorkspace",
    "PoolPlan",
    "RunResult",
    "RunError",
    "plan",
    "check_buffers",
    "check_chunk",
    "check_step",
    "plan_executor",
    "BUFFER_NAMES",
]

RunResult = _C.RunResult
RunError = _C.RunError

#: The buffers of a layer, as ``buffers=`` entries and :class:`LayerBuffers` name them.
BUFFER_NAMES = ("q", "topk_indices", "k_rows", "compressed_k_rows", "swa_cache", "compressed_cache", "attn_sink",
                "out", "lse", "max_logits")


class LayerBuffers(NamedTuple):
    """Every buffer of one layer (None where the layer has none). As a binding (an entry of
    ``buffers=``) each given array is the engine's, used in place; as returned by
    :meth:`Executor.layer` each is a view of the buffer the executor uses, bound or pooled.

    Shapes (T = max_tokens, R = max_requests; rows may exceed T, only the first T_bucket are used
    per step): q ``[T, h_q, d_qk]`` bf16 (token stride a multiple of 8 elements, heads
    contiguous); topk_indices ``[T, top_k]`` int32 (r > 1); k_rows ``[T, 512]`` bf16 and
    compressed_k_rows ``[T // r + R, 512]`` bf16 (insert stage); swa_cache and compressed_cache
    uint8 ``[num_blocks, block_stride]`` in the V4 layout (block_stride a multiple of 576);
    attn_sink ``[h_q]`` f32; out ``[T, h_q, 512]`` bf16; lse and max_logits ``[T, h_q]`` f32.
    """

    q: Any = None
    topk_indices: Any = None
    k_rows: Any = None
    compressed_k_rows: Any = None
    swa_cache: Any = None
    compressed_cache: Any = None
    attn_sink: Any = None
    out: Any = None
    lse: Any = None
    max_logits: Any = None


class StepWorkspace(NamedTuple):
    """The workspaces the layers of a step share: kv ``[R, M_max, 512]`` bf16 (the gathered rows,
    request b at row b * M), combined_indices ``[T, width]`` int32, combined_lens ``[T]`` int32."""

    kv: Any
    combined_indices: Any
    combined_lens: Any


class PoolPlan(NamedTuple):
    """A pool plan: its slots (dicts with name, kind, shape, bytes, offset, alignment), the device
    and pinned bytes, and the table serve_loop --plan prints (``str(plan)``)."""

    slots: List[Dict[str, Any]]
    device_bytes: int
    pinned_bytes: int
    table: str

    def __str__(self) -> str:
        return self.table


class Chunk:
    """One chunk of up to max_requests requests, as the host hands it to :meth:`Executor.run`.

    Any object with these attributes (or a dict with these keys) works the same; a scheduler's
    ``ChunkPlan`` is taken as it is.

    Args:
        query_lens: tokens this chunk prefills per request (a list of ints or a 1-D int32/int64
            host array). Alternatively give ``query_start_loc`` (``[requests + 1]``) as an
            attribute or key instead.
        seq_lens: tokens so far per request, this chunk's included.
        swa_block_table: each request's SWA cache blocks in logical order: a 2-D host array
            ``[>= requests, width]`` or a list of per-request lists/arrays, at least
            ``ceil(seq_len / swa_block_size)`` entries a request.
        compressed_block_tables: ``{ratio: table}`` for each compression ratio (4, 128) the
            program uses, at least ``ceil((seq_len // r) / (block_tokens // r))`` entries a request.
        swa_slots: insert stage only, optional: the SWA cache slot of each new token (-1 skips).
            Without slot lists the device derives every slot from the block tables.
        compressed_slots: ``{ratio: slots}``, the slot of each compressed row the chunk completes
            (given exactly when swa_slots is).

    int32 arrays with contiguous rows are read in place; lists and int64 arrays are converted,
    only the entries the step reads (the window's SWA blocks, the compressed blocks of a
    request's rows). Values are checked by the executor: a chunk it refuses comes back as a
    RunResult with status ``'bad_chunk'`` (or ``'no_bucket'``), naming the request and field.
    """

    __slots__ = ("query_lens", "seq_lens", "swa_block_table", "compressed_block_tables", "swa_slots",
                 "compressed_slots")

    def __init__(self, query_lens: Any, seq_lens: Any, swa_block_table: Any = None,
                 compressed_block_tables: Optional[Dict[int, Any]] = None, *, swa_slots: Any = None,
                 compressed_slots: Optional[Dict[int, Any]] = None) -> None:
        self.query_lens = query_lens
        self.seq_lens = seq_lens
        self.swa_block_table = swa_block_table
        self.compressed_block_tables = compressed_block_tables
        self.swa_slots = swa_slots
        self.compressed_slots = compressed_slots

    def __repr__(self) -> str:
        return f"Chunk(query_lens={self.query_lens!r}, seq_lens={self.seq_lens!r})"


class Executor(_C.Executor):
    """Whole-step CUDA graphs over engine-owned buffers (the C++ ``graphs::Executor``).

    Args:
        config: a :class:`spgraph.PipelineConfig` (or any object with its attributes).
        buffers: None (everything pooled), or one entry per layer: None, a dict
            ``{name: array}`` or an object naming buffers as attributes (a :class:`LayerBuffers`,
            another executor's ``layer(l)``). Arrays are DLPack (torch tensors, ...) in CUDA
            device memory, zero-copy: the executor holds them and captures their addresses, so
            they must not be resized or moved. Token strides come from the arrays' strides; a
            cache is uint8 ``[num_blocks, block_stride]`` (or flat ``[num_blocks * block_stride]``
            at the smallest stride ``cache_block_stride(block_size)``). Buffers left out are
            planned in the pool.
        **options: ``r_buckets``, ``t_buckets`` (the bucket lists; default: powers of two and
            1.5x steps), ``programs`` (layer lists; default one program of every layer),
            ``insert`` (record the insert stage, default True), ``capture`` (default True;
            False: eager only), ``time_host_phases`` (fill RunResult's staging/launch/record
            microseconds), ``device`` (default: the bound buffers', else the current device),
            ``max_step_requests`` and ``max_step_tokens`` (the largest step :meth:`run_step`
            takes, in [1, 4096] and [1, 2**20]; both 0, the default: no steps). With steps the
            row-indexed buffers hold max(T, S) rows (S = max_step_tokens; compressed_k_rows
            max(T // r + R, S // r + Q)), bound ones included: a smaller binding is refused;
            ``flat_step_chunks`` (0, the default, or in [2, max_step_chunks]: steps of that many
            chunks or fewer whose chunks are all full launch one plain graph, no conditional node;
            a staged step of one chunk the plain graph of its bucket); ``flat_step_pad``
            (default False; True, with ``flat_step_chunks``: every step of 2 .. N chunks launches
            its plain graph, full or not, each chunk on the largest bucket: the values an executor
            of that one bucket computes, its padding paid on the GPU).

    Raises:
        TypeError, ValueError: a bad config, option or binding, with the C++ message naming the
            field, or the layer and buffer (``buffers[1].out: extents [63, 128, 512], ... has 63
            rows; it needs at least 64``). Every check that needs no device runs first, so these
            refusals come before any CUDA call.
        MemoryError: the pool does not fit the device.
        spgraph.CudaError: a CUDA call failed (no device, or a buffer that is not device memory).

    An executor is not thread-safe: one thread at a time (a second gets RuntimeError). Methods:
    :meth:`warmup`, ``run(chunk, stream=None, program=0, check=False)``, ``run_eager(...)``,
    :meth:`run_step`, :meth:`run_step_eager`, :meth:`stage_step`, :meth:`run_staged`,
    :meth:`run_staged_eager`, ``synchronize()``, ``read_status()``,
    :meth:`layer`, :meth:`workspace`, :meth:`pool`. ``run``, ``run_eager``, ``run_step`` and
    ``run_step_eager`` return a :class:`RunResult` and raise only on misuse (a chunk or step that
    cannot be read: TypeError/ValueError), never for a refused step unless ``check=True``
    (``spgraph.RunError``).
    """

    #: What the views are returned as: "dlpack" arrays here, torch tensors in spgraph.torch.
    _tensors = "dlpack"

    def __init__(self, config: PipelineConfig, buffers: Optional[Sequence[Any]] = None, **options: Any) -> None:
        super().__init__(config, buffers, options)

    def warmup(self) -> Dict[str, Any]:
        """Runs every bucket of every program once eagerly, captures them all and seals the pool.

        Returns:
            The report: ``graphs``, ``buckets``, ``programs``, ``eager_ms``, ``capture_ms``,
            ``graph_device_bytes``, ``pool_device_bytes``, ``pool_pinned_bytes``,
            ``pool_allocation_calls``, ``kernel_launches_per_step``.
        """
        return super().warmup()

    def run_step(self, step: Any, stream: Any = None, program: int = 0, check: bool = False) -> RunResult:
        """Every request of a step in one graph launch (docs/graphs.md, "Steps").

        Args:
            step: the step's requests in the forms :meth:`run` takes a chunk's (a
                :class:`Chunk`, a dict, any object with ``query_lens``/``query_start_loc``,
                ``seq_lens``, ``swa_block_table``, ``compressed_block_tables``; lists, NumPy or
                CPU-tensor arrays), or a scheduler :class:`StepPlan` (its chunks' pieces merged
                back into requests). Up to max_step_requests requests and max_step_tokens
                tokens; no slot lists (the device derives the insert slots).
            stream: None (the executor's stream), an int handle or a stream object.
            program: the layer program.
            check: raise :class:`RunError` for a refused step instead of returning it.

        The executor splits the step into chunks of at most R requests and T tokens (the
        scheduler's rule); chunk c reads its q, top-k and K rows and writes out/lse/max_logits
        at rows [offset_c, offset_c + its tokens) of the step-sized buffers, offset_c the tokens
        of the chunks before it. Refusals (nothing written): ``no_bucket`` with bad_field
        ``step.requests`` / ``step.tokens`` for a step over the maxima; ``bad_chunk`` naming the
        step's request (``bad_request``), the chunk (``bad_chunk``) and the field.

        Returns:
            A :class:`RunResult`; ``chunks`` is the number of chunks the step ran.
        """
        return _C.Executor.run_step(self, step, stream, program, check)

    def run_step_eager(self, step: Any, stream: Any = None, program: int = 0, check: bool = False) -> RunResult:
        """:meth:`run_step` launched from a host loop (per chunk its kernels), for comparison;
        works with ``capture=False`` too."""
        return _C.Executor.run_step_eager(self, step, stream, program, check)

    def stage_step(self, step: Any, check: bool = False) -> RunResult:
        """Stages a step once for every program, launching nothing (docs/graphs.md, "Staged steps").

        The split, the checks and the staging of :meth:`run_step`, with every program's
        compression ratios (so a step one program could run may be refused: ``bad_chunk``
        naming ``compressed_blocks``). Then :meth:`run_staged` launches it for each layer
        program, an engine's per-layer call, with no host work but the launch. A refused step
        writes nothing and a step staged before stays staged.

        Args:
            step: as :meth:`run_step` takes it.
            check: raise :class:`RunError` for a refused step instead of returning it.

        Returns:
            A :class:`RunResult`; ``chunks`` is the number of chunks the step splits into.
        """
        return _C.Executor.stage_step(self, step, check)

    def run_staged(self, stream: Any = None, program: int = 0, check: bool = False) -> RunResult:
        """Launches the staged step for ``program``: the same kernels and rows as
        :meth:`run_step` of that step. The first launch after :meth:`stage_step` copies the
        step to the device; every later one runs what is already there (``staged_reruns``
        counts them). ``not_staged`` when no step is staged: :meth:`stage_step` has accepted
        none, or an accepted :meth:`run_step` / :meth:`run_step_eager` has since replaced it.

        Args:
            stream: None (the executor's stream), an int handle or a stream object.
            program: the layer program.
            check: raise :class:`RunError` for a refusal instead of returning it.
        """
        return _C.Executor.run_staged(self, stream, program, check)

    def run_staged_eager(self, stream: Any = None, program: int = 0, check: bool = False) -> RunResult:
        """:meth:`run_staged` launched from a host loop; works with ``capture=False`` too."""
        return _C.Executor.run_staged_eager(self, stream, program, check)

    def layer(self, layer: int) -> LayerBuffers:
        """Every buffer of layer ``layer``, bound or pooled, as zero-copy views (None where the
        layer has none). Each view keeps the executor alive."""
        return LayerBuffers(**self.layer_views(layer, self._tensors))

    def workspace(self) -> StepWorkspace:
        """The step workspaces (kv, combined_indices, combined_lens) as zero-copy views."""
        return StepWorkspace(**self.workspace_views(self._tensors))

    @property
    def config(self) -> PipelineConfig:
        """A copy of the executor's config."""
        return PipelineConfig._from_dict(self.config_dict())

    def pool(self) -> PoolPlan:
        """The pool's plan: what the executor holds beyond the bound buffers."""
        return PoolPlan(**self.pool_plan())

    def bucket_shape(self, bucket: int) -> tuple:
        """(R_bucket, T_bucket) of bucket index ``bucket``."""
        return self.buckets[bucket]


def plan(config: PipelineConfig, engine_buffers: Union[bool, Collection[str]] = False, *,
         buffers: Optional[Sequence[Any]] = None, insert: bool = True, max_step_requests: int = 0,
         max_step_tokens: int = 0) -> PoolPlan:
    """The pool an executor would plan, without a GPU (``serve_loop --plan``).

    Args:
        config: the config (validated).
        engine_buffers: True: every buffer of every layer is the engine's (the pool holds only
            spgraph's own slots); a collection of names (e.g. ``{"swa_cache",
            "compressed_cache"}``): those bound in every layer; False: everything pooled.
        buffers: the bindings themselves (as Executor takes them), instead of engine_buffers.
        insert: whether the executor records the insert stage (K rows planned).
        max_step_requests, max_step_tokens: the executor's step options (``serve_loop --plan
            --one-launch``): the layer buffers at a step's rows and the step slots. For
            ``buffers`` with step options use :func:`plan_executor`.
    """
    if buffers is not None:
        if max_step_requests or max_step_tokens:
            raise ValueError("plan(buffers=...) plans no steps; use plan_executor(config, buffers, max_step_requests=..., "
                             "max_step_tokens=...)")
        config.validate()
        return PoolPlan(**_C.plan_bound(config, buffers, bool(insert)))
    return PoolPlan(**_C.plan_pool(config, engine_buffers, bool(insert), int(max_step_requests),
                                   int(max_step_tokens)))


def check_buffers(config: PipelineConfig, buffers: Sequence[Any], programs: Optional[Sequence[Sequence[int]]] = None,
                  insert: bool = True) -> None:
    """The binding checks an Executor makes that need no device (dtype, rank, extents, strides,
    alignment, use, overlap): raises ``TypeError``/``ValueError`` naming the layer and buffer."""
    _C.check_buffers(config, buffers, [list(p) for p in programs] if programs else [], bool(insert))


def check_chunk(config: PipelineConfig, chunk: Any, layers: Optional[Sequence[int]] = None,
                insert: bool = True) -> Dict[str, Any]:
    """What the executor's encoder says of a chunk, without a GPU.

    Returns:
        ``{'status', 'requests', 'tokens', 'new_compressed_rows': (r4, r128), 'derive_slots',
        'bad_request', 'bad_field'}``; status is 'ok', 'no_bucket' or 'bad_chunk'.
    """
    return _C.check_chunk(config, chunk, None if layers is None else list(layers), bool(insert))


def check_step(config: PipelineConfig, step: Any, program: int = 0, **options: Any) -> RunResult:
    """What :meth:`Executor.run_step` would refuse, without a GPU: the executor's host checks of
    ``options`` (as ``Executor(config, **options)`` takes them), then its split of ``step`` and
    each chunk's checks, in its order.

    Returns:
        A :class:`RunResult`: ``'ok'`` with ``chunks``, or the refusal (``no_bucket`` naming
        ``step.requests`` / ``step.tokens``, ``bad_chunk`` naming the request, chunk and field;
        ``not_warmed_up`` without step options). ``message`` is the text ``check=True`` raises.

    Raises:
        TypeError, ValueError: options the executor refuses, or a step that cannot be read.
    """
    return _C.check_step(config, step, options, int(program))


def plan_executor(config: PipelineConfig, buffers: Optional[Sequence[Any]] = None, **options: Any) -> Dict[str, Any]:
    """The executor's host-side plan for ``Executor(config, buffers, **options)``, without a GPU:
    ``{'buckets': [(R, T), ...], 'programs', 'insert', 'capture', 'time_host_phases', 'step':
    {'max_step_requests', 'max_step_tokens', 'max_chunks', 'staging_bytes'}, 'pool': {...}}``.

    Raises:
        TypeError, ValueError: what the Executor's constructor raises before its first CUDA call
            (a bad option, a binding too small for the step options, ...).
    """
    return _C.plan_executor(config, buffers, options)

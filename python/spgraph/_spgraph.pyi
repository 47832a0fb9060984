"""Type stubs of the extension module spgraph._spgraph (nanobind, DLPack arrays, zero-copy).

Every array argument is any object exporting DLPack (``__dlpack__``) or a DLPack capsule; the
functions take every output explicitly and the stream as an int ``cudaStream_t`` handle. Use the
documented wrappers in :mod:`spgraph` (all buffers explicit, the executor, the configs, the
scheduler) and :mod:`spgraph.torch` (drop-in ops, the torch executor).
"""

from typing import Any, Callable, Dict, List, Optional, Tuple, Union

Array = Any
"""An array argument: any object exporting DLPack (``__dlpack__``) or a DLPack capsule."""

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

def sparse_mla_plan(s_q: int, h_q: int, d_qk: int, topk: int, device: int) -> Dict[str, Any]:
    """The launch plan sparse_mla_fwd (and the executor's attention) takes for this shape on `device`."""

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

# ---------------------------------------------------------------------------------- configs and planner
# A config argument is a spgraph.PipelineConfig (or any object with its attributes); see spgraph.config.

def config_defaults() -> Dict[str, Dict[str, Any]]:
    """The C++ defaults of every config field: {'layer', 'cache', 'pipeline', 'scheduler', 'workload'}."""

def v4_default_config() -> Dict[str, Any]:
    """PipelineConfig::v4_default() as the keyword arguments of spgraph.PipelineConfig."""

def single_layer_config(layer: Any, max_requests: int, max_tokens: int, max_model_len: int) -> Dict[str, Any]:
    """PipelineConfig::single_layer(...) as the keyword arguments of spgraph.PipelineConfig."""

def validate_config(config: Any) -> None:
    """PipelineConfig::validate(): raises ValueError naming the first field out of bounds."""

def config_derived(config: Any) -> Dict[str, Any]:
    """Values derived from a config: window, block-table widths, M_max, combined widths, labels."""

def plan_pool(config: Any, engine_buffers: Any, insert: bool, max_step_requests: int = 0, max_step_tokens: int = 0) -> Dict[str, Any]:
    """The pool plan_pipeline_pool lays out (no GPU needed), with the step options the step-sized buffers and the step slots: {'slots', 'device_bytes', 'pinned_bytes', 'table'}."""

def bucket_set(config: Any, r_buckets: List[int], t_buckets: List[int]) -> Dict[str, Any]:
    """The chunk-shape buckets an executor captures for: {'r_buckets', 't_buckets', 'describe'}."""

def check_buffers(config: Any, buffers: Any, programs: List[List[int]], insert: bool) -> None:
    """The binding checks that need no device (check_binding_shapes): raises ValueError naming the layer and buffer."""

def plan_bound(config: Any, buffers: Any, insert: bool) -> Dict[str, Any]:
    """The pool planned around these bindings (no GPU needed)."""

def check_step(config: Any, step: Any, options: Optional[Any], program: int) -> RunResult:
    """What Executor.run_step would refuse, without a GPU: a RunResult ('ok' with `chunks`, or the refusal)."""

def plan_executor(config: Any, buffers: Optional[Any], options: Optional[Any]) -> Dict[str, Any]:
    """The executor's host-side plan for these options and bindings, without a GPU: {'buckets', 'programs', 'insert', 'capture', 'time_host_phases', 'step', 'pool'}."""

def check_chunk(config: Any, chunk: Any, layers: Optional[Any], insert: bool) -> Dict[str, Any]:
    """The executor's chunk checks without a GPU: {'status', 'requests', 'tokens', 'new_compressed_rows', 'derive_slots', 'bad_request', 'bad_field'}."""

# ----------------------------------------------------------------------------------------- executor
class RunError(RuntimeError):
    """Executor.run() / run_step() with check=True refused or failed a step; `result` holds the RunResult."""

    result: "RunResult"
    """The RunResult of the refused or failed call."""

class RunResult:
    """What one Executor.run() / run_eager() / run_step() / run_step_eager() reported (never raised unless check=True)."""

    @property
    def status(self) -> str:
        """'ok', 'no_bucket', 'bad_chunk', 'bad_program', 'not_warmed_up', 'cuda_error' or 'not_staged'."""
    @property
    def message(self) -> str:
        """The status in words."""
    @property
    def ok(self) -> bool:
        """status == 'ok'."""
    @property
    def bucket(self) -> int:
        """Index of the bucket run: run(), and run_step() of one chunk (-1: none, or a step of several chunks)."""
    @property
    def r_bucket(self) -> int:
        """R_bucket of the graph run (-1: none)."""
    @property
    def t_bucket(self) -> int:
        """T_bucket of the graph run (-1: none): run() wrote that many rows of out/lse/max_logits, run_step() only the step's tokens."""
    @property
    def bad_request(self) -> int:
        """bad_chunk: the request at fault (-1 for a chunk-wide field)."""
    @property
    def bad_field(self) -> Optional[str]:
        """bad_chunk: the field at fault ('seq_len', 'swa_blocks', ...), else None."""
    @property
    def cuda(self) -> Optional[str]:
        """cuda_error: the CUDA error's name, else None."""
    @property
    def chunks(self) -> int:
        """run_step: the chunks the step was split into (0 for a step of no requests, or one the split refused)."""
    @property
    def bad_chunk(self) -> int:
        """run_step: the chunk at fault (-1: none, or the whole step); bad_request is then the step's index."""
    @property
    def bad_reason(self) -> Optional[str]:
        """What is wrong with bad_field, in words, else None."""
    @property
    def waited_us(self) -> float:
        """Microseconds the host waited for the device to release a staging block."""
    @property
    def staging_us(self) -> float:
        """Host microseconds checking and staging the chunk, waited_us excluded (time_host_phases=True only)."""
    @property
    def launch_us(self) -> float:
        """Host microseconds in cudaGraphLaunch or the eager launches (time_host_phases=True only)."""
    @property
    def record_us(self) -> float:
        """Host microseconds in events: ordering after a stream change, and the event after a launch on a caller's stream (about 0 on the executor's own stream; time_host_phases=True only)."""
    def raise_for_status(self) -> None:
        """Raises spgraph.RunError unless the step ran."""
    def __bool__(self) -> bool: ...

class Executor:
    """graphs::Executor over engine-owned arrays; use spgraph.Executor."""

    def __init__(self, config: Any, buffers: Optional[Any], options: Optional[Any]) -> None:
        """Checks the config, options and bound arrays (host-side first), then plans and allocates the pool."""
    def warmup(self) -> Dict[str, Any]:
        """Eager run and capture of every bucket; the report as a dict."""
    def run(self, chunk: Any, stream: Optional[Any] = None, program: int = 0, check: bool = False) -> RunResult:
        """Replays the chunk's graph on `stream` (None: the executor's stream); a RunResult."""
    def run_eager(self, chunk: Any, stream: Optional[Any] = None, program: int = 0, check: bool = False) -> RunResult:
        """The same recording launched kernel by kernel; a RunResult."""
    def run_step(self, step: Any, stream: Optional[Any] = None, program: int = 0, check: bool = False) -> RunResult:
        """Every request of a step in one launch of the step graph on `stream` (None: the executor's stream); a RunResult with `chunks`."""
    def run_step_eager(self, step: Any, stream: Optional[Any] = None, program: int = 0, check: bool = False) -> RunResult:
        """The same step launched from a host loop, chunk by chunk; a RunResult."""
    def stage_step(self, step: Any, check: bool = False) -> RunResult:
        """Checks and stages a step once for every program, launching nothing; a RunResult with `chunks`."""
    def run_staged(self, stream: Optional[Any] = None, program: int = 0, check: bool = False) -> RunResult:
        """Launches the staged step for `program` on `stream` (None: the executor's stream); a RunResult."""
    def run_staged_eager(self, stream: Optional[Any] = None, program: int = 0, check: bool = False) -> RunResult:
        """The staged step launched from a host loop; a RunResult."""
    def synchronize(self) -> None:
        """Waits for every submitted step."""
    def read_status(self) -> Dict[str, Any]:
        """The last completed step's fault counts (waits for it): {kind: count, 'first': ..., 'total': n}."""
    def layer_views(self, layer: int, tensors: Any = "dlpack") -> Dict[str, Any]:
        """Every buffer of a layer, {name: array or None}, zero-copy views that keep the executor alive."""
    def workspace_views(self, tensors: Any = "dlpack") -> Dict[str, Any]:
        """The step workspace {kv, combined_indices, combined_lens}, zero-copy views."""
    def config_dict(self) -> Dict[str, Any]:
        """The executor's config as the keyword arguments of spgraph.PipelineConfig."""
    def pool_plan(self) -> Dict[str, Any]:
        """The pool's plan: what the executor holds beyond the bound buffers."""
    @property
    def buckets(self) -> List[Tuple[int, int]]:
        """The buckets as (R_bucket, T_bucket), by index."""
    @property
    def stream(self) -> int:
        """The executor's own stream (cudaStream_t as an int)."""
    @property
    def device(self) -> int:
        """The CUDA device the executor runs on."""
    @property
    def max_step_requests(self) -> int:
        """The most requests run_step() takes (0: no steps)."""
    @property
    def max_step_tokens(self) -> int:
        """The most tokens run_step() takes (0: no steps)."""
    @property
    def max_step_chunks(self) -> int:
        """The most chunks a step splits into (0: no steps)."""
    @property
    def programs(self) -> int:
        """Number of layer programs."""
    def program_layers(self, program: int) -> List[int]:
        """The layers of program p."""
    @property
    def steps(self) -> int:
        """Steps launched so far."""
    @property
    def flat_steps(self) -> int:
        """Steps launched as a flat step graph (the options flat_step_chunks, flat_step_pad)."""
    @property
    def staged_chunks(self) -> int:
        """Chunks of the staged step (-1: none staged)."""
    @property
    def staged_reruns(self) -> int:
        """Launches of a staged step that ran what an earlier launch had loaded."""
    @property
    def host_waits(self) -> int:
        """Launches that waited for the device to release a staging block."""

# ---------------------------------------------------------------------------------------- scheduler
class Request:
    """A prompt to prefill: id, prompt_len, arrival_step."""

    id: int
    """The request's id, unique among the requests a scheduler holds."""
    prompt_len: int
    """Tokens to prefill, 1 .. max_model_len."""
    arrival_step: int
    """The first step that may schedule it."""
    def __init__(self, id: int, prompt_len: int, arrival_step: int = 0) -> None:
        """A request of `prompt_len` tokens that arrives at step `arrival_step`."""

def make_workload(config: Any) -> List[Request]:
    """The requests of a seeded synthetic workload (serve_loop's): ids 0 .. n - 1, arrivals non-decreasing."""

def describe_workload(config: Any) -> str:
    """One line describing a workload, as serve_loop prints it."""

class ChunkPlan:
    """One chunk of a scheduler step; pass it to Executor.run as it is (nothing is converted)."""

    slot_lists: bool
    """Executor.run hands over the scheduler's insert slot mappings (True) or lets the device derive them from the block tables (False, the default)."""
    @property
    def num_requests(self) -> int:
        """Requests in the chunk (at most R)."""
    @property
    def num_tokens(self) -> int:
        """New tokens in the chunk, over all its requests (at most T)."""
    @property
    def window(self) -> int:
        """W used for gather_lens (the layer program's window)."""
    @property
    def request_ids(self) -> List[int]:
        """[num_requests]: each request's id."""
    @property
    def query_lens(self) -> List[int]:
        """[num_requests]: each request's new tokens in this chunk (each >= 1)."""
    @property
    def seq_lens(self) -> List[int]:
        """[num_requests]: each request's prefix plus query_len, after this chunk."""
    @property
    def gather_lens(self) -> List[int]:
        """[num_requests]: min(seq_len, query_len + window - 1)."""
    @property
    def query_start_loc(self) -> List[int]:
        """[num_requests + 1]: each request's first token in the chunk, from 0 to num_tokens."""
    @property
    def ratios(self) -> List[int]:
        """The cache kinds of the plan: 1 (SWA) first, then each compression ratio."""
    def n_rows(self, ratio: int) -> int:
        """N for ratio r: max_b seq_len_b // r (0 for r = 1)."""
    def m_rows(self, ratio: int) -> int:
        """The least M for ratio r: n_rows(r) + max_b gather_len_b."""
    def new_rows(self, ratio: int) -> int:
        """Cache rows the chunk completes in the cache of ratio r (1: one per token)."""
    def block_tables(self, ratio: int) -> List[List[int]]:
        """Each request's physical block ids in the cache of ratio r (1 = SWA), as lists."""
    def slot_mapping(self, ratio: int) -> List[int]:
        """The slot of each row the chunk completes in the cache of ratio r."""

class StepPlan:
    """One scheduler step: its chunks, in the order they must run (Executor.run_step takes it whole)."""

    @property
    def step(self) -> int:
        """The step's index (the scheduler's next_step when it was formed)."""
    @property
    def chunks(self) -> List[ChunkPlan]:
        """The step's chunks, in the order they must run (empty: nothing to run this step)."""
    @property
    def started(self) -> List[int]:
        """Ids of the requests that got their first tokens in this step."""
    @property
    def finished(self) -> List[int]:
        """Ids of the requests prefilled to the end in this step."""
    @property
    def num_tokens(self) -> int:
        """Tokens of the step, over all its chunks."""

class PrefillScheduler:
    """Chunked prefill over a stream of requests with paged cache blocks."""

    def __init__(self, pipeline: Any, config: Any) -> None:
        """R, T, max_model_len, the cache kinds and W from `pipeline`, the step limits from `config` (a SchedulerConfig); raises ValueError naming an invalid field."""
    def submit(self, requests: Any) -> None:
        """Queues a Request or a list of them (ids unique among those held)."""
    def schedule(self) -> StepPlan:
        """Forms the next step (its plans stay valid until the next call releases finished requests' blocks)."""
    @property
    def done(self) -> bool:
        """Nothing queued or running (the last finished requests' blocks return at the next schedule())."""
    @property
    def next_step(self) -> int:
        """The index of the step the next schedule() forms."""
    @property
    def num_waiting(self) -> int:
        """Requests submitted and not started, including those that have not arrived yet."""
    @property
    def num_running(self) -> int:
        """Requests started and not finished."""
    @property
    def window(self) -> int:
        """W the chunks' gather_lens use (the pipeline's window)."""
    def describe(self) -> str:
        """The scheduler config in one line ('budget 8192 tokens/step, ...')."""

# ------------------------------------------------------------------------------ synthetic front, checksum
class SyntheticFront:
    """serve_loop's synthetic model front over a model's own arrays."""

    def __init__(self, layers: Any) -> None:
        """Resolves each layer's arrays once (dicts or objects with k_rows, compressed_k_rows, topk_indices, compress_ratio, top_k)."""
    def run(self, chunk: Any, seed: int, step: int, stream: int) -> None:
        """Fills the chunk's K rows, compressed K rows and top-k indices of every layer on `stream` (a StepPlan: the whole step's rows)."""

def synthetic_fill_query(q: Array, seed: int, layer: int, stream: int) -> None:
    """Fills every value of q with front_q_value(seed, layer, i)."""

def synthetic_sink_values(seed: int, layer: int, h_q: int) -> List[float]:
    """serve_loop's attention sinks of a layer: 4 * front_q_value(seed + 7, layer, h)."""

def synthetic_fill_cache(cache: Array, block_size: int, seed: int, stream: int) -> None:
    """Fills every row of a V4 cache with random finite FP8 rows (the bench's fill)."""

def checksum_accumulate(data: Array, salt: int, acc: Array, stream: int) -> None:
    """acc += sum_i word[i] * (2 * (i + salt) + 1) (mod 2^64) over data's 32-bit words (serve_loop --checksum)."""

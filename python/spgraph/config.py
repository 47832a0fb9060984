"""The configurations an executor, the planner and the scheduler are built from.

Plain dataclasses mirroring the C++ structs (``model::PipelineConfig``, ``LayerConfig``,
``CacheConfig``, ``scheduler::SchedulerConfig``, ``WorkloadConfig``): their defaults are read from
the C++ structs when the module loads, so there is one set of defaults, and the extension reads
them back field by field (any object with the same attributes works). Bounds are checked by
:meth:`PipelineConfig.validate` (the C++ ``validate()``, raising ``ValueError`` naming the field,
its value and its bounds). Field meanings: docs/pipeline.md, "Layer configuration"; the pool they
size: docs/memory.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from . import _spgraph as _C

__all__ = ["LayerConfig", "CacheConfig", "PipelineConfig", "SchedulerConfig", "WorkloadConfig"]

_D = _C.config_defaults()
_L, _K, _P, _S, _W = _D["layer"], _D["cache"], _D["pipeline"], _D["scheduler"], _D["workload"]


@dataclass
class LayerConfig:
    """One attention layer (docs/pipeline.md, "Layer configuration").

    Attributes:
        h_q: 64 or 128 query heads (one KV head).
        d_qk: 512 (the V4 cache form).
        d_v: always 512.
        window: W, the sliding-window length (one per layer program).
        compress_ratio: r: 1 (SWA only), 4 (C4A) or 128 (C128A).
        top_k: 0 when r = 1; 512 or 1024 when r = 4; a multiple of 64 up to 8192 when r = 128.
        sm_scale: softmax scale; 0 means d_qk ** -0.5.
        attn_sink: whether the layer has a per-head sink.
    """

    h_q: int = _L["h_q"]
    d_qk: int = _L["d_qk"]
    d_v: int = _L["d_v"]
    window: int = _L["window"]
    compress_ratio: int = _L["compress_ratio"]
    top_k: int = _L["top_k"]
    sm_scale: float = _L["sm_scale"]
    attn_sink: bool = _L["attn_sink"]

    def combined_width(self) -> int:
        """Width of the layer's combined index rows: ``round_up(top_k + window, 128)``."""
        return (self.top_k + self.window + 127) // 128 * 128

    def label(self) -> str:
        """``"C4A top_k 1024 h128"``, ``"SWA h128"``: the label serve_loop prints."""
        kind = "SWA" if self.compress_ratio == 1 else f"C{self.compress_ratio}A top_k {self.top_k}"
        return f"{kind} h{self.h_q}"


@dataclass
class CacheConfig:
    """Geometry of the paged FP8 caches, shared by all layers of a kind (docs/pipeline.md).

    Attributes:
        swa_block_size: tokens per SWA cache block.
        block_tokens: sequence positions per compressed cache block (``block_tokens // r`` rows).
        swa_blocks: physical blocks of each layer's SWA cache.
        compressed_blocks: physical blocks of each layer's compressed cache.
    """

    swa_block_size: int = _K["swa_block_size"]
    block_tokens: int = _K["block_tokens"]
    swa_blocks: int = _K["swa_blocks"]
    compressed_blocks: int = _K["compressed_blocks"]


@dataclass
class PipelineConfig:
    """The chunk limits, the layer program and the cache geometry an executor is planned from.

    Attributes:
        max_requests: R, requests per chunk (1 .. 64).
        max_tokens: T, tokens per chunk (max_num_batched_tokens of one chunk, 1 .. 65536).
        max_model_len: the longest sequence a request may reach.
        layers: the layer program, in order.
        cache: the caches' geometry.
    """

    max_requests: int = _P["max_requests"]
    max_tokens: int = _P["max_tokens"]
    max_model_len: int = _P["max_model_len"]
    layers: List[LayerConfig] = field(default_factory=list)
    cache: CacheConfig = field(default_factory=CacheConfig)

    @classmethod
    def v4_default(cls) -> "PipelineConfig":
        """The DeepSeek-V4-style program of table B's "model" workload: 4 C4A (top_k 1024),
        2 C128A (top_k 512), 2 SWA-only layers, h_q 128, R 4, T 2048, max_model_len 65536, caches
        for twice R prompts of max_model_len."""
        return cls._from_dict(_C.v4_default_config())

    @classmethod
    def single_layer(cls, layer: Optional[LayerConfig] = None, max_requests: int = _P["max_requests"],
                     max_tokens: int = _P["max_tokens"], max_model_len: int = _P["max_model_len"]) -> "PipelineConfig":
        """A program of one layer (``LayerConfig()`` by default), with caches for ``max_requests``
        prompts of ``max_model_len`` (the C++ ``PipelineConfig::single_layer``)."""
        return cls._from_dict(_C.single_layer_config(layer if layer is not None else LayerConfig(), int(max_requests),
                                                     int(max_tokens), int(max_model_len)))

    @classmethod
    def _from_dict(cls, d: Dict[str, Any]) -> "PipelineConfig":
        return cls(max_requests=d["max_requests"], max_tokens=d["max_tokens"], max_model_len=d["max_model_len"],
                   layers=[LayerConfig(**l) for l in d["layers"]], cache=CacheConfig(**d["cache"]))

    def validate(self) -> None:
        """Raises ``ValueError`` naming the first field out of its bounds (value and bounds)."""
        _C.validate_config(self)

    def _derived(self) -> Dict[str, Any]:
        return _C.config_derived(self)

    @property
    def window(self) -> int:
        """The program's sliding window W (every layer has the same one)."""
        return self.layers[0].window if self.layers else 0

    def swa_blocks_per_request(self) -> int:
        """Blocks a request can span in the SWA cache: ``ceil(max_model_len / swa_block_size)``."""
        return int(self._derived()["swa_blocks_per_request"])

    def compressed_blocks_per_request(self) -> int:
        """Blocks a request can span in a compressed cache: ``ceil(max_model_len / block_tokens)``."""
        return int(self._derived()["compressed_blocks_per_request"])

    def max_kv_rows(self, layer: int) -> int:
        """M_max of layer ``layer``: ``max_model_len // r + min(max_model_len, T + W - 1)``."""
        return int(self._derived()["max_kv_rows"][layer])

    def buckets(self, r_buckets: Sequence[int] = (), t_buckets: Sequence[int] = ()) -> Dict[str, Any]:
        """The chunk-shape buckets an executor captures: ``{'r_buckets', 't_buckets', 'describe'}``
        (the defaults, or the given lists checked as Executor checks them)."""
        return _C.bucket_set(self, list(r_buckets), list(t_buckets))

    def copy(self) -> "PipelineConfig":
        """A deep copy (layers and cache included)."""
        return dataclasses.replace(self, layers=[dataclasses.replace(l) for l in self.layers],
                                   cache=dataclasses.replace(self.cache))


@dataclass
class SchedulerConfig:
    """Step-level limits of the scheduler (the chunk limits R and T come from the PipelineConfig).

    Attributes:
        max_num_batched_tokens: token budget of one step, over all its chunks.
        max_tokens_per_request: cap on one request's tokens per step; 0: only the budget.
        max_chunks_per_step: 0: as many chunks as the budget fills.
    """

    max_num_batched_tokens: int = _S["max_num_batched_tokens"]
    max_tokens_per_request: int = _S["max_tokens_per_request"]
    max_chunks_per_step: int = _S["max_chunks_per_step"]


@dataclass
class WorkloadConfig:
    """Seeded synthetic traffic (serve_loop's): prompt lengths and arrival steps.

    Attributes:
        seed: the workload's seed (the same config gives the same requests on every machine).
        num_requests: requests of the workload.
        min_prompt_len, max_prompt_len: the prompt lengths' range.
        lengths: ``"uniform"`` or ``"log-normal"``.
        log_normal_sigma: sigma of ln(length) for log-normal; 0 picks ``(ln max - ln min) / 4``.
        arrivals: ``"all"`` (at ``first_step``) or ``"poisson"``.
        arrival_rate: Poisson arrivals per step.
        first_step: the first arrival step.
    """

    seed: int = _W["seed"]
    num_requests: int = _W["num_requests"]
    min_prompt_len: int = _W["min_prompt_len"]
    max_prompt_len: int = _W["max_prompt_len"]
    lengths: str = _W["lengths"]
    log_normal_sigma: float = _W["log_normal_sigma"]
    arrivals: str = _W["arrivals"]
    arrival_rate: float = _W["arrival_rate"]
    first_step: int = _W["first_step"]

    def describe(self) -> str:
        """One line, as serve_loop prints it."""
        return _C.describe_workload(self)

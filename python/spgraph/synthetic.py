"""serve_loop's synthetic model front and output checksum, over an engine's own arrays.

The same kernels serve_loop runs, with the same arguments: :class:`SyntheticFront` writes a
chunk's new K rows, compressed K rows and top-k indices from a counter-based hash
(src/spgraph/kernels/synthetic_front), :func:`fill_query` the queries once, :func:`sink_values` the sinks, and
:func:`checksum_accumulate` adds an order-sensitive 64-bit sum of a buffer's 32-bit words
(src/spgraph/kernels/checksum). A Python loop using them on serve_loop's trace writes the bytes serve_loop
writes, so ``prefill_loop.py --checksum`` can equal ``serve_loop --checksum``. For samples,
tests and benchmarks; not a model.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from . import _spgraph as _C
from .ops import Stream, stream_handle

__all__ = ["SyntheticFront", "fill_query", "sink_values", "fill_cache", "checksum_accumulate", "front_layers"]


def front_layers(config: Any, layers: Sequence[Any]) -> List[Dict[str, Any]]:
    """The front's per-layer arguments from a config and each layer's buffers (an executor's
    ``layer(l)`` views or the engine's own LayerBuffers): k_rows, compressed_k_rows,
    topk_indices, compress_ratio, top_k."""
    out = []
    for cfg, b in zip(config.layers, layers):
        d = {"k_rows": b.k_rows, "compress_ratio": cfg.compress_ratio, "top_k": cfg.top_k}
        if cfg.compress_ratio > 1:
            d["compressed_k_rows"] = b.compressed_k_rows
            d["topk_indices"] = b.topk_indices
        out.append(d)
    return out


class SyntheticFront(_C.SyntheticFront):
    """The synthetic model front over a model's arrays, resolved once (serve_loop's front_layers).

    Args:
        layers: one dict per layer: ``k_rows`` ``[>= T, 512]`` bf16, and for r > 1
            ``compressed_k_rows`` ``[>= T // r + R, 512]`` bf16 and ``topk_indices``
            ``[>= T, top_k]`` int32, all contiguous CUDA arrays; ``compress_ratio``, ``top_k``
            (:func:`front_layers` builds them).
    """

    def __init__(self, layers: Sequence[Dict[str, Any]]) -> None:
        super().__init__(list(layers))

    def run(self, chunk: Any, seed: int, step: int, stream: Stream) -> None:
        """Fills the chunk's K rows, compressed K rows and top-k indices of every layer on
        ``stream``; ``step`` is the front's counter (serve_loop: the chunk's global index). Given a
        StepPlan, fills the whole step's rows at once (serve_loop --one-launch's front: every
        chunk's tokens and completed compressed rows in chunk order; ``step``: the launch index)."""
        super().run(chunk, int(seed), int(step), stream_handle(stream))


def fill_query(q: Any, seed: int, layer: int, stream: Stream) -> None:
    """Fills every value of ``q`` (bf16, contiguous, CUDA) as serve_loop fills layer ``layer``'s."""
    _C.synthetic_fill_query(q, int(seed), int(layer), stream_handle(stream))


def sink_values(seed: int, layer: int, h_q: int) -> List[float]:
    """serve_loop's attention sinks of layer ``layer``: ``4 * front_q_value(seed + 7, layer, h)``."""
    return list(_C.synthetic_sink_values(int(seed), int(layer), int(h_q)))


def fill_cache(cache: Any, block_size: int, seed: int, stream: Stream) -> None:
    """Fills every row of a V4 cache (uint8 ``[num_blocks, block_stride]``) with random finite rows."""
    _C.synthetic_fill_cache(cache, int(block_size), int(seed), stream_handle(stream))


def checksum_accumulate(data: Any, salt: int, acc: Any, stream: Stream) -> None:
    """``acc[0] += sum_i word[i] * (2 * (i + salt) + 1)`` (mod 2^64) over the 32-bit words of
    ``data`` (contiguous, CUDA, 4-byte aligned); ``acc`` is a ``[1]`` int64/uint64 CUDA array."""
    _C.checksum_accumulate(data, int(salt) & (2**64 - 1), acc, stream_handle(stream))

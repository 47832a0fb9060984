"""serve_loop's scheduler and synthetic workload from Python (the C++ ``scheduler::`` classes).

``PrefillScheduler(pipeline, config).schedule()`` forms one step of chunks of at most R requests
and T tokens, handing out paged cache blocks; each chunk is a :class:`ChunkPlan` that
``Executor.run`` takes as it is (spans into the plan, nothing converted). With the same pipeline,
scheduler and workload configs it forms exactly the chunks serve_loop forms, block ids and slot
mappings included. Rules: src/spgraph/scheduler/prefill_scheduler.hpp and docs/pipeline.md.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

from . import _spgraph as _C
from .config import PipelineConfig, SchedulerConfig, WorkloadConfig

__all__ = ["PrefillScheduler", "ChunkPlan", "StepPlan", "Request", "make_workload"]

ChunkPlan = _C.ChunkPlan
StepPlan = _C.StepPlan
Request = _C.Request


class PrefillScheduler(_C.PrefillScheduler):
    """Chunked prefill over a stream of requests (FIFO, strict admission by cache blocks).

    Args:
        pipeline: the executor's PipelineConfig (R, T, max_model_len, caches, window).
        config: step limits; default ``SchedulerConfig()`` (8192 tokens a step).

    Raises:
        ValueError: a config field out of bounds, or a cache that cannot hold one request of
            max_model_len tokens.
    """

    def __init__(self, pipeline: PipelineConfig, config: Optional[SchedulerConfig] = None) -> None:
        super().__init__(pipeline, config if config is not None else SchedulerConfig())

    def submit(self, requests: Union[Request, Sequence[Request]]) -> None:
        """Queues a Request or a list of them (ids unique among those queued or running)."""
        super().submit(requests)


def make_workload(config: WorkloadConfig) -> List[Request]:
    """The requests of a seeded synthetic workload: ids 0 .. n - 1, arrivals non-decreasing."""
    return _C.make_workload(config)

"""Type stubs of spgraph._cupti, the CUPTI allocation counter (use spgraph.allocation_counter())."""

from typing import List

def subscribe() -> None:
    """Subscribes CUPTI to the CUDA allocation and free calls of the process (once; raises when another tool holds CUPTI's one subscription)."""

def count() -> int:
    """Allocation and free calls counted since the last reset()."""

def reset() -> None:
    """Zeroes the count and the names."""

def names() -> List[str]:
    """The API functions counted since the last reset (first 16)."""

def watched_callbacks() -> int:
    """How many API callbacks are watched."""

def attached() -> bool:
    """Whether CUPTI is attached (counting)."""

def detach() -> None:
    """Detaches CUPTI (unsubscribe + cuptiFinalize): graph launches return to their fast path; nothing is counted."""

def attach() -> None:
    """Attaches CUPTI again."""

"""Shared fixtures of the Python tests: what this machine has (torch, a CUDA device).

GPU tests carry the ``gpu`` marker and are skipped -- reported as skipped, never passed -- where
torch or a CUDA device is missing; torch-dependent CPU tests are skipped where torch is missing.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # dlpack_stub, references

try:
    import torch

    HAVE_TORCH = True
    HAVE_CUDA = torch.cuda.is_available()
except ImportError:  # torch is optional: the spgraph layer needs none
    torch = None
    HAVE_TORCH = False
    HAVE_CUDA = False

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device (or no torch)")


_ALLOCATOR_COUNTERS = ("allocation.all.allocated", "segment.all.allocated", "num_alloc_retries")


def torch_allocator_state():
    """The torch caching allocator's counters that any allocation moves, and its reserved bytes."""
    stats = torch.cuda.memory_stats()
    return {key: stats.get(key, 0) for key in _ALLOCATOR_COUNTERS}, torch.cuda.memory_reserved()


def assert_torch_allocator_unchanged(state, now=None):
    """Fails naming the first counter that moved between torch_allocator_state()'s `state` and
    `now` (another torch_allocator_state(); None: the allocator as it is now)."""
    counters, reserved = state
    now_counters, now_reserved = torch_allocator_state() if now is None else now
    for key, value in counters.items():
        assert now_counters[key] == value, key
    assert now_reserved == reserved


def allocation_control(counter):
    """The count `counter` reports for one real device allocation: torch's cache emptied, then a
    tensor larger than any block it could hold, so torch must ask CUDA for memory. Run it with the
    counter still attached after a loop measured at zero: only a count above zero here makes that
    zero mean something. Moves torch's allocator (take torch_allocator_state() first)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    counter.reset()
    probe = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
    count = counter.count()
    del probe
    torch.cuda.empty_cache()  # the probe's 3 GiB back to the device
    return count


def attached_allocation_counter():
    """The CUPTI allocation counter, attached (an earlier test may have detached it: a count must
    mean something). Fails the calling test where CUPTI is unavailable."""
    import spgraph

    try:
        counter = spgraph.allocation_counter()
    except RuntimeError as e:
        pytest.fail(f"the CUPTI allocation counter is unavailable: {e}")
    if not counter.attached:
        counter.attach()
    return counter


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs torch and a CUDA device; skipped otherwise")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and not HAVE_CUDA:
            item.add_marker(pytest.mark.skip(reason="no CUDA device (or no torch)"))


def pytest_report_header(config):
    import spgraph

    where = os.path.dirname(spgraph.__file__)
    if HAVE_TORCH:
        dev = torch.cuda.get_device_name(0) if HAVE_CUDA else "no CUDA device"
        return f"spgraph from {where}; torch {torch.__version__} ({dev})"
    return f"spgraph from {where}; torch not installed"

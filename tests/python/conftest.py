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


def assert_torch_allocator_unchanged(state):
    """Fails naming the first counter that moved since torch_allocator_state() gave `state`."""
    counters, reserved = state
    now = torch.cuda.memory_stats()
    for key, value in counters.items():
        assert now.get(key, 0) == value, key
    assert torch.cuda.memory_reserved() == reserved


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

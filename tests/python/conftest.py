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

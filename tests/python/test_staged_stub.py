"""CPU: staged steps from Python (Executor.stage_step / run_staged) end to end without a GPU, under
the stub CUDA runtime (scripts/cudart_stub.cpp: every call succeeds, no kernel runs), in a child
process that preloads it. Only the host's side is checked: the results, the counters that say
which launch read the staging block and which reran the device state, and the refusals' messages.
What the device computes is tests/python/test_steps_gpu.py's part.

Skipped (reported as skipped) where the stub cannot be built: no C++ compiler or no CUDA headers.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

CHILD = r"""
import json, sys
import spgraph

c = spgraph.PipelineConfig(max_requests=4, max_tokens=64, max_model_len=1536,
                           layers=[spgraph.LayerConfig(h_q=64, compress_ratio=4, top_k=512),
                                   spgraph.LayerConfig(h_q=128, compress_ratio=1, top_k=0, attn_sink=False)])
c.cache.swa_blocks, c.cache.compressed_blocks = 103, 29

def step(queries, compressed=True):
    seq = [100 + q for q in queries]
    swa = [[b * 12 + i for i in range(-(-s // 64))] for b, s in enumerate(seq)]
    return {"query_lens": queries, "seq_lens": seq, "swa_block_table": swa,
            "compressed_block_tables": {4: [[b] for b in range(len(queries))]} if compressed else {}}

out = {}
ex = spgraph.Executor(c, programs=[[0], [1]], max_step_requests=8, max_step_tokens=256, flat_step_chunks=4)
out["before_warmup"] = ex.stage_step(step([10])).status
report = ex.warmup()
out["staged_step_graphs"] = report["staged_step_graphs"]
r = ex.run_staged()
out["nothing_staged"] = [r.status, r.message]
r = ex.stage_step(step([64, 30, 50, 7, 64]))  # four chunks, the last not full
out["stage"] = [r.status, r.chunks, ex.staged_chunks, ex.steps]
out["runs"] = [[r.status, r.chunks] for r in (ex.run_staged(program=p) for p in (0, 1, 0))]
out["eager"] = ex.run_staged_eager(program=1).status
out["after_runs"] = [ex.steps, ex.staged_reruns, ex.flat_steps]
r = ex.stage_step(step([64, 64, 64, 64, 64]))  # 320 tokens: refused, the staged step stays
out["refused"] = [r.status, r.bad_field, ex.staged_chunks]
try:
    ex.stage_step(step([30, 30], compressed=False), check=True)  # program 0 needs the r = 4 tables
    out["union"] = "accepted"
except spgraph.RunError as e:
    out["union"] = [str(e), e.result.bad_field, e.result.bad_chunk]
r = ex.stage_step(step([64, 64, 64]))  # all full: the flat graphs
out["flat"] = [r.chunks] + [ex.run_staged(program=p).ok for p in (1, 0)] + [ex.flat_steps, ex.staged_reruns]
assert ex.run_step(step([5, 6]), program=1).ok  # replaces the staged step
r = ex.run_staged()
out["replaced"] = [r.status, ex.staged_chunks]
try:
    ex.run_staged(check=True)
    out["replaced_check"] = "accepted"
except spgraph.RunError as e:
    out["replaced_check"] = str(e)
r = ex.run_staged(program=2)
out["bad_program"] = r.status
padded = spgraph.Executor(c, programs=[[0], [1]], max_step_requests=8, max_step_tokens=256, flat_step_chunks=4,
                          flat_step_pad=True)
report = padded.warmup()
mixed = step([64, 30, 50, 7, 64])  # four chunks, the last not full
out["pad"] = [report["flat_step_graphs"], padded.run_step(mixed).chunks, padded.flat_steps,
              padded.stage_step(step([10])).chunks, padded.run_staged(program=1).ok, padded.flat_steps,
              padded.run_step_eager(mixed).ok, padded.flat_steps]
json.dump(out, sys.stdout)
"""


def stub_library(tmp_path_factory):
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if shutil.which(os.environ.get("CXX", "g++")) is None or not os.path.exists(os.path.join(cuda, "include",
                                                                                               "cuda_runtime_api.h")):
        pytest.skip("the stub runtime needs a C++ compiler and the CUDA headers")
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        from python_host_overhead import build_stub
    finally:
        sys.path.pop(0)
    return build_stub(str(tmp_path_factory.mktemp("cudart_stub")))


@pytest.fixture(scope="module")
def child_output(tmp_path_factory):
    import spgraph  # the package under test: the child imports the same one

    lib = stub_library(tmp_path_factory)
    package = os.path.dirname(os.path.dirname(os.path.abspath(spgraph.__file__)))
    env = dict(os.environ, LD_PRELOAD=lib, SPGRAPH_CUDART_STUB="1",
               PYTHONPATH=os.pathsep.join([package] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def test_stage_then_run_per_program(child_output):
    o = child_output
    assert o["before_warmup"] == "not_warmed_up"
    assert o["staged_step_graphs"] == 2 * 4  # per program the rerun step graph and 3 flat ones
    assert o["nothing_staged"][0] == "not_staged"
    assert o["nothing_staged"][1].startswith("run_staged: not_staged: no step staged")
    status, chunks, staged_chunks, steps = o["stage"]
    assert (status, chunks, staged_chunks) == ("ok", 4, 4)
    assert o["runs"] == [["ok", 4]] * 3
    assert o["eager"] == "ok"
    # Four launches; all but the first reran the device state; no flat graph (the step is not all full).
    assert o["after_runs"] == [steps + 4, 3, 0]


def test_refusals_name_the_field_and_keep_the_staged_step(child_output):
    o = child_output
    assert o["refused"] == ["no_bucket", "step.tokens", 4]
    message, field, chunk = o["union"]
    assert message.startswith("stage_step: bad_chunk:") and "field compressed_blocks" in message
    assert (field, chunk) == ("compressed_blocks", 0)
    assert o["bad_program"] == "bad_program"


def test_all_full_steps_take_the_flat_graphs(child_output):
    # Three full chunks: both runs on the flat graphs, the second a rerun (3 + 1 reruns in all).
    assert child_output["flat"] == [3, True, True, 2, 4]


def test_with_flat_step_pad_any_step_within_it_takes_the_flat_graphs(child_output):
    # 2 programs x 2 staging blocks x 2 .. 4 chunks; the mixed step and a staged one-chunk step
    # that is not full launch plain graphs; the eager step does not.
    assert child_output["pad"] == [12, 4, 1, 1, True, 2, True, 2]


def test_an_accepted_run_step_replaces_the_staged_step(child_output):
    o = child_output
    assert o["replaced"] == ["not_staged", -1]
    assert o["replaced_check"].startswith("run_staged: not_staged")

"""CPU: whole steps from Python without a GPU -- the step options (bounds, the round trip through
the executor's plan), the step-sized bindings they require, and every refusal run_step makes,
through check_step (the executor's split and chunk checks in its order) with the message
``check=True`` raises; the step forms (lists, NumPy, dicts, a scheduler StepPlan) read alike.

Bound buffers are DLPack stubs at fake device addresses (dlpack_stub): every refusal here comes
before any CUDA call, so the messages are the same with or without a device.
"""

import re
from collections import namedtuple

import pytest

import spgraph
from conftest import HAVE_CUDA, HAVE_TORCH
from test_executor_cpu import binding, expect, two_layers

STEPS = {"max_step_requests": 8, "max_step_tokens": 256}


def good_step():
    """Four requests of two_layers(), 211 tokens, their blocks disjoint: with R 4, T 64 the split is
    [r0 64] [r0 36, r1 28] [r1 22, r2 42] [r2 18, r3 1] -- four chunks."""
    ql = [100, 50, 60, 1]
    sl = [100, 1050, 60, 1]
    swa = [[0, 1], list(range(10, 27)), [30], [31]]
    comp = {4: [[0], [1, 2, 3, 4, 5], [6], [7]]}
    return ql, sl, swa, comp


def check(step, program=0, **options):
    return spgraph.check_step(two_layers(), step, program, **(options or STEPS))


# ------------------------------------------------------------------------------------------ options
def test_step_options_round_trip_through_the_plan():
    c = two_layers()
    plan = spgraph.plan_executor(c, **STEPS)
    assert plan["step"]["max_step_requests"] == 8 and plan["step"]["max_step_tokens"] == 256
    # max_split_chunks: min(Q + S / T, S) = 8 + 4
    assert plan["step"]["max_chunks"] == 12
    slots = {s["name"]: s for s in plan["pool"]["slots"]}
    for name in ("step_staging0", "step_staging1"):
        assert "12 chunk blocks" in slots[name]["shape"] and slots[name]["bytes"] >= plan["step"]["staging_bytes"] > 0
    # The pooled layer buffers are step-sized: max(T, S) rows, compressed_k_rows max(T / r + R, S / r + Q).
    assert slots["layer0.out"]["shape"].startswith("[256, 64, 512]") and slots["layer1.lse"]["shape"] == "[256, 128] f32"
    assert slots["layer0.compressed_k_rows"]["shape"].startswith(f"[{256 // 4 + 8}, 512]")
    # The other options come back as given, beside them.
    other = spgraph.plan_executor(c, t_buckets=[32, 64], insert=False, programs=[[1], [0, 1]], **STEPS)
    assert other["buckets"][-1] == (4, 64) and {t for _, t in other["buckets"]} == {32, 64}
    assert other["programs"] == [[1], [0, 1]] and other["insert"] is False and other["capture"] is True
    assert "layer0.k_rows" not in {s["name"] for s in other["pool"]["slots"]}
    # Without step options: no step slots, buffers of T rows.
    none = spgraph.plan_executor(c)
    assert none["step"] == {"max_step_requests": 0, "max_step_tokens": 0, "max_chunks": 0, "staging_bytes": 0}
    names = {s["name"]: s for s in none["pool"]["slots"]}
    assert "step_staging0" not in names and names["layer0.out"]["shape"].startswith("[64, 64, 512]")


@pytest.mark.parametrize("options, exc, pattern", [
    ({"max_step_requests": 0, "max_step_tokens": 256}, ValueError, r"max_step_requests = 0 must be in \[1, 4096\]"),
    ({"max_step_requests": 4097, "max_step_tokens": 256}, ValueError, r"max_step_requests = 4097 must be in \[1, 4096\]"),
    ({"max_step_requests": 8}, ValueError, r"max_step_tokens = 0 must be in \[1, 1048576\]"),
    ({"max_step_requests": 8, "max_step_tokens": 2**20 + 1}, ValueError,
     r"max_step_tokens = 1048577 must be in \[1, 1048576\]"),
    ({"max_step_requests": "8", "max_step_tokens": 256}, TypeError, r"max_step_requests must be an int, not str"),
    ({"max_step_requests": 8, "max_step_tokens": 2**40}, ValueError, r"max_step_tokens = 1099511627776 must be in"),
    ({"flat_step_chunks": 4}, ValueError, r"flat_step_chunks = 4 needs steps: set max_step_requests and max_step_tokens"),
    ({"max_step_requests": 8, "max_step_tokens": 256, "flat_step_chunks": 1}, ValueError,
     r"flat_step_chunks = 1 must be 0 or in \[2, \d+\]"),
    ({"max_step_requests": 8, "max_step_tokens": 256, "flat_step_chunks": 99}, ValueError,
     r"flat_step_chunks = 99 must be 0 or in \[2, \d+\]"),
    ({"max_step_requests": 8, "max_step_tokens": 256, "flat_step_pad": True}, ValueError,
     r"flat_step_pad = true needs flat step graphs: set flat_step_chunks"),
    ({"max_step_requests": 8, "max_step_tokens": 256, "flat_step_chunks": 2, "flat_step_pad": 1}, TypeError,
     r"flat_step_pad must be a bool, not int"),
])
def test_step_option_refusals(options, exc, pattern):
    expect(exc, pattern, spgraph.plan_executor, two_layers(), **options)
    expect(exc, pattern, spgraph.Executor, two_layers(), **options)  # before any CUDA call
    expect(exc, pattern, spgraph.check_step, two_layers(), spgraph.Chunk([], [], None), **options)


def test_unknown_option_lists_the_step_options():
    expect(TypeError, r"the options are .*max_step_requests, max_step_tokens, flat_step_chunks, flat_step_pad$",
           spgraph.Executor, two_layers(), max_steps=4)


# ------------------------------------------------------------------------------ step-sized bindings
def step_binding(c, rows):
    """binding(c) with every row-indexed buffer at `rows` rows (compressed_k_rows rows // r + 8)."""
    from dlpack_stub import cuda
    b = binding(c)
    for layer, buffers in zip(c.layers, b):
        for name, arr in list(buffers.items()):
            if name in ("q", "out", "lse", "max_logits", "k_rows", "topk_indices"):
                buffers[name] = cuda((rows,) + tuple(arr.shape[1:]), arr.dtype)
            elif name == "compressed_k_rows":
                buffers[name] = cuda((rows // layer.compress_ratio + 8,) + tuple(arr.shape[1:]), arr.dtype)
    return b


def test_bindings_must_hold_a_step_when_steps_are_on():
    c = two_layers()
    spgraph.plan_executor(c, binding(c))  # T rows: enough for chunks
    pattern = (r"buffers\[0\]\.q: extents \[64, 64, 512\], strides \[32768, 512, 1\] has 64 rows; it needs at least "
               r"256 \(the config's largest bucket, or with steps the largest step\)")
    expect(ValueError, pattern, spgraph.plan_executor, c, binding(c), **STEPS)
    expect(ValueError, pattern, spgraph.Executor, c, binding(c), **STEPS)  # the constructor's own check
    # Step-sized bindings pass; one buffer a row short is named.
    plan = spgraph.plan_executor(c, step_binding(c, 256), **STEPS)
    assert "layer0.out" not in {s["name"] for s in plan["pool"]["slots"]}
    short = step_binding(c, 256)
    from dlpack_stub import cuda
    short[1]["lse"] = cuda((255, 128))
    expect(ValueError, r"buffers\[1\]\.lse: extents \[255, 128\].* has 255 rows; it needs at least 256",
           spgraph.plan_executor, c, short, **STEPS)
    short = step_binding(c, 256)
    short[0]["compressed_k_rows"] = cuda((256 // 4 + 7, 512), "bfloat16")
    expect(ValueError, r"buffers\[0\]\.compressed_k_rows: .* has 71 rows; it needs at least 72",
           spgraph.plan_executor, c, short, **STEPS)


@pytest.mark.skipif(HAVE_CUDA, reason="needs a machine without a CUDA device")
def test_a_valid_step_executor_reaches_the_device_without_one():
    c = two_layers()
    expect(spgraph.CudaError, r"cuda", spgraph.Executor, c, step_binding(c, 256), **STEPS)


# ------------------------------------------------------------------------------------------- steps
def test_a_good_step_splits_into_its_chunks():
    ql, sl, swa, comp = good_step()
    r = check(spgraph.Chunk(ql, sl, swa, comp))
    assert (r.status, r.ok, r.chunks, r.bad_chunk, r.bad_request, r.bad_field) == ("ok", True, 4, -1, -1, None)
    assert r.message == "run_step: ok: ok"
    r.raise_for_status()  # ok: nothing raised
    # Only the SWA layer's program needs no compressed tables.
    assert check(spgraph.Chunk(ql, sl, swa), program=1, programs=[[0, 1], [1]], **STEPS).chunks == 4
    # A step of no requests is a step of no chunks.
    empty = check(spgraph.Chunk([], [], None))
    assert (empty.status, empty.chunks) == ("ok", 0)
    # At the maxima exactly: 8 requests, 256 tokens.
    full = check(spgraph.Chunk([32] * 8, [32] * 8, [[i] for i in range(8)], {4: [[i] for i in range(8)]}))
    assert (full.status, full.chunks) == ("ok", 4)


def step_with(**change):
    ql, sl, swa, comp = good_step()
    values = {"ql": ql, "sl": sl, "swa": swa, "comp": comp}
    for key, edit in change.items():
        edit(values[key])
    return spgraph.Chunk(values["ql"], values["sl"], values["swa"], values["comp"])


def setitem(i, v):
    def edit(x):
        x[i] = v
    return edit


# (step, status, bad_chunk, bad_request, bad_field, message); a step refused in one of its chunks
# reports the chunks it split into, one refused by the split none
STEP_REFUSALS = {
    "over max_step_tokens": (step_with(ql=setitem(0, 146), sl=setitem(0, 146)), "no_bucket", -1, -1, "step.tokens",
                             r"run_step: no_bucket: .*\(step-wide, field step\.tokens: more tokens than "
                             r"max_step_tokens"),
    "over max_step_requests": (spgraph.Chunk([1] * 9, [1] * 9, [[i] for i in range(9)], {4: [[i] for i in range(9)]}),
                               "no_bucket", -1, -1, "step.requests",
                               r"\(step-wide, field step\.requests: more requests than max_step_requests\)"),
    "far over max_step_requests": (spgraph.Chunk([1] * 5000, [1] * 5000, None), "no_bucket", -1, -1, "step.requests",
                                   r"field step\.requests"),
    "query_len 0": (step_with(ql=setitem(2, 0)), "bad_chunk", -1, 2, "query_len",
                    r"run_step: bad_chunk: .*\(request 2, field query_len: must be at least 1 in a step\)"),
    "seq_len below query_len": (step_with(sl=setitem(1, 49)), "bad_chunk", -1, 1, "seq_len",
                                r"\(request 1, field seq_len: is below query_len\)"),
    # request 2 writes its new SWA rows into block 26, which holds request 1's new rows too: chunk 2 holds both
    "shared block": (step_with(swa=setitem(2, [26])), "bad_chunk", 2, 2, "swa_blocks",
                     r"\(chunk 2, request 2, field swa_blocks: a cache block holds new rows of two requests"),
    "block past the cache": (step_with(swa=setitem(3, [103])), "bad_chunk", 3, 3, "swa_blocks",
                             r"\(chunk 3, request 3, field swa_blocks"),
    "compressed table short": (step_with(comp=lambda c: c[4].__setitem__(1, [1, 2])), "bad_chunk", 1, 1,
                               "compressed_blocks", r"\(chunk 1, request 1, field compressed_blocks"),
}


@pytest.mark.parametrize("case", list(STEP_REFUSALS))
def test_step_refusals_name_the_request_chunk_and_field(case):
    step, status, bad_chunk, bad_request, field, message = STEP_REFUSALS[case]
    r = check(step)
    assert (r.status, r.ok, r.chunks, r.bad_chunk, r.bad_request, r.bad_field) == (
        status, False, 4 if bad_chunk >= 0 else 0, bad_chunk, bad_request, field), r
    assert re.search(message, r.message), r.message
    assert r.bad_reason is not None and r.bad_reason in r.message
    with pytest.raises(spgraph.RunError) as info:
        r.raise_for_status()
    assert str(info.value) == r.message and info.value.result.bad_field == field


def test_step_without_step_options_or_program():
    ql, sl, swa, comp = good_step()
    r = spgraph.check_step(two_layers(), spgraph.Chunk(ql, sl, swa, comp))
    assert r.status == "not_warmed_up"
    assert "the executor has no steps: give it max_step_requests and max_step_tokens" in r.message
    assert check(spgraph.Chunk(ql, sl, swa, comp), program=1).status == "bad_program"


def test_step_forms_read_alike():
    np = pytest.importorskip("numpy")
    ql, sl, swa, comp = good_step()
    width = max(len(r) for r in swa)
    pad = lambda rows: np.array([r + [r[-1]] * (width - len(r)) for r in rows], np.int32)  # noqa: E731
    forms = [
        spgraph.Chunk(np.array(ql, np.int64), np.array(sl, np.int32), pad(swa),
                      {4: np.array([r + [r[-1]] * (5 - len(r)) for r in comp[4]], np.int64)}),
        {"query_start_loc": [0, 100, 150, 210, 211], "seq_lens": sl, "swa_block_table": swa,
         "compressed_block_tables": comp},
        namedtuple("S", "query_lens seq_lens swa_block_table compressed_block_tables")(tuple(ql), tuple(sl), swa, comp),
    ]
    if HAVE_TORCH:
        import torch
        forms.append(spgraph.Chunk(torch.tensor(ql), torch.tensor(sl, dtype=torch.int32), torch.from_numpy(pad(swa)),
                                   {4: [torch.tensor(r) for r in comp[4]]}))
    for step in forms:
        r = check(step)
        assert (r.status, r.chunks) == ("ok", 4), (step, r)
    # The same refusal whatever the form.
    bad = dict(forms[1], seq_lens=[100, 49, 60, 1])
    assert (check(bad).bad_request, check(bad).bad_field) == (1, "seq_len")


def test_scheduler_steps_are_run_step_inputs():
    """A scheduler StepPlan, taken whole, splits back into the scheduler's own chunks; so does the
    step spelled out as merged requests."""
    c = two_layers()
    sched = spgraph.PrefillScheduler(c, spgraph.SchedulerConfig(max_num_batched_tokens=256))
    sched.submit(spgraph.make_workload(spgraph.WorkloadConfig(num_requests=8, min_prompt_len=5, max_prompt_len=1500)))
    options = {"max_step_requests": 16, "max_step_tokens": 256}
    steps = 0
    while not sched.done:
        plan = sched.schedule()
        steps += 1
        r = spgraph.check_step(c, plan, **options)
        assert (r.status, r.chunks) == ("ok", len(plan.chunks)), (steps, r)
        # Merge the pieces by hand: a request continues only from a chunk's last piece to the next's first.
        ql, sl, swa, comp, ids = [], [], [], [], []
        for cp in plan.chunks:
            for b in range(cp.num_requests):
                if b == 0 and ids and cp.request_ids[0] == ids[-1]:
                    ql[-1] += cp.query_lens[0]
                    sl[-1], swa[-1], comp[-1] = cp.seq_lens[0], cp.block_tables(1)[0], cp.block_tables(4)[0]
                else:
                    ql.append(cp.query_lens[b])
                    sl.append(cp.seq_lens[b])
                    swa.append(cp.block_tables(1)[b])
                    comp.append(cp.block_tables(4)[b])
                    ids.append(cp.request_ids[b])
        spelled = spgraph.check_step(c, spgraph.Chunk(ql, sl, swa, {4: comp}), **options)
        assert (spelled.status, spelled.chunks) == ("ok", len(plan.chunks))
        # One ChunkPlan is a step too (its slot lists, if asked for, are not a step's).
        plan.chunks[0].slot_lists = True
        assert spgraph.check_step(c, plan.chunks[0], **options).chunks == 1
        assert steps < 1000
    # A step of more requests than max_step_requests is refused, read no further.
    sched = spgraph.PrefillScheduler(c, spgraph.SchedulerConfig(max_num_batched_tokens=256))
    sched.submit(spgraph.make_workload(spgraph.WorkloadConfig(num_requests=8, min_prompt_len=5, max_prompt_len=20)))
    plan = sched.schedule()
    requests = len({i for cp in plan.chunks for i in cp.request_ids})
    assert requests > 1 and spgraph.check_step(c, plan, max_step_requests=requests, max_step_tokens=256).ok
    r = spgraph.check_step(c, plan, max_step_requests=requests - 1, max_step_tokens=256)
    assert (r.status, r.bad_field) == ("no_bucket", "step.requests")


STEP_MISUSE = {
    "slot lists": (dict(query_lens=[1], seq_lens=[1], swa_slots=[0]), ValueError,
                   r"step\.swa_slots is given; a step carries no slot lists \(the device derives the insert slots"),
    "compressed slot lists": (spgraph.Chunk([1], [1], [[0]], compressed_slots={4: []}), ValueError,
                              r"step\.compressed_slots is given; a step carries no slot lists"),
    "lengths differ": (dict(query_lens=[1], seq_lens=[1, 2]), ValueError,
                       r"step\.seq_lens has 2 entries but step\.query_lens has 1"),
    "not an int": (dict(query_lens=["a"], seq_lens=[1]), TypeError, r"step\.query_lens\[0\] must be an int, not str"),
    "few rows": (dict(query_lens=[1, 1], seq_lens=[1, 1], swa_block_table=[[0]]), ValueError,
                 r"step\.swa_block_table has 1 rows; the step has 2 requests"),
    "bad ratio": (dict(query_lens=[1], seq_lens=[1], compressed_block_tables={2: [[1]]}), ValueError,
                  r"step\.compressed_block_tables has the key 2; the compression ratios are 4 and 128"),
    "past int32": (dict(query_lens=[1], seq_lens=[1], swa_block_table=[[2**40]]), ValueError,
                   r"step\.swa_block_table\[0\]\[0\] = 1099511627776 does not fit in int32"),
    "no seq_lens": (spgraph.Chunk([1], None), TypeError, r"a step needs seq_lens and query_lens"),
    "unknown key": (dict(query_lens=[1], seq_lens=[1], slots=[0]), ValueError, r"the step has the key 'slots'"),
}


@pytest.mark.parametrize("case", list(STEP_MISUSE))
def test_step_misuse_raises(case):
    step, exc, pattern = STEP_MISUSE[case]
    expect(exc, pattern, check, step)


# ------------------------------------------------------------------------------------ plan, front
def test_plan_with_step_options_is_the_executors():
    c = two_layers()
    pooled = spgraph.plan(c, **STEPS)
    assert pooled.slots == spgraph.plan_executor(c, **STEPS)["pool"]["slots"]
    own = spgraph.plan(c, True, **STEPS)
    names = {s["name"] for s in own.slots}
    assert {"step_staging0", "step_staging1", "step_state", "step_meta"} <= names and "layer0.q" not in names
    assert own.slots == spgraph.plan_executor(c, step_binding(c, 256), **STEPS)["pool"]["slots"]
    expect(ValueError, r"max_step_tokens = 0 must be in \[1, 1048576\]", spgraph.plan, c, max_step_requests=8)
    expect(ValueError, r"plan\(buffers=\.\.\.\) plans no steps; use plan_executor", spgraph.plan, c,
           buffers=binding(c), **STEPS)


def test_synthetic_front_of_a_step_checks_its_rows():
    from dlpack_stub import cuda
    from spgraph import synthetic
    c = two_layers()
    sched = spgraph.PrefillScheduler(c, spgraph.SchedulerConfig(max_num_batched_tokens=256))
    sched.submit(spgraph.make_workload(spgraph.WorkloadConfig(num_requests=4, min_prompt_len=300, max_prompt_len=400)))
    plan = sched.schedule()
    assert plan.num_tokens == 256 and len(plan.chunks) == 4
    layer = {"k_rows": cuda((255, 512), "bfloat16"), "compress_ratio": 1, "top_k": 0}
    front = synthetic.SyntheticFront([layer])
    # A step is one span of rows: 256 tokens do not fit 255 rows (refused before any launch).
    expect(ValueError, r"layers\[0\]: a chunk of 256 tokens does not fit the layer's row buffers", front.run, plan,
           1, 0, 0)
    expect(TypeError, r"SyntheticFront\.run takes a ChunkPlan or a StepPlan", front.run, {"query_lens": [1]}, 1, 0, 0)


# ------------------------------------------------------------------------------------------ sample
def test_sample_one_launch_flags():
    from test_executor_cpu import run_sample
    got = run_sample("--help")
    assert "--one-launch" in got.stdout and "--step-requests" in got.stdout
    for args, message in ((["--one-launch", "--checksum"], "--one-launch cannot be combined with --checksum"),
                          (["--one-launch", "--budget", "2000000"], "--budget = 2000000 must be at most 1048576"),
                          (["--step-requests", "0"], "--step-requests = 0 must be in [1, 4096]")):
        bad = run_sample(*args)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)


def test_sample_one_launch_plan_is_serve_loops():
    from test_executor_cpu import run_sample, serve_loop_binary
    args = ["--plan", "--one-launch", "--budget", "16384", "--step-requests", "128"]
    got = run_sample(*args)
    assert got.returncode == 0, got.stderr
    assert "step_staging0" in got.stdout and "136 chunk blocks" in got.stdout
    binary = serve_loop_binary()
    if binary is None:
        pytest.skip("serve_loop not built (set SPGRAPH_SERVE_LOOP)")
    import subprocess
    for py_args, cpp_args in ((args, args + ["--engine-buffers"]), (args + ["--pooled"], args)):
        py = run_sample(*py_args).stdout
        cpp = subprocess.run([binary, *cpp_args], capture_output=True, text=True).stdout
        table = lambda text: text[text.index("slot "):]  # noqa: E731
        assert table(py) == table(cpp)


def test_sample_step_tensors_are_what_the_executor_binds():
    """prefill_loop --one-launch's torch tensors (made here as stubs by a stand-in for torch) pass
    the executor's binding checks with the step options, and T-row ones do not."""
    import importlib.util
    import types

    from dlpack_stub import cuda
    from test_executor_cpu import SAMPLE
    spec = importlib.util.spec_from_file_location("prefill_loop", SAMPLE)
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    fake = types.SimpleNamespace(bfloat16="bfloat16", float32="float32", int32="int32", uint8="uint8",
                                 device=lambda name: name,
                                 zeros=lambda shape, dtype, device: cuda(shape, dtype))
    o = sample.parse(["--one-launch", "--budget", "4096", "--step-requests", "16", "--max-tokens", "512"])
    config = sample.make_config(o)
    steps = sample.step_options(o)
    assert steps == {"max_step_requests": 16, "max_step_tokens": 4096}
    tensors = sample.engine_tensors(fake, config, step=steps)
    assert tensors[0]["q"].shape[0] == 4096 and tensors[0]["compressed_k_rows"].shape[0] == 4096 // 4 + 16
    plan = spgraph.plan_executor(config, tensors, **steps)
    assert not any(s["name"].startswith("layer") for s in plan["pool"]["slots"])
    expect(ValueError, r"buffers\[0\]\.q: .* has 512 rows; it needs at least 4096", spgraph.plan_executor, config,
           sample.engine_tensors(fake, config), **steps)
    assert sample.step_options(sample.parse([])) == {}

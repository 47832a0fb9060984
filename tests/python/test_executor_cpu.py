"""CPU: the executor's Python side without a GPU -- configs, the planner, every argument check of
the executor bindings (bound buffers, options, chunks) with its message, the scheduler and the
synthetic workload, the sample's planner and flags.

Bound buffers are framework-free DLPack stubs (dlpack_stub) at fake device addresses: every refusal
tested here comes before any CUDA call, so the messages are the same with or without a device. A
stub is never handed to a launch: the calls whose arguments are all valid are the host-only checks
(check_buffers, check_chunk, plan), or an Executor on a machine without a GPU (refused by CUDA).
"""

import os
import re
import subprocess
import sys
from collections import namedtuple

import pytest

import spgraph
from conftest import HAVE_CUDA, HAVE_TORCH
from dlpack_stub import StubArray, cpu, cuda

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "samples", "python", "prefill_loop.py")


def expect(exc, pattern, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert re.search(pattern, str(info.value)), f"message {str(info.value)!r} does not match {pattern!r}"
    return info.value


def two_layers():
    """The C++ binding tests' config: a C4A h64 layer with a sink, an SWA h128 layer without."""
    c = spgraph.PipelineConfig(max_requests=4, max_tokens=64, max_model_len=1536,
                               layers=[spgraph.LayerConfig(h_q=64, compress_ratio=4, top_k=512),
                                       spgraph.LayerConfig(h_q=128, compress_ratio=1, top_k=0, attn_sink=False)])
    c.cache.swa_blocks, c.cache.compressed_blocks = 103, 29
    return c


def binding(c, insert=True):
    """Every buffer of every layer, stub device arrays at distinct addresses, at the config's sizes."""
    T, R = c.max_tokens, c.max_requests
    out = []
    for l in c.layers:
        h, r = l.h_q, l.compress_ratio
        b = {"q": cuda((T, h, 512), "bfloat16"), "out": cuda((T, h, 512), "bfloat16"), "lse": cuda((T, h)),
             "max_logits": cuda((T, h)),
             "swa_cache": cuda((c.cache.swa_blocks, spgraph.cache_block_stride(c.cache.swa_block_size)), "uint8")}
        if insert:
            b["k_rows"] = cuda((T, 512), "bfloat16")
        if r > 1:
            b["topk_indices"] = cuda((T, l.top_k), "int32")
            b["compressed_cache"] = cuda((c.cache.compressed_blocks,
                                          spgraph.cache_block_stride(c.cache.block_tokens // r)), "uint8")
            if insert:
                b["compressed_k_rows"] = cuda((T // r + R, 512), "bfloat16")
        if l.attn_sink:
            b["attn_sink"] = cuda((h,))
        out.append(b)
    return out


# ------------------------------------------------------------------------------------------ configs
def test_config_defaults_are_the_cpp_ones():
    d = spgraph._spgraph.config_defaults()
    for cls, key in ((spgraph.LayerConfig, "layer"), (spgraph.CacheConfig, "cache"),
                     (spgraph.SchedulerConfig, "scheduler"), (spgraph.WorkloadConfig, "workload")):
        obj = cls()
        assert {f for f in obj.__dataclass_fields__} == set(d[key]), cls.__name__
        assert {k: getattr(obj, k) for k in d[key]} == d[key], cls.__name__
    p = spgraph.PipelineConfig()
    assert (p.max_requests, p.max_tokens, p.max_model_len) == tuple(d["pipeline"].values())
    assert p.layers == [] and p.cache == spgraph.CacheConfig()


def test_v4_default_and_single_layer():
    c = spgraph.PipelineConfig.v4_default()
    c.validate()
    assert [l.label() for l in c.layers] == ["C4A top_k 1024 h128", "C128A top_k 512 h128"] * 1 + [
        "C4A top_k 1024 h128", "SWA h128", "C4A top_k 1024 h128", "C128A top_k 512 h128", "C4A top_k 1024 h128",
        "SWA h128"]
    assert (c.max_requests, c.max_tokens, c.max_model_len, c.window) == (4, 2048, 65536, 128)
    assert (c.swa_blocks_per_request(), c.compressed_blocks_per_request()) == (1024, 256)
    assert (c.cache.swa_blocks, c.cache.compressed_blocks) == (8192, 2048)
    assert c.max_kv_rows(0) == 65536 // 4 + 2048 + 127 and c.max_kv_rows(3) == 2048 + 127
    assert [l.combined_width() for l in c.layers[:4]] == [1152, 640, 1152, 128]
    assert "45 chunk shapes" in c.buckets()["describe"]
    one = spgraph.PipelineConfig.single_layer(spgraph.LayerConfig(compress_ratio=128, top_k=512), 2, 128, 4096)
    assert len(one.layers) == 1 and one.layers[0].compress_ratio == 128 and one.max_tokens == 128
    assert one.cache.swa_blocks == 2 * 64 and one.cache.compressed_blocks == 2 * 16
    copy = c.copy()
    copy.layers[0].h_q, copy.cache.swa_blocks = 64, 1
    assert c.layers[0].h_q == 128 and c.cache.swa_blocks == 8192


@pytest.mark.parametrize("change, exc, pattern", [
    (lambda c: setattr(c.layers[0], "h_q", 65), ValueError, r"layers\[0\]\.h_q = 65 must be 64 or 128"),
    (lambda c: setattr(c.layers[1], "window", 64), ValueError, r"layers\[1\]\.window = 64 differs from layers\[0\]"),
    (lambda c: setattr(c, "max_requests", 0), ValueError, r"max_requests = 0 must be in \[1, 64\]"),
    (lambda c: setattr(c.cache, "block_tokens", 100), ValueError, r"cache\.block_tokens = 100 must be a multiple of 128"),
    (lambda c: setattr(c.layers[0], "top_k", 100), ValueError, r"layers\[0\]\.top_k = 100 must be 512 or 1024"),
    (lambda c: setattr(c, "layers", []), ValueError, r"at least one layer"),
    (lambda c: setattr(c, "max_requests", "4"), TypeError, r"config\.max_requests must be an int, not str"),
    (lambda c: setattr(c, "max_tokens", 2**40), ValueError, r"config\.max_tokens = 1099511627776 must be in"),
    (lambda c: setattr(c, "layers", 5), TypeError, r"config\.layers must be a sequence of LayerConfig"),
    (lambda c: c.layers.append(object()), TypeError, r"config\.layers\[2\]\.h_q is missing"),
    (lambda c: setattr(c.layers[0], "sm_scale", "x"), TypeError, r"config\.layers\[0\]\.sm_scale must be a float"),
    (lambda c: setattr(c.layers[0], "attn_sink", 1), TypeError, r"config\.layers\[0\]\.attn_sink must be a bool"),
    (lambda c: setattr(c.cache, "swa_blocks", None), TypeError, r"config\.cache\.swa_blocks must be an int"),
])
def test_config_refusals(change, exc, pattern):
    c = two_layers()
    change(c)
    expect(exc, pattern, c.validate)


def test_bucket_lists_are_checked():
    c = two_layers()
    assert c.buckets()["t_buckets"][-1] == 64
    assert c.buckets(t_buckets=[32, 64])["t_buckets"] == [32, 64]
    expect(ValueError, r"t_buckets ends at 32 but must end at the maximum 64", c.buckets, t_buckets=[16, 32])
    expect(ValueError, r"r_buckets\[1\] = 1 must be", c.buckets, r_buckets=[2, 1, 4])


# ------------------------------------------------------------------------------------------ planner
def test_plan_without_a_gpu_gives_the_documented_pools():
    c = spgraph.PipelineConfig.v4_default()
    pooled = spgraph.plan(c)
    assert pooled.device_bytes == 7_225_577_472 and pooled.pinned_bytes == 73_728  # docs/memory.md
    assert spgraph.plan(c, {"swa_cache", "compressed_cache"}).device_bytes == 4_458_123_264
    own = spgraph.plan(c, True)
    assert own.device_bytes == 85_499_904
    assert {s["name"] for s in own.slots} == {"chunk_meta", "step_status", "kv_workspace", "combined_indices",
                                              "combined_lens", "staging0", "staging1", "staging_release"}
    assert "layer0.q" in {s["name"] for s in pooled.slots} and str(own) == own.table
    assert "total device: 85499904 B (81.54 MiB)" in own.table
    no_insert = {s["name"] for s in spgraph.plan(c, insert=False).slots}
    assert "layer0.k_rows" not in no_insert and "layer0.q" in no_insert
    expect(ValueError, r"engine_buffers names 'caches'; the buffers of a layer are q, topk_indices", spgraph.plan, c,
           {"caches"})
    expect(TypeError, r"engine_buffers must be a bool or a collection of buffer names, not str", spgraph.plan, c,
           "swa_cache")


def test_plan_around_real_bindings():
    c = two_layers()
    assert spgraph.plan(c, buffers=binding(c)).device_bytes == spgraph.plan(c, True).device_bytes
    some = [{"swa_cache": binding(c)[0]["swa_cache"]}, None]
    names = {s["name"] for s in spgraph.plan(c, buffers=some).slots}
    assert "layer0.swa_cache" not in names and "layer1.swa_cache" in names and "layer0.q" in names


# ---------------------------------------------------------------------------------- bound buffers
def test_a_full_binding_passes_the_host_checks():
    c = two_layers()
    spgraph.check_buffers(c, binding(c))
    spgraph.check_buffers(c, binding(c, insert=False), insert=False)
    spgraph.check_buffers(c, [None, None])
    spgraph.check_buffers(c, [])
    # A LayerBuffers (or any object naming buffers as attributes) binds the same way.
    spgraph.check_buffers(c, [spgraph.LayerBuffers(**b) for b in binding(c)])
    # Padded token strides and block strides, flat caches.
    b = binding(c)
    b[0]["q"] = cuda((64, 64, 512), "bfloat16", strides=(32768 + 8, 512, 1))
    b[1]["out"] = cuda((80, 128, 512), "bfloat16", strides=(65536 + 64, 512, 1))
    b[0]["swa_cache"] = cuda((103, 37440 + 576), "uint8")
    b[1]["swa_cache"] = cuda((103 * 37440,), "uint8")
    b[0]["compressed_cache"] = cuda((29, 64, 584), "uint8", strides=(37440, 584, 1))
    spgraph.check_buffers(c, b)


def replace(layer, name, value):
    def edit(b):
        b[layer][name] = value(b) if callable(value) else value
    return edit


SWA = 37440  # cache_block_stride(64)
BUFFER_REFUSALS = {
    "dtype": (replace(0, "q", cuda((64, 64, 512))), TypeError, r"buffers\[0\]\.q\.dtype = float32 must be bfloat16"),
    "rank": (replace(0, "q", cuda((64, 32768), "bfloat16")), ValueError,
             r"buffers\[0\]\.q\.shape = \[64, 32768\] must be \[rows, h_q, d_qk\]"),
    "host memory": (replace(1, "lse", cpu((64, 128))), ValueError,
                    r"buffers\[1\]\.lse is on cpu; spgraph's ops run on CUDA device memory"),
    "two devices": (replace(1, "out", StubArray((64, 128, 512), "bfloat16", device=("cuda", 1))), ValueError,
                    r"buffers\[1\]\.out is on cuda:1 but buffers\[0\]\.q is on cuda:0"),
    "too few rows": (replace(1, "out", cuda((63, 128, 512), "bfloat16")), ValueError,
                     r"buffers\[1\]\.out: extents \[63, 128, 512\], strides \[65536, 512, 1\] has 63 rows; it needs "
                     r"at least 64"),
    "token stride": (replace(0, "q", cuda((64, 64, 512), "bfloat16", strides=(32772, 512, 1))), ValueError,
                     r"buffers\[0\]\.q: .* token stride 32772 must be a multiple of 8 elements"),
    "heads not contiguous": (replace(0, "out", cuda((64, 64, 512), "bfloat16", strides=(65536, 1024, 1))),
                             ValueError, r"buffers\[0\]\.out: .*stride 1 = 1024 must be 512"),
    "top-k row stride": (replace(0, "topk_indices", cuda((64, 512), "int32", strides=(1024, 1))), ValueError,
                         r"buffers\[0\]\.topk_indices: .*row stride 1024 must be 512"),
    "misaligned": (replace(0, "lse", cuda((64, 64), misalign=4)), ValueError,
                   r"buffers\[0\]\.lse = 0x[0-9a-f]+ must be 16-byte aligned"),
    "cache blocks": (replace(1, "swa_cache", cuda((104, SWA), "uint8")), ValueError,
                     r"buffers\[1\]\.swa_cache\.layout\.num_blocks = 104 must be 103"),
    "cache block stride": (replace(1, "swa_cache", cuda((103, SWA + 1), "uint8")), ValueError,
                           r"buffers\[1\]\.swa_cache\.layout\.block_stride = 37441 must be a multiple of 576"),
    "flat cache": (replace(1, "swa_cache", cuda((103 * SWA + 5,), "uint8")), ValueError,
                   r"buffers\[1\]\.swa_cache\.shape = \[3856325\] \(flat bytes\) must be a multiple of the block "
                   r"stride 37440"),
    "cache dtype": (replace(0, "swa_cache", cuda((103, SWA // 4), "int32")), TypeError,
                    r"buffers\[0\]\.swa_cache\.dtype = int32 must be uint8"),
    "block bytes": (replace(0, "swa_cache", cuda((103, 64, 584), "uint8", strides=(SWA, 600, 1))), ValueError,
                    r"buffers\[0\]\.swa_cache: the bytes of one block must be contiguous"),
    "blocks overlap": (replace(0, "swa_cache", cuda((103, SWA), "uint8", strides=(1000, 1))), ValueError,
                       r"buffers\[0\]\.swa_cache: .*blocks of 37440 bytes lie 1000 bytes apart"),
    "unused sink": (replace(1, "attn_sink", cuda((128,))), ValueError,
                    r"buffers\[1\]\.attn_sink is bound but layer 1 \(SWA h128\) does not use it"),
    "unused top-k": (replace(1, "topk_indices", cuda((64, 512), "int32")), ValueError,
                     r"buffers\[1\]\.topk_indices is bound but layer 1 \(SWA h128\) does not use it"),
    "overlap": (replace(1, "out", lambda b: StubArray((64, 128, 512), "bfloat16", device=("cuda", 0),
                                                      base=b[1]["q"])), ValueError,
                r"buffers\[1\]\.q \[0x[0-9a-f]+, \+8388608 B\) overlaps buffers\[1\]\.out"),
    "cache overlap": (replace(1, "swa_cache", lambda b: StubArray((103, SWA), "uint8", device=("cuda", 0),
                                                                  base=b[0]["swa_cache"], offset_bytes=SWA)),
                      ValueError, r"a cache must not share memory with any other buffer"),
    "negative stride": (replace(0, "lse", cuda((64, 64), strides=(-64, 1))), ValueError,
                        r"buffers\[0\]\.lse has strides \[-64, 1\]; a bound buffer cannot have negative strides"),
    "unknown key": (replace(0, "outs", cuda((64, 64, 512), "bfloat16")), ValueError,
                    r"buffers\[0\] has the key 'outs'; the buffers of a layer are q, topk_indices"),
    "not an array": (replace(0, "attn_sink", [0.0] * 64), TypeError,
                     r"buffers\[0\]\.attn_sink must be an array \(an object exporting DLPack\), not list"),
}


@pytest.mark.parametrize("case", list(BUFFER_REFUSALS))
def test_bound_buffer_refusals(case):
    edit, exc, pattern = BUFFER_REFUSALS[case]
    c = two_layers()
    b = binding(c)
    edit(b)
    expect(exc, pattern, spgraph.check_buffers, c, b)
    # The executor refuses the same way, before any CUDA call (so also on a machine without a GPU).
    expect(exc, pattern, spgraph.Executor, c, buffers=b)


def test_binding_shape_refusals():
    c = two_layers()
    expect(ValueError, r"buffers holds 3 entries; it must be empty or hold one per layer \(2\)", spgraph.check_buffers,
           c, [None, None, None])
    expect(TypeError, r"buffers must be a sequence with one entry per layer", spgraph.check_buffers, c, {"q": None})
    expect(TypeError, r"buffers\[1\] is an array; each entry names one layer's buffers", spgraph.check_buffers, c,
           [None, cuda((64, 128, 512), "bfloat16")])
    b = binding(c, insert=True)
    expect(ValueError, r"buffers\[0\]\.k_rows is bound but layer 0 \(C4A top_k 512 h64\) does not use it \(the "
                       r"executor records no insert stage\)", spgraph.check_buffers, c, b, insert=False)
    expect(ValueError, r"buffers\[0\]\.k_rows is bound", spgraph.Executor, c, buffers=binding(c), insert=False)
    # Outputs of layers run by different programs may share memory.
    b = binding(c)
    b[1]["lse"] = StubArray((64, 128), device=("cuda", 0), base=b[0]["lse"])
    spgraph.check_buffers(c, b, programs=[[0], [1]])
    expect(ValueError, r"overlaps", spgraph.check_buffers, c, b)


@pytest.mark.parametrize("options, exc, pattern", [
    ({"bogus": 1}, TypeError, r"Executor\(\) got the unknown option 'bogus'; the options are r_buckets, t_buckets"),
    ({"t_buckets": [8, 7]}, ValueError, r"t_buckets\[1\] = 7 must be"),
    ({"t_buckets": "16"}, TypeError, r"t_buckets must be a list of ints, not str"),
    ({"r_buckets": [1, "2"]}, TypeError, r"r_buckets\[1\] must be an int, not str"),
    ({"programs": [[2]]}, ValueError, r"programs\[0\] names layer 2; layers are 0 \.\. 1"),
    ({"programs": [[]]}, ValueError, r"programs\[0\] is empty"),
    ({"insert": "yes"}, TypeError, r"insert must be a bool, not str"),
    ({"capture": 1}, TypeError, r"capture must be a bool, not int"),
    ({"device": -1}, ValueError, r"device = -1 must be in \[0, 65536\]"),
])
def test_executor_option_refusals(options, exc, pattern):
    expect(exc, pattern, spgraph.Executor, two_layers(), **options)


def test_executor_config_refusals():
    c = two_layers()
    c.layers[0].h_q = 65
    expect(ValueError, r"layers\[0\]\.h_q = 65 must be 64 or 128", spgraph.Executor, c)
    expect(TypeError, r"config\.max_requests is missing", spgraph.Executor, object())
    b = binding(two_layers())
    b[0]["q"] = StubArray((64, 64, 512), "bfloat16", device=("cuda", 1))
    b[0]["out"] = StubArray((64, 64, 512), "bfloat16", device=("cuda", 1))
    # (every other buffer is on cuda:0: the device check names the first disagreeing buffer)
    expect(ValueError, r"is on cuda:0 but buffers\[0\]\.q is on cuda:1", spgraph.Executor, two_layers(), buffers=b)


@pytest.mark.skipif(HAVE_CUDA, reason="needs a machine without a CUDA device")
def test_a_valid_executor_reaches_the_device_without_one():
    expect(spgraph.CudaError, r"cuda", spgraph.Executor, two_layers())
    expect(spgraph.CudaError, r"cuda", spgraph.Executor, two_layers(), buffers=binding(two_layers()))


# ------------------------------------------------------------------------------------------- chunks
def chunk_ok(c, chunk, **kw):
    got = spgraph.check_chunk(c, chunk, **kw)
    assert got["status"] == "ok", got
    return got


def test_chunk_forms_read_alike():
    np = pytest.importorskip("numpy")
    c = two_layers()
    # 2 requests: 60 new tokens at positions 1000..1059, and a 4-token prompt.
    ql, sl = [60, 4], [1060, 4]
    swa = [list(range(80, 97)), [7]]  # block ids inside the cache (103 blocks)
    comp = {4: [list(range(5)), [6]]}  # no block of request 1 is one of request 0's
    want = chunk_ok(c, spgraph.Chunk(ql, sl, swa, comp))
    # (r = 4: rows 250 .. 264 and row 0; r = 128: row 7, counted though no layer is C128A)
    assert (want["requests"], want["tokens"], want["new_compressed_rows"]) == (2, 64, (16, 1))
    assert want["derive_slots"] is True
    forms = [
        spgraph.Chunk(np.array(ql, np.int64), np.array(sl, np.int32), np.array([swa[0], [7] * 17], np.int32),
                      {4: np.array([[0, 1, 2, 3, 4], [6] * 5], np.int64)}),
        spgraph.Chunk(tuple(ql), tuple(sl), [np.array(swa[0], np.int32), np.array([7], np.int64)], comp),
        {"query_start_loc": [0, 60, 64], "seq_lens": sl, "swa_block_table": swa, "compressed_block_tables": comp},
        namedtuple("C", "query_lens seq_lens swa_block_table compressed_block_tables")(ql, sl, swa, comp),
        # A strided int32 table (every other column) is converted, not read in place.
        spgraph.Chunk(ql, sl, np.repeat(np.array([swa[0], [7] * 17], np.int32), 2, axis=1)[:, ::2], comp),
    ]
    for chunk in forms:
        assert chunk_ok(c, chunk) == want
    # The buffer protocol without NumPy (array.array, memoryview), and NumPy views read with their strides.
    import array
    assert chunk_ok(c, spgraph.Chunk(array.array("i", ql), memoryview(array.array("q", sl)), swa, comp)) == want
    reversed_rows = np.array([[7] * 17, swa[0]], np.int32)[::-1]
    assert chunk_ok(c, spgraph.Chunk(np.array(ql[::-1], np.int32)[::-1], sl, reversed_rows, comp)) == want
    if HAVE_TORCH:
        import torch
        t = spgraph.Chunk(torch.tensor(ql), torch.tensor(sl, dtype=torch.int32),
                          torch.tensor([swa[0], [7] * 17], dtype=torch.int32), {4: torch.tensor([[0, 1, 2, 3, 4], [6] * 5])})
        assert chunk_ok(c, t) == want
    # Only the SWA layer: no compressed tables needed.
    assert chunk_ok(c, spgraph.Chunk(ql, sl, swa), layers=[1])["tokens"] == 64
    # Slot lists (one per token, one per completed compressed row) instead of derived slots.
    # (each slot is the one the request's table gives its position or row, as the host now checks)
    swa_slots = [swa[0][p // 64] * 64 + p % 64 for p in range(1000, 1060)] + [7 * 64 + p for p in range(4)]
    comp_slots = [comp[4][0][r // 64] * 64 + r % 64 for r in range(250, 265)] + [6 * 64]
    got = chunk_ok(c, spgraph.Chunk(ql, sl, swa, comp, swa_slots=swa_slots, compressed_slots={4: comp_slots}))
    assert got["derive_slots"] is False
    # Lists longer than any chunk reads are cut, never copied whole (and still refused where refused).
    chunk_ok(c, spgraph.Chunk(ql, sl, [list(range(10000)), [7] * 10000], comp))
    long_slots = spgraph.check_chunk(c, spgraph.Chunk(ql, sl, swa, comp, swa_slots=[0] * 100000,
                                                      compressed_slots={4: comp_slots}))
    assert (long_slots["status"], long_slots["bad_field"]) == ("bad_chunk", "swa_slots")


@pytest.mark.parametrize("chunk, status, at, field", [
    (spgraph.Chunk([5], [4], [[0]]), "bad_chunk", 0, "seq_len"),
    (spgraph.Chunk([1, 5], [1, 2000], [[0], [0] * 32]), "bad_chunk", 1, "seq_len"),
    (spgraph.Chunk([-1], [4], [[0]]), "bad_chunk", 0, "query_len"),
    (spgraph.Chunk([4, 60], [4, 1060], [[0], list(range(16))], {4: [[0], [0] * 5]}), "bad_chunk", 1, "swa_blocks"),
    (spgraph.Chunk([4], [1000], [list(range(16))]), "bad_chunk", 0, "compressed_blocks"),
    (spgraph.Chunk([3], [3], [[0]], {4: [[]]}, swa_slots=[0, 1]), "bad_chunk", -1, "swa_slots"),
    (spgraph.Chunk([3], [3], [[0]], {4: [[]]}, compressed_slots={4: [1]}), "bad_chunk", -1, "compressed_slots"),
    (spgraph.Chunk([1] * 5, [1] * 5, [[0]] * 5), "no_bucket", -1, None),
    (spgraph.Chunk([40, 30], [40, 30], [[0], [1]], {4: [[0], [1]]}), "no_bucket", -1, None),
    (spgraph.Chunk([], [], None), "ok", -1, None),
])
def test_chunk_refusals_are_statuses(chunk, status, at, field):
    got = spgraph.check_chunk(two_layers(), chunk)
    assert (got["status"], got["bad_request"], got["bad_field"]) == (status, at, field), got


CHUNK_MISUSE = {
    "lengths differ": (dict(query_lens=[1], seq_lens=[1, 2]), ValueError,
                       r"chunk\.seq_lens has 2 entries but chunk\.query_lens has 1"),
    "starts differ": (dict(query_start_loc=[0, 1], seq_lens=[1, 2]), ValueError,
                      r"chunk\.query_start_loc has 2 \(requests \+ 1\)"),
    "not an int": (dict(query_lens=["a"], seq_lens=[1]), TypeError, r"chunk\.query_lens\[0\] must be an int, not str"),
    "past int32": (dict(query_lens=[1], seq_lens=[1], swa_block_table=[[2**40]]), ValueError,
                   r"chunk\.swa_block_table\[0\]\[0\] = 1099511627776 does not fit in int32"),
    "int64 past int32": ("np-int64", ValueError, r"chunk\.seq_lens\[0\] = 4294967296 does not fit in int32"),
    "float array": ("np-float", TypeError, r"chunk\.swa_block_table\.dtype = float32 must be int32 or int64"),
    "unsigned array": ("np-uint32", TypeError, r"chunk\.seq_lens\.dtype = uint32 must be int32 or int64"),
    "bytes": (dict(query_lens=[1], seq_lens=b"\x01"), TypeError, r"chunk\.seq_lens\.dtype = uint8 must be int32"),
    "1-D table": ("np-1d", ValueError, r"chunk\.swa_block_table has 1 dims; it must be 2-D \[requests, width\]"),
    "2-D lengths": ("np-2d", ValueError, r"chunk\.query_lens has 2 dims; it must be 1-D"),
    "device lengths": (dict(query_lens=cuda((1,), "int32"), seq_lens=[1]), ValueError,
                       r"chunk\.query_lens is device memory \(DLPack device type 2\); a chunk's lengths"),
    "few rows": (dict(query_lens=[1, 1], seq_lens=[1, 1], swa_block_table=[[0]]), ValueError,
                 r"chunk\.swa_block_table has 1 rows; the chunk has 2 requests"),
    "bad ratio": (dict(query_lens=[1], seq_lens=[1], compressed_block_tables={2: [[1]]}), ValueError,
                  r"chunk\.compressed_block_tables has the key 2; the compression ratios are 4 and 128"),
    "tables not a dict": (dict(query_lens=[1], seq_lens=[1], compressed_block_tables=[[1]]), TypeError,
                          r"chunk\.compressed_block_tables must be a dict \{ratio: table\}, not list"),
    "slots not a dict": (dict(query_lens=[1], seq_lens=[1], compressed_slots=[1]), TypeError,
                         r"chunk\.compressed_slots must be a dict \{ratio: slots\}"),
    "table type": (dict(query_lens=[1], seq_lens=[1], swa_block_table=5), TypeError,
                   r"chunk\.swa_block_table must be a 2-D integer array \[requests, width\] or a list"),
    "row type": (dict(query_lens=[1], seq_lens=[1], swa_block_table=["ab"]), TypeError,
                 r"chunk\.swa_block_table\[0\] must be a list of ints or a 1-D integer array, not str"),
    "no seq_lens": (spgraph.Chunk([1], None), TypeError, r"a chunk needs seq_lens and query_lens"),
    "unknown key": (dict(query_lens=[1], seq_lens=[1], swa_block_tables=[[0]]), ValueError,
                    r"the chunk has the key 'swa_block_tables'; its fields are query_lens, query_start_loc"),
}


@pytest.mark.parametrize("case", list(CHUNK_MISUSE))
def test_chunk_misuse_raises(case):
    chunk, exc, pattern = CHUNK_MISUSE[case]
    if isinstance(chunk, str):
        np = pytest.importorskip("numpy")
        chunk = {"np-int64": dict(query_lens=[1], seq_lens=np.array([2**32], np.int64)),
                 "np-float": dict(query_lens=[1], seq_lens=[1], swa_block_table=np.zeros((1, 3), np.float32)),
                 "np-uint32": dict(query_lens=[1], seq_lens=np.ones(1, np.uint32)),
                 "np-1d": dict(query_lens=[1], seq_lens=[1], swa_block_table=np.zeros(3, np.int32)),
                 "np-2d": dict(query_lens=np.zeros((1, 1), np.int32), seq_lens=[1])}[chunk]
    expect(exc, pattern, spgraph.check_chunk, two_layers(), chunk)


# ---------------------------------------------------------------------------------------- scheduler
def test_workload_is_seeded_and_bounded():
    wc = spgraph.WorkloadConfig(seed=3, num_requests=10, min_prompt_len=100, max_prompt_len=1000, lengths="log-normal")
    a, b = spgraph.make_workload(wc), spgraph.make_workload(wc)
    assert [(r.id, r.prompt_len, r.arrival_step) for r in a] == [(r.id, r.prompt_len, r.arrival_step) for r in b]
    assert [r.id for r in a] == list(range(10)) and all(100 <= r.prompt_len <= 1000 for r in a)
    assert "10 requests" in wc.describe()
    expect(ValueError, r"'gaussian'", spgraph.make_workload, spgraph.WorkloadConfig(lengths="gaussian"))
    expect(ValueError, r"min_prompt_len", spgraph.make_workload, spgraph.WorkloadConfig(min_prompt_len=0))


def test_scheduler_chunks_are_executor_inputs():
    c = two_layers()
    sched = spgraph.PrefillScheduler(c, spgraph.SchedulerConfig(max_num_batched_tokens=128))
    reqs = spgraph.make_workload(spgraph.WorkloadConfig(num_requests=6, min_prompt_len=5, max_prompt_len=1500))
    sched.submit(reqs)
    tokens = 0
    steps = 0
    while not sched.done:
        plan = sched.schedule()
        steps += 1
        assert plan.num_tokens <= 128 and plan.step == steps - 1
        for cp in plan.chunks:
            assert cp.num_requests <= c.max_requests and 0 < cp.num_tokens <= c.max_tokens
            assert cp.query_start_loc[-1] == cp.num_tokens and cp.ratios == [1, 4]
            assert cp.new_rows(1) == cp.num_tokens and len(cp.slot_mapping(4)) == cp.new_rows(4)
            assert cp.n_rows(4) == max(s // 4 for s in cp.seq_lens)
            assert cp.slot_lists is False
            got = chunk_ok(c, cp)
            assert got["derive_slots"] and got["tokens"] == cp.num_tokens
            assert got["new_compressed_rows"][0] == cp.new_rows(4)
            cp.slot_lists = True
            assert chunk_ok(c, cp)["derive_slots"] is False
            # The same chunk spelled out as lists reads the same.
            spelled = spgraph.Chunk(cp.query_lens, cp.seq_lens, cp.block_tables(1), {4: cp.block_tables(4)},
                                    swa_slots=cp.slot_mapping(1), compressed_slots={4: cp.slot_mapping(4)})
            assert chunk_ok(c, spelled) == chunk_ok(c, cp)
            tokens += cp.num_tokens
        assert steps < 1000
    assert tokens == sum(r.prompt_len for r in reqs)
    expect(TypeError, r"submit\(\) takes Requests; got a int", sched.submit, [1])
    expect(ValueError, r"prompt_len", sched.submit, spgraph.Request(100, 0))
    expect(ValueError, r"max_num_batched_tokens", spgraph.PrefillScheduler, c,
           spgraph.SchedulerConfig(max_num_batched_tokens=0))


# ---------------------------------------------------------------------------------- synthetic front
def test_synthetic_front_argument_checks():
    from spgraph import synthetic
    sinks = synthetic.sink_values(1, 0, 8)
    assert sinks == synthetic.sink_values(1, 0, 8) and all(-4.0 <= v < 4.0 for v in sinks) and len(set(sinks)) == 8
    expect(ValueError, r"layers\[0\]\.k_rows is on cpu", synthetic.SyntheticFront, [{"k_rows": cpu((64, 512),
                                                                                                    "bfloat16")}])
    expect(TypeError, r"layers\[0\]\.k_rows\.dtype = float32 must be bfloat16", synthetic.SyntheticFront,
           [{"k_rows": cuda((64, 512))}])
    expect(ValueError, r"layers\[0\]: compressed_k_rows and topk_indices are needed", synthetic.SyntheticFront,
           [{"k_rows": cuda((64, 512), "bfloat16"), "compress_ratio": 4, "top_k": 512}])
    front = synthetic.SyntheticFront([{"k_rows": cuda((64, 512), "bfloat16"), "compress_ratio": 1, "top_k": 0}])
    expect(TypeError, r"SyntheticFront\.run takes a ChunkPlan", front.run, spgraph.Chunk([1], [1]), 1, 0, 0)
    expect(TypeError, r"acc\.dtype = int32 must be int64 or uint64", synthetic.checksum_accumulate,
           cuda((8,)), 0, cuda((1,), "int32"), 0)
    expect(ValueError, r"data holds 6 bytes", synthetic.checksum_accumulate, cuda((3,), "bfloat16"), 0,
           cuda((1,), "int64"), 0)


# ------------------------------------------------------------------------------ stubs and the counter
def test_import_spgraph_does_not_load_cupti():
    code = "import sys, spgraph, spgraph.executor; print('spgraph._cupti' in sys.modules)"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "False"


@pytest.mark.skipif(HAVE_CUDA, reason="without a device CUPTI cannot subscribe; the GPU tests count")
def test_allocation_counter_without_a_device():
    code = ("import spgraph\ntry:\n    c = spgraph.allocation_counter(); print('counter', c.count())\n"
            "except RuntimeError as e:\n    print('refused', e)")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith(("counter 0", "refused AllocationCounter")), got.stdout


def _stub_classes(path):
    import ast
    tree = ast.parse(open(path).read())
    classes = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            methods = {}
            for f in node.body:
                if isinstance(f, ast.FunctionDef):
                    is_property = any(getattr(d, "id", None) == "property" for d in f.decorator_list)
                    methods[f.name] = None if is_property else [a.arg for a in f.args.args[1:]]
                elif isinstance(f, ast.AnnAssign):
                    methods[f.target.id] = None
            classes[node.name] = methods
    return classes


def _params(fn):
    signature = fn.__doc__.splitlines()[0]
    return re.findall(r"(\w+):", signature[signature.index("(") + 1: signature.rindex(")")])


def test_class_stubs_match_the_extension():
    """_spgraph.pyi names every class of the extension, its methods with the same parameters and its
    properties; _cupti.pyi every function of the counter module."""
    import os as _os

    from spgraph import _spgraph
    stub = _os.path.join(_os.path.dirname(spgraph.__file__), "_spgraph.pyi")
    classes = _stub_classes(stub)
    exported = {n for n in dir(_spgraph) if isinstance(getattr(_spgraph, n), type) and not n.startswith("_")}
    assert set(classes) == exported
    for name, members in classes.items():
        cls = getattr(_spgraph, name)
        if issubclass(cls, BaseException):
            continue
        public = {n for n in vars(cls) if not n.startswith("_")}
        assert public == {m for m in members if not m.startswith("_")}, name
        for member, params in members.items():
            if params is not None and member not in ("__bool__",):
                assert _params(getattr(cls, member)) == params, f"{name}.{member}"
    import ast
    tree = ast.parse(open(_os.path.join(_os.path.dirname(spgraph.__file__), "_cupti.pyi")).read())
    stubbed = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
    import importlib.util
    spec = importlib.util.find_spec("spgraph._cupti")
    assert spec is not None and spec.origin.endswith(".so")
    assert stubbed == {"subscribe", "count", "reset", "names", "watched_callbacks", "attached", "detach", "attach"}


# ------------------------------------------------------------------------------------------- sample
def run_sample(*args):
    env = dict(os.environ)
    return subprocess.run([sys.executable, SAMPLE, *args], capture_output=True, text=True, env=env, timeout=120)


def serve_loop_binary():
    path = os.environ.get("SPGRAPH_SERVE_LOOP", os.path.join(ROOT, "build", "release", "samples", "serve_loop"))
    return path if os.path.exists(path) else None


def test_sample_help_and_flags():
    got = run_sample("--help")
    assert got.returncode == 0
    for flag in ("--steps", "--checksum", "--json", "--no-progress", "--derive-slots", "--engine-buffers"[:0] or
                 "--pooled", "--max-model-len", "--lengths", "--budget"):
        assert flag in got.stdout, flag
    bad = run_sample("--max-len", "70000")
    assert bad.returncode == 2 and "--max-len = 70000 must be at most --max-model-len = 65536" in bad.stderr


def test_sample_plan_is_serve_loops():
    got = run_sample("--plan", "--max-tokens", "512")
    assert got.returncode == 0, got.stderr
    assert "total device: " in got.stdout and "kv_workspace" in got.stdout and "layer0.q" not in got.stdout
    binary = serve_loop_binary()
    if binary is None:
        pytest.skip("serve_loop not built (set SPGRAPH_SERVE_LOOP)")
    for py_args, cpp_args in ((["--plan", "--max-tokens", "512"], ["--plan", "--engine-buffers", "--max-tokens", "512"]),
                              (["--plan", "--pooled"], ["--plan"])):
        py = run_sample(*py_args).stdout
        cpp = subprocess.run([binary, *cpp_args], capture_output=True, text=True).stdout
        table = lambda text: text[text.index("slot "):]  # noqa: E731
        assert table(py) == table(cpp)
        assert py.splitlines()[:10] == cpp.splitlines()[:10]  # the layer program and the buckets


@pytest.mark.skipif(HAVE_CUDA, reason="needs a machine without a CUDA device")
def test_sample_without_a_device_plans(capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location("prefill_loop", SAMPLE)
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)  # in-process: torch is imported once, by conftest
    assert sample.main(["--steps", "3"]) == 0
    assert "running the CPU-side planner instead" in capsys.readouterr().out
    assert sample.main(["--require-gpu"]) == 77

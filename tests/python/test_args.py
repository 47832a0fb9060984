"""CPU: the package imports, and every argument check of every op raises with its message.

The arrays are framework-free DLPack stubs (dlpack_stub), so these run without torch or a GPU. A
call whose arguments are all valid gets as far as the device check and is refused there, since the
stubs live in host memory: nothing is ever launched.
"""

import re

import pytest

import spgraph
from conftest import HAVE_CUDA
from dlpack_stub import cpu, cuda

DEVICE_REFUSAL = "run on CUDA device memory"


def expect(exc, pattern, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert re.search(pattern, str(info.value)), f"message {str(info.value)!r} does not match {pattern!r}"
    return info.value


# ---------------------------------------------------------------------------------- package
def test_package_imports_and_constants():
    assert spgraph.__version__
    assert spgraph.FAULT_KINDS == ("scalars", "seq_len", "block_id", "slot", "topk_index")
    assert spgraph.STATUS_WORDS == 10
    assert (spgraph.KV_ROW_BYTES, spgraph.KV_SCALE_BYTES, spgraph.KV_DIM) == (576, 8, 512)
    assert spgraph.cache_block_stride(64) == 37440
    assert spgraph.cache_block_stride(2) == 1728
    assert spgraph.cache_block_stride(1) == 1152
    assert spgraph.combined_width(1024, 128) == 1152
    assert spgraph.combined_width(512, 128) == 640
    assert spgraph.combined_width(0, 128) == 128
    assert issubclass(spgraph.CudaError, RuntimeError)


def test_stream_handle():
    class Protocol:
        def __cuda_stream__(self):
            return (0, 1234)

    class TorchLike:
        cuda_stream = 99

    class CupyLike:
        ptr = 7

    assert spgraph.stream_handle(5) == 5
    assert spgraph.stream_handle(Protocol()) == 1234
    assert spgraph.stream_handle(TorchLike()) == 99
    assert spgraph.stream_handle(CupyLike()) == 7
    expect(TypeError, "stream is required", spgraph.stream_handle, None)
    expect(TypeError, "not a bool", spgraph.stream_handle, True)
    expect(TypeError, "not str", spgraph.stream_handle, "s")


def test_fault_counts():
    words = [0] * 10
    assert spgraph.fault_counts(words)["first"] is None
    words[2] = 3  # block_id
    words[5] = 1  # recorded
    words[6:10] = [2, 1, 17, (1 << 32) - 5]  # kind block_id, request 1, position 17, value -5
    got = spgraph.fault_counts(words)
    assert got["block_id"] == 3 and got["scalars"] == 0
    assert got["first"] == ("block_id", 1, 17, -5)
    expect(ValueError, "holds 3 words", spgraph.fault_counts, [0, 0, 0])


def test_stubs_match_the_extension():
    """_spgraph.pyi names every function of the extension with the same parameters."""
    import ast
    import os

    from spgraph import _spgraph

    stub = os.path.join(os.path.dirname(spgraph.__file__), "_spgraph.pyi")
    tree = ast.parse(open(stub).read())
    stubbed = {f.name: [a.arg for a in f.args.args] for f in tree.body if isinstance(f, ast.FunctionDef)}
    exported = {n for n in dir(_spgraph) if callable(getattr(_spgraph, n)) and not n.startswith("_")
                and not isinstance(getattr(_spgraph, n), type)}
    assert set(stubbed) == exported
    for name, params in stubbed.items():
        signature = getattr(_spgraph, name).__doc__.splitlines()[0]
        got = re.findall(r"(\w+):", signature[signature.index("(") + 1: signature.rindex(")")])
        assert got == params, f"{name}: extension {got}, stub {params}"


# --------------------------------------------------------------------------- sparse_mla_fwd
def mla_args(s_q=5, h_q=64, d_qk=512, s_kv=100, topk=64, dev=cpu, **over):
    a = dict(
        q=dev((s_q, h_q, d_qk), "bfloat16"),
        kv=dev((s_kv, 1, d_qk), "bfloat16"),
        indices=dev((s_q, 1, topk), "int32"),
        sm_scale=d_qk ** -0.5,
        d_v=512,
        attn_sink=None,
        topk_length=None,
        out=(dev((s_q, h_q, 512), "bfloat16"), dev((s_q, h_q), "float32"), dev((s_q, h_q), "float32")),
        stream=0,
    )
    a.update(over)
    return a


def call_mla(a):
    a = dict(a)
    return spgraph.sparse_mla_fwd(a.pop("q"), a.pop("kv"), a.pop("indices"), a.pop("sm_scale"), **a)


def test_sparse_mla_valid_arguments_reach_the_device_check():
    expect(ValueError, "q is on cpu; spgraph's ops " + DEVICE_REFUSAL, call_mla, mla_args())
    expect(ValueError, DEVICE_REFUSAL, call_mla, mla_args(h_q=128, d_qk=576, topk=640,
                                                          attn_sink=cpu((128,), "float32"),
                                                          topk_length=cpu((5,), "int32")))
    # 2-D kv and indices (FlashMLA's 3-D form without the head dim) are accepted too
    expect(ValueError, DEVICE_REFUSAL, call_mla, mla_args(kv=cpu((100, 512), "bfloat16"),
                                                          indices=cpu((5, 64), "int32")))
    # padded kv rows: a row stride that is a multiple of 8
    expect(ValueError, DEVICE_REFUSAL, call_mla, mla_args(kv=cpu((100, 1, 512), "bfloat16", strides=(520, 520, 1))))


# Empty work (s_q = 0, no tokens, no requests): every argument is checked as for any call, and a
# call that passes returns without launching. The "cuda" stubs are fake device arrays: only where
# no GPU is present is an all-valid one passed (the GPU tests make real empty calls).
no_gpu_only = pytest.mark.skipif(HAVE_CUDA, reason="fake device arrays are passed only where no GPU is present")


def test_sparse_mla_empty_query_is_checked_like_any_call():
    expect(ValueError, "q is on cpu; spgraph's ops " + DEVICE_REFUSAL, call_mla, mla_args(s_q=0))
    expect(ValueError, r"topk = 100 must be a positive multiple of 64", call_mla, mla_args(s_q=0, topk=100))
    expect(ValueError, r"h_q = 96 must be 64 or 128", call_mla, mla_args(s_q=0, h_q=96))
    expect(TypeError, r"q\.dtype = float32 must be bfloat16", call_mla, mla_args(s_q=0, q=cpu((0, 64, 512))))


@no_gpu_only
def test_sparse_mla_empty_query_is_a_no_op():
    a = mla_args(s_q=0, dev=cuda)
    got = call_mla(a)  # nothing launched: no CUDA call is made (there is no device)
    assert all(g is w for g, w in zip(got, a["out"]))
    assert call_mla(mla_args(s_q=0, s_kv=0, dev=cuda)) is not None  # an empty kv too
    assert spgraph.sparse_mla_workspace_bytes(0, 128, 512, 1024) == 0


def o3(out=None, ml=None, lse=None, s_q=5, h_q=64):
    return (out or cpu((s_q, h_q, 512), "bfloat16"), ml or cpu((s_q, h_q), "float32"), lse or cpu((s_q, h_q), "float32"))


MLA_CASES = [
    ("q dtype", dict(q=cpu((5, 64, 512), "float32")), TypeError, r"q\.dtype = float32 must be bfloat16"),
    ("q rank", dict(q=cpu((5, 512), "bfloat16")), ValueError, r"q\.shape = \[5, 512\] must be \[s_q, h_q, d_qk\]"),
    ("q strides", dict(q=cpu((5, 64, 512), "bfloat16", strides=(64 * 1024, 1024, 1))), ValueError,
     r"q must be contiguous: shape \[5, 64, 512\] has strides \[65536, 1024, 1\]"),
    ("kv dtype", dict(kv=cpu((100, 1, 512), "float16")), TypeError, r"kv\.dtype = float16 must be bfloat16"),
    ("kv heads", dict(kv=cpu((100, 2, 512), "bfloat16")), ValueError, r"kv\.shape\[1\] = 2 must be 1 \(one kv head"),
    ("kv width", dict(kv=cpu((100, 1, 576), "bfloat16")), ValueError, r"kv\.shape\[2\] = 576 must be 512 \(d_qk"),
    ("kv last stride", dict(kv=cpu((100, 1, 512), "bfloat16", strides=(1024, 1024, 2))), ValueError,
     r"kv\.stride\(-1\) = 2 must be 1"),
    ("kv row stride", dict(kv=cpu((100, 1, 512), "bfloat16", strides=(516, 516, 1))), ValueError,
     r"kv_row_stride = 516 must be >= d_qk = 512 and a multiple of 8"),
    ("indices dtype", dict(indices=cpu((5, 1, 64), "int64")), TypeError, r"indices\.dtype = int64 must be int32"),
    ("indices rows", dict(indices=cpu((4, 1, 64), "int32")), ValueError, r"indices\.shape\[0\] = 4 must be 5 \(s_q"),
    ("indices contiguous", dict(indices=cpu((5, 1, 64), "int32", strides=(128, 128, 1))), ValueError,
     r"indices must be contiguous"),
    ("topk multiple of 64", dict(indices=cpu((5, 1, 100), "int32")), ValueError,
     r"topk = 100 must be a positive multiple of 64"),
    ("d_v", dict(d_v=256), ValueError, r"d_v = 256 must be 512"),
    ("sink dtype", dict(attn_sink=cpu((64,), "bfloat16")), TypeError, r"attn_sink\.dtype = bfloat16 must be float32"),
    ("sink length", dict(attn_sink=cpu((128,), "float32")), ValueError, r"attn_sink\.shape\[0\] = 128 must be 64"),
    ("topk_length dtype", dict(topk_length=cpu((5,), "int64")), TypeError, r"topk_length\.dtype = int64 must be int32"),
    ("topk_length length", dict(topk_length=cpu((6,), "int32")), ValueError, r"topk_length\.shape\[0\] = 6 must be 5"),
    ("out dtype", dict(out=o3(out=cpu((5, 64, 512), "float32"))), TypeError, r"out\.dtype = float32 must be bfloat16"),
    ("out shape", dict(out=o3(out=cpu((5, 64, 256), "bfloat16"))), ValueError, r"out\.shape\[2\] = 256 must be 512"),
    ("out contiguous", dict(out=o3(out=cpu((5, 64, 512), "bfloat16", strides=(64 * 1024, 1024, 1)))), ValueError,
     r"out must be contiguous"),
    ("max_logits dtype", dict(out=o3(ml=cpu((5, 64), "float64"))), TypeError,
     r"max_logits\.dtype = float64 must be float32"),
    ("lse shape", dict(out=o3(lse=cpu((5, 128), "float32"))), ValueError, r"lse\.shape\[1\] = 128 must be 64"),
    ("h_q", dict(q=cpu((5, 96, 512), "bfloat16"), out=o3(h_q=96)), ValueError, r"h_q = 96 must be 64 or 128"),
    ("d_qk", dict(q=cpu((5, 64, 256), "bfloat16"), kv=cpu((100, 1, 256), "bfloat16")), ValueError,
     r"d_qk = 256 must be 512 or 576"),
    ("s_kv", dict(kv=cpu((0, 1, 512), "bfloat16")), ValueError, r"s_kv = 0 must be at least 1"),
    ("sm_scale", dict(sm_scale=float("inf")), ValueError, r"sm_scale = inf must be finite"),
    ("q alignment", dict(q=cpu((5, 64, 512), "bfloat16", misalign=2)), ValueError, r"q = 0x[0-9a-f]+ must be 16-byte aligned"),
    ("out alignment", dict(out=o3(out=cpu((5, 64, 512), "bfloat16", misalign=8))), ValueError,
     r"out = 0x[0-9a-f]+ must be 16-byte aligned"),
    ("mixed devices", dict(kv=cuda((100, 1, 512), "bfloat16")), ValueError,
     r"kv is on cuda:0 but q is on cpu; every tensor of one call must be on the same device"),
    ("workspace dtype", dict(workspace=cpu((1024,), "int32")), TypeError, r"workspace\.dtype = int32 must be uint8"),
    ("workspace type", dict(workspace="x"), TypeError, r"workspace must be a uint8 array, a callable"),
    ("out tuple", dict(out=(cpu((5, 64, 512), "bfloat16"),)), TypeError, r"out must be a tuple \(out, max_logits, lse\)"),
    ("stream", dict(stream=None), TypeError, r"stream is required"),
]


@pytest.mark.parametrize("what, over, exc, pattern", MLA_CASES, ids=[c[0] for c in MLA_CASES])
def test_sparse_mla_refuses(what, over, exc, pattern):
    expect(exc, pattern, call_mla, mla_args(**over))


# ------------------------------------------------------------------ combine_topk_swa_indices
def combine_args(T=7, R=2, K=512, width=640, dev=cpu, **over):
    a = dict(
        topk_indices=dev((T, K), "int32"),
        query_start_loc=dev((R + 1,), "int32"),
        seq_lens=dev((R,), "int32"),
        gather_lens=dev((R,), "int32"),
        window_size=128,
        compress_ratio=4,
        topk=512,
        M=1000,
        N=200,
        out=(dev((T, width), "int32"), dev((T,), "int32")),
        stream=0,
    )
    a.update(over)
    return a


def call_combine(a):
    a = dict(a)
    names = ["topk_indices", "query_start_loc", "seq_lens", "gather_lens", "window_size", "compress_ratio",
             "topk", "M", "N"]
    return spgraph.combine_topk_swa_indices(*[a.pop(n) for n in names], **a)


def test_combine_valid_arguments_reach_the_device_check():
    expect(ValueError, "topk_indices is on cpu; spgraph's ops " + DEVICE_REFUSAL, call_combine, combine_args())
    # [T, 1, K] top-k (FlashMLA's index form), a wider row stride, M and N as host scalars of numpy
    expect(ValueError, DEVICE_REFUSAL, call_combine, combine_args(topk_indices=cpu((7, 1, 512), "int32")))
    expect(ValueError, DEVICE_REFUSAL, call_combine, combine_args(topk_indices=cpu((7, 512), "int32", strides=(1024, 1))))
    expect(ValueError, DEVICE_REFUSAL, call_combine, combine_args(M=cpu((1,), "int64"), N=cpu((), "int32")))
    expect(ValueError, DEVICE_REFUSAL, call_combine, combine_args(compress_ratio=1, topk=0, width=128))
    expect(ValueError, DEVICE_REFUSAL, call_combine, combine_args(status=cpu((10,), "int32")))


def test_combine_no_tokens_is_checked_like_any_call():
    expect(ValueError, DEVICE_REFUSAL, call_combine, combine_args(T=0))
    expect(ValueError, DEVICE_REFUSAL, call_combine, combine_args(T=0, R=0))  # an empty batch
    expect(ValueError, r"N = 2000 must be at most M = 1000", call_combine, combine_args(T=0, N=2000))
    expect(ValueError, r"window = 0 must be in \[1, 65536\]", call_combine, combine_args(T=0, window_size=0))
    expect(ValueError, r"seq_lens\.shape\[0\] \(num_reqs\) = 0 must be in \[1, 128\]", call_combine, combine_args(R=0))


@no_gpu_only
def test_combine_no_tokens_is_a_no_op():
    for a in (combine_args(T=0, dev=cuda), combine_args(T=0, R=0, dev=cuda)):
        got = call_combine(a)
        assert got[0] is a["out"][0] and got[1] is a["out"][1]


COMBINE_CASES = [
    ("topk dtype", dict(topk_indices=cpu((7, 512), "int64")), TypeError, r"topk_indices\.dtype = int64 must be int32"),
    ("topk rank", dict(topk_indices=cpu((7,), "int32")), ValueError, r"topk_indices\.shape = \[7\] must be \[num_tokens, topk\]"),
    ("topk width", dict(topk_indices=cpu((7, 256), "int32")), ValueError,
     r"topk_indices\.shape\[-1\] = 256 must be at least topk = 512"),
    ("topk last stride", dict(topk_indices=cpu((7, 512), "int32", strides=(1024, 2))), ValueError,
     r"topk_indices\.stride\(-1\) = 2 must be 1"),
    ("query_start_loc length", dict(query_start_loc=cpu((2,), "int32")), ValueError,
     r"query_start_loc\.shape\[0\] = 2 must be 3 \(num_reqs \+ 1"),
    ("seq_lens dtype", dict(seq_lens=cpu((2,), "int64")), TypeError, r"seq_lens\.dtype = int64 must be int32"),
    ("gather_lens length", dict(gather_lens=cpu((3,), "int32")), ValueError, r"gather_lens\.shape\[0\] = 3 must be 2"),
    ("no requests", dict(seq_lens=cpu((0,), "int32"), gather_lens=cpu((0,), "int32"), query_start_loc=cpu((1,), "int32")),
     ValueError, r"seq_lens\.shape\[0\] \(num_reqs\) = 0 must be in \[1, 128\]"),
    ("too many requests", dict(seq_lens=cpu((129,), "int32"), gather_lens=cpu((129,), "int32"),
                               query_start_loc=cpu((130,), "int32")),
     ValueError, r"seq_lens\.shape\[0\] \(num_reqs\) = 129 must be in \[1, 128\]"),
    ("combined rows", dict(out=(cpu((6, 640), "int32"), cpu((7,), "int32"))), ValueError,
     r"combined_indices\.shape\[0\] = 6 must be 7"),
    ("combined width", dict(out=(cpu((7, 636), "int32"), cpu((7,), "int32"))), ValueError,
     r"combined_width = 636 must be a multiple of 4 and at least top_k \+ window = 640"),
    ("combined narrow", dict(out=(cpu((7, 512), "int32"), cpu((7,), "int32"))), ValueError,
     r"combined_width = 512 must be a multiple of 4 and at least top_k \+ window = 640"),
    ("combined alignment", dict(out=(cpu((7, 640), "int32", misalign=4), cpu((7,), "int32"))), ValueError,
     r"combined = 0x[0-9a-f]+ must be 16-byte aligned"),
    ("lens dtype", dict(out=(cpu((7, 640), "int32"), cpu((7,), "uint32"))), TypeError,
     r"combined_lens\.dtype = uint32 must be int32"),
    ("ratio", dict(compress_ratio=2), ValueError, r"compress_ratio = 2 must be 1, 4 or 128"),
    ("topk for r = 1", dict(compress_ratio=1), ValueError, r"top_k = 512 must be 0 when compress_ratio = 1"),
    ("topk zero", dict(topk=0), ValueError, r"top_k = 0 must be in \[1, 65536\] when compress_ratio = 4"),
    ("window", dict(window_size=0), ValueError, r"window = 0 must be in \[1, 65536\]"),
    ("N > M", dict(M=100, N=200), ValueError, r"N = 200 must be at most M = 100"),
    ("M negative", dict(M=-1), ValueError, r"M = -1 must be in \[0, 2147483647\]"),
    ("M * requests past int32", dict(M=1 << 30), ValueError, r"M = 1073741824 must be in \[0, \(2\^31 - 1\) / requests"),
    ("M type", dict(M=1.5), TypeError, r"M must be an int or a one-element int32 device tensor, not float"),
    ("M elements", dict(M=cpu((2,), "int32")), ValueError, r"M\.shape = \[2\] must hold one element"),
    ("N host dtype", dict(N=cpu((1,), "float32")), TypeError, r"N\.dtype = float32 must be int32 or int64"),
    ("M device dtype", dict(M=cuda((1,), "int64")), TypeError, r"M\.dtype = int64 must be int32"),
    ("M device", dict(M=cuda((1,), "int32")), ValueError, r"M is on cuda:0 but topk_indices is on cpu"),
    ("status words", dict(status=cpu((9,), "int32")), ValueError, r"status\.shape\[0\] = 9 must be 10"),
    ("status dtype", dict(status=cpu((10,), "float32")), TypeError, r"status\.dtype = float32 must be int32"),
    ("status device", dict(status=cuda((10,), "int32")), ValueError, r"status is on cuda:0 but topk_indices is on cpu"),
    ("out pair", dict(out=cpu((7, 640), "int32")), TypeError, r"out must be a tuple \(combined_indices, combined_lens\)"),
]


@pytest.mark.parametrize("what, over, exc, pattern", COMBINE_CASES, ids=[c[0] for c in COMBINE_CASES])
def test_combine_refuses(what, over, exc, pattern):
    expect(exc, pattern, call_combine, combine_args(**over))


# ------------------------------------------------------------------------- FP8 cache insert
def insert_args(n=9, **over):
    a = dict(k=cpu((n, 512), "bfloat16"), k_cache=cpu((4, 37440), "uint8"), slot_mapping=cpu((n,), "int32"),
             block_size=64, stream=0)
    a.update(over)
    return a


def call_insert(a):
    a = dict(a)
    return spgraph.quantize_and_insert_k_cache(a.pop("k"), a.pop("k_cache"), a.pop("slot_mapping"),
                                               a.pop("block_size"), **a)


def test_insert_valid_arguments_reach_the_device_check():
    expect(ValueError, "k is on cpu; spgraph's ops " + DEVICE_REFUSAL, call_insert, insert_args())
    # [num_blocks, block_size, 584] views at the padded block stride, and flat bytes
    expect(ValueError, DEVICE_REFUSAL, call_insert,
           insert_args(k_cache=cpu((4, 64, 584), "uint8", strides=(37440, 584, 1))))
    expect(ValueError, DEVICE_REFUSAL, call_insert, insert_args(k_cache=cpu((4 * 37440,), "uint8")))
    expect(ValueError, DEVICE_REFUSAL, call_insert, insert_args(k_cache=cpu((3, 1728), "uint8"), block_size=2))
    expect(ValueError, DEVICE_REFUSAL, call_insert, insert_args(status=cpu((10,), "int32")))


def test_insert_no_rows_is_checked_like_any_call():
    expect(ValueError, DEVICE_REFUSAL, call_insert, insert_args(n=0))
    expect(ValueError, r"k_cache\.stride\(0\) = 37504 bytes must be the V4 block stride", call_insert,
           insert_args(n=0, k_cache=cpu((4, 37440), "uint8", strides=(37504, 1))))
    expect(TypeError, r"slot_mapping\.dtype = int64 must be int32", call_insert,
           insert_args(n=0, slot_mapping=cpu((0,), "int64")))


@no_gpu_only
def test_insert_no_rows_is_a_no_op():
    assert call_insert(insert_args(n=0, k=cuda((0, 512), "bfloat16"), k_cache=cuda((4, 37440), "uint8"),
                                   slot_mapping=cuda((0,), "int32"))) is None


INSERT_CASES = [
    ("k dtype", dict(k=cpu((9, 512), "float32")), TypeError, r"k\.dtype = float32 must be bfloat16"),
    ("k width", dict(k=cpu((9, 448), "bfloat16")), ValueError, r"k\.shape\[1\] = 448 must be 512"),
    ("k contiguous", dict(k=cpu((9, 512), "bfloat16", strides=(1024, 1))), ValueError, r"k must be contiguous"),
    ("k alignment", dict(k=cpu((9, 512), "bfloat16", misalign=2)), ValueError, r"rows = 0x[0-9a-f]+ must be 16-byte aligned"),
    ("slots dtype", dict(slot_mapping=cpu((9,), "int64")), TypeError, r"slot_mapping\.dtype = int64 must be int32"),
    ("slots length", dict(slot_mapping=cpu((8,), "int32")), ValueError, r"slot_mapping\.shape\[0\] = 8 must be 9"),
    ("cache dtype", dict(k_cache=cpu((4, 37440), "int8")), TypeError, r"k_cache\.dtype = int8 must be uint8"),
    ("cache stride", dict(k_cache=cpu((4, 37376), "uint8")), ValueError,
     r"k_cache\.stride\(0\) = 37376 bytes must be the V4 block stride round_up\(block_size \* 584, 576\) = 37440"),
    ("cache block too small", dict(k_cache=cpu((4, 64, 576), "uint8", strides=(37440, 576, 1))), ValueError,
     r"a block holds 36864 bytes .* must hold block_size \* 584 = 37376 to 37440"),
    ("cache inner strides", dict(k_cache=cpu((4, 64, 584), "uint8", strides=(37440, 1, 64))), ValueError,
     r"the bytes of one block must be contiguous"),
    ("cache flat size", dict(k_cache=cpu((1000,), "uint8")), ValueError,
     r"k_cache\.shape = \[1000\] \(flat bytes\) must be a multiple of the block stride 37440"),
    ("cache empty", dict(k_cache=cpu((0, 37440), "uint8")), ValueError, r"number of cache blocks = 0 must be in \[1, "),
    ("cache alignment", dict(k_cache=cpu((4, 37440), "uint8", misalign=8)), ValueError,
     r"cache = 0x[0-9a-f]+ must be 16-byte aligned"),
    ("block_size", dict(block_size=0), ValueError, r"block_size = 0 must be in \[1, 65536\]"),
    ("mixed devices", dict(k_cache=cuda((4, 37440), "uint8")), ValueError, r"k_cache is on cuda:0 but k is on cpu"),
    ("status", dict(status=cpu((10, 1), "int32")), ValueError, r"status\.shape = \[10, 1\] must be \[10\] int32"),
]


@pytest.mark.parametrize("what, over, exc, pattern", INSERT_CASES, ids=[c[0] for c in INSERT_CASES])
def test_insert_refuses(what, over, exc, pattern):
    expect(exc, pattern, call_insert, insert_args(**over))


# ------------------------------------------------------------------------- dequant-gather
def gather_args(R=2, M=300, **over):
    a = dict(out=cpu((R + 1, M, 512), "bfloat16"), k_cache=cpu((4, 37440), "uint8"), seq_lens=cpu((R,), "int32"),
             gather_lens=cpu((R,), "int32"), block_table=cpu((R, 5), "int32"), block_size=64, offset=100, stream=0)
    a.update(over)
    return a


def call_gather(a):
    a = dict(a)
    names = ["out", "k_cache", "seq_lens", "gather_lens", "block_table", "block_size", "offset"]
    return spgraph.dequantize_and_gather_k_cache(*[a.pop(n) for n in names], **a)


def test_gather_valid_arguments_reach_the_device_check():
    expect(ValueError, "out is on cpu; spgraph's ops " + DEVICE_REFUSAL, call_gather, gather_args())
    expect(ValueError, DEVICE_REFUSAL, call_gather, gather_args(gather_lens=None, offset=0))
    expect(ValueError, DEVICE_REFUSAL, call_gather, gather_args(offset=300))


def empty_gather_args(dev=cpu, **over):
    a = dict(out=dev((0, 300, 512), "bfloat16"), k_cache=dev((4, 37440), "uint8"), seq_lens=dev((0,), "int32"),
             gather_lens=dev((0,), "int32"), block_table=dev((0, 5), "int32"))
    a.update(over)
    return gather_args(R=0, **a)


def test_gather_no_requests_is_checked_like_any_call():
    expect(ValueError, DEVICE_REFUSAL, call_gather, empty_gather_args())
    expect(ValueError, DEVICE_REFUSAL, call_gather, empty_gather_args(out=cpu((0, 0, 512), "bfloat16"), offset=0,
                                                                      block_table=cpu((0, 0), "int32")))
    expect(ValueError, r"offset = 301 must be in \[0, 300\]", call_gather, empty_gather_args(offset=301))
    expect(ValueError, r"k_cache\.stride\(0\) = 100 bytes must be the V4 block stride", call_gather,
           empty_gather_args(k_cache=cpu((4, 100), "uint8")))


@no_gpu_only
def test_gather_no_requests_is_a_no_op():
    assert call_gather(empty_gather_args(dev=cuda)) is None


GATHER_CASES = [
    ("out dtype", dict(out=cpu((3, 300, 512), "float32")), TypeError, r"out\.dtype = float32 must be bfloat16"),
    ("out width", dict(out=cpu((3, 300, 256), "bfloat16")), ValueError, r"out\.shape\[2\] = 256 must be 512"),
    ("out contiguous", dict(out=cpu((3, 300, 512), "bfloat16", strides=(400 * 512, 512, 1))), ValueError,
     r"out must be contiguous"),
    ("out requests", dict(out=cpu((1, 300, 512), "bfloat16")), ValueError,
     r"out\.shape\[0\] = 1 must be at least num_reqs = 2"),
    ("out rows", dict(out=cpu((3, 0, 512), "bfloat16")), ValueError,
     r"out\.shape\[1\] \(rows per request\) = 0 must be in \[1, "),
    ("offset", dict(offset=301), ValueError, r"offset = 301 must be in \[0, 300\]"),
    ("seq_lens dtype", dict(seq_lens=cpu((2,), "uint32")), TypeError, r"seq_lens\.dtype = uint32 must be int32"),
    ("gather_lens length", dict(gather_lens=cpu((3,), "int32")), ValueError, r"gather_lens\.shape\[0\] = 3 must be 2"),
    ("table rows", dict(block_table=cpu((3, 5), "int32")), ValueError, r"block_table\.shape\[0\] = 3 must be 2"),
    ("table contiguous", dict(block_table=cpu((2, 5), "int32", strides=(8, 1))), ValueError,
     r"block_table must be contiguous"),
    ("table width", dict(block_table=cpu((2, 0), "int32")), ValueError, r"block_table\.shape\[1\] = 0 must be in \[1, "),
    ("too many requests", dict(seq_lens=cpu((129,), "int32"), gather_lens=None, block_table=cpu((129, 5), "int32"),
                               out=cpu((129, 300, 512), "bfloat16")),
     ValueError, r"seq_lens\.shape\[0\] \(num_reqs\) = 129 must be in \[0, 128\]"),
    ("cache stride", dict(k_cache=cpu((4, 37440), "uint8"), block_size=32), ValueError,
     r"k_cache\.stride\(0\) = 37440 bytes must be the V4 block stride .* = 19008 for block_size = 32"),
    ("mixed devices", dict(seq_lens=cuda((2,), "int32")), ValueError, r"seq_lens is on cuda:0 but out is on cpu"),
]


@pytest.mark.parametrize("what, over, exc, pattern", GATHER_CASES, ids=[c[0] for c in GATHER_CASES])
def test_gather_refuses(what, over, exc, pattern):
    expect(exc, pattern, call_gather, gather_args(**over))


# ------------------------------------------------------------------------ error translation
def test_errors_keep_their_types_with_the_counter_module_loaded():
    """spgraph._cupti (the allocation counter the GPU tests load) must not change how _spgraph's
    errors surface: nanobind tries the exception translators of a domain newest first, and a
    catch-all spg::Error translator in _cupti once turned every ValueError (InvalidArgument) into
    RuntimeError for the rest of the process. In a subprocess, so this process's modules stay as
    they are."""
    import subprocess
    import sys

    code = """
import os, sys
sys.path.insert(0, os.environ["STUBS"])
import spgraph, spgraph._cupti
from dlpack_stub import cpu
q, kv = cpu((5, 64, 512), "bfloat16"), cpu((100, 1, 512), "bfloat16")
out = (cpu((5, 64, 512), "bfloat16"), cpu((5, 64), "float32"), cpu((5, 64), "float32"))
def kind(fn):
    try:
        fn()
    except Exception as e:
        return type(e).__name__
    return "nothing"
print(kind(lambda: spgraph.sparse_mla_fwd(q, kv, cpu((5, 1, 100), "int32"), 0.1, out=out, stream=0)))  # InvalidArgument
print(kind(lambda: spgraph.PipelineConfig(max_requests=0).validate()))
print(kind(lambda: spgraph._cupti.count()))  # the counter's own errors (none where CUPTI attaches)
"""
    import os

    env = dict(os.environ, STUBS=os.path.dirname(__file__))
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert got.returncode == 0, got.stderr
    lines = got.stdout.split()
    assert lines[0] == "ValueError", got.stdout
    assert lines[1] == "ValueError", got.stdout
    assert lines[2] in ("RuntimeError", "nothing"), got.stdout

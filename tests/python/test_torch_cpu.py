"""CPU, with torch: the custom ops' registration, mutation annotations and fake implementations,
errors through the torch layer, and torch.compile(fullgraph=True) tracing through the ops.

Fake tensors on device "cuda" need no GPU, so shapes and tracing are checked here; running the
ops is the GPU tests' part. Skipped (not passed) where torch is not installed.
"""

import pytest

from conftest import HAVE_TORCH, needs_torch

pytestmark = needs_torch

if HAVE_TORCH:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import spgraph.torch as st

OPS = [
    "sparse_mla_fwd",
    "sparse_mla_fwd_out",
    "combine_topk_swa_indices",
    "combine_topk_swa_indices_out",
    "quantize_and_insert_k_cache",
    "dequantize_and_gather_k_cache",
]

MUTATED = {
    "sparse_mla_fwd": set(),
    "sparse_mla_fwd_out": {"out", "max_logits", "lse", "workspace"},
    "combine_topk_swa_indices": set(),
    "combine_topk_swa_indices_out": {"combined_indices", "combined_lens", "status"},
    "quantize_and_insert_k_cache": {"k_cache", "status"},
    "dequantize_and_gather_k_cache": {"out", "status"},
}


@pytest.mark.parametrize("name", OPS)
def test_ops_are_registered_with_their_mutations(name):
    schema = getattr(torch.ops.spgraph, name).default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == MUTATED[name], str(schema)


def mla_inputs(device, s_q=5, h_q=64, d_qk=512, s_kv=100, topk=128):
    return (torch.empty(s_q, h_q, d_qk, dtype=torch.bfloat16, device=device),
            torch.empty(s_kv, 1, d_qk, dtype=torch.bfloat16, device=device),
            torch.empty(s_q, 1, topk, dtype=torch.int32, device=device))


def combine_inputs(device, T=7, R=2, topk=512):
    return (torch.empty(T, topk, dtype=torch.int32, device=device), torch.empty(R + 1, dtype=torch.int32, device=device),
            torch.empty(R, dtype=torch.int32, device=device), torch.empty(R, dtype=torch.int32, device=device))


@pytest.mark.parametrize("h_q, d_qk, s_q", [(64, 512, 5), (128, 576, 1), (128, 512, 0)])
def test_fake_sparse_mla_shapes(h_q, d_qk, s_q):
    with FakeTensorMode():
        q, kv, idx = mla_inputs("cuda", s_q=s_q, h_q=h_q, d_qk=d_qk)
        out, ml, lse = st.sparse_mla_fwd(q, kv, idx, d_qk ** -0.5, attn_sink=torch.empty(h_q, device="cuda"))
        assert (out.shape, out.dtype, out.device.type) == ((s_q, h_q, 512), torch.bfloat16, "cuda")
        assert (ml.shape, ml.dtype) == ((s_q, h_q), torch.float32)
        assert (lse.shape, lse.dtype) == ((s_q, h_q), torch.float32)
        given = (torch.empty(s_q, h_q, 512, dtype=torch.bfloat16, device="cuda"),
                 torch.empty(s_q, h_q, device="cuda"), torch.empty(s_q, h_q, device="cuda"))
        got = st.sparse_mla_fwd(q, kv, idx, 0.1, out=given)
        assert all(a is b for a, b in zip(got, given))
        only_out = st.sparse_mla_fwd(q, kv, idx, 0.1, out=given[0])  # vLLM's fork: out alone
        assert only_out[0] is given[0] and only_out[1].shape == (s_q, h_q)


@pytest.mark.parametrize("topk, window, ratio, width", [(512, 128, 4, 640), (1024, 128, 4, 1152), (0, 128, 1, 128),
                                                       (512, 64, 128, 640)])
def test_fake_combine_shapes(topk, window, ratio, width):
    with FakeTensorMode():
        inputs = combine_inputs("cuda", topk=max(topk, 1))
        combined, lens = st.combine_topk_swa_indices(*inputs, window, ratio, topk, 1000,
                                                     torch.empty(1, dtype=torch.int32, device="cuda"))
        assert (combined.shape, combined.dtype) == ((7, width), torch.int32)
        assert (lens.shape, lens.dtype) == ((7,), torch.int32)
        given = (torch.empty(7, width, dtype=torch.int32, device="cuda"), torch.empty(7, dtype=torch.int32, device="cuda"))
        got = st.combine_topk_swa_indices(*inputs, window, ratio, topk, 1000, 10, out=given)
        assert got[0] is given[0] and got[1] is given[1]


def test_fake_cache_ops_return_nothing():
    with FakeTensorMode():
        k = torch.empty(9, 512, dtype=torch.bfloat16, device="cuda")
        cache = torch.empty(4, 37440, dtype=torch.uint8, device="cuda")
        slots = torch.empty(9, dtype=torch.int32, device="cuda")
        assert st.quantize_and_insert_k_cache(k, cache, slots, 64) is None
        out = torch.empty(2, 300, 512, dtype=torch.bfloat16, device="cuda")
        lens = torch.empty(2, dtype=torch.int32, device="cuda")
        table = torch.empty(2, 5, dtype=torch.int32, device="cuda")
        assert st.dequantize_and_gather_k_cache(out, cache, lens, None, table, 64, 0) is None


def test_errors_surface_through_the_torch_layer():
    # As in the GPU runs, where the allocation counter's module is loaded by then: it must not
    # change the types (test_args.py, test_errors_keep_their_types_with_the_counter_module_loaded).
    import spgraph._cupti  # noqa: F401

    q, kv, idx = mla_inputs("cpu")
    with pytest.raises(TypeError, match=r"q\.dtype = float32 must be bfloat16"):
        st.sparse_mla_fwd(q.float(), kv, idx, 0.1)
    with pytest.raises(ValueError, match=r"topk = 100 must be a positive multiple of 64"):
        st.sparse_mla_fwd(q, kv, idx[..., :100].contiguous(), 0.1)
    with pytest.raises(ValueError, match=r"d_v = 256 must be 512"):
        st.sparse_mla_fwd(q, kv, idx, 0.1, d_v=256)
    with pytest.raises(ValueError, match=r"q is on cpu; spgraph's ops run on CUDA device memory"):
        st.sparse_mla_fwd(q, kv, idx, 0.1)
    inputs = combine_inputs("cpu")
    with pytest.raises(ValueError, match=r"N = 2000 must be at most M = 1000"):
        st.combine_topk_swa_indices(*inputs, 128, 4, 512, 1000, 2000)
    with pytest.raises(TypeError, match=r"M must be an int or a one-element int32 device tensor, not float"):
        st.combine_topk_swa_indices(*inputs, 128, 4, 512, 1.5, 10)
    with pytest.raises(TypeError, match=r"slot_mapping\.dtype = int64 must be int32"):
        st.quantize_and_insert_k_cache(torch.empty(3, 512, dtype=torch.bfloat16), torch.empty(2, 37440, dtype=torch.uint8),
                                       torch.zeros(3, dtype=torch.int64), 64)
    with pytest.raises(ValueError, match=r"offset = 301 must be in \[0, 300\]"):
        st.dequantize_and_gather_k_cache(torch.empty(2, 300, 512, dtype=torch.bfloat16),
                                         torch.empty(2, 37440, dtype=torch.uint8), torch.zeros(2, dtype=torch.int32),
                                         None, torch.zeros(2, 3, dtype=torch.int32), 64, 301)


def test_plain_eager_calls_skip_the_dispatcher_and_nothing_else_does(monkeypatch):
    # In plain eager mode the public functions call the op's kernel directly; under any tracing,
    # mode, transform or profiler, and for tensors that require grad or are subclasses, they go
    # through torch.ops.spgraph (the compile and make_fx tests below need that path).
    plain = [torch.empty(3), None, torch.empty(2, dtype=torch.int32)]
    assert st._direct(plain)
    assert not st._direct(plain + [torch.zeros(2, requires_grad=True)])
    with FakeTensorMode() as mode:
        assert not st._direct(plain)
        fake = torch.empty(3)
    assert not st._direct(plain + [fake])  # a tensor subclass, outside its mode
    with torch.device("cpu"):  # a torch function mode
        assert not st._direct(plain)
    with torch.profiler.profile():
        assert not st._direct(plain)
    seen = torch.vmap(lambda x: torch.full_like(x, float(st._direct([x]))))(torch.zeros(2, 3))
    assert not seen.any()
    assert st._direct(plain)  # and back
    del mode

    # Which path a call takes: the dispatcher's op is replaced by a recorder that raises.
    calls = []

    def recorder(*args):
        calls.append(args)
        raise LookupError("dispatched")

    monkeypatch.setattr(torch.ops.spgraph, "sparse_mla_fwd", recorder)
    q, kv, idx = mla_inputs("cpu")
    with pytest.raises(ValueError, match="run on CUDA device memory"):  # the kernel itself, directly
        st.sparse_mla_fwd(q, kv, idx, 0.1)
    assert calls == []
    with pytest.raises(LookupError, match="dispatched"):
        st.sparse_mla_fwd(q, kv, idx, 0.1, attn_sink=torch.zeros(64, requires_grad=True))
    assert len(calls) == 1


def test_errors_surface_through_the_dispatcher_too():
    q, kv, idx = mla_inputs("cpu")
    with pytest.raises(ValueError, match=r"topk = 100 must be a positive multiple of 64"):
        torch.ops.spgraph.sparse_mla_fwd(q, kv, idx[..., :100].contiguous(), 0.1, 512, None, None)
    with pytest.raises(TypeError, match=r"q\.dtype = float32 must be bfloat16"):
        torch.ops.spgraph.sparse_mla_fwd_out(q.float(), kv, idx, 0.1, 512, None, None, q, q, q, None)


def test_tensors_that_require_grad_are_taken():
    q, kv, idx = mla_inputs("cpu")
    sink = torch.zeros(64, requires_grad=True)
    with pytest.raises(ValueError, match="run on CUDA device memory"):  # got past the DLPack export
        st.sparse_mla_fwd(q, kv, idx, 0.1, attn_sink=sink)


def test_torch_tensors_are_read_without_dlpack_as_dlpack_reads_them(monkeypatch):
    # The ops read a torch tensor through torch's C-level export (torch_view), not through its
    # Python-level __dlpack__: the same view __dlpack__ gives, for views with offsets,
    # transposes, steps, every dtype the ops see, and empty tensors.
    from spgraph import _spgraph as C
    base = torch.arange(4 * 6 * 8, dtype=torch.float32).reshape(4, 6, 8)
    tensors = [
        base, base[1:, 2:5, ::2], base.transpose(0, 2), base[0], base[:, 3], base.reshape(-1)[7:8],
        torch.zeros(5, 3, dtype=torch.bfloat16), torch.zeros(2, 9, dtype=torch.int32).t(),
        torch.zeros(16, dtype=torch.uint8), torch.zeros(3, 2, dtype=torch.int64), torch.zeros(4, dtype=torch.bool),
        torch.empty(0, 512, dtype=torch.bfloat16), torch.tensor(3.0),
    ]
    want = [C._array_view_dlpack(t) for t in tensors]
    calls = []
    dlpack = torch.Tensor.__dlpack__
    monkeypatch.setattr(torch.Tensor, "__dlpack__", lambda self, *a, **k: calls.append(1) or dlpack(self, *a, **k))
    got = [C._array_view(t) for t in tensors]
    assert calls == []  # not one __dlpack__ call
    for t, g, w in zip(tensors, got, want):
        assert g == w, f"{t.dtype} {tuple(t.shape)} {t.stride()}: {g} != {w}"
    assert got[1][1:3] == ((3, 3, 4), (48, 8, 2)) and got[1][0] == base.data_ptr() + 4 * (48 + 16)
    # What DLPack exports otherwise, or refuses, still goes through it: a tensor that requires
    # grad, a conjugate view, and a real tensor with the negative bit (the .imag of a conjugate
    # view), whose export would otherwise read the values without their sign.
    negative = torch.ones(3, dtype=torch.complex64).conj().imag
    assert negative.is_neg() and negative.dtype == torch.float32
    for t in (torch.zeros(3, requires_grad=True), torch.zeros(3, dtype=torch.complex64).conj(), negative):
        calls.clear()
        try:
            C._array_view(t)
        except (TypeError, RuntimeError, BufferError):
            pass
        assert calls, f"{t}: expected the DLPack path"
    host = torch.zeros(3).numpy()  # not a torch tensor: DLPack, as before
    assert C._array_view(host) == C._array_view_dlpack(host)


def prefill_step(topk_indices, qsl, seq_lens, gather_lens, q, kv, sink, M, N):
    combined, lens = st.combine_topk_swa_indices(topk_indices, qsl, seq_lens, gather_lens, 128, 4, 512, M, N)
    return st.sparse_mla_fwd(q, kv, combined.unsqueeze(1), q.shape[-1] ** -0.5, attn_sink=sink, topk_length=lens)


def test_compile_fullgraph_traces_through_the_ops():
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    step = torch.compile(prefill_step, fullgraph=True, backend=record)
    q, kv, _ = mla_inputs("cpu", s_q=7)
    M = torch.tensor([300], dtype=torch.int32)
    with pytest.raises(ValueError, match="run on CUDA device memory"):  # traced whole, then run on the host
        step(*combine_inputs("cpu"), q, kv, torch.zeros(64), M, 100)
    assert len(graphs) == 1
    targets = {str(n.target).removesuffix(".default") for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert {"spgraph.combine_topk_swa_indices", "spgraph.sparse_mla_fwd"} <= targets, targets


def test_fake_tracing_builds_a_graph_of_the_ops():
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        q, kv, _ = mla_inputs("cuda", s_q=7)
        args = (*combine_inputs("cuda"), q, kv, torch.zeros(64, device="cuda"),
                torch.empty(1, dtype=torch.int32, device="cuda"), 100)
    gm = make_fx(prefill_step, tracing_mode="fake")(*args)
    ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "spgraph.combine_topk_swa_indices.default" in ops and "spgraph.sparse_mla_fwd.default" in ops
    del mode

"""GPU: every op through spgraph.torch against the references of references.py (written from
docs/pipeline.md) on seeded random non-zero inputs, with the spec's accuracy bars; the
index-invariance check; torch.cuda.graph capture and replay with new data equal to eager;
torch.compile(fullgraph=True) equal to eager; torch.library.opcheck of each op; no allocation and
no host sync with out=; launches on the caller's stream.

Skipped (reported as skipped) without torch or a CUDA device. Outputs are poisoned with NaN (0xFF
bytes) before each call, so an element the op should have written and did not fails.
"""

import math
import zlib

import pytest

from conftest import HAVE_CUDA

pytestmark = pytest.mark.gpu

if HAVE_CUDA:
    import torch

    import references as ref
    import spgraph
    import spgraph.torch as st

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
DEV = "cuda"


def gen(seed):
    return torch.Generator().manual_seed(seed)


def nonzero(shape, g, scale=0.1, dtype=None):
    """Normal values of standard deviation `scale` (0.1: the scale the bars are calibrated for,
    docs/testing.md), never exactly zero."""
    x = (torch.randn(shape, generator=g) * scale).to(dtype or torch.bfloat16)
    x[x == 0] = 1e-3
    return x.to(DEV)


def poisoned(shape, dtype, byte=0xFF):
    """0xFF bytes: NaN for floats; int buffers whose untouched entries are checked use another byte."""
    t = torch.empty(shape, dtype=dtype, device=DEV)
    if t.numel():
        t.view(torch.uint8).fill_(byte)
    return t


# ----------------------------------------------------------------------------- attention
def attention_problem(seed, s_q, s_kv, h_q, d_qk, topk, sink, lengths, bad=0):
    g = gen(seed)
    q = nonzero((s_q, h_q, d_qk), g)
    kv = nonzero((s_kv, 1, d_qk), g)
    idx = torch.randint(0, s_kv, (s_q, 1, topk), generator=g, dtype=torch.int32)
    if bad:
        values = torch.tensor([-1, -2, INT32_MIN, s_kv, s_kv + 7, INT32_MAX], dtype=torch.int32)
        where = torch.randint(0, s_q * topk, (bad,), generator=g)
        idx.view(-1)[where] = values[torch.randint(0, len(values), (bad,), generator=g)]
    attn_sink = None
    if sink:
        attn_sink = (torch.randn(h_q, generator=g) * 0.5).float()
        attn_sink[0], attn_sink[h_q - 1] = math.inf, -math.inf
        attn_sink = attn_sink.to(DEV)
    topk_length = None
    if lengths:
        topk_length = torch.randint(0, topk + 1, (s_q,), generator=g, dtype=torch.int32)
        topk_length[0] = 0  # an empty row
        topk_length = topk_length.to(DEV)
    return q, kv, idx.to(DEV), d_qk ** -0.5, attn_sink, topk_length


def run_attention(q, kv, idx, scale, sink, lengths, workspace=None):
    s_q, h_q = q.shape[:2]
    out = (poisoned((s_q, h_q, 512), torch.bfloat16), poisoned((s_q, h_q), torch.float32),
           poisoned((s_q, h_q), torch.float32))
    return st.sparse_mla_fwd(q, kv, idx, scale, attn_sink=sink, topk_length=lengths, out=out, workspace=workspace)


GRID = [(s_q, s_kv, topk) for (s_q, s_kv, topk) in [(1, 577, 64), (37, 4099, 640), (213, 9001, 1152)]]


@pytest.mark.parametrize("h_q", [64, 128])
@pytest.mark.parametrize("d_qk", [512, 576])
@pytest.mark.parametrize("sink", [False, True], ids=["nosink", "sink"])
@pytest.mark.parametrize("lengths", [False, True], ids=["full", "topk_length"])
@pytest.mark.parametrize("s_q, s_kv, topk", GRID)
def test_sparse_mla_matches_reference(h_q, d_qk, sink, lengths, s_q, s_kv, topk):
    args = attention_problem(1000 * h_q + d_qk + 7 * s_q + sink + 2 * lengths, s_q, s_kv, h_q, d_qk, topk, sink,
                             lengths, bad=s_q * topk // 50)
    want = ref.sparse_mla(*args)
    got = st.sparse_mla_fwd(*args[:4], attn_sink=args[4], topk_length=args[5])  # allocates, workspace included
    ref.check_attention(got, want)
    single = run_attention(*args)  # out= without workspace: the single pass
    ref.check_attention(single, want)
    nbytes = spgraph.sparse_mla_workspace_bytes(s_q, h_q, d_qk, topk, torch.cuda.current_device())
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=DEV)
    planned = run_attention(*args, workspace=ws)  # out= with workspace: the plan of the allocating call
    for a, b, name in zip(planned, got, ("out", "max_logits", "lse")):
        assert not ref.first_difference(a, b, name)


def test_sparse_mla_every_invalid_index_and_empty_rows():
    s_q, s_kv, h_q, d_qk, topk = 41, 1000, 128, 512, 256
    q, kv, idx, scale, sink, _ = attention_problem(5, s_q, s_kv, h_q, d_qk, topk, True, False)
    bad = torch.tensor([-1, -2, INT32_MIN, s_kv, s_kv + 1, INT32_MAX], dtype=torch.int32, device=DEV)
    idx[:, :, :6] = bad  # every kind of invalid value in every row
    idx[3] = -1  # empty rows: all -1, and all >= s_kv
    idx[4] = s_kv
    lengths = torch.full((s_q,), topk, dtype=torch.int32, device=DEV)
    lengths[5] = 6  # only invalid entries before the length: empty
    lengths[6] = 0
    lengths[7] = 100  # valid values past the length are never read
    want = ref.sparse_mla(q, kv, idx, scale, sink, lengths)
    for got in (st.sparse_mla_fwd(q, kv, idx, scale, attn_sink=sink, topk_length=lengths),
                run_attention(q, kv, idx, scale, sink, lengths)):
        ref.check_attention(got, want)
        for t in (3, 4, 5, 6):
            assert (got[0][t] == 0).all()
            assert (got[1][t] == -math.inf).all() and (got[2][t] == math.inf).all()


@pytest.mark.parametrize("d_qk", [512, 576])
@pytest.mark.parametrize("h_q", [64, 128])
def test_sparse_mla_topk_length_1_reads_only_index_0(d_qk, h_q):
    """The index-invariance check: all but the first index -1, or random, with topk_length 1:
    out, max_logits and lse bit-identical."""
    s_q, s_kv, topk = 37, 1000, 256
    q, kv, full, scale, sink, _ = attention_problem(11 + d_qk + h_q, s_q, s_kv, h_q, d_qk, topk, True, False)
    ones = torch.ones(s_q, dtype=torch.int32, device=DEV)
    first = full.clone()
    first[:, :, 1:] = -1
    for run in (lambda i: st.sparse_mla_fwd(q, kv, i, scale, attn_sink=sink, topk_length=ones),
                lambda i: run_attention(q, kv, i, scale, sink, ones)):
        a, b = run(first), run(full)
        for x, y, name in zip(a, b, ("out", "max_logits", "lse")):
            diff = ref.first_difference(x, y, name)
            assert not diff, diff
        ref.check_attention(a, ref.sparse_mla(q, kv, first, scale, sink, ones))


def test_sparse_mla_empty_query():
    q = torch.empty(0, 128, 512, dtype=torch.bfloat16, device=DEV)
    kv = torch.empty(10, 1, 512, dtype=torch.bfloat16, device=DEV)
    idx = torch.empty(0, 1, 64, dtype=torch.int32, device=DEV)
    out, m, lse = st.sparse_mla_fwd(q, kv, idx, 0.1)
    assert out.shape == (0, 128, 512) and m.shape == (0, 128) and lse.shape == (0, 128)


def test_sparse_mla_padded_kv_rows():
    s_q, s_kv, h_q, d_qk, topk = 19, 700, 64, 576, 128
    q, kv, idx, scale, sink, lengths = attention_problem(3, s_q, s_kv, h_q, d_qk, topk, True, True)
    wide = poisoned((s_kv, 1, 640), torch.bfloat16)  # NaN padding must never be read
    wide[:, :, :d_qk] = kv
    got = st.sparse_mla_fwd(q, wide[:, :, :d_qk], idx, scale, attn_sink=sink, topk_length=lengths)
    ref.check_attention(got, ref.sparse_mla(q, kv, idx, scale, sink, lengths))


# --------------------------------------------------------------------------------- combine
def combine_problem(seed, r, topk, window, lens, base=0, bad=0):
    """lens: (query_len, seq_len) per request; returns the op's arguments (M, N as ints)."""
    g = gen(seed)
    q_lens = [q for q, _ in lens]
    seqs = [s for _, s in lens]
    gathers = [min(s, q + window - 1) for q, s in lens]
    qsl = [base]
    for q in q_lens:
        qsl.append(qsl[-1] + q)
    T = qsl[-1] - base
    N = max((s // r for s in seqs), default=0) if r > 1 else 0
    M = N + max(gathers) + 3
    topk_w = max(topk, 1)
    topk_indices = torch.full((T, topk_w), -1, dtype=torch.int32)
    t = 0
    for q, s in lens:
        rows = s // r if r > 1 else 0
        for _ in range(q):
            if rows:
                topk_indices[t] = torch.randint(0, rows, (topk_w,), generator=g, dtype=torch.int32)
            t += 1
    if bad and T:
        where = torch.randint(0, T * topk_w, (bad,), generator=g)
        topk_indices.view(-1)[where] = torch.tensor([-2, INT32_MIN, 1 << 30, 123456], dtype=torch.int32)[
            torch.randint(0, 4, (bad,), generator=g)]
    i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=DEV)  # noqa: E731
    return (topk_indices.to(DEV), i32(qsl), i32(seqs), i32(gathers), window, r, topk, M, N)


def check_combine(got, want_rows, want_lens, untouched=None):
    combined, lens = (x.cpu() for x in got)
    assert lens.tolist() == want_lens
    for t, row in enumerate(want_rows):
        assert combined[t, :len(row)].tolist() == row, f"token {t}"
        if untouched is not None:
            assert torch.equal(combined[t, len(row):], untouched[t, len(row):]), f"token {t}: entries past lens"


COMBINE_CASES = {
    "c4a": (4, 512, 128, [(37, 1000), (0, 50), (61, 61), (5, 4099)]),
    "c4a-1024": (4, 1024, 128, [(97, 2000), (3, 3)]),
    "c128a": (128, 512, 128, [(13, 70000), (40, 130)]),
    "c128a-topk-not-multiple-of-4": (128, 66, 64, [(17, 9000)]),
    "swa": (1, 0, 128, [(29, 300), (1, 1), (8, 200)]),
}


@pytest.mark.parametrize("case", list(COMBINE_CASES))
@pytest.mark.parametrize("scalars", ["int", "device"])
def test_combine_matches_reference(case, scalars):
    r, topk, window, lens = COMBINE_CASES[case]
    args = combine_problem(zlib.crc32(case.encode()) % 1000, r, topk, window, lens, base=17, bad=9 if r > 1 else 0)
    *head, M, N = args
    rows, want_lens, faults = ref.combine(*head, M, N)
    if scalars == "device":
        M, N = (torch.tensor([v], dtype=torch.int32, device=DEV) for v in (M, N))
    got = st.combine_topk_swa_indices(*head, M, N)
    check_combine(got, rows, want_lens, untouched=torch.full_like(got[0], -1).cpu())
    T = args[0].shape[0]
    width = st.combined_width(topk, window)
    out = (poisoned((T, width), torch.int32, 0x5A), poisoned((T,), torch.int32))  # 0x5A5A5A5A: not -1
    before = out[0].cpu()
    status = torch.zeros(10, dtype=torch.int32, device=DEV)
    got = st.combine_topk_swa_indices(*head, M, N, out=out, status=status)
    check_combine(got, rows, want_lens, untouched=before)
    counts = spgraph.fault_counts(status.cpu().tolist())
    assert {k: counts[k] for k in ref.FAULTS} == faults


def test_combine_strided_and_3d_topk_and_unfit_requests():
    r, topk, window = 4, 512, 128
    args = combine_problem(77, r, topk, window, [(20, 800), (9, 100)])
    topk_indices, qsl, seqs, gathers, _, _, _, M, N = args
    rows, want_lens, _ = ref.combine(*args)
    wide = torch.full((topk_indices.shape[0], 1024), 99999, dtype=torch.int32, device=DEV)
    wide[:, :topk] = topk_indices
    check_combine(st.combine_topk_swa_indices(wide[:, :topk], qsl, seqs, gathers, window, r, topk, M, N), rows,
                  want_lens)
    check_combine(st.combine_topk_swa_indices(topk_indices[:, None, :], qsl, seqs, gathers, window, r, topk, M, N),
                  rows, want_lens)
    # a request whose window does not fit M (gather_len 0 < needed) gets lens 0 and is counted
    short = gathers.clone()
    short[1] = 0
    rows, want_lens, faults = ref.combine(topk_indices, qsl, seqs, short, window, r, topk, M, N)
    status = torch.zeros(10, dtype=torch.int32, device=DEV)
    got = st.combine_topk_swa_indices(topk_indices, qsl, seqs, short, window, r, topk, M, N, status=status)
    check_combine(got, rows, want_lens)
    assert spgraph.fault_counts(status.cpu().tolist())["seq_len"] == faults["seq_len"] == 1
    # N > M given on the device: every token gets lens 0 (the host cannot see it)
    M_dev = torch.tensor([N - 1], dtype=torch.int32, device=DEV)
    got = st.combine_topk_swa_indices(topk_indices, qsl, seqs, gathers, window, r, topk, M_dev, N)
    assert (got[1] == 0).all()


# ------------------------------------------------------------------------ FP8 insert, gather
def random_rows(g, n):
    """K rows with tiles of very different magnitudes, tiny tiles (amax < 1e-4) included."""
    k = nonzero((n, 512), g, scale=1.0, dtype=torch.float32).cpu()
    tile_scale = torch.exp2(torch.randint(-20, 12, (n, 8), generator=g).float())
    tile_scale[::5, 2] = 1e-7
    k = k * tile_scale.repeat_interleave(64, dim=1)
    return k.bfloat16()


@pytest.mark.parametrize("block_size", [64, 2, 1, 37])
def test_insert_matches_reference(block_size):
    g = gen(block_size)
    blocks = 11
    stride = ref.block_stride(block_size)
    n = min(blocks * block_size, 97)
    k = random_rows(g, n)
    slots = torch.randperm(blocks * block_size, generator=g)[:n].int()
    slots[3] = -1
    slots[5] = blocks * block_size  # outside the cache: skipped, counted
    slots[7] = -9
    cache0 = torch.randint(0, 256, (blocks * stride,), generator=g, dtype=torch.uint8)  # untouched bytes stay
    want, faults = ref.insert(cache0, k, slots, block_size)
    cache = cache0.to(DEV).view(blocks, stride)
    status = torch.zeros(10, dtype=torch.int32, device=DEV)
    st.quantize_and_insert_k_cache(k.to(DEV), cache, slots.to(DEV), block_size, status=status)
    diff = ref.first_difference(cache.view(-1).cpu(), want, "cache bytes")
    assert not diff, diff
    assert spgraph.fault_counts(status.cpu().tolist())["slot"] == faults["slot"] == 2


def filled_cache(g, blocks, block_size):
    stride = ref.block_stride(block_size)
    rows = blocks * block_size
    cache, _ = ref.insert(torch.zeros(blocks * stride, dtype=torch.uint8), random_rows(g, rows),
                          torch.arange(rows, dtype=torch.int32), block_size)
    return cache


@pytest.mark.parametrize("block_size", [64, 2])
@pytest.mark.parametrize("window", [True, False], ids=["gather_lens", "all"])
def test_gather_matches_reference(block_size, window):
    g = gen(31 + block_size)
    blocks, width = 40, 300
    cache = filled_cache(g, blocks, block_size)
    seqs = torch.tensor([500, 1, 77, 0, 129], dtype=torch.int32)
    gathers = torch.minimum(seqs, torch.tensor([200, 1, 77, 0, 64], dtype=torch.int32)) if window else None
    table = torch.randint(0, blocks, (5, width), generator=g, dtype=torch.int32)
    table[2, 0] = blocks + 3  # a block id outside the cache: zero rows, counted
    table[4, 1] = -1
    M, offset = 600, 50
    out0 = torch.full((6, M, 512), float("nan"), dtype=torch.bfloat16)
    if not window:
        seqs[0] = 400  # 50 + 400 <= 600
    want, faults = ref.gather(out0, cache, seqs, gathers, table, block_size, offset)
    out = out0.to(DEV)
    status = torch.zeros(10, dtype=torch.int32, device=DEV)
    st.dequantize_and_gather_k_cache(out, cache.to(DEV), seqs.to(DEV), None if gathers is None else gathers.to(DEV),
                                     table.to(DEV), block_size, offset, status=status)
    diff = ref.first_difference(out.cpu(), want, "out")
    assert not diff, diff
    counts = spgraph.fault_counts(status.cpu().tolist())
    assert {k: counts[k] for k in ref.FAULTS} == faults


def test_gather_skips_requests_that_do_not_fit():
    g = gen(8)
    block_size, blocks = 64, 8
    cache = filled_cache(g, blocks, block_size)
    seqs = torch.tensor([300, 100], dtype=torch.int32)
    table = torch.randint(0, blocks, (2, 4), generator=g, dtype=torch.int32)  # 4 blocks: 256 positions
    out0 = torch.full((2, 200, 512), float("nan"), dtype=torch.bfloat16)
    want, faults = ref.gather(out0, cache, seqs, torch.tensor([10, 150]), table, block_size, 60)
    assert faults["seq_len"] == 2  # 300 positions past the table; 60 + 150 > 200
    out = out0.to(DEV)
    st.dequantize_and_gather_k_cache(out, cache.to(DEV), seqs.to(DEV), torch.tensor([10, 150], dtype=torch.int32,
                                     device=DEV), table.to(DEV), block_size, 60)
    assert not ref.first_difference(out.cpu(), want, "out")
    assert torch.isnan(out.float()).all()


def test_insert_then_gather_round_trip():
    g = gen(99)
    block_size, blocks, n = 64, 6, 300
    k = random_rows(g, n).to(DEV)
    cache = torch.zeros(blocks, ref.block_stride(block_size), dtype=torch.uint8, device=DEV)
    table = torch.randperm(blocks, generator=g).int()[None].to(DEV)
    slots = (table[0].long()[torch.arange(n, device=DEV) // block_size] * block_size
             + torch.arange(n, device=DEV) % block_size).int()
    st.quantize_and_insert_k_cache(k, cache, slots, block_size)
    out = poisoned((1, n, 512), torch.bfloat16)
    st.dequantize_and_gather_k_cache(out, cache, torch.tensor([n], dtype=torch.int32, device=DEV), None, table,
                                     block_size, 0)
    want = ref.dequantize_rows(*ref.quantize_rows(k.cpu()))
    assert not ref.first_difference(out[0].cpu(), want, "dequant(insert(k))")


# ------------------------------------------------------------------- a whole step, captured
def step_inputs(seed):
    """One C4A layer step: caches, new K rows, top-k, q; the engine-style order of the ops."""
    g = gen(seed)
    window, r, topk, h_q = 128, 4, 512, 128
    swa_bs, c_bs = 64, 64
    lens = [(48, 700), (31, 31)]
    blocks = 24
    swa = filled_cache(g, blocks, swa_bs).to(DEV).view(blocks, -1)
    comp = filled_cache(g, blocks, c_bs).to(DEV).view(blocks, -1)
    swa_table = torch.randperm(blocks, generator=g)[:24].int().view(2, 12).to(DEV)
    comp_table = torch.randperm(blocks, generator=g)[:8].int().view(2, 4).to(DEV)
    topk_indices, qsl, seqs, gathers, _, _, _, M, N = combine_problem(seed, r, topk, window, lens)
    T = topk_indices.shape[0]
    new_k = random_rows(g, T).to(DEV)
    # the new tokens' SWA slots (positions seq - q .. seq - 1)
    slots = []
    for b, (q, s) in enumerate(lens):
        for p in range(s - q, s):
            slots.append(int(swa_table[b, p // swa_bs]) * swa_bs + p % swa_bs)
    return dict(q=nonzero((T, h_q, 512), g), sink=(torch.randn(h_q, generator=g) * 0.3).to(DEV), new_k=new_k,
                slots=torch.tensor(slots, dtype=torch.int32, device=DEV), swa=swa, comp=comp, swa_table=swa_table,
                comp_table=comp_table, topk=topk_indices, qsl=qsl, seqs=seqs, gathers=gathers,
                c_lens=(seqs // r).int(), M=M, N=N, window=window, r=r, k=topk, bs=(swa_bs, c_bs))


def prefill_step(x, kv, M, N):
    """An engine's layer step: insert the new K rows, gather compressed rows and the window,
    combine indices, attend."""
    swa_bs, c_bs = x["bs"]
    st.quantize_and_insert_k_cache(x["new_k"], x["swa"], x["slots"], swa_bs)
    st.dequantize_and_gather_k_cache(kv, x["comp"], x["c_lens"], None, x["comp_table"], c_bs, 0)
    st.dequantize_and_gather_k_cache(kv, x["swa"], x["seqs"], x["gathers"], x["swa_table"], swa_bs, x["N"])
    combined, lens = st.combine_topk_swa_indices(x["topk"], x["qsl"], x["seqs"], x["gathers"], x["window"], x["r"],
                                                 x["k"], M, N)
    return st.sparse_mla_fwd(x["q"], kv.view(-1, 1, 512), combined.unsqueeze(1), 512 ** -0.5, attn_sink=x["sink"],
                             topk_length=lens)


def fresh_kv(x):
    return torch.zeros(2, x["M"], 512, dtype=torch.bfloat16, device=DEV)


def copy_inputs(dst, src):
    for key, v in src.items():
        if isinstance(v, torch.Tensor):
            dst[key].copy_(v)


def test_cuda_graph_capture_and_replay_with_new_data_equal_eager():
    static = step_inputs(1)
    kv = fresh_kv(static)
    M_dev = torch.tensor([static["M"]], dtype=torch.int32, device=DEV)
    N_dev = torch.tensor([static["N"]], dtype=torch.int32, device=DEV)
    prefill_step(static, kv, M_dev, N_dev)  # warm-up: first-call set-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = prefill_step(static, kv, M_dev, N_dev)
    for seed in (2, 3):
        new = step_inputs(seed)  # same shapes and M, N; new values everywhere
        eager_x = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in new.items()}
        eager_kv = fresh_kv(new)
        want = prefill_step(eager_x, eager_kv, M_dev, N_dev)
        copy_inputs(static, new)
        kv.zero_()
        graph.replay()
        torch.cuda.synchronize()
        for a, b, name in zip(captured, want, ("out", "max_logits", "lse")):
            diff = ref.first_difference(a, b, name)
            assert not diff, f"seed {seed}: {diff}"
        assert not ref.first_difference(static["swa"], eager_x["swa"], "swa cache after insert")


@pytest.mark.parametrize("scalars", ["ints", "device_tensors"])
def test_compile_fullgraph_equals_eager(scalars):
    """Compiled whole with M and N of the combine as Python ints, and as one-element int32 device
    tensors (graph inputs the kernel reads, so the traced graph reads no value back)."""
    x = step_inputs(4)
    if scalars == "ints":
        M, N = x["M"], x["N"]
    else:
        M = torch.tensor([x["M"]], dtype=torch.int32, device=DEV)
        N = torch.tensor([x["N"]], dtype=torch.int32, device=DEV)
    eager_x = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in x.items()}
    want = prefill_step(eager_x, fresh_kv(x), M, N)
    torch._dynamo.reset()
    compiled = torch.compile(prefill_step, fullgraph=True)
    got = compiled(x, fresh_kv(x), M, N)
    for a, b, name in zip(got, want, ("out", "max_logits", "lse")):
        diff = ref.first_difference(a, b, name)
        assert not diff, diff


# --------------------------------------------------------------------------------- opcheck
def opcheck_cases():
    g = gen(5)
    q, kv, idx, scale, sink, lengths = attention_problem(6, 9, 300, 64, 512, 128, True, True)
    out = (torch.empty(9, 64, 512, dtype=torch.bfloat16, device=DEV), torch.empty(9, 64, device=DEV),
           torch.empty(9, 64, device=DEV))
    topk_indices, qsl, seqs, gathers, window, r, topk, M, N = combine_problem(7, 4, 512, 128, [(21, 600), (4, 4)])
    T = topk_indices.shape[0]
    width = st.combined_width(topk, window)
    cache = filled_cache(g, 6, 64).to(DEV).view(6, -1)
    k = random_rows(g, 10).to(DEV)
    slots = torch.randperm(6 * 64, generator=g)[:10].int().to(DEV)
    status = torch.zeros(10, dtype=torch.int32, device=DEV)
    m_dev = torch.tensor([M], dtype=torch.int32, device=DEV)
    n_dev = torch.tensor([N], dtype=torch.int32, device=DEV)
    return {
        "sparse_mla_fwd": (q, kv, idx, scale, 512, sink, lengths),
        "sparse_mla_fwd_out": (q, kv, idx, scale, 512, sink, lengths, *out, None),
        "combine_topk_swa_indices": (topk_indices, qsl, seqs, gathers, window, r, topk, 0, N, m_dev, None),
        "combine_topk_swa_indices/M_N_device": (topk_indices, qsl, seqs, gathers, window, r, topk, 0, 0, m_dev, n_dev),
        "combine_topk_swa_indices_out": (topk_indices, qsl, seqs, gathers, window, r, topk, M, N, None, None,
                                         torch.full((T, width), -1, dtype=torch.int32, device=DEV),
                                         torch.empty(T, dtype=torch.int32, device=DEV), status),
        "quantize_and_insert_k_cache": (k, cache.clone(), slots, 64, None),
        "dequantize_and_gather_k_cache": (torch.zeros(2, 300, 512, dtype=torch.bfloat16, device=DEV), cache,
                                          torch.tensor([200, 5], dtype=torch.int32, device=DEV), None,
                                          torch.randint(0, 6, (2, 4), generator=g, dtype=torch.int32).to(DEV), 64, 3,
                                          None),
    }


@pytest.mark.parametrize("name", ["sparse_mla_fwd", "sparse_mla_fwd_out", "combine_topk_swa_indices",
                                  "combine_topk_swa_indices/M_N_device", "combine_topk_swa_indices_out",
                                  "quantize_and_insert_k_cache", "dequantize_and_gather_k_cache"])
def test_opcheck(name):
    """A case is named by its op, then after '/' what it varies."""
    op = name.split("/")[0]
    torch.library.opcheck(getattr(torch.ops.spgraph, op).default, opcheck_cases()[name])


# -------------------------------------------------------- no allocation, no sync, the stream
def out_calls(dispatched=False):
    """Every op with every output (and the attention's workspace) given: through spgraph.torch's
    functions (which, in plain eager mode, call the kernels directly), or with `dispatched`
    through torch.ops.spgraph, the dispatcher's path."""
    x = step_inputs(6)
    kv = fresh_kv(x)
    T, h_q = x["q"].shape[:2]
    width = st.combined_width(x["k"], x["window"])
    combined = torch.empty(T, width, dtype=torch.int32, device=DEV)
    lens = torch.empty(T, dtype=torch.int32, device=DEV)
    outs = (torch.empty(T, h_q, 512, dtype=torch.bfloat16, device=DEV), torch.empty(T, h_q, device=DEV),
            torch.empty(T, h_q, device=DEV))
    nbytes = spgraph.sparse_mla_workspace_bytes(T, h_q, 512, width, torch.cuda.current_device())
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=DEV)
    M_dev = torch.tensor([x["M"]], dtype=torch.int32, device=DEV)
    # what the ops write (the workspace is the attention's scratch); kv and combined are checked
    # through the attention that reads them
    written = dict(kv=kv, combined=combined, lens=lens, out=outs[0], max_logits=outs[1], lse=outs[2], ws=ws)

    def run_dispatched():
        swa_bs, c_bs = x["bs"]
        ops = torch.ops.spgraph
        ops.quantize_and_insert_k_cache(x["new_k"], x["swa"], x["slots"], swa_bs, None)
        ops.dequantize_and_gather_k_cache(kv, x["comp"], x["c_lens"], None, x["comp_table"], c_bs, 0, None)
        ops.dequantize_and_gather_k_cache(kv, x["swa"], x["seqs"], x["gathers"], x["swa_table"], swa_bs, x["N"], None)
        ops.combine_topk_swa_indices_out(x["topk"], x["qsl"], x["seqs"], x["gathers"], x["window"], x["r"], x["k"], 0,
                                         x["N"], M_dev, None, combined, lens, None)
        ops.sparse_mla_fwd_out(x["q"], kv.view(-1, 1, 512), combined.unsqueeze(1), 512 ** -0.5, 512, x["sink"], lens,
                               outs[0], outs[1], outs[2], ws)
        return outs

    def run():
        swa_bs, c_bs = x["bs"]
        st.quantize_and_insert_k_cache(x["new_k"], x["swa"], x["slots"], swa_bs)
        st.dequantize_and_gather_k_cache(kv, x["comp"], x["c_lens"], None, x["comp_table"], c_bs, 0)
        st.dequantize_and_gather_k_cache(kv, x["swa"], x["seqs"], x["gathers"], x["swa_table"], swa_bs, x["N"])
        st.combine_topk_swa_indices(x["topk"], x["qsl"], x["seqs"], x["gathers"], x["window"], x["r"], x["k"], M_dev,
                                    x["N"], out=(combined, lens))
        st.sparse_mla_fwd(x["q"], kv.view(-1, 1, 512), combined.unsqueeze(1), 512 ** -0.5, attn_sink=x["sink"],
                          topk_length=lens, out=outs, workspace=ws)
        return outs

    return (run_dispatched if dispatched else run), x, written


def test_direct_and_dispatched_calls_agree_and_bump_what_they_write():
    """spgraph.torch's functions call the kernels directly in plain eager mode; torch.ops.spgraph
    goes through the dispatcher. Both give the same bits, and both bump the version counter of
    every tensor an op writes once per write, as torch's in-place ops do: the insert's cache 1,
    the two gathers' kv 2, the combine's rows 1 each, the attention's outputs and workspace 1."""
    results = {}
    for dispatched in (False, True):
        run, x, written = out_calls(dispatched)
        for v in written.values():
            v.view(torch.uint8).fill_(0xFF)
        before = {k: v._version for k, v in written.items()}
        cache_before = x["swa"]._version
        run()
        torch.cuda.synchronize()
        bumps = {k: v._version - before[k] for k, v in written.items()}
        assert bumps == dict(kv=2, combined=1, lens=1, out=1, max_logits=1, lse=1, ws=1), (dispatched, bumps)
        assert x["swa"]._version - cache_before == 1, dispatched
        results[dispatched] = {k: written[k].clone() for k in ("kv", "lens", "out", "max_logits", "lse")}
        results[dispatched]["swa"] = x["swa"].clone()
    for k, v in results[False].items():
        assert torch.equal(v.view(torch.uint8), results[True][k].view(torch.uint8)), k
    assert results[False]["lens"].sum() > 0 and results[False]["out"].float().abs().sum() > 0  # not empty work


def test_out_variants_allocate_nothing_and_never_sync():
    run, _, _ = out_calls()
    run()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before


def test_launches_go_to_the_callers_stream():
    """With the default stream held busy, every op runs on a side stream and finishes first: each
    op's outputs (and the inserted cache rows) are poisoned on the side stream first, so an op
    queued anywhere else would leave poison in what the side stream copies out.

    Two things make the method sound. (1) The side stream's whole sequence (poison, ops, copies
    out) runs once before the default stream is made busy: CUDA loads a kernel's module at its
    first launch (torch sets CUDA_MODULE_LOADING=LAZY), and that load may wait for the whole
    device, so a torch kernel first used inside the timed section (the uint8 fill, index_fill_)
    waited for the busy default stream; that, not a launch of spgraph's, is what made the
    9d15381 run's guard fire. Each phase's host time is reported if the guard fires. (2) A control
    op launched on the busy default stream on purpose (the framework-neutral insert, stream 0)
    must still show its poison in the side stream's copy: the check sees a launch that went
    elsewhere."""
    import time

    run, x, written = out_calls()
    checked = ("lens", "out", "max_logits", "lse")
    data, _ = ref.cache_rows(None, x["slots"].cpu(), x["bs"][0])
    row_bytes = (data[:, None] + torch.arange(ref.ROW_BYTES)[None, :]).flatten().to(DEV)
    side = torch.cuda.Stream()
    run()
    torch.cuda.synchronize()
    want = {k: written[k].clone() for k in checked}
    want_swa = x["swa"].clone()
    control_cache = x["swa"].clone()  # the control inserts the same rows into a copy
    host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in want.items()}
    host_swa = torch.empty(want_swa.shape, dtype=want_swa.dtype, pin_memory=True)
    host_control = torch.empty(want_swa.shape, dtype=want_swa.dtype, pin_memory=True)
    phases = {}

    def side_sequence(control):
        t = time.perf_counter()
        for v in written.values():
            v.view(torch.uint8).fill_(0xFF)
        x["swa"].view(-1).index_fill_(0, row_bytes, 0xFF)
        control_cache.view(-1).index_fill_(0, row_bytes, 0xFF)
        phases["poison"] = time.perf_counter() - t
        t = time.perf_counter()
        run()
        phases["ops"] = time.perf_counter() - t
        if control:  # on the legacy default stream, behind the sleep
            spgraph.quantize_and_insert_k_cache(x["new_k"], control_cache, x["slots"], x["bs"][0], stream=0)
        t = time.perf_counter()
        for k in checked:
            host[k].copy_(written[k], non_blocking=True)
        host_swa.copy_(x["swa"], non_blocking=True)
        host_control.copy_(control_cache, non_blocking=True)
        phases["copies"] = time.perf_counter() - t

    with torch.cuda.stream(side):  # (1): every kernel of the sequence loaded before the sleep
        side_sequence(control=False)
    side.synchronize()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of spinning on the default stream
    with torch.cuda.stream(side):
        side_sequence(control=True)
    side.synchronize()
    busy = not torch.cuda.default_stream().query()
    torch.cuda.synchronize()
    spent = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in phases.items())
    assert busy, f"the default stream finished first: the test proves nothing (host time per phase: {spent})"
    for k, w in want.items():
        diff = ref.first_difference(host[k], w.cpu(), k)
        assert not diff, diff
    assert not ref.first_difference(host_swa, want_swa.cpu(), "swa cache")
    # (2): the control's rows were still poison when the side stream copied them out ...
    assert bool((host_control.view(-1)[row_bytes.cpu()] == 0xFF).all()), "the control launch was not held back"
    # ... and it did run on the default stream afterwards
    assert not ref.first_difference(control_cache.cpu(), want_swa.cpu(), "control cache")


def test_empty_calls_write_nothing_eager_and_captured():
    """Empty work (issue 17): every op with no tokens (s_q = 0, no rows, no requests) returns
    cleanly, eager and inside torch.cuda.graph, and writes nothing: the cache and the output of a
    neighbouring non-empty view are filled with a known byte and must keep it."""
    swa_bs = 64
    stride = spgraph.cache_block_stride(swa_bs)
    cache = torch.full((4, stride), 0x5C, dtype=torch.uint8, device=DEV)
    backing = torch.full((2, 300, 512), 7.0, dtype=torch.bfloat16, device=DEV)
    i32 = dict(dtype=torch.int32, device=DEV)
    q = torch.empty(0, 128, 576, dtype=torch.bfloat16, device=DEV)
    kv = torch.randn(64, 1, 576, device=DEV).to(torch.bfloat16)
    idx = torch.empty(0, 1, 512, **i32)
    sink = torch.zeros(128, device=DEV)
    M = torch.tensor([1000], **i32)  # made before the capture (a host-to-device copy)

    def calls():
        outs = st.sparse_mla_fwd(q, kv, idx, 0.04, attn_sink=sink, topk_length=torch.empty(0, **i32))
        given = (torch.empty(0, 128, 512, dtype=torch.bfloat16, device=DEV), torch.empty(0, 128, device=DEV),
                 torch.empty(0, 128, device=DEV))
        st.sparse_mla_fwd(q, kv, idx, 0.04, out=given, workspace=torch.empty(256, dtype=torch.uint8, device=DEV))
        comb = st.combine_topk_swa_indices(torch.empty(0, 512, **i32), torch.zeros(3, **i32), torch.zeros(2, **i32),
                                           torch.zeros(2, **i32), 128, 4, 512, 1000, 10)
        st.combine_topk_swa_indices(torch.empty(0, 512, **i32), torch.zeros(1, **i32), torch.empty(0, **i32),
                                    torch.empty(0, **i32), 128, 4, 512, M, 10,
                                    out=(torch.empty(0, 640, **i32), torch.empty(0, **i32)))
        st.quantize_and_insert_k_cache(torch.empty(0, 512, dtype=torch.bfloat16, device=DEV), cache,
                                       torch.empty(0, **i32), swa_bs)
        st.dequantize_and_gather_k_cache(backing[:0], cache, torch.empty(0, **i32), None, torch.empty(0, 4, **i32),
                                         swa_bs, 0)
        return outs, comb

    (out, ml, lse), (combined, lens) = calls()
    assert (out.shape, ml.shape, lse.shape) == ((0, 128, 512), (0, 128), (0, 128))
    assert (combined.shape, lens.shape) == ((0, 640), (0,))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        calls()  # warm torch's allocator for the capture
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            calls()
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    assert bool((cache == 0x5C).all()), "an empty insert or gather wrote the cache"
    assert bool((backing == 7.0).all()), "an empty gather wrote past its empty out"

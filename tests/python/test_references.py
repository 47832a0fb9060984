"""CPU, with torch: the GPU tests' references against hand-worked values from docs/pipeline.md,
so that a GPU failure points at the op, not at its reference. Skipped without torch."""

import math

import pytest

from conftest import HAVE_TORCH, needs_torch

pytestmark = needs_torch

if HAVE_TORCH:
    import torch

    import references as ref


def test_combine_worked_example():
    # docs/pipeline.md: r = 4, W = 128, top_k = 1024, pos = 1000 -> topk_len 250, swa_len 128, lens 378
    seq = 1001
    topk = torch.arange(1024, dtype=torch.int32)[None].clone()
    topk[0, 3] = -1
    topk[0, 5] = 250  # seq // r = 250 rows: 250 is one past the last
    rows, lens, faults = ref.combine(topk, torch.tensor([7, 8]), torch.tensor([seq]), torch.tensor([128]), 128, 4,
                                     1024, M=1000, N=300)
    assert lens == [378]
    assert rows[0][:6] == [0, 1, 2, -1, 4, -1] and rows[0][249] == 249
    # window: positions 873 .. 1000 of the gathered 128 (start 873) at N + 0 .. N + 127
    assert rows[0][250:] == list(range(300, 428))
    assert faults["topk_index"] == 1


def test_combine_offsets_requests_and_bad_chunks():
    # two requests, the second at M * 1; qsl as a slice starting at 10
    topk = torch.zeros(5, 4, dtype=torch.int32)
    rows, lens, _ = ref.combine(topk, torch.tensor([10, 12, 15]), torch.tensor([2, 8]), torch.tensor([2, 8]), 4, 4, 4,
                                M=20, N=2)
    # request 0: positions 0, 1 (no compressed row complete yet); request 1: positions 5, 6, 7 with
    # 1, 1, 2 top-k entries and a window of 4
    assert lens == [1, 2, 5, 5, 6]
    assert rows[0] == [2] and rows[1] == [2, 3]
    # top-k entry 0 of request 1 lands at M * 1; its window (positions 2 .. 5, gathered from 0) at
    # M + N + 2 ..
    assert rows[2] == [20, 24, 25, 26, 27]
    assert rows[4] == [20, 20, 26, 27, 28, 29]
    _, lens_bad, faults = ref.combine(topk, torch.tensor([0, 2, 5]), torch.tensor([2, 8]), torch.tensor([2, 8]), 4, 4,
                                      4, M=2, N=3)
    assert lens_bad == [0] * 5 and faults["scalars"] == 1


def test_quantize_hand_worked_tile():
    k = torch.zeros(1, 512, dtype=torch.bfloat16)
    k[0, :64] = 1.0  # amax 1: e = ceil(log2(1 / 448)) = -8, byte 119, value 1 * 2^8 = 256 (e4m3 exact)
    k[0, 64] = 448.0  # amax 448: e = 0, byte 127
    k[0, 65] = -3.0
    k[0, 128:192] = 1e-6  # amax clamps to 1e-4: e = ceil(log2(1e-4 / 448)) = -22
    k[0, 448:] = torch.arange(64, dtype=torch.bfloat16)
    data, scales = ref.quantize_rows(k)
    # tiles 2-6 hold amax < 1e-4 (tile 2) or zeros: both clamp to 1e-4, byte 127 - 22
    assert scales[0].tolist() == [119, 127, 105, 105, 105, 105, 105, 0]
    e4 = data[0, :448].view(torch.float8_e4m3fn).float()
    assert e4[0] == 256.0 and e4[64] == 448.0 and e4[65] == -3.0
    assert data[0, 448:].view(torch.bfloat16).tolist() == list(range(64))
    back = ref.dequantize_rows(data, scales)
    assert back[0, 0] == 1.0 and back[0, 64] == 448.0 and back[0, 65] == -3.0
    assert torch.equal(back[0, 448:], k[0, 448:])


def test_tile_exponent_at_powers_of_two():
    k = torch.zeros(3, 512, dtype=torch.bfloat16)
    k[0, 0] = 448.0 * 2.0**-5  # exactly 448 * 2^-5: e = -5
    k[1, 0] = torch.tensor(448.0 * 2.0**-5).bfloat16().float() * (1 + 2**-7)  # just above: e = -4
    k[2, 0] = 7.0  # 7 / 448 = 2^-6: e = -6
    e = ref.tile_exponents(k)[:, 0].tolist()
    assert e == [-5, -4, -6]


def test_gather_reference_reads_the_layout():
    bs = 2
    stride = ref.block_stride(bs)
    assert stride == 1728
    k = (torch.randn(4, 512) * 0.1).bfloat16()
    cache = torch.zeros(3 * stride, dtype=torch.uint8)
    cache, faults = ref.insert(cache, k, torch.tensor([6, 0, 1, -1]), bs)  # slot 6 is past 3 blocks of 2
    assert faults["slot"] == 1
    out = torch.full((1, 4, 512), float("nan"), dtype=torch.bfloat16)
    got, faults = ref.gather(out, cache, torch.tensor([2]), None, torch.tensor([[0, 2]]), bs, 1)
    want = ref.dequantize_rows(*ref.quantize_rows(k[1:3]))
    assert torch.equal(got[0, 1:3], want) and torch.isnan(got[0, 0]).all() and torch.isnan(got[0, 3]).all()
    got, faults = ref.gather(out, cache, torch.tensor([2]), None, torch.tensor([[7, 2]]), bs, 0)
    assert faults["block_id"] == 2 and (got[0, :2] == 0).all()
    _, faults = ref.gather(out, cache, torch.tensor([3]), torch.tensor([3]), torch.tensor([[0, 2]]), bs, 2)
    assert faults["seq_len"] == 1  # offset 2 + 3 rows > M = 4


def test_attention_reference_semantics():
    torch.manual_seed(0)
    q = torch.randn(3, 64, 512, dtype=torch.float64) * 0.1
    kv = torch.randn(10, 1, 512, dtype=torch.float64) * 0.1
    idx = torch.tensor([[[1, 2, -1, 10]], [[-1, -1, -1, -1]], [[3, 3, 4, 2**31 - 1]]], dtype=torch.int32)
    sink = torch.zeros(64, dtype=torch.float64)
    sink[0], sink[1] = math.inf, -math.inf
    out, m, lse = ref.sparse_mla(q, kv, idx, 0.5, attn_sink=sink, topk_length=torch.tensor([4, 4, 3]))
    # token 0: rows 1 and 2
    p = 0.5 * (q[0] @ kv[[1, 2], 0].T)
    assert torch.allclose(m[0], p.amax(-1)) and torch.allclose(lse[0], torch.logsumexp(p, -1))
    w = torch.exp(p - torch.logaddexp(torch.logsumexp(p, -1), sink)[:, None])
    assert torch.allclose(out[0], w @ kv[[1, 2], 0])
    assert (out[0, 0] == 0).all()  # sink +inf
    # token 1: empty row
    assert (out[1] == 0).all() and (m[1] == -math.inf).all() and (lse[1] == math.inf).all()
    # token 2: index 3 twice, 4 once (the last entry is past topk_length)
    p = 0.5 * (q[2] @ kv[[3, 3, 4], 0].T)
    assert torch.allclose(lse[2], torch.logsumexp(p, -1))
    ref.check_attention((out.float(), m.float(), lse.float()), (out, m, lse))


def test_accuracy_bars_fail_on_the_worst_element():
    r = torch.ones(4, 4, dtype=torch.float64)
    g = r.clone()
    g[1, 2] = 1.1
    with pytest.raises(AssertionError, match="1 elements outside the bar; worst at flat index 6"):
        ref.check_out(g, r)
    g[1, 2] = float("nan")
    with pytest.raises(AssertionError, match="outside the bar"):
        ref.check_out(g, r)
    s = torch.tensor([math.inf, -math.inf, 1.0], dtype=torch.float64)
    with pytest.raises(AssertionError, match="lse"):
        ref.check_stat(torch.tensor([math.inf, math.inf, 1.0]), s, "lse")
    ref.check_stat(torch.tensor([math.inf, -math.inf, 1.00002]), s, "lse")

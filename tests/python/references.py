"""torch references of the ops, written from docs/pipeline.md (not from the kernels), and the
accuracy bars. Attention runs in float64; the index, insert and gather references are exact.

Each reference takes and returns torch tensors on any device (the GPU tests run them on the GPU,
test_references.py checks them on the CPU against hand-worked values).
"""

import math

import torch

ROW_BYTES, SCALE_BYTES, DIM, NOPE, TILE, TILES = 576, 8, 512, 448, 64, 7
INT32_MAX = 2**31 - 1
FAULTS = ("scalars", "seq_len", "block_id", "slot", "topk_index")


def block_stride(block_size):
    return -(-block_size * (ROW_BYTES + SCALE_BYTES) // ROW_BYTES) * ROW_BYTES


# ------------------------------------------------------------------------------ attention
def sparse_mla(q, kv, indices, sm_scale, attn_sink=None, topk_length=None, chunk_bytes=1 << 30):
    """docs/pipeline.md "Sparse attention semantics", in float64. Returns (out, max_logits, lse)."""
    s_q, h_q, d_qk = q.shape
    kv2 = kv.reshape(kv.shape[0], -1)[:, :d_qk].double()
    s_kv = kv2.shape[0]
    idx = indices.reshape(s_q, -1).long()
    topk = idx.shape[1]
    valid = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        valid &= torch.arange(topk, device=idx.device)[None, :] < topk_length.long()[:, None]
    out = torch.empty(s_q, h_q, DIM, dtype=torch.float64, device=q.device)
    max_logits = torch.empty(s_q, h_q, dtype=torch.float64, device=q.device)
    lse = torch.empty(s_q, h_q, dtype=torch.float64, device=q.device)
    step = max(1, chunk_bytes // max(1, topk * d_qk * 8))
    for t0 in range(0, s_q, step):
        t1 = min(s_q, t0 + step)
        v = valid[t0:t1]
        rows = kv2[torch.where(v, idx[t0:t1], 0)]  # [t, topk, d_qk]
        p = sm_scale * torch.einsum("thd,tkd->thk", q[t0:t1].double(), rows)
        p = p.masked_fill(~v[:, None, :], -math.inf)
        m = p.amax(-1)
        s = torch.logsumexp(p, -1)
        big_l = s if attn_sink is None else torch.logaddexp(s, attn_sink.double()[None, :])
        w = torch.exp(p - big_l[..., None])
        w = torch.nan_to_num(w, nan=0.0)  # rows with no valid index (-inf - -inf): set below
        o = torch.einsum("thk,tkd->thd", w, rows[..., :DIM])
        empty = ~v.any(-1)
        o[empty] = 0.0
        m[empty] = -math.inf
        s[empty] = math.inf
        out[t0:t1], max_logits[t0:t1], lse[t0:t1] = o, m, s
    return out, max_logits, lse


def _worst(err, bad, got, ref):
    flat = torch.where(bad, err, torch.zeros_like(err)).flatten()
    i = int(torch.argmax(flat))
    return i, float(got.flatten()[i]), float(ref.flatten()[i]), float(err.flatten()[i])


def check_out(got, ref, what="out"):
    """out bar: every element abs <= 8e-4 or rel <= 2.4e-2, NaN never passes; 1 - cos <= 1e-5."""
    g = got.double()
    err = (g - ref).abs()
    ok = (err <= 8e-4) | (err <= 2.4e-2 * ref.abs())
    ok &= ~torch.isnan(g)
    n_bad = int((~ok).sum())
    if n_bad:
        err = torch.nan_to_num(err, nan=math.inf)
        i, gv, rv, ev = _worst(err, ~ok, g, ref)
        raise AssertionError(f"{what}: {n_bad} elements outside the bar; worst at flat index {i}: got {gv}, "
                             f"reference {rv}, error {ev}")
    gg, rr = g.flatten(), ref.flatten()
    denom = gg.norm() * rr.norm()
    if denom > 0:
        cos_diff = 1.0 - float(gg.dot(rr) / denom)
        assert cos_diff <= 1e-5, f"{what}: 1 - cos = {cos_diff} > 1e-5"


def check_stat(got, ref, what):
    """lse / max_logits bar: abs <= 1e-4 or rel <= 3e-5; infinities must match exactly."""
    g = got.double()
    inf_ref, inf_got = torch.isinf(ref), torch.isinf(g)
    same_inf = inf_ref & inf_got & (torch.sign(ref) == torch.sign(g))
    finite = ~inf_ref & ~inf_got
    err = torch.where(finite, (g - ref).abs(), torch.zeros_like(g))
    ok = same_inf | (finite & ((err <= 1e-4) | (err <= 3e-5 * ref.abs())))
    n_bad = int((~ok).sum())
    if n_bad:
        err = torch.where(ok, torch.zeros_like(g), torch.nan_to_num((g - ref).abs(), nan=math.inf, posinf=math.inf))
        i, gv, rv, ev = _worst(err, ~ok, g, ref)
        raise AssertionError(f"{what}: {n_bad} elements outside the bar; worst at flat index {i}: got {gv}, "
                             f"reference {rv}, error {ev}")


def check_attention(got, ref):
    check_out(got[0], ref[0])
    check_stat(got[1], ref[1], "max_logits")
    check_stat(got[2], ref[2], "lse")


def first_difference(got, want, what):
    """Bit-exact comparison (integers, or floats by their bits); names the first differing element."""
    if got.dtype.is_floating_point:
        view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
        got, want = got.contiguous().view(view), want.contiguous().view(view)
    diff = (got != want).flatten().nonzero()
    if diff.numel():
        i = int(diff[0])
        return (f"{what}: {diff.numel()} of {got.numel()} elements differ; first at flat index {i}: "
                f"got {int(got.flatten()[i])}, want {int(want.flatten()[i])}")
    return ""


# ---------------------------------------------------------------------- FP8 cache (V4 layout)
def tile_exponents(k):
    """Per tile of 64 NoPE values: the smallest e with max(amax, 1e-4) <= 448 * 2^e, i.e.
    ceil(log2(amax / 448)), found exactly (float64 log2, then corrected by the exact comparison)."""
    x = k.float()[:, :NOPE].reshape(-1, TILES, TILE)
    amax = x.abs().amax(-1).clamp_min(torch.tensor(1e-4, dtype=torch.float32)).double()
    e = torch.ceil(torch.log2(amax / 448.0)).long()
    e = e + (amax > 448.0 * torch.exp2(e.double())).long()
    e = e - (amax <= 448.0 * torch.exp2((e - 1).double())).long()
    return e


def quantize_rows(k):
    """K rows [n, 512] bf16 -> (data [n, 576] uint8, scales [n, 8] uint8), docs/pipeline.md."""
    n = k.shape[0]
    e = tile_exponents(k)
    x = k.float()[:, :NOPE].reshape(n, TILES, TILE).double()
    scaled = (x / torch.exp2(e.double())[..., None]).clamp(-448.0, 448.0).float()
    q = scaled.to(torch.float8_e4m3fn).reshape(n, NOPE).view(torch.uint8)
    data = torch.cat([q, k[:, NOPE:].contiguous().view(torch.uint8).reshape(n, 2 * (DIM - NOPE))], dim=1)
    scales = torch.zeros(n, SCALE_BYTES, dtype=torch.uint8, device=k.device)
    scales[:, :TILES] = (e + 127).clamp(0, 255).to(torch.uint8)
    return data, scales


def dequantize_rows(data, scales):
    """(data [n, 576], scales [n, 8]) uint8 -> [n, 512] bf16: e4m3 * 2^(byte - 127) rounded once."""
    n = data.shape[0]
    e4 = data[:, :NOPE].contiguous().view(torch.float8_e4m3fn).double().reshape(n, TILES, TILE)
    factor = torch.exp2(scales[:, :TILES].double() - 127.0)
    nope = (e4 * factor[..., None]).reshape(n, NOPE).float().to(torch.bfloat16)
    rope = data[:, NOPE:].contiguous().view(torch.bfloat16).reshape(n, DIM - NOPE)
    return torch.cat([nope, rope], dim=1)


def cache_rows(cache, slots, block_size):
    """Byte offsets of slot s's data row and scale row in a flat cache."""
    stride = block_stride(block_size)
    s = slots.long()
    base = (s // block_size) * stride
    return base + (s % block_size) * ROW_BYTES, base + block_size * ROW_BYTES + (s % block_size) * SCALE_BYTES


def insert(cache, k, slots, block_size):
    """Stage 0 on a flat uint8 cache (a copy is returned) and its fault counts."""
    cache = cache.clone()
    faults = dict.fromkeys(FAULTS, 0)
    capacity = cache.numel() // block_stride(block_size) * block_size
    data, scales = quantize_rows(k)
    for i, s in enumerate(slots.tolist()):
        if s == -1:
            continue
        if s < -1 or s >= capacity:
            faults["slot"] += 1
            continue
        d, sc = (int(v) for v in cache_rows(cache, torch.tensor([s]), block_size))
        cache[d:d + ROW_BYTES] = data[i]
        cache[sc:sc + SCALE_BYTES] = scales[i]
    return cache, faults


def gather(out, cache, seq_lens, gather_lens, block_table, block_size, offset):
    """Stages 1-2 (dequantize_and_gather_k_cache) into a copy of out, and its fault counts."""
    out = out.clone()
    faults = dict.fromkeys(FAULTS, 0)
    stride = block_stride(block_size)
    num_blocks = cache.numel() // stride
    R, M = seq_lens.shape[0], out.shape[1]
    width = block_table.shape[1]
    seqs = seq_lens.tolist()
    gathers = seqs if gather_lens is None else gather_lens.tolist()
    table = block_table.tolist()
    for b in range(R):
        seq, g = seqs[b], gathers[b]
        if not (seq >= 0 and 0 <= g <= seq and offset + g <= M and -(-seq // block_size) <= width):
            faults["seq_len"] += 1
            continue
        for j in range(g):
            pos = seq - g + j
            blk = table[b][pos // block_size]
            if blk < 0 or blk >= num_blocks:
                faults["block_id"] += 1
                out[b, offset + j] = 0
                continue
            slot = blk * block_size + pos % block_size
            d, sc = (int(v) for v in cache_rows(cache, torch.tensor([slot]), block_size))
            out[b, offset + j] = dequantize_rows(cache[d:d + ROW_BYTES][None], cache[sc:sc + SCALE_BYTES][None])[0]
    return out, faults


# ---------------------------------------------------------------------------- combine (stage 3)
def combine(topk_indices, query_start_loc, seq_lens, gather_lens, window, r, topk, M, N):
    """Stage 3 with the standalone rules of combine_topk_swa_indices. Returns (rows, lens, faults):
    rows[t] the defined entries of token t (length lens[t])."""
    topk_indices = topk_indices.reshape(topk_indices.shape[0], -1)
    T = topk_indices.shape[0]
    qsl = [v - int(query_start_loc[0]) for v in query_start_loc.tolist()]
    seqs, gathers = seq_lens.tolist(), gather_lens.tolist()
    R = len(seqs)
    faults = dict.fromkeys(FAULTS, 0)
    lens = [0] * T
    rows = [[] for _ in range(T)]
    num_tokens = qsl[R]
    ok = 0 <= num_tokens <= T and 0 <= N <= M and M <= INT32_MAX // R and all(qsl[b] <= qsl[b + 1] for b in range(R))
    if not ok:
        faults["scalars"] += 1
        return rows, lens, faults
    fits = []
    for b in range(R):
        qlen, seq, g = qsl[b + 1] - qsl[b], seqs[b], gathers[b]
        needed = min(seq, qlen + window - 1)
        f = qlen == 0 or (qlen <= seq and needed <= g <= seq and N + g <= M and (r == 1 or seq // r <= N))
        fits.append(f)
        if not f:
            faults["seq_len"] += 1
    table = topk_indices.tolist()
    for t in range(num_tokens):
        b = max(i for i in range(R) if qsl[i] <= t)
        if not fits[b]:
            continue
        seq, qlen = seqs[b], qsl[b + 1] - qsl[b]
        pos = seq - qlen + (t - qsl[b])
        topk_len = min((pos + 1) // r, topk) if r > 1 else 0
        swa_len = min(pos + 1, window)
        start = seq - gathers[b]
        row = []
        for j in range(topk_len):
            v = table[t][j]
            if v == -1:
                row.append(-1)
            elif 0 <= v < seq // r:
                row.append(v + M * b)
            else:
                faults["topk_index"] += 1
                row.append(-1)
        row += [M * b + N + (pos - swa_len + 1 - start) + j for j in range(swa_len)]
        rows[t] = row
        lens[t] = topk_len + swa_len
    return rows, lens, faults

#!/usr/bin/env python3
"""The PyTorch peer of spgraph's prefill pipeline (table B of the benchmarks).

What it is: the sparse-attention prefill step of docs/pipeline.md (stages 1-4: dequant-gather of
the compressed rows and the sliding window from the FP8 paged caches into a bf16 workspace, the
combined index rows, sparse attention with attention sinks), written with stock PyTorch operations
only -- no custom kernels, no Triton -- the way a Python serving engine runs this path today. One
Python function runs the whole step (every layer of the program) over static tensors, so it is
timed twice: launched eagerly, and captured once with torch.cuda.CUDAGraph and replayed. Before
each step the chunk's metadata (query_start_loc, seq_lens, block tables) is copied from pinned
host memory into the static device tensors, as spgraph's step copies its staged metadata in.

What it is not: not FlashMLA and not a tuned engine kernel. Its attention gathers each token's
K rows into a dense [tokens, index width, 512] tensor and runs a masked softmax over it with
batched matmuls, in chunks of tokens to bound memory. Math is fp32-grade on TF32 tensor cores:
q and kv are bf16, which TF32 holds exactly, so the logits are exact products summed in fp32; the
fp32 softmax weights go into the PV product as two TF32-exact parts (about 21 mantissa bits; one
TF32 pass would keep 10 and misses the accuracy bars on large-valued caches). --strict-fp32 runs
plain fp32 matmuls (no tensor cores) instead. N and M are static bounds fixed when the peer is
set up for a chunk (the largest seq_len/r and gather_len it carries), as an engine sizes the
buffers of a captured graph; workspace rows past a request's own are zero-filled.

Modes:
  --check DIR   run on the inputs of `bench --dump DIR` (one C4A layer), compare the peer and
                spgraph with a float64 reference under the accuracy bars; exit 1 on FAIL
  --bench       table B workloads, eager and CUDA graph: GPU/host/wall time per step
                (--quick, --json FILE, --workloads a,b, --chunk N, --time-budget S)
  --selftest    small random case against the float64 reference, FP8 dequant hand-worked values,
                combine against a loop over the formulas (--device cpu runs it without a GPU)
"""
import argparse
import datetime
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

D, NOPE, TILE, TILES, ROW, SCALE_ROW = 512, 448, 64, 7, 576, 8
BF16 = torch.bfloat16


def log(*a):
    print(*a, flush=True)


def block_stride(bs):
    """Bytes of one cache block of bs rows: data rows, then scale rows, padded to 576."""
    return (bs * (ROW + SCALE_ROW) + ROW - 1) // ROW * ROW


# ----------------------------------------------------------------------------- the peer
def cache_views(cache, bs):
    """[nb, stride] uint8 cache -> views of its data rows [nb, bs, 576] and scale rows [nb, bs, 8]."""
    nb, stride = cache.shape
    assert stride == block_stride(bs), f"cache stride {stride} != {block_stride(bs)} for {bs} rows per block"
    data = cache.as_strided((nb, bs, ROW), (stride, ROW, 1), cache.storage_offset())
    scale = cache.as_strided((nb, bs, SCALE_ROW), (stride, SCALE_ROW, 1), cache.storage_offset() + bs * ROW)
    return data, scale


def scale_tables(device):
    """2^(byte-127) as two fp32 factors (2^min(e,127), then 1 or 2) so byte 255 (2^128) stays exact."""
    e = np.arange(256, dtype=np.float64) - 127
    lo = np.minimum(e, 127)
    return (torch.tensor(np.exp2(lo), dtype=torch.float32, device=device),
            torch.tensor(np.exp2(e - lo), dtype=torch.float32, device=device))


def dequant(views, blk, off, ok, tables):
    """Rows (blk, off) of a cache -> bf16 [..., 512]; rows not ok (or a bad block id) are zeros."""
    data, scale = views
    ok = ok & (blk >= 0) & (blk < data.shape[0])
    blk, off = torch.where(ok, blk, 0), torch.where(ok, off, 0)
    raw = data[blk, off]                                   # [..., 576] uint8
    e = scale[blk, off][..., :TILES].long()                # [..., 7] UE8M0 exponents
    nope = raw[..., :NOPE].view(torch.float8_e4m3fn).float().unflatten(-1, (TILES, TILE))
    nope = nope * tables[0][e].unsqueeze(-1) * tables[1][e].unsqueeze(-1)
    rows = torch.cat([nope.flatten(-2).to(BF16), raw[..., NOPE:].view(BF16)], -1)
    return rows.masked_fill(~ok.unsqueeze(-1), 0)


def weights_times_values(p, g, split):
    """p [C, h, width] fp32 @ g [C, width, 512]. g holds bf16 values, exact in TF32. With split, p
    goes in as two TF32-exact parts (high: low 13 mantissa bits cleared; low: the rest), so TF32
    tensor cores give about 21 bits of p instead of 10: fp32-grade accuracy at tensor-core speed."""
    if not split:
        return torch.matmul(p, g)
    hi = (p.view(torch.int32) & ~0x1FFF).view(torch.float32)
    return torch.baddbmm(torch.matmul(p - hi, g), hi, g)


def attention(q, kv, comb, lens, sink, sm_scale, chunk, out, lse, mx, cols, split=True):
    """Sparse attention with sinks over kv [S + 1, 512] (row S is zeros), in chunks of tokens."""
    S = kv.shape[0] - 1
    for t0 in range(0, q.shape[0], chunk):
        t1 = min(q.shape[0], t0 + chunk)
        idx = comb[t0:t1]
        ok = (cols[None, :idx.shape[1]] < lens[t0:t1, None]) & (idx >= 0) & (idx < S)
        g = kv[torch.where(ok, idx, S)].float()                          # [C, width, 512]
        p = torch.matmul(q[t0:t1].float(), g.transpose(1, 2)).mul_(sm_scale)  # [C, h, width]
        p.masked_fill_(~ok[:, None, :], float("-inf"))
        m = p.amax(-1)
        ms = torch.where(m == float("-inf"), 0.0, m)
        p = p.sub_(ms.unsqueeze(-1)).exp_()
        s = p.sum(-1)
        denom = s if sink is None else s + torch.exp(sink[None, :] - ms)   # exp(L - ms)
        p.div_(torch.where(s > 0, denom, 1.0).unsqueeze(-1))
        out[t0:t1] = weights_times_values(p, g, split)
        lse[t0:t1] = torch.where(s > 0, torch.log(s) + ms, float("inf"))
        mx[t0:t1] = m


class Peer:
    """Static tensors of one chunk shape and the step over them (eager or captured)."""

    def __init__(self, case, chunk, device, split=True):
        self.dev, self.chunk, self.W, self.split = device, chunk, case["window"], split
        self.swa_bs = case["swa_block_size"]
        qsl, seq = case["query_start_loc"], case["seq_lens"]
        self.R, self.T = len(seq), case["layers"][0]["q"].shape[0]
        qlen = qsl[1:] - qsl[:-1]
        self.G = int(np.minimum(seq, qlen + self.W - 1).max())
        pin = device.type == "cuda"
        self.host, self.static = [], []
        def static(a):  # host array -> (pinned host tensor, device tensor) pair restaged every step
            h = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32))
            h = h.pin_memory() if pin else h
            self.host.append(h)
            self.static.append(torch.empty_like(h, device=device))
            return self.static[-1]
        self.qsl, self.seq, self.swa_table = static(qsl), static(seq), static(case["swa_table"])
        self.comp_table = {r: static(t) for r, t in case["comp_tables"].items()}
        self.tables = scale_tables(device)
        self.tok = torch.arange(self.T, device=device)
        self.layers = []
        for spec in case["layers"]:
            r, k = spec["ratio"], spec["top_k"]
            L = dict(spec, N=int((seq // r).max()) if r > 1 else 0,
                     width=(k + self.W + 127) // 128 * 128,
                     swa=cache_views(spec["swa_cache"], self.swa_bs),
                     comp=cache_views(spec["comp_cache"], case["block_tokens"] // r) if r > 1 else None)
            L["M"] = L["N"] + self.G
            L["kv"] = torch.zeros(self.R * L["M"] + 1, D, dtype=BF16, device=device)
            h = spec["q"].shape[1]
            L["out"] = torch.zeros(self.T, h, D, dtype=BF16, device=device)
            L["lse"] = torch.zeros(self.T, h, dtype=torch.float32, device=device)
            L["mx"] = torch.zeros(self.T, h, dtype=torch.float32, device=device)
            self.layers.append(L)
        self.rows = torch.arange(max([L["N"] for L in self.layers] + [self.G]), device=device)
        self.cols = torch.arange(max(L["width"] for L in self.layers), device=device)

    def stage(self):
        for h, d in zip(self.host, self.static):
            d.copy_(h, non_blocking=True)

    def outputs(self):
        return [(L["out"], L["lse"], L["mx"]) for L in self.layers]

    def _slots(self, table, logical, ok, bs):
        col = torch.clamp(logical // bs, 0, table.shape[1] - 1).expand(self.R, -1)
        return torch.gather(table.long(), 1, col), logical % bs, ok

    def token_meta(self):
        """Per request and per token, from the staged metadata (device tensors, no host sync)."""
        qsl, seq = self.qsl.long(), self.seq.long()
        qlen = qsl[1:] - qsl[:-1]
        glen = torch.minimum(seq, qlen + self.W - 1)
        b = (self.tok[:, None] >= qsl[None, 1:self.R]).sum(1)          # request of each token
        pos = seq[b] - qlen[b] + self.tok - qsl[b]
        return {"seq": seq, "glen": glen, "gstart": seq - glen, "b": b, "pos": pos,
                "live": self.tok < qsl[self.R], "swa_len": torch.clamp(pos + 1, max=self.W)}

    def step(self):
        """The whole step: no host syncs, no data-dependent shapes (CUDA-graph capturable)."""
        R, m = self.R, self.token_meta()
        seq, j = m["seq"], self.rows[None, :self.G]
        swa_slots = self._slots(self.swa_table, m["gstart"][:, None] + j, j < m["glen"][:, None], self.swa_bs)
        comp_slots = {}
        for L in self.layers:
            r, N, M = L["ratio"], L["N"], L["M"]
            ws = L["kv"][:R * M].view(R, M, D)
            if r > 1:
                if r not in comp_slots:
                    i = self.rows[None, :N]
                    comp_slots[r] = self._slots(self.comp_table[r], i, i < (seq // r)[:, None], L["comp"][0].shape[1])
                ws[:, :N].copy_(dequant(L["comp"], *comp_slots[r], self.tables))
            ws[:, N:].copy_(dequant(L["swa"], *swa_slots, self.tables))
            comb, lens = self.combine(L, m)
            attention(L["q"], L["kv"], comb, lens, L.get("sink"), L["sm_scale"], self.chunk,
                      L["out"], L["lse"], L["mx"], self.cols, self.split)

    def combine(self, L, m):
        """Stage 3: the combined index row of every token and its length."""
        r, k, N, M, width = L["ratio"], L["top_k"], L["N"], L["M"], L["width"]
        b, pos, swa_len = m["b"], m["pos"], m["swa_len"]
        j = self.cols[None, :width]
        if r > 1:
            topk_len = torch.clamp((pos + 1) // r, max=k)
            tk = F.pad(L["topk"].long(), (0, width - k), value=-1)
            ok = (tk >= 0) & (tk < (m["seq"] // r)[b][:, None])  # -1 (or a bad entry) stays -1
            tk = torch.where(ok, tk + M * b[:, None], -1)
        else:
            topk_len, tk = torch.zeros_like(pos), -1
        j2 = j - topk_len[:, None]
        win = M * b[:, None] + N + (pos - swa_len + 1 - m["gstart"][b])[:, None] + j2
        comb = torch.where(j < topk_len[:, None], tk, torch.where(j2 < swa_len[:, None], win, -1))
        return comb, torch.where(m["live"], topk_len + swa_len, 0)


def capture(peer):
    """Warm up on a side stream, then capture peer.step() into a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            peer.step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        peer.step()
    torch.cuda.synchronize()
    return graph


def graph_matches_eager(peer, graph):
    """Eager outputs, cleared, then the graph's replay of the same step: (bitwise equal, max |diff|)."""
    peer.stage()
    peer.step()
    eager = [tuple(t.clone() for t in o) for o in peer.outputs()]
    for o in peer.outputs():
        for t in o:
            t.zero_()
    peer.stage()
    graph.replay()
    torch.cuda.synchronize()
    pairs = [(a, b) for e, g in zip(eager, peer.outputs()) for a, b in zip(e, g)]
    return all(torch.equal(a, b) for a, b in pairs), max(max_diff(a, b) for a, b in pairs)


# ----------------------------------------------------------------------------- float64 reference
def e4m3_table():
    v = np.arange(256)
    e, m = (v >> 3) & 15, (v & 7) / 8.0
    mag = np.where(e == 0, m * 2.0 ** -6, (1 + m) * np.exp2(e - 7.0))
    t = np.where(v & 0x80, -mag, mag)
    t[[0x7F, 0xFF]] = np.nan
    return t


E4M3 = e4m3_table()


def bf16_bits_to_f64(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def bf16_round(x):
    """float64 -> nearest bf16 (ties to even), as float64."""
    with np.errstate(over="ignore"):
        u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return bf16_bits_to_f64(((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16))


def ref_dequant(cache, bs, table_row, logical):
    """Logical rows of one request, read byte by byte from the cache: float64 [n, 512]."""
    logical = np.asarray(logical, dtype=np.int64)
    blk, off = table_row[logical // bs].astype(np.int64), logical % bs
    assert (blk >= 0).all() and (blk < cache.shape[0]).all(), "reference: bad block id"
    flat = cache.reshape(-1)
    data = flat[(blk * cache.shape[1] + off * ROW)[:, None] + np.arange(ROW)]
    sc = flat[(blk * cache.shape[1] + bs * ROW + off * SCALE_ROW)[:, None] + np.arange(TILES)]
    nope = E4M3[data[:, :NOPE]].reshape(-1, TILES, TILE) * np.exp2(sc.astype(np.float64) - 127)[:, :, None]
    rope = bf16_bits_to_f64(np.ascontiguousarray(data[:, NOPE:]).view("<u2"))
    return np.concatenate([bf16_round(nope.reshape(-1, NOPE)), rope], 1)


def reference(case, layer, device):
    """Per token, straight from the caches (no workspace, no combined rows), in float64."""
    qsl, seq, W = case["query_start_loc"], case["seq_lens"], case["window"]
    r, k = layer["ratio"], layer["top_k"]
    cache = {n: layer[n].cpu().numpy() if layer[n] is not None else None for n in ("swa_cache", "comp_cache")}
    q = layer["q"].to(device).double()
    topk = layer["topk"].cpu().numpy() if r > 1 else None
    sink = layer["sink"].to(device).double() if layer.get("sink") is not None else None
    scale = float(np.float32(layer["sm_scale"]))
    T, h = q.shape[:2]
    out = torch.zeros(T, h, D, dtype=torch.float64, device=device)
    lse = torch.full((T, h), float("inf"), dtype=torch.float64, device=device)
    mx = torch.full((T, h), float("-inf"), dtype=torch.float64, device=device)
    for b in range(len(seq)):
        s, ql = int(seq[b]), int(qsl[b + 1] - qsl[b])
        nrows, gstart = (s // r if r > 1 else 0), s - min(s, ql + W - 1)
        comp = torch.from_numpy(ref_dequant(cache["comp_cache"], case["block_tokens"] // r, case["comp_tables"][r][b],
                                            np.arange(nrows)) if nrows else np.zeros((0, D))).to(device)
        swa = torch.from_numpy(ref_dequant(cache["swa_cache"], case["swa_block_size"], case["swa_table"][b],
                                           np.arange(gstart, s))).to(device)
        for i in range(ql):
            t, pos = int(qsl[b]) + i, s - ql + i
            swa_len = min(pos + 1, W)
            keys = [swa[pos - swa_len + 1 - gstart: pos + 1 - gstart]]
            if r > 1:
                sel = topk[t, :min((pos + 1) // r, k)]
                sel = sel[(sel >= 0) & (sel < nrows)]
                keys.insert(0, comp[torch.from_numpy(sel.astype(np.int64)).to(device)])
            kk = torch.cat(keys)
            p = scale * (q[t] @ kk.T)
            mx[t], lse[t] = p.amax(1), torch.logsumexp(p, 1)
            L = lse[t] if sink is None else torch.logaddexp(lse[t], sink)
            out[t] = torch.exp(p - L[:, None]) @ kk
    return out.cpu(), lse.cpu(), mx.cpu()


def check_out(got, ref):
    """Bars for out: every element |err| <= 8e-4 or rel <= 2.4e-2; 1 - cos <= 1e-5; NaN fails."""
    err = (got - ref).abs()
    bad = ~((err <= 8e-4) | (err <= 2.4e-2 * ref.abs()))
    den = float(got.norm() * ref.norm())
    one_minus_cos = 1.0 - float((got * ref).sum()) / den if den > 0 else (0.0 if got.abs().max() == 0 else 1.0)
    n_bad, worst = int(bad.sum()), float(err.nan_to_num(float("inf")).max())
    return n_bad == 0 and one_minus_cos <= 1e-5, \
        f"max |err| {worst:.3g}, {n_bad} over the bar, 1-cos {one_minus_cos:.3g}"


def check_stat(got, ref):
    """Bars for lse / max_logits: |err| <= 1e-4 or rel <= 3e-5; infinities must match exactly."""
    fin = torch.isfinite(ref)
    err = torch.where(fin, (got - ref).abs(), torch.zeros_like(ref))
    bad = torch.where(fin, ~((err <= 1e-4) | (err <= 3e-5 * ref.abs())), got != ref)
    n_bad, worst = int(bad.sum()), float(err.nan_to_num(float("inf")).max())
    return n_bad == 0, f"max |err| {worst:.3g}, {n_bad} over the bar"


def compare(label, outs, ref):
    ok_all = True
    for name, got, want, fn in zip(("out", "lse", "max_logits"), outs, ref, (check_out, check_stat, check_stat)):
        ok, msg = fn(got.cpu().double(), want)
        ok_all &= ok
        log(f"{'PASS' if ok else 'FAIL'} {label}: {name}: {msg}")
    return ok_all


def max_diff(a, b):
    a, b = a.cpu().double(), b.cpu().double()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    return float(torch.where(same, 0.0, (a - b).abs()).max())


# ----------------------------------------------------------------------------- --check
def load_dump(d):
    with open(os.path.join(d, "manifest.json")) as f:
        man = json.load(f)
    types = {"uint8": np.uint8, "int32": "<i4", "float32": "<f4", "bfloat16": "<i2"}
    arr = {}
    for key, e in man["files"].items():
        a = np.fromfile(os.path.join(d, e["file"]), dtype=types[e["dtype"]])
        assert a.size == int(np.prod(e["shape"])), f"{e['file']}: {a.size} elements, manifest says {e['shape']}"
        arr[key] = a.reshape(e["shape"])
    return man, arr


def tensor(a, device):
    t = torch.from_numpy(np.ascontiguousarray(a))
    return (t.view(BF16) if t.dtype == torch.int16 else t).to(device)


def run_check(args, device):
    man, a = load_dump(args.check)
    r = man["compress_ratio"]
    qlens = a["query_lens"].astype(np.int32)
    assert man["d_qk"] == D and man["d_v"] == D, "the peer runs the V4 cache form (d = 512)"
    case = {"window": man["window"], "swa_block_size": man["swa_block_size"], "block_tokens": man["block_tokens"],
            "query_start_loc": np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32),
            "seq_lens": a["seq_lens"].astype(np.int32), "swa_table": a["swa_block_table"],
            "comp_tables": {r: a["compressed_block_table"]}}
    assert man.get("compressed_rows_per_block", man["block_tokens"] // r) == man["block_tokens"] // r
    case["layers"] = [{"ratio": r, "top_k": man["top_k"], "sm_scale": man["sm_scale"],
                       "swa_cache": tensor(a["swa_cache"], device), "comp_cache": tensor(a["compressed_cache"], device),
                       "q": tensor(a["q"], device), "topk": tensor(a["topk_indices"], device),
                       "sink": tensor(a["attn_sink"], device)}]
    spg = [tensor(a[k], "cpu") for k in ("out", "lse", "max_logits")]
    log(f"check: workload {man.get('workload')}: {len(qlens)} requests, {int(qlens.sum())} tokens, "
        f"seq_lens {a['seq_lens'].tolist()}, r {r}, top_k {man['top_k']}, W {man['window']}, h_q {man['h_q']}")
    peer = Peer(case, args.chunk, device, not args.strict_fp32)
    peer.stage()
    peer.step()
    mine = [t.clone() for t in peer.outputs()[0]]
    ok = True
    if device.type == "cuda":
        same, diff = graph_matches_eager(peer, capture(peer))
        log(f"{'PASS' if same else 'FAIL'} peer CUDA graph == peer eager (bitwise; max |diff| {diff:.3g})")
        ok &= same
    ref = reference(case, case["layers"][0], device)
    ok &= compare("peer vs float64 reference", mine, ref)
    ok &= compare("spgraph vs float64 reference", spg, ref)
    log("peer vs spgraph max |diff|: " + ", ".join(f"{n} {max_diff(x, y):.3g}" for n, x, y in
                                                  zip(("out", "lse", "max_logits"), mine, spg)))
    log("check: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


# ----------------------------------------------------------------------------- random cases
def random_cache(nblocks, bs, gen, device, realistic):
    """A cache full of valid rows: random FP8 bytes (no NaN codes) with scale bytes 112..115, so
    values stay under 448 * 2^-12 = 0.11 (the magnitude the accuracy bars are calibrated for, and
    what spgraph's bench fills its caches with), random bf16 RoPE of similar size; or (realistic)
    N(0, 1) rows quantized as the spec says."""
    cache = torch.zeros(nblocks, block_stride(bs), dtype=torch.uint8, device=device)
    data, scale = cache_views(cache, bs)
    if realistic:
        x = torch.randn(nblocks, bs, TILES, TILE, generator=gen, device=device, dtype=torch.float64)
        e = torch.ceil(torch.log2(x.abs().amax(-1).clamp_min(1e-4) / 448))
        data[..., :NOPE] = (x / torch.exp2(e)[..., None]).clamp(-448, 448).float().to(torch.float8_e4m3fn) \
            .view(torch.uint8).flatten(-2)
        scale[..., :TILES] = (e + 127).clamp(0, 255).to(torch.uint8)
    else:
        b = torch.randint(0, 254, (nblocks, bs, NOPE), generator=gen, device=device, dtype=torch.uint8)
        data[..., :NOPE] = b + (b >= 0x7F).to(torch.uint8)
        scale[..., :TILES] = torch.randint(112, 116, (nblocks, bs, TILES), generator=gen, device=device,
                                           dtype=torch.uint8)
    rope = torch.randn(nblocks, bs, 64, generator=gen, device=device)
    data[..., NOPE:] = (rope if realistic else 0.05 * rope).to(BF16).view(torch.uint8)
    return cache


def random_case(seq_lens, query_lens, layers, h_q, window, device, seed=1, swa_bs=64, block_tokens=256,
                realistic=False):
    """Random valid inputs for a chunk. layers: list of (ratio, top_k). Blocks are shuffled."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    seq, ql = np.asarray(seq_lens, np.int32), np.asarray(query_lens, np.int32)
    R, T = len(seq), int(ql.sum())
    def table(bs_tokens):
        per = int(-(-seq.max() // bs_tokens))
        return rng.permutation(R * per).reshape(R, per).astype(np.int32), R * per
    swa_table, swa_blocks = table(swa_bs)
    comp = {r: table(block_tokens) for r in sorted({r for r, _ in layers if r > 1})}
    case = {"window": window, "swa_block_size": swa_bs, "block_tokens": block_tokens,
            "query_start_loc": np.concatenate([[0], np.cumsum(ql)]).astype(np.int32), "seq_lens": seq,
            "swa_table": swa_table, "comp_tables": {r: t for r, (t, _) in comp.items()}, "layers": []}
    b_of_t = np.repeat(np.arange(R), ql)
    for r, k in layers:
        L = {"ratio": r, "top_k": k, "sm_scale": D ** -0.5,
             "swa_cache": random_cache(swa_blocks, swa_bs, gen, device, realistic),
             "comp_cache": random_cache(comp[r][1], block_tokens // r, gen, device, realistic) if r > 1 else None,
             "q": torch.randn(T, h_q, D, generator=gen, device=device).to(BF16),
             "sink": torch.randn(h_q, generator=gen, device=device)}
        if r > 1:
            nrows = (seq // r)[b_of_t][:, None]
            tk = (rng.random((T, k)) * nrows).astype(np.int32)
            tk[rng.random((T, k)) < 0.06] = -1
            L["topk"] = torch.from_numpy(tk).to(device)
        case["layers"].append(L)
    return case


# ----------------------------------------------------------------------------- --selftest
def combine_loop(case, L):
    """Stage 3 straight from the formulas, one token and entry at a time."""
    qsl, seq, W = case["query_start_loc"], case["seq_lens"], case["window"]
    r, k, N, M, width = L["ratio"], L["top_k"], L["N"], L["M"], L["width"]
    T = L["q"].shape[0]
    comb, lens = np.full((T, width), -1, np.int64), np.zeros(T, np.int64)
    topk = L["topk"].cpu().numpy() if r > 1 else None
    for b in range(len(seq)):
        ql = qsl[b + 1] - qsl[b]
        gstart = seq[b] - min(seq[b], ql + W - 1)
        for t in range(qsl[b], qsl[b + 1]):
            pos = seq[b] - ql + (t - qsl[b])
            topk_len, swa_len = (min((pos + 1) // r, k) if r > 1 else 0), min(pos + 1, W)
            for j in range(topk_len):
                x = topk[t, j]
                comb[t, j] = x + M * b if 0 <= x < seq[b] // r else -1
            for j in range(swa_len):
                comb[t, topk_len + j] = M * b + N + (pos - swa_len + 1 - gstart) + j
            lens[t] = topk_len + swa_len
    return comb, lens


def run_selftest(args, device):
    ok = True
    def report(cond, what):
        nonlocal ok
        ok &= bool(cond)
        log(f"{'PASS' if cond else 'FAIL'} {what}")

    # FP8 dequant, hand-worked: e4m3 byte * 2^(scale byte - 127), one value per tile, then RoPE.
    cache = torch.zeros(1, block_stride(1), dtype=torch.uint8, device=device)
    codes = [(0x40, 126), (0xC5, 129), (0x03, 127), (0x08, 255), (0x7E, 0), (0x7E, 127), (0xB8, 124)]
    want = [1.0, -13.0, 3 * 2.0 ** -9, 2.0 ** 122, 1.75 * 2.0 ** -119, 448.0, -0.125]
    for i, (c, s) in enumerate(codes):
        cache[0, i * TILE], cache[0, ROW + i] = c, s
    cache[0, NOPE:NOPE + 2] = torch.tensor([0xC0, 0x3F], dtype=torch.uint8)   # bf16 0x3FC0 = 1.5
    zero = torch.zeros(1, 1, dtype=torch.long, device=device)
    row = dequant(cache_views(cache, 1), zero, zero, zero == 0, scale_tables(device))[0, 0].double().cpu()
    got = row[[i * TILE for i in range(TILES)] + [NOPE]].tolist()
    report(got == want + [1.5], f"FP8 dequant hand-worked values: {got}")
    report(np.array_equal(ref_dequant(cache.cpu().numpy(), 1, np.zeros(1, np.int32), [0])[0], row.numpy()),
           "FP8 dequant: peer == byte-level reference, whole row")

    # The docs' combine example: r = 4, W = 128, top_k = 1024, pos = 1000 -> lens 378.
    ex = random_case([1001], [1], [(4, 1024)], 2, 128, device, realistic=True)
    p = Peer(ex, args.chunk, device, not args.strict_fp32)
    p.stage()
    lens = int(p.combine(p.layers[0], p.token_meta())[1][0])
    report(lens == 378 and combine_loop(ex, p.layers[0])[1][0] == 378, f"combine: docs example pos 1000: lens {lens}")

    # A three-layer program (C4A, SWA-only, C128A) over four requests of uneven lengths.
    case = random_case([37, 700, 3, 300], [5, 20, 3, 1], [(4, 32), (1, 0), (128, 64)], 8, 16, device, seed=7,
                       swa_bs=8, block_tokens=128, realistic=True)
    case["layers"][0]["topk"][3, 0] = 9999     # a bad entry: masked like -1
    sink = case["layers"][0]["sink"]
    sink[0], sink[1] = float("inf"), float("-inf")
    peer = Peer(case, 7, device, not args.strict_fp32)  # 7-token chunks: several, a ragged last one
    peer.stage()
    peer.step()
    qsl, seq = case["query_start_loc"], case["seq_lens"]
    for li, L in enumerate(peer.layers):
        r, N, M = L["ratio"], L["N"], L["M"]
        kv = L["kv"][:peer.R * M].view(peer.R, M, D).double().cpu().numpy()
        exact = True
        for b in range(peer.R):
            s, ql = int(seq[b]), int(qsl[b + 1] - qsl[b])
            g = min(s, ql + case["window"] - 1)
            if r > 1:
                rows = ref_dequant(case["layers"][li]["comp_cache"].cpu().numpy(), case["block_tokens"] // r,
                                   case["comp_tables"][r][b], np.arange(s // r))
                exact &= np.array_equal(kv[b, :s // r], rows) and not kv[b, s // r:N].any()
            rows = ref_dequant(case["layers"][li]["swa_cache"].cpu().numpy(), case["swa_block_size"],
                               case["swa_table"][b], np.arange(s - g, s))
            exact &= np.array_equal(kv[b, N:N + g], rows) and not kv[b, N + g:].any()
        report(exact, f"layer {li} (r {r}): gathered workspace == byte-level reference (bit-exact)")
        comb, lens = (t.cpu().numpy() for t in peer.combine(L, peer.token_meta()))
        want_c, want_l = combine_loop(case, L)
        mask = np.arange(L["width"])[None] < want_l[:, None]
        report(np.array_equal(lens, want_l) and np.array_equal(np.where(mask, comb, -1), want_c),
               f"layer {li}: combined indices and lens == loop over the formulas")
        ok &= compare(f"layer {li}: peer vs float64 reference", peer.outputs()[li],
                      reference(case, case["layers"][li], device))
    # Random FP8 bytes (every code but NaN) and random RoPE, as the benchmark fills its caches.
    rnd = random_case([300, 41], [9, 41], [(4, 64)], 8, 16, device, seed=11, swa_bs=8, block_tokens=128)
    p = Peer(rnd, 16, device, not args.strict_fp32)
    p.stage()
    p.step()
    ok &= compare("random-byte caches: peer vs float64 reference", p.outputs()[0],
                  reference(rnd, rnd["layers"][0], device))
    # An empty row (lens 0) and a +inf sink: out 0, max_logits -inf, lse +inf.
    L = peer.layers[0]
    out, lse, mx = (torch.empty_like(t) for t in (L["out"][:2], L["lse"][:2], L["mx"][:2]))
    comb = torch.zeros(2, L["width"], dtype=torch.long, device=device)
    attention(L["q"][:2], L["kv"], comb, torch.tensor([0, 1], device=device), L["sink"], L["sm_scale"], 4,
              out, lse, mx, peer.cols)
    report(not out[0].any() and bool((mx[0] == float("-inf")).all()) and bool((lse[0] == float("inf")).all())
           and not out[1, 0].any() and out[1, 1].any(), "empty row and +inf sink give out 0, max -inf, lse +inf")
    if device.type == "cuda":
        same, diff = graph_matches_eager(peer, capture(peer))
        report(same, f"CUDA graph == eager (bitwise; max |diff| {diff:.3g})")
    log("selftest: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


# ----------------------------------------------------------------------------- --bench
WORKLOADS = [  # name, requests, new tokens per request, prefix per request, layers as (ratio, top_k)
    ("tiny", 1, 16, 4096, [(4, 512)]),
    ("small", 4, 64, 8192, [(4, 512)]),
    ("medium", 4, 512, 16384, [(4, 1024)]),
    ("large", 4, 2048, 32768, [(4, 1024)]),
    ("model", 4, 256, 16384, [(4, 1024), (128, 512), (4, 1024), (1, 0), (4, 1024), (128, 512), (4, 1024), (1, 0)]),
]


def time_step(run, device, reps, wall_steps):
    """Microseconds per step: GPU (CUDA events around the call), host (perf_counter around the call,
    synchronized after), wall (back-to-back steps). Medians; 3 warm-up steps first."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        run()
    sync()
    gpu, host = [], []
    start, stop = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else (None, None)
    for _ in range(reps):
        if cuda:
            start.record()
            run()
            stop.record()
            stop.synchronize()
            gpu.append(start.elapsed_time(stop) * 1e3)
        else:  # CPU self-test only: the call is synchronous
            t0 = time.perf_counter()
            run()
            gpu.append((time.perf_counter() - t0) * 1e6)
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        host.append((time.perf_counter() - t0) * 1e6)
        sync()
    t0 = time.perf_counter()
    for _ in range(wall_steps):
        run()
    sync()
    wall = (time.perf_counter() - t0) * 1e6 / wall_steps
    return {"gpu_us": float(np.median(gpu)), "host_us": float(np.median(host)), "wall_us": wall}


def run_bench(args, device):
    t_begin = time.perf_counter()
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    names = args.workloads.split(",") if args.workloads else [w[0] for w in WORKLOADS]
    unknown = set(names) - {w[0] for w in WORKLOADS}
    assert not unknown, f"unknown workloads {sorted(unknown)}"
    reps, wall_steps = (20, 50) if args.quick else (30, 200)
    commit, date = os.environ.get("SPGRAPH_COMMIT", "unknown"), datetime.date.today().isoformat()
    records, table, status = [], [], 0
    for seed, (name, R, new, prefix, layers) in enumerate(WORKLOADS, 1):
        if name not in names:
            continue
        left = args.time_budget - (time.perf_counter() - t_begin)
        log(f"== {name}: {R} x {new} tokens, prefix {prefix}, {len(layers)} layer(s); {left:.0f} s of budget left")
        if left < 5:
            log("   skipped: the time budget is spent")
            table.append((name, R * new, "skipped (time)", None, None, None, ""))
            continue
        case = peer = graph = None
        try:
            case = random_case([prefix + new] * R, [new] * R, layers, 128, 128, device, seed=seed)
            peer = Peer(case, args.chunk, device, not args.strict_fp32)
            def eager():
                peer.stage()
                peer.step()
            eager()
            sync()
            t0 = time.perf_counter()
            eager()
            sync()
            one = time.perf_counter() - t0
            projected = one * 2 * (3 + 2 * reps + wall_steps + 4)
            if projected > left:
                log(f"   skipped: projected {projected:.0f} s (eager step {one * 1e3:.1f} ms) > {left:.0f} s left")
                table.append((name, R * new, "skipped (time)", None, None, None, ""))
                continue
            results = {"torch-eager" if cuda else "torch-eager-cpu": time_step(eager, device, reps, wall_steps)}
            same = ""
            if cuda:
                graph = capture(peer)
                def replay():
                    peer.stage()
                    graph.replay()
                results["torch-graph"] = time_step(replay, device, reps, wall_steps)
                equal, diff = graph_matches_eager(peer, graph)
                same = "yes" if equal else f"NO ({diff:.3g})"
                if not equal:
                    status = 1
                    log(f"   FAIL: graph output differs from eager output (max |diff| {diff:.3g})")
            for variant, m in results.items():
                table.append((name, R * new, variant, m["gpu_us"], m["host_us"], m["wall_us"], same))
                log(f"   {variant:<16} gpu {m['gpu_us']:10.1f} us  host {m['host_us']:9.1f} us  "
                    f"wall {m['wall_us']:10.1f} us")
                records += [{"suite": "pipeline", "name": name, "variant": variant, "metric": k, "value": v,
                             "commit": commit, "date": date} for k, v in m.items()]
        except torch.cuda.OutOfMemoryError:
            log("   skipped: does not fit in device memory")
            table.append((name, R * new, "skipped (memory)", None, None, None, ""))
        except RuntimeError as e:  # e.g. a cuBLAS allocation failure: report it, go on with the next
            status = 1
            log(f"   skipped: error: {str(e).splitlines()[0]}")
            table.append((name, R * new, "skipped (error)", None, None, None, ""))
        finally:
            case = peer = graph = None  # free the workload before the next one
            if cuda:
                torch.cuda.empty_cache()
    log(f"\nPyTorch peer, table B ({'quick' if args.quick else 'full'}; chunk {args.chunk} tokens; "
        "medians, us per step)")
    log(f"{'workload':<9}{'tokens':>7}  {'variant':<17}{'gpu_us':>11}{'host_us':>10}{'wall_us':>11}  graph==eager")
    for name, tokens, variant, g, h, w, same in table:
        nums = "".join(f"{x:>11.1f}" if i != 1 else f"{x:>10.1f}" for i, x in enumerate((g, h, w))) if g else ""
        log(f"{name:<9}{tokens:>7}  {variant:<17}{nums}  {same}")
    if args.json:
        with open(args.json, "w") as f:
            f.write("[\n" + ",\n".join("  " + json.dumps(r) for r in records) + "\n]\n")
        log(f"wrote {len(records)} records to {args.json}")
    return status


def main():
    ap = argparse.ArgumentParser(description="PyTorch peer of spgraph's prefill pipeline (see the module docstring)")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", metavar="DIR", help="compare with spgraph on a `bench --dump DIR` dump")
    mode.add_argument("--bench", action="store_true", help="table B workloads, eager and CUDA graph")
    mode.add_argument("--selftest", action="store_true", help="small random case against the float64 reference")
    ap.add_argument("--json", metavar="FILE", help="--bench: write the records to FILE")
    ap.add_argument("--quick", action="store_true", help="--bench: 20 timed reps and 50 wall steps (else 30, 200)")
    ap.add_argument("--workloads", help="--bench: comma-separated subset of tiny,small,medium,large,model")
    ap.add_argument("--time-budget", type=float, default=240, help="--bench: seconds; later workloads that "
                    "would not fit are skipped (default 240)")
    ap.add_argument("--chunk", type=int, default=256, help="tokens per attention chunk (default 256)")
    ap.add_argument("--strict-fp32", action="store_true", help="fp32 matmuls without TF32")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu only for a local self-test")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        log("no CUDA device: use --device cpu for a self-test")
        return 2
    torch.set_float32_matmul_precision("highest" if args.strict_fp32 else "high")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    math = "fp32" if args.strict_fp32 else "tf32, PV split"
    log(f"torch_peer: torch {torch.__version__} on {where}; matmuls {math}; attention chunk {args.chunk} tokens")
    with torch.inference_mode():
        if args.check:
            return run_check(args, device)
        if args.bench:
            return run_bench(args, device)
        return run_selftest(args, device)


if __name__ == "__main__":
    sys.exit(main())

"""GPU: whole steps from Python (Executor.run_step / run_step_eager) against chunks run one by one.

* a step of k random chunks (k = 1 .. 16, mixed buckets, one-request chunks and chunks at the
  bucket maximum, requests continued into the next chunk) in one launch leaves exactly what its k
  chunks leave run one by one through Executor.run, each on its rows of the step's inputs (every
  row of every layer's out / lse / max_logits, NaN-poisoned before each run, and every cache, bit
  for bit), graph (replayed twice) and eager, steps of different sizes alternating, for two
  programs; the step spelled as lists, NumPy arrays or a dict reads alike;
* a staged step (stage_step once, run_staged per program) equals run_step of each program, its
  first launch and its reruns, graph and eager, flat or not; an accepted run_step replaces it;
* a step of no requests launches and writes nothing, graph and eager;
* zero CUDA allocation calls (CUPTI) and zero torch allocator growth over many run_step calls of
  varying size, scheduler StepPlans and spelled steps;
* refusals are statuses (RunError only with check=True), the same as check_step's without a GPU.

Modelled on tests/gpu/test_step.cpp. Skipped (reported as skipped) without torch or a CUDA device.
"""

import random

import pytest

from conftest import (HAVE_CUDA, allocation_control, assert_torch_allocator_unchanged, attached_allocation_counter,
                      torch_allocator_state)

pytestmark = pytest.mark.gpu

if HAVE_CUDA:
    import numpy as np
    import torch

    import spgraph
    import spgraph.torch as sgt

STEP_REQUESTS = 64
STEP_TOKENS = 1024  # 16 chunks of T = 64
MIN_PREFIX = 256    # every piece's seq_len > 256: one set of top-k indices fits all
STEPS = {"max_step_requests": STEP_REQUESTS, "max_step_tokens": STEP_TOKENS}


def step_config():
    """R 4, T 64; C4A h64 with a sink, SWA h128, C128A h64; caches for 64 requests of up to 453 tokens."""
    c = spgraph.PipelineConfig(max_requests=4, max_tokens=64, max_model_len=2048,
                               layers=[spgraph.LayerConfig(h_q=64, compress_ratio=4, top_k=512),
                                       spgraph.LayerConfig(h_q=128, compress_ratio=1, top_k=0, attn_sink=False),
                                       spgraph.LayerConfig(h_q=64, compress_ratio=128, top_k=512)])
    c.cache.swa_blocks = 521
    c.cache.compressed_blocks = 131
    c.validate()
    return c


def split(config, query_lens, seq_lens):
    """The split rule (docs/graphs.md, "Steps"): chunks of at most R requests and T tokens, a
    request's later pieces each opening a fresh chunk. Each chunk: [(request, tokens, seq_len)]."""
    R, T = config.max_requests, config.max_tokens
    chunks = []
    for i, (q, s) in enumerate(zip(query_lens, seq_lens)):
        left, end, first = q, s - q, True
        while left > 0:
            cur = chunks[-1] if chunks else None
            if first and cur is not None and len(cur) < R and sum(t for _, t, _ in cur) < T:
                t = min(left, T - sum(t for _, t, _ in cur))
            else:
                cur = []
                chunks.append(cur)
                t = min(left, T)
            end += t
            cur.append((i, t, end))
            left -= t
            first = False
    return chunks


def make_step(config, lens, rng):
    """A step of these query lengths, each request with its own cache blocks: (Chunk, tables)."""
    swa_free = list(range(config.cache.swa_blocks))
    comp_free = {r: list(range(config.cache.compressed_blocks)) for r in (4, 128)}
    rng.shuffle(swa_free)
    for v in comp_free.values():
        rng.shuffle(v)
    seq, swa, comp = [], [], {4: [], 128: []}
    for q in lens:
        s = MIN_PREFIX + rng.randrange(64) + q
        seq.append(s)
        n = -(-s // config.cache.swa_block_size)
        swa.append([swa_free.pop() for _ in range(n)])
        for r in (4, 128):
            comp[r].append([comp_free[r].pop() for _ in range(-(-s // config.cache.block_tokens))])
    return spgraph.Chunk(list(lens), seq, swa, comp)


def step_of(config, k, rng):
    """A random step that splits into exactly k chunks: one-token, short, T-token and longer-than-T
    requests (continued into the next chunk)."""
    if k == 0:
        return spgraph.Chunk([], [], None)
    T = config.max_tokens
    for _ in range(10000):
        lens, tokens = [], 0
        while len(lens) < STEP_REQUESTS:
            q = rng.choice([1, 1 + rng.randrange(8), T, T + 1 + rng.randrange(70), 1 + rng.randrange(T)])
            if tokens + q > STEP_TOKENS:
                break
            lens.append(q)
            tokens += q
            n = len(split(config, lens, lens))
            if n == k and rng.randrange(3) == 0:
                return make_step(config, lens, rng)
            if n > k:
                break
    raise AssertionError(f"no random step of {k} chunks found")


class StepRig:
    """An executor with steps, random step inputs on every row of its buffers, and its starting caches."""

    def __init__(self, config, seed=17, **options):
        self.config = config
        self.ex = sgt.Executor(config, programs=[[0, 1, 2], [1]], **STEPS, **options)
        report = self.report = self.ex.warmup()
        assert (self.ex.max_step_requests, self.ex.max_step_tokens) == (STEP_REQUESTS, STEP_TOKENS)
        assert self.ex.max_step_chunks >= 16
        self.views = [self.ex.layer(l) for l in range(len(config.layers))]
        assert report["graphs"] > 0
        assert report["step_graphs"] == 2 * report["programs"]
        assert report["one_chunk_step_graphs"] == 2 * report["programs"] * report["buckets"]
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.inputs = []
        for layer, v in zip(config.layers, self.views):
            assert v.q.shape[0] == STEP_TOKENS and v.out.shape[0] == STEP_TOKENS
            x = {"q": torch.randn(v.q.shape, generator=g, device="cuda").to(torch.bfloat16),
                 "k_rows": (0.1 * torch.randn(v.k_rows.shape, generator=g, device="cuda")).to(torch.bfloat16)}
            r = layer.compress_ratio
            if r > 1:
                assert v.compressed_k_rows.shape[0] == STEP_TOKENS // r + STEP_REQUESTS
                x["compressed_k_rows"] = (0.05 * torch.randn(v.compressed_k_rows.shape, generator=g,
                                                             device="cuda")).to(torch.bfloat16)
                topk = torch.randint(0, MIN_PREFIX // r, v.topk_indices.shape, generator=g, device="cuda",
                                     dtype=torch.int32)
                drop = torch.rand(v.topk_indices.shape, generator=g, device="cuda") < 0.1
                x["topk_indices"] = torch.where(drop, torch.full_like(topk, -1), topk)
            if layer.attn_sink:
                v.attn_sink.copy_(torch.randn(v.attn_sink.shape, generator=g, device="cuda"))
            self.inputs.append(x)
        # Every cache starts zeroed (a prefix of zero keys); the runs insert the random K rows.
        for v in self.views:
            for cache in (v.swa_cache, v.compressed_cache):
                if cache is not None:
                    cache.zero_()
        self.start = self.caches()
        self.upload_step_inputs()

    def caches(self):
        return [c.clone() for v in self.views for c in (v.swa_cache, v.compressed_cache) if c is not None]

    def restore(self):
        for dst, src in zip([c for v in self.views for c in (v.swa_cache, v.compressed_cache) if c is not None],
                            self.start):
            dst.copy_(src)

    def upload_step_inputs(self):
        for v, x in zip(self.views, self.inputs):
            for name, t in x.items():
                getattr(v, name).copy_(t)

    def poison(self):
        for v in self.views:
            v.out.fill_(float("nan"))
            v.lse.fill_(float("nan"))
            v.max_logits.fill_(float("nan"))

    def state(self):
        torch.cuda.synchronize()
        outs = [tuple(bits(t) for t in (v.out, v.lse, v.max_logits)) for v in self.views]
        return outs, [bits(c) for c in self.caches()]

    def run_chunks(self, step, program):
        """The reference: each chunk of the step run alone (Executor.run) with its rows of the step's
        inputs at rows from 0, its outputs' rows put at the chunk's rows of the step."""
        self.restore()
        self.poison()
        want = [[t.clone() for t in (v.out, v.lse, v.max_logits)] for v in self.views]
        token = 0
        row = {4: 0, 128: 0}
        for chunk in split(self.config, step.query_lens, step.seq_lens):
            ql = [t for _, t, _ in chunk]
            sl = [s for _, _, s in chunk]
            ids = [i for i, _, _ in chunk]
            n = sum(ql)
            new = {r: sum(s // r - (s - q) // r for q, s in zip(ql, sl)) for r in (4, 128)}
            for layer, v, x in zip(self.config.layers, self.views, self.inputs):
                v.q[:n].copy_(x["q"][token:token + n])
                v.k_rows[:n].copy_(x["k_rows"][token:token + n])
                r = layer.compress_ratio
                if r > 1:
                    v.topk_indices[:n].copy_(x["topk_indices"][token:token + n])
                    v.compressed_k_rows[:new[r]].copy_(x["compressed_k_rows"][row[r]:row[r] + new[r]])
            one = spgraph.Chunk(ql, sl, [step.swa_block_table[i] for i in ids],
                                {r: [step.compressed_block_tables[r][i] for i in ids] for r in (4, 128)})
            r = self.ex.run(one, program=program)
            assert r.ok, r.message
            for w, v in zip(want, self.views):
                for dst, src in zip(w, (v.out, v.lse, v.max_logits)):
                    dst[token:token + n].copy_(src[:n])
            token += n
            for k in row:
                row[k] += new[k]
        for w, v in zip(want, self.views):
            for dst, src in zip((v.out, v.lse, v.max_logits), w):
                dst.copy_(src)
        got = self.state()
        self.upload_step_inputs()
        return got

    def run_step(self, step, program, eager):
        self.restore()
        self.poison()
        r = (self.ex.run_step_eager if eager else self.ex.run_step)(step, program=program)
        assert r.ok, r.message
        return r, self.state()


def bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else (torch.uint8 if t.element_size() == 1
                                                                           else torch.int32)).cpu()


def same(a, b):
    (outs_a, caches_a), (outs_b, caches_b) = a, b
    for l, (x, y) in enumerate(zip(outs_a, outs_b)):
        for what, u, w in zip(("out", "lse", "max_logits"), x, y):
            if not torch.equal(u, w):
                return f"layer {l} {what}: {int((u != w).sum())} elements differ"
    for i, (u, w) in enumerate(zip(caches_a, caches_b)):
        if not torch.equal(u, w):
            return f"cache {i}: {int((u != w).sum())} bytes differ"
    return None


def test_a_step_of_k_chunks_equals_its_chunks_run_one_by_one():
    config = step_config()
    rig = StepRig(config)
    rng = random.Random(5)
    ks = list(range(1, 17))
    rng.shuffle(ks)
    one_request_chunks = full_chunks = 0
    shapes = set()
    for k in ks:
        step = step_of(config, k, rng)
        chunks = split(config, step.query_lens, step.seq_lens)
        assert len(chunks) == k
        assert spgraph.check_step(config, step, programs=[[0, 1, 2], [1]], **STEPS).chunks == k
        one_request_chunks += sum(len(c) == 1 for c in chunks)
        full_chunks += sum(sum(t for _, t, _ in c) == config.max_tokens for c in chunks)
        shapes |= {(len(c), sum(t for _, t, _ in c)) for c in chunks}
        program = 1 if k % 5 == 0 else 0
        want = rig.run_chunks(step, program)
        # The reference ran: the step's last row is written, the row after it still poison.
        last = [rig.views[l] for l in rig.ex.program_layers(program)][-1]
        tokens = sum(step.query_lens)
        assert not torch.isnan(last.lse[tokens - 1]).any()
        if tokens < STEP_TOKENS:
            assert torch.isnan(last.lse[tokens]).all()
        for eager in (True, False, False):  # eager, the graph, the graph replayed again
            r, got = rig.run_step(step, program, eager)
            assert r.chunks == k
            diff = same(got, want)
            assert diff is None, f"k = {k}, program {program}, {'eager' if eager else 'graph'}: {diff}"
    assert one_request_chunks > 0 and full_chunks > 0 and len(shapes) >= 5
    assert rig.ex.read_status()["total"] == 0


def test_an_all_full_step_runs_its_flat_graph_bit_for_bit():
    # flat_step_chunks = 8: all-full steps of 2 .. 8 chunks launch a plain graph of the largest
    # body; larger ones, and steps that are not all full, the step graph. Every one equals its
    # chunks run one by one.
    config = step_config()
    rig = StepRig(config, seed=29, flat_step_chunks=8)
    assert rig.report["flat_step_graphs"] == 2 * rig.report["programs"] * 7
    assert rig.report["staged_one_chunk_graphs"] == 3 * rig.report["programs"] * rig.report["buckets"]
    rng = random.Random(13)
    T = config.max_tokens
    for k in (2, 5, 8, 11):
        lens = []
        while len(split(config, lens, lens)) < k:  # chunks of one T-token request or of requests summing to T
            n = rng.choice([1, 2, 3, 4])
            cuts = sorted(rng.sample(range(1, T), n - 1))
            lens += [b - a for a, b in zip([0] + cuts, cuts + [T])]
        for full in (True, False):
            step_lens = lens if full else lens[:-1] + [lens[-1] - 1 if lens[-1] > 1 else 1] + [T // 2]
            step = make_step(config, step_lens, rng)
            chunks = split(config, step.query_lens, step.seq_lens)
            all_full = all(sum(t for _, t, _ in c) == T for c in chunks)
            assert all_full == full
            want = rig.run_chunks(step, 0)
            before = rig.ex.flat_steps
            r, got = rig.run_step(step, 0, eager=False)
            assert r.chunks == len(chunks)
            diff = same(got, want)
            assert diff is None, f"k = {k}, {'all full' if full else 'not all full'}: {diff}"
            assert rig.ex.flat_steps == before + (1 if full and len(chunks) <= 8 else 0)
    assert rig.ex.read_status()["total"] == 0


def test_padded_flat_steps_equal_their_chunks_at_the_largest_bucket():
    # flat_step_pad: every step of 1 .. 8 chunks launches its flat graph, each chunk on the
    # largest bucket's body; the reference is the same chunks run one by one by an executor whose
    # only bucket is the largest (same seed: the same inputs and caches).
    config = step_config()
    rig = StepRig(config, seed=41, flat_step_chunks=8, flat_step_pad=True)
    ref = StepRig(config, seed=41, r_buckets=[config.max_requests], t_buckets=[config.max_tokens])
    assert rig.report["flat_step_graphs"] == 2 * rig.report["programs"] * 7
    assert ref.report["buckets"] == 1 and rig.report["buckets"] > 1
    rng = random.Random(5)
    T = config.max_tokens
    not_full = 0
    for k in (2, 5, 8, 3):
        step = step_of(config, k, rng)
        chunks = split(config, step.query_lens, step.seq_lens)
        assert len(chunks) == k
        not_full += not all(sum(t for _, t, _ in c) == T for c in chunks)
        want = ref.run_chunks(step, k % 2)
        before = rig.ex.flat_steps
        r, got = rig.run_step(step, k % 2, eager=False)
        assert r.ok and r.chunks == k, r.message
        diff = same(got, want)
        assert diff is None, f"k = {k}: {diff}"
        assert rig.ex.flat_steps == before + 1
    assert not_full >= 2
    assert rig.ex.read_status()["total"] == 0 and ref.ex.read_status()["total"] == 0


def test_a_staged_step_runs_each_program_as_run_step_does():
    # stage_step once, then run_staged per program (an engine's per-layer calls): the first launch
    # loads the step, the later ones run what the device holds; each equals run_step of that program.
    config = step_config()
    rig = StepRig(config, seed=37, flat_step_chunks=4)
    assert rig.report["staged_step_graphs"] == rig.report["programs"] * 4
    rng = random.Random(21)
    T = config.max_tokens
    reruns = 0
    for k in (1, 3, 4, 9):
        step = make_step(config, [T] * k, rng) if k in (3, 4) else step_of(config, k, rng)  # 3, 4: flat
        want = [rig.run_step(step, p, eager=False)[1] for p in (0, 1)]
        r = rig.ex.stage_step(step, check=True)
        assert (r.status, r.chunks, rig.ex.staged_chunks) == ("ok", k, k)
        for i, (p, eager) in enumerate(((1, False), (0, False), (1, False), (0, True))):
            rig.restore()
            rig.poison()
            r = (rig.ex.run_staged_eager if eager else rig.ex.run_staged)(program=p)
            assert r.ok and r.chunks == k, r.message
            diff = same(rig.state(), want[p])
            assert diff is None, f"k = {k}, run {i} (program {p}{', eager' if eager else ''}): {diff}"
            reruns += i > 0
        assert rig.ex.staged_reruns == reruns
    # An accepted run_step replaces the staged step.
    assert rig.ex.run_step(step).ok
    r = rig.ex.run_staged()
    assert r.status == "not_staged" and rig.ex.staged_chunks == -1
    with pytest.raises(spgraph.RunError, match="run_staged: not_staged"):
        rig.ex.run_staged(check=True)
    assert rig.ex.read_status()["total"] == 0


def test_step_forms_run_alike():
    config = step_config()
    rig = StepRig(config, seed=23)
    rng = random.Random(9)
    step = step_of(config, 6, rng)
    r, want = rig.run_step(step, 0, eager=False)
    width = max(len(t) for t in step.swa_block_table)
    pad = lambda rows: np.array([t + [t[-1]] * (width - len(t)) for t in rows], np.int32)  # noqa: E731
    forms = [
        spgraph.Chunk(np.array(step.query_lens, np.int64), np.array(step.seq_lens, np.int32),
                      pad(step.swa_block_table), {k: pad(v) for k, v in step.compressed_block_tables.items()}),
        {"query_start_loc": [0] + [int(x) for x in np.cumsum(step.query_lens)], "seq_lens": step.seq_lens,
         "swa_block_table": step.swa_block_table, "compressed_block_tables": step.compressed_block_tables},
        spgraph.Chunk(torch.tensor(step.query_lens), torch.tensor(step.seq_lens),
                      torch.from_numpy(pad(step.swa_block_table)), step.compressed_block_tables),
    ]
    for form in forms:
        r, got = rig.run_step(form, 0, eager=False)
        assert r.chunks == 6
        assert same(got, want) is None


def test_a_step_of_no_requests_launches_and_writes_nothing():
    config = step_config()
    rig = StepRig(config, seed=3)
    for eager in (False, True):
        rig.restore()
        rig.poison()
        before = rig.state()
        r = (rig.ex.run_step_eager if eager else rig.ex.run_step)(spgraph.Chunk([], [], None))
        assert (r.status, r.chunks) == ("ok", 0), r.message
        assert same(rig.state(), before) is None
    # The chunk path still works after it, and vice versa.
    assert rig.ex.run(spgraph.Chunk([1], [1], [[0]], {4: [[0]], 128: [[0]]})).ok
    assert rig.ex.run_step({"query_lens": [], "seq_lens": []}).ok


def test_no_cuda_allocation_over_many_steps():
    config = step_config()
    rig = StepRig(config, seed=29)
    rng = random.Random(13)
    steps = [step_of(config, k, rng) for k in (1, 3, 16, 7, 0, 12)]
    sched = spgraph.PrefillScheduler(config, spgraph.SchedulerConfig(max_num_batched_tokens=STEP_TOKENS,
                                                                     max_chunks_per_step=16))
    sched.submit(spgraph.make_workload(spgraph.WorkloadConfig(seed=2, num_requests=40, min_prompt_len=20,
                                                              max_prompt_len=1800)))
    plans = [sched.schedule() for _ in range(8)]
    inputs = steps + plans
    counter = attached_allocation_counter()
    for step in inputs:  # every input form read once before counting
        assert rig.ex.run_step(step).ok
    torch.cuda.synchronize()
    allocator = torch_allocator_state()
    statuses = set()
    chunks = 0
    try:
        counter.reset()
        for i in range(400):
            step = inputs[i % len(inputs)]
            r = rig.ex.run_step_eager(step) if i % 7 == 3 else rig.ex.run_step(step)
            statuses.add(r.status)
            chunks += r.chunks
        rig.ex.synchronize()
        count, names = counter.count(), counter.names()
        after = torch_allocator_state()
        control = allocation_control(counter)
    finally:
        counter.detach()
    assert statuses == {"ok"} and chunks > 400
    assert count == 0, f"{count} CUDA allocation calls over 400 steps: {names}"
    assert control > 0, "the counter saw no call for a real device allocation: its zero above proves nothing"
    assert_torch_allocator_unchanged(allocator, after)


def test_refused_steps_are_statuses_as_check_step_says():
    config = step_config()
    plain = sgt.Executor(config)
    plain.warmup()
    r = plain.run_step(spgraph.Chunk([1], [1], [[0]], {4: [[0]], 128: [[0]]}))
    assert r.status == "not_warmed_up" and "the executor has no steps" in r.message
    assert plain.max_step_requests == 0 and plain.max_step_chunks == 0
    ex = sgt.Executor(config, **STEPS)
    assert ex.run_step(spgraph.Chunk([], [], None)).status == "not_warmed_up"
    ex.warmup()
    rng = random.Random(1)
    good = step_of(config, 4, rng)
    bad_len = spgraph.Chunk(good.query_lens, [1] + good.seq_lens[1:], good.swa_block_table,
                            good.compressed_block_tables)
    shared = spgraph.Chunk(good.query_lens, good.seq_lens, [good.swa_block_table[0]] * len(good.query_lens),
                           good.compressed_block_tables)
    too_many = spgraph.Chunk([1] * 65, [1] * 65, None)
    too_long = spgraph.Chunk([STEP_TOKENS + 1], [STEP_TOKENS + 1], None)
    for step in (good, bad_len, shared, too_many, too_long):
        want = spgraph.check_step(config, step, **STEPS)
        for run in (ex.run_step, ex.run_step_eager):
            got = run(step)
            assert (got.status, got.chunks, got.bad_chunk, got.bad_request, got.bad_field, got.message) == (
                want.status, want.chunks, want.bad_chunk, want.bad_request, want.bad_field, want.message)
    assert ex.run_step(too_long).bad_field == "step.tokens" and ex.run_step(too_many).bad_field == "step.requests"
    with pytest.raises(spgraph.RunError, match=r"field step\.tokens"):
        ex.run_step(too_long, check=True)
    with pytest.raises(ValueError, match=r"step\.swa_slots is given"):
        ex.run_step(spgraph.Chunk([1], [1], [[0]], swa_slots=[0]))
    assert ex.run_step(good, program=1).status == "bad_program"
    assert ex.run_step(good, stream=torch.cuda.Stream()).ok  # a caller's stream object
    assert ex.run_step(good).ok  # still usable after misuse
    ex.synchronize()
    assert ex.read_status()["total"] == 0


def test_sample_one_launch_runs_each_step_in_one_launch():
    import importlib.util
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("prefill_loop", os.path.join(root, "samples", "python",
                                                                               "prefill_loop.py"))
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    trace = ["--steps", "30", "--requests", "24", "--min-len", "64", "--max-len", "3000", "--max-model-len", "4096",
             "--max-tokens", "256", "--budget", "2048", "--seed", "3", "--no-progress"]
    per_chunk = sample.run(sample.parse(trace + ["--no-alloc-count"]))
    counter = attached_allocation_counter()
    try:
        reports = []
        for extra in ([], ["--mode", "eager"], ["--pooled"]):
            # (64 requests: the scheduler's cap of 16 chunks a step is above any step of this trace,
            # so the steps are the per-chunk run's)
            reports.append((extra, sample.run(sample.parse(trace + ["--one-launch", "--step-requests", "64"] + extra))))
    finally:
        counter.detach()
    for extra, rep in reports:
        assert rep["faults"] == 0 and rep["alloc_calls"] == 0 and rep["torch_reserved_growth"] == 0, (extra, rep)
        # The same scheduler steps: the same chunks and tokens, one launch per step that had chunks.
        assert rep["chunks"] == per_chunk["chunks"] and rep["tokens"] == per_chunk["tokens"], extra
        assert rep["launches"] <= 30 < rep["chunks"] and rep["graph_hits"] + rep["eager_runs"] == rep["launches"]
        assert rep["padded"] == per_chunk["padded"]

"""The four ``*_faithful`` policies: the notes' worked examples, and event skipping == walking every step."""

import bisect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from portbench import sim
from portbench.policies import make_policy
from portbench.policies._blocks import BlockManager
from portbench.workload import make_window

FAITHFUL = ("vllm_faithful", "vllm_chunked_prefill_faithful", "sarathi_faithful", "slai_faithful")
ARRAYS = ("admit_s", "first_token_s", "finish_s")


def window(arrivals, inputs, outputs):
    return make_window("t", "test", arrivals, inputs, outputs, outputs)


class Recorder(sim.Policy):
    """Wraps a policy and records its non-empty decisions by step."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.event_driven, self.admission_only = inner.event_driven, inner.admission_only
        self.decisions = {}
        self.states = {}
        self.steady = set()         # steps whose decision was steady
        self.calls = 0

    def reset(self, view):
        self.inner.reset(view)

    def schedule(self, view):
        d = self.inner.schedule(view)
        self.calls += 1
        if d.admit or d.preempt or d.hold:
            self.decisions[view.step] = (list(d.admit), list(d.preempt), sorted(d.hold))
        if d.steady:
            self.steady.add(view.step)
        self.states[view.step] = self.state()
        return d

    def state(self):
        """The policy's own bookkeeping after a call: block manager, shadow prefill, LSTs."""
        p = self.inner
        bm = p._bm
        return (bm.free_blocks, dict(bm.tokens), dict(bm.table), dict(getattr(p, "_rem", {})),
                dict(getattr(p, "_lst", {})))


def run(name, w, model=None, event_skipping=True, **params):
    rec = Recorder(make_policy(name, **params))
    return sim.simulate(w, rec, model, event_skipping=event_skipping), rec


def assert_same(a, b):
    for f in ARRAYS:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert (a.n_steps, a.duration_s, a.n_preemptions) == (b.n_steps, b.duration_s, b.n_preemptions)


# --------------------------------------------------------------------------- block manager

def test_block_manager_counts_and_watermark():
    bm = BlockManager(131072)
    assert (bm.num_blocks, bm.watermark_blocks) == (8192, 81)
    assert bm.blocks(0) == 0 and bm.blocks(16) == 1 and bm.blocks(17) == 2
    bm.allocate(0, 16)
    assert bm.free_blocks == 8191
    bm.append_slot(0)                      # token 17 opens block 2
    assert (bm.tokens[0], bm.table[0], bm.free_blocks) == (17, 2, 8190)
    small = BlockManager(64)
    assert (small.num_blocks, small.watermark_blocks) == (4, 0)
    small.allocate(0, 28)
    assert small.can_allocate(21) and not small.can_allocate(33)
    small.allocate(1, 21)
    assert small.free_blocks == 0
    assert small.can_append_slot(1)       # token 22 fits block 2
    small.append_slot(0, 4)               # 32 tokens: still 2 blocks
    assert not small.can_append_slot(0)   # token 33 needs a third block, none free
    small.free(1)
    assert small.free_blocks == 2 and small.can_append_slot(0)


def test_steps_to_exhaustion_matches_a_step_by_step_walk():
    rng = np.random.default_rng(7)
    for _ in range(200):
        bm = BlockManager(int(rng.integers(32, 400)), block_size=int(rng.choice([4, 16])))
        ids = []
        for r in range(int(rng.integers(1, 6))):
            n = int(rng.integers(1, 60))
            if bm.free_blocks - bm.blocks(n) >= 0:
                bm.allocate(r, n)
                ids.append(r)
        if not ids:
            continue
        expect = bm.steps_to_exhaustion(ids)
        j, exhausted = 0, False
        while not exhausted:
            j += 1
            for r in ids:
                if not bm.can_append_slot(r):
                    exhausted = True
                    break
                bm.append_slot(r)
        assert expect == j


# --------------------------------------------------------------------------- worked examples

def test_vllm_faithful_default_example():
    # A (p 2000, out 3) and B (p 600, out 2) at 0; C (p 100) at 0.4 ms, first visible at step 1.
    w = window([0.0, 0.0, 0.0004], [2000, 600, 100], [3, 2, 4])
    r, rec = run("vllm_faithful", w, sim.LsspModel(drain_s=0.1))
    np.testing.assert_allclose(r.admit_s, [0.0, 0.001, 0.001])   # B closed out at step 0 by the budget
    np.testing.assert_allclose(r.first_token_s, [0.001, 0.002, 0.002])
    np.testing.assert_allclose(r.finish_s, [0.003, 0.003, 0.005])
    assert r.n_preemptions == 0
    assert rec.decisions[0] == ([0], [], []) and rec.decisions[1] == ([1, 2], [], [])


def test_vllm_faithful_preemption_illustration():
    # 64 tokens of KV: 4 blocks, no watermark. A (p 27) at step 0 takes 2 blocks, B (p 20) at step 1
    # the other 2. At step 5 A needs its 33rd token slot: B (newest) is preempted after 4 tokens.
    model = sim.LsspModel(max_kv_tokens=64, drain_s=0.1)
    w = window([0.0, 0.001], [27, 20], [10, 6])
    r, rec = run("vllm_faithful", w, model)
    assert rec.decisions[5] == ([], [1], [])
    # Step 6: B fails can_allocate(21) (1 free block, 2 needed); it waits until A leaves after step 9.
    assert sorted(rec.decisions) == [0, 1, 5, 10]
    # B keeps its first admission (step 1) and first token (end of step 1): metrics.py's definitions
    np.testing.assert_allclose(r.admit_s, [0.0, 0.001])
    np.testing.assert_allclose(r.first_token_s, [0.001, 0.002])
    np.testing.assert_allclose(r.finish_s, [0.010, 0.016])           # all 6 tokens decoded again
    assert r.n_preemptions == 1
    r2, _ = run("vllm_faithful", w, model, event_skipping=False)
    assert_same(r, r2)


def test_vllm_faithful_prompt_over_budget_blocks_the_queue_forever():
    model = sim.LsspModel(drain_s=0.3)
    # 0 runs; 1 (p 3000 > 2560) reaches the head and closes admission for 2 and 3 for good.
    w = window([0.0, 0.001, 0.002, 0.003], [100, 3000, 10, 10], [5, 5, 5, 5])
    for es in (True, False):
        r, _ = run("vllm_faithful", w, model, event_skipping=es)
        np.testing.assert_allclose(r.admit_s[0], 0.0)
        assert np.isnan(r.admit_s[1:]).all() and np.isnan(r.finish_s[1:]).all()
        assert r.n_steps == 3 + 300                                   # the full drain
    # fifo would simply skip it
    r = sim.simulate(w, make_policy("fifo"), model)
    assert not np.isnan(r.finish_s[2:]).any()


@pytest.mark.parametrize("name", ["vllm_chunked_prefill_faithful", "sarathi_faithful"])
def test_chunked_and_sarathi_example(name):
    # A (p 1200) takes 512, 512, 176 of the budget at steps 0-2; B (p 100) closes out until step 2.
    w = window([0.0, 0.0], [1200, 100], [5, 3])
    r, rec = run(name, w, sim.LsspModel(drain_s=0.1))
    np.testing.assert_allclose(r.admit_s, [0.0, 0.002])
    np.testing.assert_allclose(r.first_token_s, [0.001, 0.003])      # A decodes from step 0 anyway
    np.testing.assert_allclose(r.finish_s, [0.005, 0.005])
    assert r.n_preemptions == 0
    assert sorted(rec.decisions) == [0, 2]                            # step 2: a timer, no event
    assert rec.calls == 4                                             # steps 0-3, then a skip to 5


def test_slai_example():
    # A (p 100, out 1000) runs alone; B (p 3000, out 5) arrives at 10 ms and eats the budget with
    # its shadow prefill for steps 10-14, so A is held 5 steps; B completes at 15 ms regardless.
    w = window([0.0, 0.010], [100, 3000], [1000, 5])
    model = sim.LsspModel(drain_s=2.0)
    r, rec = run("slai_faithful", w, model)
    np.testing.assert_allclose(r.admit_s, [0.0, 0.010])
    np.testing.assert_allclose(r.first_token_s, [0.001, 0.011])
    np.testing.assert_allclose(r.finish_s, [1.005, 0.015])
    assert r.n_preemptions == 0
    r2, rec2 = run("slai_faithful", w, model, event_skipping=False)
    assert_same(r, r2)
    assert {s: d for s, d in rec2.decisions.items() if d[2]} == {s: ([1] if s == 10 else [], [], [0])
                                                                 for s in range(10, 15)}
    # On the fast path step 10's decision (B admitted, its first chunk the whole budget, A held) is
    # steady: steps 11-14 repeat it without an admission, up to B's last whole chunk (3000 =
    # 5 x 512 + 440), and the engine skips them.
    assert {s: d for s, d in rec.decisions.items() if d[2]} == {10: ([1], [], [0])}
    assert 10 in rec.steady and not any(11 <= s <= 14 for s in rec.states)
    assert rec.calls < 40                                             # the 1000 steps are skipped


def test_slai_lst_float_boundary_and_expiry():
    # A is held from step 10 on by a long stream of prefill; it turns critical exactly when
    # now >= (a + 0.5) - 0.005 with a = its last service (step 9), as a float comparison.
    w = window([0.0, 0.010], [16, 400000], [2000, 1000])
    model = sim.LsspModel(max_kv_tokens=10**6, drain_s=3.0)
    r, rec = run("slai_faithful", w, model, False, token_budget=512, block_size=16)
    lst = (9 * 0.001 + 0.5) - 5 * 0.001
    first_critical = next(s for s in range(10, 1000) if s * 0.001 >= lst)
    held = sorted(s for s, d in rec.decisions.items() if 0 in d[2])
    assert held[:first_critical - 10] == list(range(10, first_critical))
    assert first_critical not in held
    # The fast path: from B's admission at step 10 the hold is steady, with A's LST as its clock
    # timer, so the next call comes at the step the timer names (or one before, as a clock timer may).
    fast, rec_fast = run("slai_faithful", w, model, True, token_budget=512, block_size=16)
    assert_same(fast, r)
    asked = sorted(rec_fast.states)
    assert 10 in rec_fast.steady
    assert asked[asked.index(10) + 1] in (first_critical - 1, first_critical)


@pytest.mark.parametrize("threshold", [0.0149, 0.015, 0.0151])
def test_slai_theta_after_a_skip_is_that_of_the_last_skipped_step(threshold):
    # A (p 100) decodes alone from step 0, so real KV at the start of step s >= 1 is 100 + s; the
    # engine skips steps 2..49. B (p 8000) arrives at step 50 and holds A until A turns critical,
    # which depends on Θ at A's last service (step 49): KV 149 vs the threshold (crossed at 149,
    # 150 or 151 of 10000).
    w = window([0.0, 0.050], [100, 8000], [2000, 100])
    model = sim.LsspModel(max_kv_tokens=10000, drain_s=3.0)
    params = dict(tbt_s=0.02, kv_threshold=threshold)
    a, ra = run("slai_faithful", w, model, True, **params)
    b, rb = run("slai_faithful", w, model, False, **params)
    assert ra.calls < rb.calls
    assert_same(a, b)
    theta = 10 if threshold <= 0.0149 else 5
    lst = (0.049 + 0.02) - theta * 0.001
    first_critical = next(s for s in range(50, 100) if s * 0.001 >= lst)
    held = sorted(s for s, d in rb.decisions.items() if 0 in d[2])
    assert held[0] == 50 and first_critical not in held and first_critical - 1 in held


def test_sarathi_equals_chunked_without_preemption():
    rng = np.random.default_rng(3)
    n = 40
    arrivals = np.cumsum(rng.exponential(0.002, n))
    inputs = rng.integers(1, 1500, n)
    outputs = rng.integers(1, 60, n)
    w = window(arrivals, inputs, outputs)
    model = sim.LsspModel(max_active_sequences=8, drain_s=0.5)
    a, _ = run("vllm_chunked_prefill_faithful", w, model)
    b, _ = run("sarathi_faithful", w, model)
    assert a.n_preemptions == 0
    assert not np.isnan(a.finish_s).any()
    assert_same(a, b)


def test_defaults_are_the_studys():
    p = make_policy("vllm_faithful")
    assert (p.max_num_batched_tokens, p.max_num_seqs, p.block_size, p.watermark) == (2560, 256, 16, 0.01)
    p = make_policy("vllm_chunked_prefill_faithful")
    assert (p.max_num_batched_tokens, p.max_num_seqs) == (512, 256)
    p = make_policy("sarathi_faithful")
    assert (p.chunk_size, p.max_num_seqs) == (512, 128)
    p = make_policy("slai_faithful")
    r = p.rule
    assert (r.token_budget, p.max_num_seqs, r.decode_limit, r.tbt_s, r.theta_low, r.theta_high,
            r.kv_threshold, r.step_s) == (512, 128, 128, 0.5, 5, 10, 0.96, 0.001)
    with pytest.raises(TypeError, match="unknown parameter.*tbt"):
        make_policy("slai_faithful", tbt=0.5)


# --------------------------------------------------------------------------- event skipping

def random_case(seed, name):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 30))
    gaps = rng.choice([0.0, 0.0004, 0.001, 0.003, 0.02], n) * rng.random(n) * 2
    arrivals = np.cumsum(gaps)
    kv = int(rng.choice([256, 512, 1024, 2048]))
    inputs = np.where(rng.random(n) < 0.7, rng.integers(1, 64, n), rng.integers(64, kv + 64, n))
    outputs = rng.integers(1, 90, n)
    model = sim.LsspModel(max_active_sequences=int(rng.integers(1, 10)), max_kv_tokens=kv,
                          drain_s=int(rng.integers(50, 300)) / 1000)
    block = int(rng.choice([4, 16]))
    wm = float(rng.choice([0.0, 0.01, 0.1]))
    budget = int(rng.choice([2, 8, 40, 128, 512]))
    if name == "vllm_faithful":
        params = dict(max_num_batched_tokens=int(rng.choice([64, 300, 2560])), block_size=block, watermark=wm)
    elif name == "vllm_chunked_prefill_faithful":
        params = dict(max_num_batched_tokens=budget, block_size=block, watermark=wm)
    elif name == "sarathi_faithful":
        params = dict(chunk_size=budget, block_size=block, watermark=wm)
    else:
        params = dict(token_budget=budget, block_size=block, watermark=wm,
                      tbt_s=float(rng.choice([0.5, 0.03, 0.016, 0.014, 0.008])),
                      kv_threshold=float(rng.choice([0.96, 0.5, 0.2])),
                      decode_limit=int(rng.choice([128, 3])))
    return window(arrivals, inputs, outputs), model, params


def check_skipping(seed, name):
    w, model, params = random_case(seed, name)
    a, ra = run(name, w, model, True, **params)
    b, rb = run(name, w, model, False, **params)
    # the same decisions at every step the skipping run asks; at a step it skips, the step-by-step
    # run holds what the last steady decision held, and does nothing else
    called = sorted(ra.states)
    for s, d in rb.decisions.items():
        if s in ra.states:
            assert ra.decisions.get(s) == d, (seed, name, s)
        else:
            last = called[bisect.bisect_right(called, s) - 1]
            assert last in ra.steady and d == ([], [], ra.decisions[last][2]), (seed, name, s)
    assert all(rb.decisions.get(s) == d for s, d in ra.decisions.items()), (seed, name)
    # after every call the skipping run makes, the policy's state is the step-by-step run's
    assert all(ra.states[s] == rb.states[s] for s in ra.states), (seed, name)
    assert_same(a, b)
    return a, ra, rb


@pytest.mark.parametrize("name", FAITHFUL)
@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_event_skipping_is_exact(name, seed):
    check_skipping(seed, name)


@pytest.mark.parametrize("name", FAITHFUL)
def test_event_skipping_cases_exercise_the_timers(name):
    """The seeded cases do reach preemption / holds, and skipping does skip steps."""
    preemptions = holds = skipped = 0
    for seed in range(60):
        r, ra, rb = check_skipping(10_000 + seed, name)
        preemptions += r.n_preemptions
        holds += sum(1 for d in rb.decisions.values() if d[2])
        skipped += rb.calls - ra.calls
    assert skipped > 0
    if name == "slai_faithful":
        assert holds > 0 and preemptions == 0
    else:
        assert preemptions > 0


def test_vllm_faithful_oversize_ablation():
    """A 3,000-token prompt at the head blocks everything under the study's rule; 'reject' drops it
    and serves the rest; 'chunk' admits it alone, then the rest."""
    from portbench.workload import make_window
    w = make_window("hol", "t", [0.0, 0.0, 0.0], [3000, 10, 10], [2, 2, 2], [2, 2, 2])
    model = sim.LsspModel(drain_s=0.1)
    block = sim.simulate(w, make_policy("vllm_faithful"), model)
    assert block.completed.tolist() == [False, False, False]
    reject = sim.simulate(w, make_policy("vllm_faithful", oversize="reject"), model)
    assert reject.completed.tolist() == [False, True, True]
    assert reject.admit_s[1] == 0.0 and reject.admit_s[2] == 0.0
    chunk = sim.simulate(w, make_policy("vllm_faithful", oversize="chunk"), model)
    assert chunk.completed.tolist() == [True, True, True]
    assert chunk.admit_s[0] == 0.0 and chunk.admit_s[1] > 0.0      # the oversize prompt took the budget
    with pytest.raises(ValueError, match="oversize"):
        make_policy("vllm_faithful", oversize="drop")


@pytest.mark.parametrize("oversize", ["reject", "chunk"])
def test_vllm_faithful_oversize_variants_skip_exactly(oversize):
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = 30
        w = make_window("r", "t", np.cumsum(rng.exponential(0.002, n)), rng.integers(1, 4000, n),
                        rng.integers(1, 40, n), rng.integers(1, 40, n))
        model = sim.LsspModel(max_active_sequences=8, max_kv_tokens=20000, drain_s=0.3)
        fast = sim.simulate(w, make_policy("vllm_faithful", oversize=oversize), model)
        slow = sim.simulate(w, make_policy("vllm_faithful", oversize=oversize), model, event_skipping=False)
        for f in ("admit_s", "first_token_s", "finish_s"):
            np.testing.assert_array_equal(getattr(fast, f), getattr(slow, f))


def test_slai_plans_whole_prompt_admissions_when_the_engine_does_not_chunk():
    # A 64-token budget, chunked prefill off. Requests 0 and 1 decode; 2 and 3 (40-token prompts)
    # arrive together. The engine admits 2 whole and refuses 3 (40 > the 24 tokens left), so SLAI's
    # plan must not count a 24-token chunk of 3 against its budget: the 24 tokens left go to the
    # decodes (as on vLLM, where SLAI's port plans on vLLM's own admission rule).
    from portbench.engine.vllm_native import record_model_steps
    from portbench.engine.vllm_v1 import VllmV1Model

    w = make_window("t", "test", [0.0, 0.0, 0.005, 0.005], [16, 16, 40, 40], [30, 30, 2, 2], [30, 30, 2, 2])
    model = VllmV1Model(max_num_batched_tokens=64, enable_chunked_prefill=False, max_active_sequences=8)
    _, steps = record_model_steps(w, make_policy("slai_faithful", token_budget=64), model)
    step = next(s for s in steps if 2 in s.admitted)
    assert 3 not in step.scheduled                      # the engine took 2 alone
    assert {0, 1} <= set(step.scheduled)                # and SLAI served the decodes beside it

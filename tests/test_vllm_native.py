"""The ``vllm_native`` engine model: vLLM 0.32's own scheduler stepped in virtual time.

The tests that step vLLM's scheduler need the vLLM environment (``.venv-vllm``) and skip elsewhere;
the ones about the model's name, its policies and its message without vLLM run everywhere.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re

import numpy as np
import pandas as pd
import pytest

from portbench import store
from portbench.engine import ENGINE_MODELS, describe, simulate
from portbench.engine import vllm_native as nat
from portbench.metrics import cell_metrics
from portbench.policies import make_policy
from portbench.regions import REGIONS
from portbench.workload import make_window, scale

STAMPS = ("admit_s", "first_token_s", "finish_s")


@pytest.fixture(scope="module")
def vllm():
    """vLLM itself (the test is skipped without it)."""
    return pytest.importorskip("vllm")


def lambda_ref(window_id: str) -> float:
    table = pd.read_csv(store.default_data_dir() / "results" / "lambda_ref_vllm_v1.csv")
    return float(table.set_index("window_id").loc[window_id, "lambda_ref"])


def real_window(source: str, region: str, k: int = 0):
    w = store.load_windows(source=source)[k]
    return scale(w, lambda_ref(w.window_id) * REGIONS[region])


def tiny(arrival, inp, out):
    return make_window("tiny", "test", arrival, inp, out, out)


def same_stamps(a, b) -> bool:
    return all(np.array_equal(getattr(a, s), getattr(b, s), equal_nan=True) for s in STAMPS)


def first_difference(window, policy, shared, native_only=None):
    """(class, detail) of the first step where vllm_v1 and vLLM's scheduler part, or None."""
    from portbench.engine.vllm_v1 import VllmV1Model

    native = nat.VllmNativeModel(**shared, **(native_only or {}))
    _, ms = nat.record_model_steps(window, make_policy(policy), VllmV1Model(**shared))
    _, ns = nat.record_native_steps(window, make_policy(policy), native)
    k = nat.first_differing_step(ms, ns)
    return None if k is None else nat.classify_step(k, ms, ns, window, policy, native)


# --- everywhere ----------------------------------------------------------------------------------

def test_the_model_is_registered_and_described_without_importing_vllm():
    assert "vllm_native" in ENGINE_MODELS
    assert "vLLM" in describe("vllm_native")


def test_without_vllm_the_model_names_the_command_that_sets_it_up():
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    with pytest.raises(nat.VllmUnavailable, match=re.escape(nat.VLLM_SETUP)):
        nat.VllmNativeModel()


def test_policies_map_to_vllms_own_scheduling_policies():
    assert nat.native_form("fifo") == "fcfs"
    assert nat.native_form("edf") == nat.native_form("vllm_v0_priority") == "priority"
    assert set(nat.native_policies()) >= {"fifo", "edf", "vllm_v0_priority"}
    with pytest.raises(ValueError, match="enable_chunked_prefill=False"):
        nat.native_form("vllm_faithful")
    with pytest.raises(ValueError, match="no vLLM form"):
        nat.native_form("las")                           # not a key: it holds and preempts
    assert nat.native_form("slai_faithful") == "priority"     # its port, on the virtual clock
    assert not nat.uses_key_adapter("slai_faithful")
    # every other key policy runs through the key adapter, vLLM's FCFS queue in the key's order
    assert {"sjf_aging", "lof", "hrrn", "shortest_prefill_first"} <= set(nat.native_policies())
    assert nat.uses_key_adapter("sjf_aging") and not nat.uses_key_adapter("edf")


def test_a_campaign_on_vllms_scheduler_refuses_a_policy_vllm_cannot_express_up_front():
    from portbench.campaign import CampaignConfig

    with pytest.raises(ValueError, match="'las' has no vLLM form .* runnable: .*fifo"):
        CampaignConfig(engine_model="vllm_native", policies=("fifo", "las"))


# --- with vLLM -----------------------------------------------------------------------------------

def test_a_real_window_runs_to_completion_with_exact_output_lengths(vllm):
    w = real_window("burstgpt", "KNEE")
    engine = nat.VllmNativeModel().make_engine(w, make_policy("fifo"))
    engine.run()
    r = engine.result(w)
    assert r.completed.all() and r.engine_model == "vllm_native"
    assert engine.produced == w.output_tokens.tolist()
    assert np.all(w.arrival_s <= r.admit_s) and np.all(r.admit_s < r.first_token_s)
    assert np.all(r.first_token_s <= r.finish_s)
    metrics = cell_metrics(r)                   # the campaign's metrics read it unchanged
    assert metrics and all(np.isfinite(v) for v in metrics.values() if isinstance(v, float))


def test_a_campaign_on_vllms_scheduler_takes_its_policies(vllm):
    from portbench.campaign import CampaignConfig

    assert CampaignConfig(engine_model="vllm_native", policies=("fifo", "edf")).policies == ("fifo", "edf")


def test_runs_are_deterministic(vllm):
    w = real_window("azure_llm_2024", "PRE_KNEE")          # preempts
    model = nat.VllmNativeModel()
    a = simulate(w, make_policy("fifo"), model)
    b = simulate(w, make_policy("fifo"), model)
    assert a.n_preemptions > 0
    assert same_stamps(a, b) and (a.n_steps, a.n_preemptions, a.duration_s) == \
        (b.n_steps, b.n_preemptions, b.duration_s)


@pytest.mark.parametrize("policy", ["fifo", "edf"])
@pytest.mark.parametrize("reserve_full_isl", [True, False])
def test_agrees_with_vllm_v1_step_by_step_when_the_kv_cache_is_ample(vllm, policy, reserve_full_isl):
    # Nothing is preempted and no admission waits for blocks: both run the same rules.
    w = real_window("bailian_qwen", "HIGH_PRESSURE")
    assert first_difference(w, policy, {"max_kv_tokens": 1 << 20},
                            {"reserve_full_isl": reserve_full_isl}) is None


@pytest.mark.parametrize("policy", ["sjf_aging", "lof", "hrrn", "shortest_prefill_first"])
def test_a_key_policy_runs_on_vllms_scheduler_as_on_vllm_v1(vllm, policy):
    """One definition of the order: the key adapter puts vLLM's queue in the policy's key order, and
    vLLM's scheduler then makes vllm_v1's decisions, step for step, preemptions included (a KV cache
    small enough to preempt)."""
    w = real_window("azure_llm_2024", "OVERLOAD", k=1)
    for shared in ({"max_kv_tokens": 1 << 20}, {"max_kv_tokens": 16384}):
        assert first_difference(w, policy, shared) is None, shared


def test_a_users_own_key_policy_runs_on_vllms_scheduler_with_no_further_code(vllm):
    from portbench.engine.queue import KeyPolicy
    from portbench.engine.vllm_v1 import VllmV1Model
    from portbench.policies import _REGISTRY, register

    @register
    class LongestPromptFirst(KeyPolicy):
        name = "test_longest_prompt_first"

        def key(self, view, ids):
            return -view.input_tokens[ids]

    try:
        w = real_window("bailian_qwen", "OVERLOAD")
        a = nat.VllmNativeModel().make_engine(w, LongestPromptFirst())
        a.run()
        b = VllmV1Model().make_engine(w, LongestPromptFirst())
        b.run()
        ra, rb = a.result(w), b.result(w)
        assert same_stamps(ra, rb)
        fifo = nat.VllmNativeModel().make_engine(w, make_policy("fifo"))
        fifo.run()
        assert not same_stamps(ra, fifo.result(w))       # the order did change something
    finally:
        _REGISTRY.pop("test_longest_prompt_first", None)


def test_a_request_that_cannot_grow_preempts_itself_as_in_vllm(vllm):
    # 4 blocks of 16 tokens, 32 tokens a step. Step 1: request 0 (8 tokens) and the first 24 of
    # request 1's 60 take 3 blocks. Step 2: request 1 needs 2 more blocks, 1 is free, and it is the
    # last running request: vLLM preempts it and admits nothing; so does vllm_v1 (it used to keep
    # it and admit request 2).
    from portbench.engine.vllm_v1 import VllmV1Model

    w = tiny([0, 0, 0], [8, 60, 8], [20, 1, 1])
    shared = {"max_kv_tokens": 64, "max_num_batched_tokens": 32, "max_active_sequences": 8,
              "reserve_full_isl": False}
    assert simulate(w, make_policy("fifo"), VllmV1Model(**shared)).n_preemptions > 0
    assert first_difference(w, "fifo", shared) is None


def test_the_whole_prompt_is_reserved_at_admission_as_in_vllm(vllm):
    # 6 blocks; request 0 decodes its last token in 3 of them when request 1 (80 tokens = 5 blocks)
    # arrives: its first chunk (31 tokens, 2 blocks) fits, its whole prompt does not. vLLM admits it
    # a step later, once request 0 has left, and so does vllm_v1 (both reserve by default); without
    # the reservation both admit it at once, and a model without it parts from vLLM with it.
    from portbench.engine.vllm_v1 import VllmV1Model

    w = tiny([0, 0.001], [32, 80], [2, 1])
    shared = {"max_kv_tokens": 96, "max_num_batched_tokens": 32, "max_active_sequences": 8}
    assert first_difference(w, "fifo", shared) is None
    assert first_difference(w, "fifo", {**shared, "reserve_full_isl": False}) is None
    _, ms = nat.record_model_steps(w, make_policy("fifo"), VllmV1Model(**shared, reserve_full_isl=False))
    native = nat.VllmNativeModel(**shared)
    _, ns = nat.record_native_steps(w, make_policy("fifo"), native)
    k = nat.first_differing_step(ms, ns)
    assert nat.classify_step(k, ms, ns, w, "fifo", native)[0] == "full_sequence_reservation"


def test_the_long_prefill_cap_is_lifted_for_a_lone_request_as_in_vllm(vllm):
    assert first_difference(tiny([0], [600], [2]), "fifo", {"long_prefill_token_threshold": 256}) is None
    assert first_difference(tiny([0, 0], [600, 10], [2, 2]), "fifo", {"long_prefill_token_threshold": 256}) is None


@pytest.mark.parametrize("reserve_full_isl", [True, False])
def test_vllms_priority_policy_preempts_the_lowest_priority_and_so_does_vllm_v1(vllm, reserve_full_isl):
    # 4 blocks. Request 1 (earlier deadline) is admitted after request 0 and needs a third block
    # when none is free: vLLM's priority scheduling (edf's form) preempts request 0, the lowest
    # priority, though it was scheduled already in the step; vllm_v1 too (its victim used to be the
    # newest admission, request 1 itself).
    from portbench.engine.vllm_v1 import VllmV1Model

    w = tiny([0, 0.001], [16, 30], [40, 20])
    shared = {"max_kv_tokens": 64, "max_num_batched_tokens": 64, "max_active_sequences": 8,
              "reserve_full_isl": reserve_full_isl}
    _, ns = nat.record_native_steps(w, make_policy("edf"), nat.VllmNativeModel(**shared))
    assert [i for s in ns for i in s.preempted][:1] == [0]
    assert simulate(w, make_policy("edf"), VllmV1Model(**shared)).n_preemptions > 0
    assert first_difference(w, "edf", shared) is None


def test_a_priority_victim_already_scheduled_gives_back_its_tokens_as_in_vllm(vllm):
    # tests/test_engine_v1_priority_victim.py's hand-worked window: request 0 (late deadline) is
    # scheduled first in the step in which request 1 cannot grow; both engines preempt request 0.
    w = make_window("t", "test", [0.0, 0.5e-3], [15, 15], [10, 10], [1000, 1])
    shared = {"max_kv_tokens": 48, "max_num_batched_tokens": 2048, "max_active_sequences": 4}
    for policy in ("edf", "fifo"):
        assert first_difference(w, policy, shared) is None


def test_vllm_v1_has_no_eviction_by_a_waiting_request(vllm):
    # Request 0 holds all 4 blocks; request 1 (earlier deadline) arrives: the simulator's
    # vllm_v0_priority evicts request 0 for it (vLLM v0's rule), vLLM v1's scheduler lets it wait.
    w = tiny([0, 0.001], [60, 16], [3, 2])
    cls, _ = first_difference(w, "vllm_v0_priority", {"max_kv_tokens": 64, "max_num_batched_tokens": 64,
                                                   "max_active_sequences": 8}, {"reserve_full_isl": False})
    assert cls == "waiting_eviction"


def test_a_request_no_eviction_can_fit_is_passed_over_by_the_model_and_stops_vllm(vllm):
    # 4 KV blocks. Request 0 (late deadline) runs on 2; request 1 (earliest deadline) needs 5 blocks,
    # more than the whole cache; request 2 needs 1. The simulator's vllm_v0_priority passes over request
    # 1 (evicting request 0 would not make it fit) and admits request 2; vLLM stops at its queue head.
    w = make_window("t", "test", [0.0, 0.5e-3, 0.6e-3], [32, 80, 16], [20, 1, 2], [1000, 1, 5])
    assert w.deadline_s[1] < w.deadline_s[2] < w.deadline_s[0]
    cls, detail = first_difference(w, "vllm_v0_priority", {"max_kv_tokens": 64, "max_num_batched_tokens": 64,
                                                        "max_active_sequences": 8})
    assert cls == "waiting_eviction" and "passed over request 1" in detail, detail


def test_without_chunked_prefill_a_prompt_over_the_budget_left_stops_admission(vllm):
    w = tiny([0, 0], [40, 40], [3, 3])
    shared = {"max_num_batched_tokens": 64, "max_active_sequences": 8}
    native_only = {"enable_chunked_prefill": False, "max_model_len": 64}
    r = simulate(w, make_policy("fifo"), nat.VllmNativeModel(**shared, **native_only))
    assert r.completed.all() and r.admit_s[1] > r.admit_s[0]
    assert first_difference(w, "fifo", shared, native_only)[0] == "chunked_prefill_off"


def test_requests_longer_than_max_model_len_are_refused(vllm):
    w = tiny([0, 0, 0.01], [30, 100, 20], [10, 10, 5])
    r = simulate(w, make_policy("fifo"), nat.VllmNativeModel(max_model_len=64))
    assert np.isnan(r.admit_s[1]) and np.isnan(r.finish_s[1])
    assert r.completed[[0, 2]].all()


def test_prefix_caching_never_hits_on_distinct_prompts(vllm):
    w = real_window("burstgpt", "OVERLOAD")
    off = simulate(w, make_policy("fifo"), nat.VllmNativeModel())
    on = simulate(w, make_policy("fifo"), nat.VllmNativeModel(enable_prefix_caching=True))
    assert same_stamps(off, on) and off.n_steps == on.n_steps


def test_settings_vllm_refuses_are_refused_up_front(vllm):
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        nat.VllmNativeModel(max_num_batched_tokens=32)              # below 64 sequences
    with pytest.raises(ValueError, match="chunked prefill off"):
        nat.VllmNativeModel(enable_chunked_prefill=False)           # 32,768 > 2,048


# --- prefix caching ------------------------------------------------------------------------------

def vllm_v1_has_prefix_caching() -> bool:
    import dataclasses

    from portbench.engine.vllm_v1 import VllmV1Model

    return "enable_prefix_caching" in {f.name for f in dataclasses.fields(VllmV1Model)}


needs_model_cache = pytest.mark.skipif(not vllm_v1_has_prefix_caching(),
                                       reason="VllmV1Model has no enable_prefix_caching yet")

#: vllm_native with the cache on and room for Mooncake's longest requests (vllm_v1 has no such cap)
CACHE_ON = {"enable_prefix_caching": True}
NATIVE_LONG = {"max_model_len": 131072}


def mooncake(k: int = 0):
    return store.load_windows(source="mooncake_conversation")[k]


def shared_prefix_pair(gap_s: float = 1.0):
    """Two requests whose first 512-token hash block is the same (hash id 5), the second arriving
    ``gap_s`` after the first (which has left by then: its blocks stay cached)."""
    return make_window("tiny_prefix", "test", [0, gap_s], [600, 700], [2, 2], [2, 2],
                       meta={"block_tokens": 512}, block_hashes=[np.array([5, 6]), np.array([5, 7])])


def test_prompts_from_hash_ids_share_vllms_block_hashes_exactly_where_the_keys_agree(vllm):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    from portbench.engine import prefix

    w = mooncake()
    model = nat.VllmNativeModel(**CACHE_ON, **NATIVE_LONG)
    bs, hash_tokens = model.block_size, int(w.meta["block_tokens"])
    hasher = nat._block_hasher(bs, nat._vllm_config(model, "fcfs").cache_config.prefix_caching_hash_algo)
    keys, offsets, _ = prefix.block_keys(w, bs)
    rng = np.random.default_rng(0)
    key_of, hash_of = {}, {}
    n_blocks = 0
    for i in range(20):
        ids = prefix.prompt_token_ids(int(w.input_tokens[i]), w.block_hashes[i], hash_tokens, rng)
        r = Request(str(i), ids, SamplingParams(max_tokens=1), None, arrival_time=0.0, block_hasher=hasher)
        assert len(r.block_hashes) == w.input_tokens[i] // bs          # the prompt's full blocks
        for j, h in enumerate(r.block_hashes):
            k = int(keys[offsets[i] + j])
            assert key_of.setdefault(h, k) == k and hash_of.setdefault(k, h) == h, (i, j)
        n_blocks += len(r.block_hashes)
    assert len(hash_of) < n_blocks                  # the window's requests do share blocks


def test_a_request_with_a_cache_hit_is_scheduled_with_fewer_prefill_tokens(vllm):
    # Request 1 shares request 0's first 512 tokens (32 blocks): vLLM admits it with them computed,
    # schedules the other 188 of its 700, and the step costs 188 prefill tokens and 512 context ones.
    w = shared_prefix_pair()
    on = nat.VllmNativeModel(**CACHE_ON)
    _, steps = nat.record_native_steps(w, make_policy("fifo"), on)
    k = next(j for j, s in enumerate(steps) if 1 in s.admitted)
    assert steps[k].hits == {1: 512} and steps[k].scheduled == {1: 700 - 512}
    c0, cp, _, cc, cg = on.cost.picoseconds()
    assert steps[k + 1].start_ps - steps[k].start_ps == c0 + cg + cp * 188 + cc * 512
    engine = on.make_engine(w, make_policy("fifo"))
    engine.run()
    assert engine.hit_tokens == 512
    _, off = nat.record_native_steps(w, make_policy("fifo"), nat.VllmNativeModel())
    k = next(j for j, s in enumerate(off) if 1 in s.admitted)
    assert off[k].hits == {1: 0} and off[k].scheduled == {1: 700}
    # a window without hashes shares nothing
    plain = make_window("tiny_plain", "test", [0, 1.0], [600, 700], [2, 2], [2, 2])
    _, steps = nat.record_native_steps(plain, make_policy("fifo"), on)
    assert all(h == 0 for s in steps for h in s.hits.values())


def test_a_hit_one_engine_misses_is_classed_as_a_cache_difference(vllm):
    # vllm_v1 without the cache against vLLM with it: request 1's admission step is the first to
    # differ, with the same request admitted and another hit (0 tokens against 512).
    from portbench.engine.vllm_v1 import VllmV1Model

    w = shared_prefix_pair()
    native = nat.VllmNativeModel(**CACHE_ON)
    _, ms = nat.record_model_steps(w, make_policy("fifo"), VllmV1Model())
    _, ns = nat.record_native_steps(w, make_policy("fifo"), native)
    k = nat.first_differing_step(ms, ns)
    assert ns[k].admitted == [1]
    cls, detail = nat.classify_step(k, ms, ns, w, "fifo", native)
    assert cls == "cache_hit" and detail.endswith("{1: (0, 512)}")


@pytest.mark.parametrize("cache", [True, False])
def test_the_key_view_reads_the_hit_vllm_finds_at_admission_without_touching_the_cache(vllm, monkeypatch,
                                                                                       cache):
    """At every lookup vLLM makes for a waiting request (``get_computed_blocks``), the key view's
    ``cached_prefix`` says the same, and asking it leaves the free queue as it was."""
    from portbench.realengine.vllm_key_scheduler import KeyPolicyScheduler

    seen = []
    build = nat.build_scheduler

    def hooked(*args, **kwargs):
        sched = build(*args, **kwargs)
        assert isinstance(sched, KeyPolicyScheduler)
        kvm = sched.kv_cache_manager
        lookup = kvm.get_computed_blocks

        def checked(request):
            i = int(request.request_id)
            pool = kvm.block_pool
            queue = pool.free_block_queue
            before = [b.block_id for b in queue.get_all_free_blocks()] if len(seen) < 30 else None
            said = int(sched._view.cached_prefix([i])[0])
            if before is not None:
                assert [b.block_id for b in queue.get_all_free_blocks()] == before
            out = lookup(request)
            seen.append((i, said, out[1]))
            return out

        kvm.get_computed_blocks = checked
        return sched

    monkeypatch.setattr(nat, "build_scheduler", hooked)
    w = scale(mooncake(), 2.0) if cache else real_window("burstgpt", "KNEE")
    model = nat.VllmNativeModel(**(CACHE_ON if cache else {}), **(NATIVE_LONG if cache else {}))
    engine = model.make_engine(w, make_policy("shortest_prefill_first"))
    engine.record_steps()
    engine.run()
    assert seen and all(said == found for _, said, found in seen)
    admitted = sum(h for s in engine.step_log for h in s.hits.values())
    assert admitted == engine.hit_tokens
    if cache:
        assert sum(found > 0 for _, _, found in seen) > 50 and admitted > 0
    else:
        assert all(found == 0 for _, _, found in seen) and admitted == 0


def test_the_key_view_reads_no_hit_for_a_request_vllm_does_not_hold(vllm):
    from portbench.realengine.vllm_key_scheduler import KeyView

    w = shared_prefix_pair()
    view = KeyView(w, model=None)
    assert view.cached_prefix([0, 1]).tolist() == [0, 0] and view.cached_prefix([]).dtype == np.int64


@needs_model_cache
def test_the_tiny_shared_prefix_runs_as_on_vllm_v1(vllm):
    assert first_difference(shared_prefix_pair(), "fifo", CACHE_ON) is None
    assert first_difference(shared_prefix_pair(0.001), "fifo", CACHE_ON) is None    # overlapping


@needs_model_cache
def test_fifo_with_the_prefix_cache_on_a_mooncake_window_at_high_load_is_vllms(vllm):
    """One Mooncake window, compressed 2x (about 2.5 times its λ_ref on vllm_v1 with the cache: KV
    pressure, preemptions and hits), FIFO: vllm_v1 and vLLM's own scheduler admit, emit the first
    token and finish every request at the same picosecond."""
    from portbench.engine.vllm_v1 import VllmV1Model

    w = scale(mooncake(), 2.0)
    a = simulate(w, make_policy("fifo"), VllmV1Model(**CACHE_ON))
    engine = nat.VllmNativeModel(**CACHE_ON, **NATIVE_LONG).make_engine(w, make_policy("fifo"))
    engine.run()
    b = engine.result(w)
    assert engine.hit_tokens > 0 and b.n_preemptions > 0
    assert same_stamps(a, b), first_difference(w, "fifo", CACHE_ON, NATIVE_LONG)


def test_the_comparison_names_an_option_vllm_v1_lacks(monkeypatch):
    import importlib.util as iu
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "native_vs_model.py"
    spec = iu.spec_from_file_location("native_vs_model", path)
    bench = iu.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert "campaign_cache" in bench.CONFIGS
    monkeypatch.setitem(bench.CONFIGS, "future", ({"enable_some_cache": True}, {}))
    with pytest.raises(SystemExit, match="VllmV1Model option.* enable_some_cache"):
        bench.models("future")
    # vllm_v1's offload tier has no vLLM counterpart: the comparison refuses it by name
    monkeypatch.setitem(bench.CONFIGS, "offload", ({"enable_prefix_caching": True,
                                                    "offload_kv_tokens": 65536}, {}))
    with pytest.raises(SystemExit, match="VllmNativeModel option.* offload_kv_tokens.* no counterpart"):
        bench.models("offload")
    # the warm check: RQ9's three capacities; a window's regions taken in turn, every region run
    assert bench.GROUPS["warm"] == tuple(f"campaign_cache_warm_kv{kv}" for kv in (131072, 262144, 524288))
    regions = list(REGIONS)[:5]
    taken = [bench.regions_of(k, regions, 4) for k in range(10)]
    assert all(len(set(r)) == 4 for r in taken) and {x for r in taken for x in r} == set(regions)
    assert bench.regions_of(3, regions, 0) == regions


# --- a warm prefix cache -------------------------------------------------------------------------

WARM = {"enable_prefix_caching": True, "warm_start": True}

#: vllm_v1's warm pool (blockpool.serve_one_by_one) gives each history request prompt + output
#: tokens of KV, caching the block its last output token would fill; vLLM never computes the last
#: sampled token (prompt + output - 1 tokens, as vllm_v1's own runs count a request that leaves).
V1_WARMS_ONE_TOKEN_MORE = pytest.mark.xfail(
    strict=True, reason="vllm_v1's warm pool serves each history request with prompt + output "
                        "tokens of KV, vLLM with prompt + output - 1 (blockpool.serve_one_by_one)")


def with_history(source: str, k: int = 0):
    """Window ``k`` of ``source``, loaded with its history (the trace's requests before it)."""
    ids = store.list_windows(source=source)["window_id"].tolist()
    return store.load_windows(window_ids=[ids[k]], history=True)[0]


def warm_native(window, kv: int):
    """A fresh vLLM scheduler for ``window`` at ``kv`` KV tokens, its KV-cache manager warmed by
    :func:`nat.warm_kv_cache`: (scheduler, the history requests it served)."""
    model = nat.VllmNativeModel(**WARM, max_kv_tokens=kv, max_model_len=max(kv, 2))
    sched = nat.build_scheduler(model)
    hasher = nat._block_hasher(model.block_size, sched.cache_config.prefix_caching_hash_algo)
    return sched, nat.warm_kv_cache(sched.kv_cache_manager, window, model, hasher)


def free_queue(sched) -> list:
    """vLLM's free queue, head (evicted first) to tail: (block id, its hash or None)."""
    return [(b.block_id, b.block_hash) for b in
            sched.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()]


def native_cached_keys(window, kv: int, bs: int = 16) -> list:
    """The cached blocks of vLLM's free queue after warming, oldest first, as vllm_v1's block keys
    (:func:`prefix.block_keys` with the same history rows): one key a hash, one hash a key."""
    from vllm.v1.core.kv_cache_utils import get_block_hash

    from portbench.engine import prefix

    sched, served = warm_native(window, kv)
    first = prefix.warm_history_start(window, kv // bs, bs)
    keys, offsets, _ = prefix.block_keys(window, bs, history_from=first)
    key_of, hash_of = {}, {}
    for j, request in enumerate(served):
        for q, h in enumerate(request.block_hashes if request is not None else ()):
            k = int(keys[offsets[len(window) + j] + q])
            assert key_of.setdefault(h, k) == k and hash_of.setdefault(k, h) == h, (j, q)
    return [key_of[get_block_hash(h)] for _, h in free_queue(sched) if h is not None]


def model_cached_keys(window, kv: int, bs: int = 16) -> list:
    """The keys of the cached blocks in vllm_v1's warm free queue, oldest first."""
    from portbench.engine import blockpool

    n_blocks = kv // bs
    pool = blockpool.views(blockpool.warm_array(window, n_blocks, bs))
    nxt, bkey = pool[blockpool.NXT], pool[blockpool.BKEY]
    keys, b = [], nxt[n_blocks]                 # the queue's sentinel is block n_blocks
    while b != n_blocks:
        if bkey[b] >= 0:
            keys.append(int(bkey[b]))
        b = nxt[b]
    return keys


def one_request_history():
    """A window whose history is one request of 20 prompt and 12 output tokens (16-token blocks)."""
    from portbench.workload import History

    w = make_window("tiny_warm", "test", [0.0], [16], [1], [1], meta={"block_tokens": 512},
                    block_hashes=[np.array([1])])
    return dataclasses.replace(w, history=History(np.array([20]), np.array([12]), (np.array([9]),), 512))


def test_warm_start_needs_the_cache_and_a_history(vllm):
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        nat.VllmNativeModel(warm_start=True)
    with pytest.raises(ValueError, match="history=True"):
        nat.VllmNativeModel(**WARM).make_engine(mooncake(), make_policy("fifo"))
    assert "offload_kv_tokens" not in {f.name for f in dataclasses.fields(nat.VllmNativeModel)}


def test_warming_through_the_kv_cache_manager_leaves_what_vllms_scheduler_leaves(vllm):
    """warm_kv_cache's calls leave the free queue (block ids and hashes, in order) as vLLM's
    scheduler does, stepped on each history request alone until it finishes."""
    from vllm import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    w = with_history("mooncake_conversation")
    kv = 131072
    warmed, served = warm_native(w, kv)
    sched = nat.build_scheduler(nat.VllmNativeModel(**WARM, max_kv_tokens=kv, max_model_len=kv))
    hasher = nat._block_hasher(16, sched.cache_config.prefix_caching_hash_algo)
    assert len(served) > 5 and all(r is not None for r in served)
    for j, r in enumerate(served):
        request = Request(f"alone-{j}", r.prompt_token_ids, SamplingParams(
            max_tokens=r.num_output_tokens, ignore_eos=True, detokenize=False), None,
            arrival_time=0.0, block_hasher=hasher)
        sched.add_request(request)
        token = [r.output_token_ids[0]]
        while sched.has_unfinished_requests():
            so = sched.schedule()
            ids = list(so.num_scheduled_tokens)
            sampled = [token if request.num_computed_tokens >= request.num_tokens else [] for _ in ids]
            sched.update_from_output(so, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={i: k for k, i in enumerate(ids)}, sampled_token_ids=sampled))
        assert request.num_computed_tokens == r.num_computed_tokens == r.num_tokens - 1
    assert free_queue(sched) == free_queue(warmed)
    assert sum(h is not None for _, h in free_queue(sched)) > 1000


@V1_WARMS_ONE_TOKEN_MORE
def test_both_models_warm_one_request_the_same_way(vllm):
    # vLLM caches block 0 only (31 tokens computed) and puts block 1 back at the head, uncached;
    # vllm_v1 caches both (32 tokens), the output block at the tail
    assert model_cached_keys(one_request_history(), 64) == native_cached_keys(one_request_history(), 64)


@V1_WARMS_ONE_TOKEN_MORE
@pytest.mark.parametrize("source, k", [("mooncake_conversation", 0), ("mooncake_synthetic", 1)])
def test_both_models_warm_the_same_way(vllm, source, k):
    """After warming, the cached blocks of vLLM's free queue, oldest first, hold the keys of
    vllm_v1's warm pool, in the same order (RQ9's smallest capacity, a real window)."""
    w = with_history(source, k)
    native = native_cached_keys(w, 131072)
    assert len(native) > 7000
    assert model_cached_keys(w, 131072) == native


@needs_model_cache
@pytest.mark.parametrize("source, k, kv, factor, policy", [
    ("mooncake_conversation", 0, 131072, 0.8, "fifo"),
    ("mooncake_synthetic", 0, 262144, 1.2, "cache_aware_sjf"),
    ("mooncake_conversation", 2, 524288, 0.5, "lpm"),
])
def test_a_warm_run_of_a_real_window_is_vllms(vllm, source, k, kv, factor, policy):
    """With the cache warmed by the window's history in both, vllm_v1 and vLLM's own scheduler
    admit, emit the first token and finish every request at the same picosecond, taking the same
    tokens from the cache."""
    from portbench.engine.vllm_v1 import VllmV1Model

    w = scale(with_history(source, k), factor)
    a = simulate(w, make_policy(policy), VllmV1Model(**WARM, max_kv_tokens=kv))
    native = nat.VllmNativeModel(**WARM, max_kv_tokens=kv, max_model_len=kv)
    engine = native.make_engine(w, make_policy(policy))
    engine.run()
    b = engine.result(w)
    assert same_stamps(a, b), first_difference(w, policy, {**WARM, "max_kv_tokens": kv}, {"max_model_len": kv})
    assert b.completed.all() and engine.hit_tokens == a.prefix_hit_tokens > 0


def test_a_warm_cache_serves_the_windows_first_requests(vllm):
    """The first requests of a window that continue conversations of its history find their
    prefixes cached when warm, and nothing when cold (in both engine models)."""
    from portbench.engine.vllm_v1 import VllmV1Model

    w = with_history("mooncake_conversation")
    n = 12
    head = dataclasses.replace(
        make_window("head", w.source, w.arrival_s[:n], w.input_tokens[:n], w.output_tokens[:n],
                    w.predicted_output_tokens[:n], meta=w.meta, block_hashes=w.block_hashes[:n]),
        history=w.history)
    hits = {}
    for warm in (True, False):
        options = {"enable_prefix_caching": True, "warm_start": warm}
        engine = nat.VllmNativeModel(**options, max_model_len=131072).make_engine(head, make_policy("fifo"))
        engine.run()
        a = simulate(head, make_policy("fifo"), VllmV1Model(**options))
        assert same_stamps(a, engine.result(head)) and a.prefix_hit_tokens == engine.hit_tokens
        hits[warm] = engine.hit_tokens
    assert hits[True] > hits[False]


# --- SLAI's scheduler port on the virtual clock ---------------------------------------------------

def test_slai_port_runs_on_the_virtual_clock_and_finishes_every_request(vllm):
    w = real_window("burstgpt", "KNEE")
    model = nat.VllmNativeModel(max_num_batched_tokens=512, max_active_sequences=128)
    res = simulate(w, make_policy("slai_faithful"), model)
    assert np.isfinite(res.finish_s).all()
    again = simulate(w, make_policy("slai_faithful"), model)
    assert same_stamps(res, again)          # deterministic: no wall clock read


def test_slai_port_sets_the_priority_vllm_v1_reads_for_its_victim(vllm):
    # the port orders by prompt length itself (add_request); vllm_v1 takes slai_faithful's victim
    # order from vllm_settings (priority="prompt"): the two must state the same priority
    from vllm import SamplingParams
    from vllm.v1.request import Request

    from portbench.realengine.vllm_settings import priorities

    w = tiny([0.0, 0.1, 0.2], [300, 20, 90], [5, 5, 5])
    sched = nat.build_scheduler(nat.VllmNativeModel(max_num_batched_tokens=512, max_active_sequences=128),
                                "priority", nat.SLAI_SCHEDULER)
    for i in range(len(w)):
        sched.add_request(Request(str(i), [1] * int(w.input_tokens[i]), SamplingParams(max_tokens=5),
                                  None, arrival_time=float(w.arrival_s[i]), priority=0))
    assert [sched.requests[str(i)].priority for i in range(len(w))] == list(priorities(w, "slai_faithful"))


def test_slai_port_keeps_the_long_prefill_cap_while_it_holds_decodes(vllm):
    # Requests 0 and 1 decode; request 2's 3,000-token prompt arrives and SLAI gives its first chunk
    # the whole 512-token budget, holding both decodes. They are still in the engine, so vLLM's
    # long_prefill_token_threshold (lifted only for a lone request) caps the chunk at 256, as in
    # vllm_v1: the port hid the held decodes from vLLM's request count before. (The runs part later:
    # the simulator's SLAI prefills a shadow of whole-budget chunks, its port reads vLLM's progress.)
    w = make_window("t", "test", [0.0, 0.0, 0.01], [16, 16, 3000], [200, 200, 2], [200, 200, 2])
    shared = dict(max_num_batched_tokens=512, max_active_sequences=128, long_prefill_token_threshold=256)
    _, steps = nat.record_native_steps(w, make_policy("slai_faithful"), nat.VllmNativeModel(**shared))
    first = next(s for s in steps if 2 in s.admitted)
    assert not {0, 1} & set(first.scheduled)            # SLAI held both decodes
    assert first.scheduled[2] == 256


def test_slai_port_does_not_hold_decodes_for_a_request_vllm_will_not_admit(vllm):
    # 16 KV blocks, a 32-token budget. Requests 0-2 decode; request 3's first chunk (2 blocks) fits
    # the free blocks, its whole 200-token prompt (13 blocks) does not, and vLLM 0.32 admits only a
    # request whose whole sequence fits (scheduler_reserve_full_isl). SLAI's port then leaves the
    # budget to the decodes: at no step is request 3 refused while a decoder waits unserved.
    w = make_window("t", "test", [0.0, 0.0, 0.0, 0.01], [16, 16, 16, 200], [20, 20, 20, 2], [20, 20, 20, 2])
    model = nat.VllmNativeModel(max_kv_tokens=256, max_num_batched_tokens=32, max_active_sequences=8,
                                max_model_len=512)
    engine = model.make_engine(w, make_policy("slai_faithful"))
    engine.record_steps()
    engine.run()
    refused = [s for s in engine.step_log if 3 in s.waiting and 3 not in s.admitted and s.running]
    assert refused, "request 3 was never refused: the window does not test the gate"
    assert all(set(s.running) <= set(s.scheduled) for s in refused)


# --- SLAI's port plans each step with the simulator's own policy (issue 54, item 3) ---------------

def slai_for(shared):
    """slai_faithful with the engine's budget and sequence cap, as the native check runs it."""
    return make_policy("slai_faithful", token_budget=shared.get("max_num_batched_tokens", 2048),
                       max_num_seqs=shared.get("max_active_sequences", 64))


def test_slai_plan_admits_in_slai_faithfuls_order_requests_it_meets_as_they_arrive():
    # The plan keys each request on (prompt, id) as it arrives; the policy ranks a whole window at
    # reset (shortest prompt first, then id). With room for all, the first step proposes every
    # waiting request in that order. (No vLLM needed.)
    import dataclasses

    from portbench.policies.slai_faithful import SLAI
    from portbench.realengine.slai_plan import SlaiPlan, plan_model

    rng = np.random.default_rng(2)
    prompts = rng.integers(1, 40, 300).tolist()         # many ties: the id breaks them
    model = plan_model(max_kv_tokens=1 << 20, max_active_sequences=512, max_num_batched_tokens=1 << 14,
                       enable_chunked_prefill=True, block_size=16)
    waiting = []
    plan = SlaiPlan(model, dataclasses.replace(SLAI, token_budget=1 << 14), lambda: list(waiting),
                    lambda ids: [0] * len(ids), max_num_seqs=512)
    for p in prompts:
        waiting.append(plan.arrive(p, 0.0))
    d = plan.decide(0.0, [], 0)
    assert list(d.admit) == np.lexsort((np.arange(len(prompts)), prompts)).tolist()
    assert not d.hold


@pytest.mark.parametrize("config, window_id, region", [
    ("campaign", "burstgpt_stage0_w00", "HIGH_PRESSURE"),
    ("long_prefill", "burstgpt_stage0_w03", "HIGH_PRESSURE"),
    ("slai", "burstgpt_stage0_w00", "HIGH_PRESSURE"),
    ("campaign", "azure_llm_2024_pilot_v2_w20", "LOW"),        # preempts
])
def test_slai_port_plans_the_steps_slai_faithful_plans_on_vllm_v1(vllm, config, window_id, region):
    # Runs where the port's own estimate (vLLM's free blocks and computed tokens) parted from the
    # policy's shadow block count and shadow prefill (class slai_step_plan); the port now asks the
    # policy itself, on vLLM's state, and the two engines run step for step alike.
    from portbench.engine.vllm_v1 import VllmV1Model

    shared = {"campaign": {}, "long_prefill": {"long_prefill_token_threshold": 256},
              "slai": {"max_num_batched_tokens": 512, "max_active_sequences": 128}}[config]
    w = store.load_windows(window_ids=[window_id])[0]
    s = scale(w, lambda_ref(window_id) * REGIONS[region])
    native = nat.VllmNativeModel(**shared)
    _, ms = nat.record_model_steps(s, slai_for(shared), VllmV1Model(**shared))
    _, ns = nat.record_native_steps(s, slai_for(shared), native)
    k = nat.first_differing_step(ms, ns)
    assert k is None, nat.classify_step(k, ms, ns, s, "slai_faithful", native)


def test_slai_port_agrees_with_vllm_v1_where_kv_runs_short(vllm):
    # Small random windows on a tight KV cache, a short budget and sometimes a long-prefill cap:
    # holds, refused admissions and vLLM's preemptions (a held decode can be the victim) all occur,
    # and every run has the same admission, first-token and finish times on both engines.
    from portbench.engine.vllm_v1 import VllmV1Model

    rng = np.random.default_rng(5)
    configs = [dict(max_kv_tokens=512, max_num_batched_tokens=128, max_active_sequences=8),
               dict(max_kv_tokens=768, max_num_batched_tokens=64, max_active_sequences=8,
                    long_prefill_token_threshold=48)]
    preempted = held = 0
    for k in range(12):
        shared = configs[k % 2]
        arrival = np.sort(rng.uniform(0.0, 0.3, 14))
        out = rng.integers(1, 80, 14)
        w = make_window(f"r{k}", "test", arrival, rng.integers(8, 400, 14), out, out)
        tbt = 0.05 if k % 3 else 0.5                     # a short TBT makes decodes critical
        policy = lambda: make_policy("slai_faithful", token_budget=shared["max_num_batched_tokens"],  # noqa: E731
                                     max_num_seqs=8, tbt_s=tbt)
        a = simulate(w, policy(), VllmV1Model(**shared))
        b, steps = nat.record_native_steps(w, policy(), nat.VllmNativeModel(**shared, max_model_len=1024))
        assert same_stamps(a, b), (k, shared)
        assert a.n_preemptions == b.n_preemptions
        preempted += b.n_preemptions
        held += sum(len(set(s.running) - set(s.scheduled) - set(s.preempted)) for s in steps)
    assert preempted > 0 and held > 0


def test_slai_port_leaves_vllms_running_order_and_queue_as_they_were(vllm):
    # The plan's holds and admissions go through vLLM's own lists for one call only: after each
    # step the running list is in admission order and every waiting request is in vLLM's queue.
    w = make_window("t", "test", [0.0, 0.0, 0.0, 0.001, 0.002], [16, 16, 16, 900, 40], [30, 30, 30, 3, 3],
                    [30, 30, 30, 3, 3])
    model = nat.VllmNativeModel(max_num_batched_tokens=256, max_active_sequences=8)
    engine = model.make_engine(w, slai_for({"max_num_batched_tokens": 256, "max_active_sequences": 8}))
    engine.record_steps()
    engine.run()
    log = engine.step_log
    assert any(set(s.running) - set(s.scheduled) for s in log), "no step held a decode"
    first_admitted = {}
    for s in log:
        for i in s.admitted:
            first_admitted.setdefault(i, len(first_admitted))
        assert s.running == sorted(s.running, key=first_admitted.get)   # no preemption here
        assert not set(s.running) & set(s.waiting)
    assert np.isfinite(engine.result(w).finish_s).all()

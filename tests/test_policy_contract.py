"""The policy interface's contract: the engine enforces it, check_policy finds what breaks it."""

import subprocess
import sys

import numpy as np
import pytest

from portbench import sim
from portbench.engine import VllmV1Model
from portbench.policies import available, make_policy
from portbench.queue import WaitingOrder
from portbench.sim import Decision, Policy, PolicyContractError
from portbench.testing import check_policy, verified_run
from portbench.workload import make_window

MODELS = [sim.LsspModel(drain_s=2.0), VllmV1Model(drain_s=2.0)]


@pytest.mark.parametrize("name", available())
def test_every_registered_policy_keeps_the_contract(name):
    check_policy(type(make_policy(name)), max_examples=30)


@pytest.mark.parametrize("name", available())
def test_every_registered_policy_keeps_the_contract_with_the_prefix_cache(name):
    # vllm_v1 with its prefix cache on: random windows whose prompts share prefixes, and a
    # prefix-hashed (Mooncake) window at high load; view.cached_prefix changes under the policy
    check_policy(type(make_policy(name)), engine_models=("vllm_v1_cache",), max_examples=15,
                 real_windows=1)


class PreemptOnce(Policy):
    """Admits in arrival order and, once, preempts the oldest running request — with no timer."""

    name = "preempt_once"
    event_driven = True

    def reset(self, view):
        self.done = False

    def schedule(self, view):
        if not self.done and len(view.running) >= 2:
            self.done = True
            return Decision(admit=list(view.waiting), preempt=[view.running[0]])
        return Decision(admit=list(view.waiting))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_preemption_without_a_timer_ends_the_stretch(model):
    # A long request runs alone for a while, a second arrives; the preempted one must be re-admitted
    # at once (next step) and finish, on the fast path as walking every step.
    w = make_window("w", "test", [0.0, 0.005], [10, 10], [40, 5], [40, 5])
    fast = verified_run(w, PreemptOnce(), model)
    assert fast.n_preemptions == 1
    assert fast.completed.all()
    check_policy(PreemptOnce, max_examples=25, real_windows=0)


class ForgetfulTimer(Policy):
    """Admits a request only once it has waited 20 ms, but announces no timer."""

    name = "forgetful_timer"
    admission_only = True

    def schedule(self, view):
        return Decision(admit=[i for i in view.waiting if view.now - view.arrival_s[i] >= 0.02])


class HonestTimer(ForgetfulTimer):
    name = "honest_timer"

    def schedule(self, view):
        d = super().schedule(view)
        pending = [view.arrival_s[i] + 0.02 for i in view.waiting if i not in d.admit]
        return Decision(admit=d.admit, wake_at_s=min(pending, default=sim.NEVER))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_missing_timer_is_caught_with_the_request_and_step(model):
    w = make_window("w", "test", [0.0], [10], [5], [5])
    with pytest.raises(PolicyContractError, match=r"request 0 .*admitted never on the fast path but at "
                                                  r"[0-9.]+ s \(step \d+\) walking every step"):
        verified_run(w, ForgetfulTimer(), model)
    r = verified_run(w, HonestTimer(), model)
    assert r.admit_s[0] >= 0.02
    check_policy(HonestTimer, max_examples=25, real_windows=0)


class HoldsButSaysAdmissionOnly(Policy):
    name = "holds_but_says_admission_only"
    admission_only = True

    def schedule(self, view):
        return Decision(admit=list(view.waiting), hold=frozenset(view.running[:1]))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_an_admission_only_policy_that_holds_is_refused(model):
    w = make_window("w", "test", [0.0, 0.0, 0.05], [10, 10, 10], [500, 500, 5], [5, 5, 5])
    with pytest.raises(PolicyContractError, match="declares admission_only but returned hold"):
        sim.simulate(w, HoldsButSaysAdmissionOnly(), model)


class HoldsTheOldest(Policy):
    """Holds the oldest running request for its first 20 ms after arrival, admitting nothing
    meanwhile; otherwise admits every waiting request. While it holds, its answer stays the same
    whatever arrives, until the 20 ms are up: a steady decision with that timer."""

    name = "holds_the_oldest"
    event_driven = True
    timer = True
    hold_s = 0.02

    def schedule(self, view):
        if view.running:
            r = min(view.running)
            until = view.arrival_s[r] + self.hold_s
            if view.now < until:
                return Decision(hold=frozenset([r]), steady=True,
                                wake_at_s=until if self.timer else sim.NEVER)
        return Decision(admit=list(view.waiting))


class HoldsTheOldestWithoutTimer(HoldsTheOldest):
    name = "holds_the_oldest_without_timer"
    timer = False


class AdmitsSteadily(Policy):
    """Claims a steady answer while admitting whatever waits: an arrival changes the answer."""

    name = "admits_steadily"
    event_driven = True

    def schedule(self, view):
        return Decision(admit=list(view.waiting), steady=True)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_steady_hold_is_skipped_over_and_a_false_claim_is_caught(model):
    # request 0 is held for 20 ms while 1 and 2 arrive (not admitted meanwhile); then all run
    w = make_window("w", "test", [0.0, 0.004, 0.008], [10, 10, 10], [30, 5, 5], [30, 5, 5])
    r = verified_run(w, HoldsTheOldest(), model)
    assert r.completed.all()
    assert (r.admit_s[1:] >= 0.02).all()
    check_policy(HoldsTheOldest, max_examples=30, real_windows=0)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_false_steady_claim_is_caught(model):
    # lssp skips the steps a steady decision covers; vllm_v1 walks them without asking the policy
    w = make_window("w", "test", [0.0, 0.004, 0.008], [10, 10, 10], [30, 5, 5], [30, 5, 5])
    with pytest.raises(PolicyContractError, match=r"request 1 .*admitted never on the fast path .*steady"):
        verified_run(w, HoldsTheOldestWithoutTimer(), model)
    with pytest.raises(PolicyContractError, match="admits_steadily.*differ"):
        check_policy(AdmitsSteadily, max_examples=30, real_windows=0)


class CountedHolds(HoldsTheOldest):
    name = "counted_holds"
    hold_s = 0.2

    def reset(self, view):
        self.calls = 0

    def schedule(self, view):
        self.calls += 1
        return super().schedule(view)


def test_vllm_v1_repeats_a_steady_decision_without_asking():
    # Request 0 is held for 200 ms (tens of vllm_v1 steps, each walked): the policy is asked at the
    # first of them and again when its timer fires, not at every step; the result is the walk's.
    w = make_window("w", "test", [0.0, 0.004, 0.008], [10, 10, 10], [30, 5, 5], [30, 5, 5])
    model = VllmV1Model(drain_s=2.0)
    fast, walked = CountedHolds(), CountedHolds()
    a = sim.simulate(w, fast, model)
    b = sim.simulate(w, walked, model, event_skipping=False)
    for x, y in [(a.admit_s, b.admit_s), (a.first_token_s, b.first_token_s), (a.finish_s, b.finish_s)]:
        np.testing.assert_array_equal(x, y)
    assert (a.admit_s[1:] >= 0.2).all()
    assert fast.calls < walked.calls / 4


class HoldsWhileCrowded(Policy):
    """Holds the oldest running request while another runs too, steady and with no timer: its
    answer changes only when the other one completes, which ends the stretch."""

    name = "holds_while_crowded"
    event_driven = True

    def schedule(self, view):
        if len(view.running) >= 2:
            return Decision(hold=frozenset([min(view.running)]), steady=True)
        return Decision(admit=list(view.waiting))


class OneAtATime(Policy):
    """Admits the first waiting request when nothing runs; while one runs, it admits nothing, steady
    with no timer: the answer changes when that one completes (in a pure-decode stretch)."""

    name = "one_at_a_time"
    event_driven = True

    def schedule(self, view):
        if view.running:
            return Decision(steady=True)
        return Decision(admit=list(view.waiting[:1]))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
@pytest.mark.parametrize("policy", [HoldsWhileCrowded, OneAtATime], ids=lambda p: p.name)
def test_a_completion_ends_a_steady_stretch(model, policy):
    w = make_window("w", "test", [0.0, 0.0, 0.001], [10, 600, 20], [30, 40, 10], [30, 40, 10])
    r = verified_run(w, policy(), model)
    assert r.completed.all()


def test_a_steady_decision_may_not_preempt():
    class PreemptsSteadily(PreemptOnce):
        name = "preempts_steadily"

        def schedule(self, view):
            d = super().schedule(view)
            return Decision(admit=d.admit, preempt=d.preempt, steady=bool(d.preempt))

    w = make_window("w", "test", [0.0, 0.005], [10, 10], [40, 5], [40, 5])
    with pytest.raises(PolicyContractError, match="steady decision that preempts"):
        sim.simulate(w, PreemptsSteadily(), sim.LsspModel())


class CountsCalls(Policy):
    """Declares admission_only but admits by how often it was asked: hidden state."""

    name = "counts_calls"
    admission_only = True

    def reset(self, view):
        self.calls = 0

    def schedule(self, view):
        self.calls += 1
        return Decision(admit=list(view.waiting) if self.calls % 3 == 0 else [])


def test_check_policy_names_a_stateful_admission_only_policy():
    with pytest.raises(PolicyContractError, match="counts_calls.*differ"):
        check_policy(CountsCalls, max_examples=40, real_windows=0)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_admitting_a_request_that_is_not_waiting_is_an_error(model):
    class AdmitsTwice(Policy):
        name = "admits_twice"
        event_driven = True

        def schedule(self, view):
            return Decision(admit=list(view.waiting) + list(view.running))

    w = make_window("w", "test", [0.0, 0.001], [10, 10], [5, 5], [5, 5])
    with pytest.raises(PolicyContractError, match="admitted request 0 at step \\d+, which is not waiting"):
        sim.simulate(w, AdmitsTwice(), model)


class HoldsWhileRefused(Policy):
    """Holds every running request until ``release_s`` and proposes the waiting ones meanwhile,
    shortest prompt first: in a KV cache this small the engine refuses a long one (the held requests
    keep their blocks), so the steps change nothing but the clock until the timer or an arrival (a
    short one goes first, and fits) — which it claims with repeat_if_refused."""

    name = "holds_while_refused"
    event_driven = True
    release_s = 0.3
    timer = True

    def reset(self, view):
        self.calls = 0

    def schedule(self, view):
        self.calls += 1
        if view.running and view.now < self.release_s:
            # (the step timer counts only if the admission goes through: it never does here)
            return Decision(admit=sorted(view.waiting, key=lambda i: (view.input_tokens[i], i)),
                            hold=frozenset(view.running), wake_after_steps=2,
                            wake_at_s=self.release_s if self.timer else sim.NEVER,
                            repeat_if_refused=True)
        return Decision(admit=list(view.waiting))


class HoldsWhileRefusedWithoutTimer(HoldsWhileRefused):
    name = "holds_while_refused_without_timer"
    timer = False


def test_vllm_v1_skips_the_steps_after_a_refusal_that_change_nothing():
    # Request 0 (3 of the cache's 4 blocks) is held for 300 ms; request 1 (3 blocks) is proposed and
    # refused at each of those steps: the engine skips them up to the arrival of request 2 (1 block,
    # admitted at once) and then up to the timer, as walking them gives.
    w = make_window("w", "test", [0.0, 0.004, 0.05], [40, 40, 10], [5, 5, 5], [5, 5, 5])
    model = VllmV1Model(max_kv_tokens=64, drain_s=2.0)
    fast, walked = HoldsWhileRefused(), HoldsWhileRefused()
    a = verified_run(w, fast, model)
    b = sim.simulate(w, walked, model, event_skipping=False)
    for x, y in [(a.admit_s, b.admit_s), (a.first_token_s, b.first_token_s), (a.finish_s, b.finish_s)]:
        np.testing.assert_array_equal(x, y)
    assert a.completed.all() and a.admit_s[1] >= 0.3 and 0.05 <= a.admit_s[2] < 0.06
    assert fast.calls < walked.calls / 4
    # without the timer the claim is false: the answer changes at 300 ms, unannounced
    with pytest.raises(PolicyContractError, match="holds_while_refused_without_timer.*differ"):
        verified_run(w, HoldsWhileRefusedWithoutTimer(), model)


def test_a_refusal_while_requests_run_is_not_skipped_over():
    # The claim is made without holding anybody: the requests that run change the engine's state,
    # so the engine does not skip after the refusal (and the result is the walk's).
    class ClaimsWithoutHolding(HoldsWhileRefused):
        name = "claims_without_holding"

        def schedule(self, view):
            d = super().schedule(view)
            return Decision(admit=d.admit, wake_at_s=d.wake_at_s, repeat_if_refused=True)

    w = make_window("w", "test", [0.0, 0.004, 0.05], [40, 40, 10], [20, 5, 5], [20, 5, 5])
    r = verified_run(w, ClaimsWithoutHolding(), VllmV1Model(max_kv_tokens=64, drain_s=2.0))
    assert r.completed.all()


def test_a_repeat_if_refused_decision_may_not_preempt():
    class PreemptsOnRefusal(Policy):
        name = "preempts_on_refusal"
        event_driven = True

        def schedule(self, view):
            return Decision(admit=list(view.waiting), preempt=list(view.running), repeat_if_refused=True)

    w = make_window("w", "test", [0.0, 0.001], [10, 10], [5, 5], [5, 5])
    with pytest.raises(PolicyContractError, match="repeat_if_refused decision that preempts"):
        sim.simulate(w, PreemptsOnRefusal(), VllmV1Model(drain_s=2.0))


def test_holding_a_request_outside_the_window_is_an_error():
    class HoldsAStranger(Policy):
        name = "holds_a_stranger"
        event_driven = True

        def schedule(self, view):
            return Decision(admit=list(view.waiting), hold=frozenset([7]) if view.running else frozenset())

    w = make_window("w", "test", [0.0, 0.001], [10, 10], [5, 5], [5, 5])
    with pytest.raises(PolicyContractError, match="held request 7 at step \\d+, which is not in the window"):
        sim.simulate(w, HoldsAStranger(), VllmV1Model(drain_s=2.0))


class HoldsInOneSet(Policy):
    """Holds, through one set object it changes in place, every running request but the newest,
    on odd calls, and nobody on even ones: an engine must read the set anew at each step."""

    name = "holds_in_one_set"
    event_driven = True

    def reset(self, view):
        self.calls, self.held = 0, set()

    def schedule(self, view):
        self.calls += 1
        self.held.clear()
        if self.calls % 2:
            self.held.update(view.running[:-1])
        return Decision(admit=list(view.waiting), hold=self.held, wake_after_steps=1)


class HoldsInNewSets(HoldsInOneSet):
    name = "holds_in_new_sets"

    def schedule(self, view):
        d = super().schedule(view)
        return Decision(admit=d.admit, hold=frozenset(d.hold), wake_after_steps=1)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_hold_set_changed_in_place_is_read_anew(model):
    w = make_window("w", "test", [0.0, 0.001, 0.002, 0.003], [10, 20, 30, 40], [9, 7, 5, 3], [9, 7, 5, 3])
    one = verified_run(w, HoldsInOneSet(), model)
    new = sim.simulate(w, HoldsInNewSets(), model)
    never = sim.simulate(w, make_policy("fifo"), model)
    assert one.completed.all()
    np.testing.assert_array_equal(one.finish_s, new.finish_s)
    np.testing.assert_array_equal(one.first_token_s, new.first_token_s)
    assert not np.array_equal(one.finish_s, never.finish_s)         # the holds took effect


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_refusals_are_reported_to_the_policy(model):
    seen = []

    class Greedy(Policy):
        name = "greedy"
        event_driven = True

        def schedule(self, view):
            seen.append(view.refused)
            return Decision(admit=list(view.waiting))

    # KV room for one prompt only: the second is refused at step 0 and the policy is told.
    m = type(model)(max_kv_tokens=64, drain_s=1.0)
    w = make_window("w", "test", [0.0, 0.0], [48, 48], [3, 3], [3, 3])
    r = sim.simulate(w, Greedy(), m, event_skipping=False)
    assert seen[1] == ((1, "kv"),)
    assert r.completed.all()


def test_the_drain_bound_is_in_seconds_on_both_engines():
    w = make_window("w", "test", [0.0], [10], [10_000], [10_000])
    for model in (sim.LsspModel(drain_s=0.5), VllmV1Model(drain_s=0.5)):
        r = verified_run(w, make_policy("fifo"), model)
        assert not r.completed.any()
        assert r.duration_s < 0.5 <= r.duration_s + model.longest_quiet_step_s


def test_the_policy_registry_does_not_load_llvmlite():
    # The real-engine backends import the registry inside a vLLM process, whose CPU platform scans
    # every loaded module at start-up and fails on llvmlite's objects: numba (and llvmlite with it)
    # is imported only when a policy or engine that compiles a loop actually runs.
    code = ("import sys\n"
            "from portbench.policies import available, make_policy\n"
            "[make_policy(p) for p in available()]\n"
            "import portbench.realengine.vllm_backend, portbench.realengine.transformers_backend\n"
            "assert 'llvmlite' not in sys.modules, sorted(m for m in sys.modules if 'llvm' in m)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


class KeepsItsOwnQueue(Policy):
    """Keeps the queue sorted by id across calls with :class:`portbench.queue.WaitingOrder` (which
    follows the engine's log of the queue's changes), checks it against ``view.waiting``, admits in
    that order and now and then preempts; its admissions are taken lazily, and it reads
    ``view.waiting`` only after the engine has taken its first one. With four requests running it
    preempts the newest that was never preempted."""

    name = "keeps_its_own_queue"
    event_driven = True

    def reset(self, view):
        self.order, self.late_reads, self.preempted = WaitingOrder(), 0, set()
        self.ids = np.arange(view.n_requests, dtype=np.int64)

    def schedule(self, view):
        at_call = list(self.order.get(view, self.ids).ids)
        assert at_call == sorted(view.waiting), "the sorted queue lost track of the engine's"
        # with four running, the newest admission goes back once (a rule of the view: no timer)
        fresh = [i for i in view.running if i not in self.preempted]
        preempt = fresh[-1:] if len(view.running) >= 4 else []
        self.preempted.update(preempt)

        def admissions():
            first = True
            for i in at_call:
                yield i
                if first:
                    first = False
                    # the engine is now taking admissions: the view still shows the call's queue
                    assert sorted(view.waiting) == at_call, "view.waiting changed during the call"
                    self.late_reads += 1

        return Decision(admit=admissions(), preempt=preempt)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_the_queue_log_replays_to_the_queue(model):
    rng = np.random.default_rng(3)
    n = 300
    w = make_window("w", "test", np.sort(rng.uniform(0, 0.4, n)), rng.integers(5, 600, n),
                    rng.integers(1, 80, n), rng.integers(1, 80, n))
    policy = KeepsItsOwnQueue()
    r = sim.simulate(w, policy, model)
    assert r.n_preemptions > 0 and policy.late_reads > 0
    check_policy(KeepsItsOwnQueue, max_examples=15, real_windows=0)

"""Check a scheduling policy against the engine's contract: :func:`check_policy`.

For a policy that declares ``event_driven`` (or ``admission_only``; every key policy does), the
engine skips steps in which nothing can change, and asks an ``admission_only`` policy only when an
admission is possible. That is exact only if the policy tells the engine the truth (its timers, its
flags). :func:`check_policy` replays random small windows, and a few real windows at high load,
under every engine model twice — with the fast path and walking every step, asking the policy at
each — and requires identical results request by request; it also checks that the engine honoured
every decision seen in the walk and that a second run gives the same result (no hidden randomness
or leftover state)::

    from portbench.testing import check_policy
    check_policy(MyPolicy)                      # raises PolicyContractError with the first difference

:func:`verified_run` makes the same fast-versus-walk check for one run. The random windows need
``hypothesis`` (the project's ``dev`` extra).
"""

from __future__ import annotations

import copy
import functools

import numpy as np

from .engine import LsspModel, simulate
from .engine.api import Decision, Policy, PolicyContractError, RunResult
from .workload import make_window, scale

_EVENTS = (("admit_s", "admitted"), ("first_token_s", "first token"), ("finish_s", "finished"))


# --- one run, fast against step by step ---------------------------------------------------------

def _step_of(engine, t: float, start: bool) -> int:
    """The engine step that begins at ``t`` (``start``) or ends at ``t`` (a token's time stamp)."""
    if engine.model.fixed_steps:
        k = round(t / engine.model.step_s)
        return k if start else k - 1
    from .engine.stepcost import PS
    starts = np.asarray(engine.step_starts_ps, dtype=np.float64) / PS
    j = int(np.searchsorted(starts, t, side="left"))
    return j if start else j - 1


def first_difference(fast: RunResult, slow: RunResult, slow_engine=None) -> str | None:
    """Where two runs of one window differ, in words (the earliest differing event first); None if
    they are identical."""
    first = None
    for field, what in _EVENTS:
        a, b = getattr(fast, field), getattr(slow, field)
        bad = ~((a == b) | (np.isnan(a) & np.isnan(b)))
        for i in np.flatnonzero(bad):
            when = np.nanmin([a[i], b[i], np.inf])
            if first is None or when < first[0]:
                first = (when, int(i), field, what, a[i], b[i])
    if first is not None:
        _, i, field, what, a, b = first

        def show(t):
            if np.isnan(t):
                return "never"
            step = "" if slow_engine is None else f" (step {_step_of(slow_engine, t, field == 'admit_s')})"
            return f"at {t:.9g} s{step}"

        return (f"request {i} (arrival {fast.arrival_s[i]:.9g} s, prompt {int(fast.input_tokens[i])}, "
                f"output {int(fast.output_tokens[i])}): {what} {show(a)} on the fast path but "
                f"{show(b)} walking every step")
    for field in ("n_preemptions", "n_steps", "duration_s"):
        if getattr(fast, field) != getattr(slow, field):
            return f"{field}: {getattr(fast, field)} on the fast path, {getattr(slow, field)} walking every step"
    return None


def verified_run(window, policy: Policy, model, *, priority=None) -> RunResult:
    """Run fast, then step by step with a fresh copy of the policy (watched for honoured decisions);
    raise :class:`PolicyContractError` where they differ. Returns the fast run's result."""
    fresh = copy.deepcopy(policy)
    fast_engine = model.make_engine(window, policy, priority)
    fast_engine.run(event_skipping=True)
    fast = fast_engine.result(window)
    slow_engine = model.make_engine(window, _Watcher(fresh), priority)
    if hasattr(slow_engine, "step_starts_ps"):
        slow_engine.step_starts_ps = []
    slow_engine.run(event_skipping=False)
    slow = slow_engine.result(window)
    diff = first_difference(fast, slow, slow_engine)
    if diff:
        raise PolicyContractError(
            f"policy {policy.name!r} on window {window.window_id!r} under the {model.name} engine "
            f"model: the fast engine and the step-by-step loop differ — {diff}. The policy's decision "
            "changed at a step it did not announce (a timer missing from wake_at_s/wake_after_steps), "
            "it returned steady=True where the next steps' answers differ (an arrival admitted, a "
            "hold released) or repeat_if_refused=True where its answer changes after a refusal, or "
            "it declares admission_only but keeps state or reads more than the view.")
    return fast


class _Watcher(Policy):
    """Wraps a policy in the step-by-step walk and checks, at each call, that the engine honoured the
    previous step's decision: preempted requests are waiting again, held ones gained no token, and
    admitted ones run (or left already) unless the engine reported refusing them."""

    def __init__(self, inner: Policy):
        self.inner = inner
        self.name = inner.name
        self.admission_only = inner.admission_only
        self.event_driven = inner.event_driven
        self._prev = None

    def reset(self, view):
        self.inner.reset(view)
        self._prev = None

    def schedule(self, view):
        if self._prev is not None and self._prev[0] == view.step - 1:
            self._check(view, *self._prev[1:])
        d = self.inner.schedule(view)
        consumed: list = []

        def watched(ids):
            for i in ids:
                consumed.append(i)
                yield i

        held = list(d.hold)
        decoded = dict(zip(held, view.decoded_of(held)))
        self._prev = (view.step, consumed, list(d.preempt), decoded)
        return Decision(admit=watched(d.admit), preempt=d.preempt, hold=d.hold,
                        wake_at_s=d.wake_at_s, wake_after_steps=d.wake_after_steps)

    def _check(self, view, admitted, preempted, held):
        waiting = set(view.waiting)
        refused = {i for i, _ in view.refused}
        for i in preempted:
            if i not in waiting:
                raise PolicyContractError(f"policy {self.name!r}: request {i}, preempted at step "
                                          f"{view.step - 1}, is not back in the queue")
        for i, n in zip(held, view.decoded_of(list(held))):
            if n != held[i]:
                raise PolicyContractError(f"policy {self.name!r}: request {i}, held at step "
                                          f"{view.step - 1}, gained a token")
        for i in admitted:
            if i in waiting and i not in refused and i not in preempted:
                raise PolicyContractError(f"policy {self.name!r}: request {i}, admitted at step "
                                          f"{view.step - 1}, is still waiting and was not refused")


# --- random windows ---------------------------------------------------------------------------

def _strategies():
    from hypothesis import strategies as st

    @st.composite
    def lssp_cases(draw):
        n = draw(st.integers(1, 24))
        gaps = draw(st.lists(st.floats(0, 0.02, allow_nan=False), min_size=n, max_size=n))
        inputs = draw(st.lists(st.integers(1, 400), min_size=n, max_size=n))
        outputs = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
        predicted = draw(st.lists(st.integers(1, 80), min_size=n, max_size=n))
        factor = draw(st.sampled_from([0.5, 5.0, 50.0, 400.0]))
        model = LsspModel(max_active_sequences=draw(st.integers(1, 8)),
                              max_kv_tokens=draw(st.sampled_from([400, 600, 1000, 3000])),
                              drain_s=draw(st.sampled_from([0.2, 5.0])))
        w = make_window("random", "test", np.cumsum(gaps), inputs, outputs, predicted)
        return scale(w, factor), model

    @st.composite
    def vllm_v1_cases(draw):
        from .engine import StepCost, VllmV1Model
        window, lssp = draw(lssp_cases())
        cost = StepCost(fixed_s=draw(st.sampled_from([1e-3, 5.75e-3])),
                        per_prefill_token_s=draw(st.sampled_from([0.0, 17.3e-6])),
                        per_decode_seq_s=draw(st.sampled_from([0.0, 6e-6])),
                        per_context_token_s=draw(st.sampled_from([0.0, 1e-8, 3e-7])))
        model = VllmV1Model(max_num_batched_tokens=draw(st.sampled_from([16, 64, 512])),
                            max_active_sequences=lssp.max_active_sequences,
                            max_kv_tokens=lssp.max_kv_tokens, block_size=draw(st.sampled_from([4, 16])),
                            cost=cost, drain_s=lssp.drain_s)
        return window, model

    @st.composite
    def vllm_v1_caps_cases(draw):
        # vLLM's long-prefill caps on (see VllmV1Model): a threshold, and concurrent-prefill caps
        import dataclasses
        window, model = draw(vllm_v1_cases())
        partial = draw(st.integers(1, 3))
        model = dataclasses.replace(
            model, long_prefill_token_threshold=draw(st.sampled_from([8, 32, 100])),
            max_num_partial_prefills=partial, max_long_partial_prefills=draw(st.integers(1, partial)))
        return window, model

    @st.composite
    def vllm_v1_cache_cases(draw):
        # vLLM's prefix cache on, and prompts that share prefixes: each request follows one of a
        # few chains of 16-token hash blocks, as far as a drawn length (a conversation's turns)
        import dataclasses
        window, model = draw(vllm_v1_cases())
        chains = [[100 * c + g for g in range(40)] for c in range(3)]
        hashes = []
        for tokens in window.input_tokens.tolist():
            c = draw(st.integers(0, len(chains) - 1))
            hashes.append(chains[c][:draw(st.integers(0, -(-tokens // 16)))])
        window = dataclasses.replace(window, block_hashes=tuple(np.asarray(h, dtype=np.int64)
                                                                for h in hashes),
                                     meta={**window.meta, "block_tokens": 16})
        return window, dataclasses.replace(model, enable_prefix_caching=True)

    @st.composite
    def vllm_v1_whole_cases(draw):
        # chunked prefill off: a waiting prompt enters only whole (the budget at least the longest)
        import dataclasses
        window, model = draw(vllm_v1_cases())
        budget = max(model.max_num_batched_tokens, int(window.input_tokens.max()))
        return window, dataclasses.replace(model, enable_chunked_prefill=False, max_num_batched_tokens=budget)

    return {"lssp": lssp_cases(), "vllm_v1": vllm_v1_cases(), "vllm_v1_caps": vllm_v1_caps_cases(),
            "vllm_v1_cache": vllm_v1_cache_cases(), "vllm_v1_whole": vllm_v1_whole_cases()}


def random_cases(engine_model: str):
    """A hypothesis strategy of (window, engine model) pairs: up to 24 requests, tight capacity."""
    cases = _strategies()
    if engine_model not in cases:
        raise KeyError(f"unknown engine model {engine_model!r}; known: {', '.join(cases)}")
    return cases[engine_model]


@functools.lru_cache(maxsize=None)
def real_cases(engine_model: str, n_windows: int = 2) -> tuple:
    """(window, engine model) pairs from the shipped windows at the HIGH_PRESSURE load (the first
    window of the study's first ``n_windows`` sources, at its base SLO), where queues run long: at
    the λ_ref of ``data/results/lambda_ref_<engine>.csv`` when present, else calibrated here.
    ``vllm_v1_caps``: the ``vllm_v1`` cases with vLLM's long-prefill caps on (threshold 256, at most
    two prefills a step, one of them long). ``vllm_v1_whole``: chunked prefill off, with the study's
    real-system budget (32,768 tokens, above every shipped prompt). ``vllm_v1_cache``: ``vllm_v1`` with its prefix cache on,
    on the first windows of the prefix-hashed source (``mooncake_conversation``), calibrated here.
    Loaded once per process (every policy checked reuses them; the engines never change a window)."""
    from . import results, store
    from .engine import engine_model as make_model
    from .regions import find_lambda_ref, region_factor
    from .workload import with_slo

    import dataclasses

    variant = engine_model
    engine_model = engine_model.removesuffix("_caps").removesuffix("_cache").removesuffix("_whole")
    model = make_model(engine_model)
    if variant == "vllm_v1_caps":
        model = dataclasses.replace(model, long_prefill_token_threshold=256,
                                    max_num_partial_prefills=2, max_long_partial_prefills=1)
    if variant == "vllm_v1_whole":
        model = dataclasses.replace(model, enable_chunked_prefill=False, max_num_batched_tokens=32768)
    table = results.read_lambda_table(engine_model)
    lam = table.set_index("window_id")["lambda_ref"] if table is not None else {}
    first = store.list_windows().groupby("source", sort=True).head(1)["window_id"].tolist()
    if variant == "vllm_v1_cache":
        model = dataclasses.replace(model, enable_prefix_caching=True)
        first = store.list_windows(source=store.PREFIX_HASHED_SOURCE)["window_id"].tolist()
        lam = {}
    cases = []
    for wid in first[:n_windows]:
        w = with_slo(store.load_window(wid), 20.0)
        lam_ref = lam[wid] if wid in lam else find_lambda_ref(w, model=model).lambda_ref
        cases.append((scale(w, lam_ref * region_factor("HIGH_PRESSURE")), model))
    return tuple(cases)


def check_policy(policy_class, params: dict | None = None, *, engine_models=("lssp", "vllm_v1"),
                 max_examples: int = 40, real_windows: int = 2, seed: int = 0) -> None:
    """Check ``policy_class(**params)`` against the engine's contract on random and real windows.

    Under each engine model (``lssp``, ``vllm_v1``, ``vllm_v1_caps``: ``vllm_v1`` with vLLM's
    long-prefill caps on, ``vllm_v1_whole``: with chunked prefill off, or ``vllm_v1_cache``: with
    its prefix cache on, prompts sharing prefixes), on ``max_examples`` random windows and on ``real_windows`` shipped
    windows at high load (:func:`real_cases`): the fast engine equals the step-by-step loop request
    by request, the engine honoured every decision of the walk, and a second run is identical.
    Raises :class:`PolicyContractError` naming the policy, the engine model, the first diverging
    request and step, and the window (hypothesis shrinks a random one first).
    """
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed

    params = dict(params or {})
    if not (isinstance(policy_class, type) and issubclass(policy_class, Policy)):
        raise TypeError(f"check_policy takes a Policy subclass, got {policy_class!r}")
    if not policy_class.name:
        raise PolicyContractError(f"{policy_class.__qualname__} has no name")

    def check(window, model, engine):
        first = verified_run(window, policy_class(**params), model)
        again = simulate(window, policy_class(**params), model)
        diff = first_difference(first, again)
        if diff:
            raise PolicyContractError(f"policy {policy_class.name!r} under {engine}: two runs of "
                                      f"the same window differ (hidden state or randomness) — {diff}")

    for engine in engine_models:
        @hypothesis_seed(seed)
        @settings(max_examples=max_examples, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(case=random_cases(engine))
        def prop(case):
            check(*case, engine)

        try:
            prop()
        except BaseExceptionGroup as group:      # several distinct failures: report the first
            raise _first_contract_error(group) from group
        for window, model in (real_cases(engine, real_windows) if real_windows else []):
            check(window, model, engine)


def _first_contract_error(group: BaseExceptionGroup) -> BaseException:
    """The first :class:`PolicyContractError` in a (nested) exception group, else the first error."""
    flat = []
    stack = [group]
    while stack:
        e = stack.pop(0)
        if isinstance(e, BaseExceptionGroup):
            stack[:0] = list(e.exceptions)
        else:
            flat.append(e)
    return next((e for e in flat if isinstance(e, PolicyContractError)), flat[0])

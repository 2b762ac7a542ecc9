"""One definition of the metrics for every engine: the same synthetic run — a request admitted,
preempted after its first tokens, re-admitted and finished — gives the same admission, TTFT, finish
and span through both simulator models and through the real backend's result converter."""

from types import SimpleNamespace

import numpy as np
import pytest

from portbench import metrics, sim
from portbench.engine import StepCost, VllmV1Model
from portbench.sim import Decision, Policy
from portbench.testing import verified_run
from portbench.workload import make_window

# Request 0 arrives at 0 and runs; request 1 arrives at 5 ms; at the first step with both running the
# policy preempts request 0, which is re-admitted at the next step and finishes later.
WINDOW = make_window("contract", "test", [0.0, 0.005], [8, 8], [20, 3], [20, 3])


class PreemptFirstOnce(Policy):
    name = "preempt_first_once"
    event_driven = True

    def reset(self, view):
        self.done = False

    def schedule(self, view):
        if not self.done and 1 in view.running and 0 in view.running:
            self.done = True
            return Decision(preempt=[0])
        return Decision(admit=list(view.waiting))


MODELS = [sim.LsspModel(drain_s=1.0),
          VllmV1Model(cost=StepCost(fixed_s=1e-3, per_prefill_token_s=0, per_decode_seq_s=0), drain_s=1.0)]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_preempted_request_keeps_its_first_admission_and_first_token(model):
    r = verified_run(WINDOW, PreemptFirstOnce(), model)
    assert r.n_preemptions == 1 and r.completed.all()
    # request 0: admitted at t = 0, first token at the end of its first step (1 ms), both kept
    assert r.admit_s[0] == 0.0
    assert r.first_token_s[0] == pytest.approx(0.001)
    assert r.finish_s[0] > 0.020                      # it recomputed after the preemption
    m = metrics.cell_metrics(r)
    ttft = r.first_token_s - r.arrival_s
    assert m["mean_ttft_s"] == pytest.approx(ttft.mean())
    assert m["mean_latency_s"] == pytest.approx((r.finish_s - r.arrival_s).mean())
    # the span is the start of the last executed step: the one that produced the last token
    assert r.duration_s == pytest.approx(np.nanmax(r.finish_s) - 0.001)
    assert m["request_throughput"] == pytest.approx(2 / r.duration_s)


def test_the_same_run_through_the_transformers_converter():
    """The transformers backend's converter, fed the records that engine keeps for the same run
    (an evicted request is re-queued as a second state), gives the simulator's times."""
    pytest.importorskip("transformers")
    from portbench.realengine import transformers_backend as tb

    ref = sim.simulate(WINDOW, PreemptFirstOnce(), MODELS[1])
    t0 = 100.0
    a, f, e = ref.admit_s + t0, ref.first_token_s + t0, ref.finish_s + t0
    # request 0: first state admitted at a[0] with its first token at f[0]; the second state (after
    # eviction) admitted later; the final output carries the last state's lifespan and tokens.
    states = {
        "req_0": [SimpleNamespace(lifespan=(a[0], -1), _timestamps=[f[0], f[0] + 0.001]),
                  SimpleNamespace(lifespan=(a[0] + 0.007, -1), _timestamps=[e[0] - 0.005, e[0]])],
        "req_1": [SimpleNamespace(lifespan=(a[1], -1), _timestamps=[f[1], e[1]])],
    }
    finished = tb.RequestStatus.FINISHED
    outputs = {f"req_{i}": SimpleNamespace(generated_tokens=[0] * int(WINDOW.output_tokens[i]), error=None,
                                           status=finished, lifespan=states[f"req_{i}"][-1].lifespan,
                                           timestamps=states[f"req_{i}"][-1]._timestamps)
               for i in range(2)}
    step_starts = [t0 + x for x in np.arange(0, ref.duration_s + 1e-9, 0.001)]
    step_log = [(t, 0, 1, 0, 1, True) for t in step_starts]
    got = tb.result_from_engine(WINDOW, "fifo", ["req_0", "req_1"], outputs, states, step_log, t0,
                                len(step_log), 1)
    for field in ("admit_s", "first_token_s", "finish_s"):
        np.testing.assert_allclose(getattr(got, field), getattr(ref, field), atol=1e-9, err_msg=field)
    assert got.duration_s == pytest.approx(ref.duration_s)
    a_m, b_m = metrics.cell_metrics(got), metrics.cell_metrics(ref)
    for k in metrics.METRICS:
        assert a_m[k] == pytest.approx(b_m[k], nan_ok=True), k


def test_run_span_is_the_last_step_start():
    assert metrics.run_span_s([0.0, 0.4, 0.2]) == 0.4
    assert metrics.run_span_s([]) == 0.0


def test_percentile_is_numpys_bit_for_bit():
    # The cells' p95 latency and TTFT use metrics.percentile; it must equal np.percentile exactly
    # (ties, tiny and large scales, the ends, NaN and infinities included).
    rng = np.random.default_rng(7)
    for trial in range(4000):
        n = int(rng.integers(1, 300))
        kind = trial % 5
        if kind == 0:
            x = rng.random(n)
        elif kind == 1:
            x = rng.exponential(3, n) * 10 ** rng.uniform(-4, 3)
        elif kind == 2:
            x = rng.integers(0, 5, n) * 0.001
        elif kind == 3:
            x = np.round(rng.normal(0, 1, n), 3)
        else:
            x = rng.random(n)
            x[rng.integers(0, n)] = (np.nan, np.inf, -np.inf)[trial % 3]
        for q in (95, 50, 0, 100, float(rng.uniform(0, 100))):
            with np.errstate(invalid="ignore"):
                want = float(np.percentile(x, q))
                got = metrics.percentile(x, q)
            assert (got == want or (np.isnan(got) and np.isnan(want))) and \
                np.signbit(got) == np.signbit(want), (n, q, got, want)

"""``scorpio_style_slo_guard``: the study's SCORPIO-inspired guard (credit bucket, deadline filter)."""

import numpy as np

from ..engine.api import NEVER, Decision, Policy
from . import register
from ._common import ALPHA, BETA, ESTIMATE_UNIT_S, admit_in_order, estimate_s


@register
class ScorpioStyleSloGuard(Policy):
    """SLO guard with a composite score and a per-step admission credit bucket.

    Per scheduled step (nothing at all, not even a refill, when the queue is empty):

    1. refill the bucket: ``b = min(admission_budget_max, b + admission_budget_refill)``;
    2. pressures before admissions: ``kv_p = kv / max_kv``, ``dec_p = running / max_active``,
       ``queue_p = waiting / max_active``;
    3. candidates: drop a request with ``lax < -laxity_threshold`` or ``ttft_slack <
       -ttft_slack_threshold`` where ``lax = (d - now) - (alpha*P + beta*O)*unit`` and
       ``ttft_slack = (d - now) - alpha*P*unit``. Laxity only falls, so a request whose laxity has
       gone negative is never admitted again (it ends the run waiting, i.e. dropped);
    4. guard = ``kv_p >= kv_utilization_threshold or dec_p >= decode_pressure_threshold or queue_p >=
       queue_overload_factor or mean(lax of candidates) < 0``;
    5. under guard with ``kv_p >= kv_utilization_threshold`` keep only candidates with
       ``O <= long_decode_token_threshold`` or ``lax < 0.5``;
    6. key ``(-score, lax, -priority, arrival, id)``, ``score = 1/max(lax, 1e-9) + priority_weight *
       priority + age_bonus * (now - arrival) - pen``, ``pen = decode_penalty_weight * beta*O * dec_p``
       under guard, else 0;
    7. walk with the hard limits; under guard at most ``max(1, int(b))`` admissions, each costing
       ``admission_cost`` credit (floored at 0).

    The bucket persists across steps (``reset`` refills it). The study calls the policy at every
    step, so the bucket refills at every step in which requests wait; to keep that without replaying
    skipped steps, the policy asks for the next step while requests wait and the bucket is below its
    cap (at most ``ceil(max / refill)`` steps), and lets the engine skip only once it is full, when
    further refills change nothing.

    Timers (the decision's): the next step when the admission cap stopped the walk or the bucket is
    still filling; otherwise the time at which a request held back only by the long-decode filter
    gets ``lax < 0.5``.
    Every other change with time (expiry, guard switching on, score drift) can only remove
    admissions when nothing arrives or completes.

    Parameters are the study's defaults: estimate_unit_s (``unit``) 0.001 s (its 1 ms step), alpha 0.5, beta 1.0, laxity_threshold 0.0,
    ttft_slack_threshold 0.0, kv_utilization_threshold 0.65, decode_pressure_threshold 0.70,
    queue_overload_factor 3.0, admission_budget_refill 2.0, admission_budget_max 4.0,
    admission_cost 1.0, priority_weight 1.0, age_bonus 0.05, decode_penalty_weight 0.35,
    long_decode_token_threshold 256.
    """

    name = "scorpio_style_slo_guard"
    event_driven = True

    #: Laxity (s) below which a long-decode request passes the filter of step 5 (fixed in the study).
    LONG_DECODE_UNLOCK_LAXITY_S = 0.5

    def __init__(self, estimate_unit_s: float = ESTIMATE_UNIT_S, alpha: float = ALPHA, beta: float = BETA,
                 laxity_threshold: float = 0.0, ttft_slack_threshold: float = 0.0,
                 kv_utilization_threshold: float = 0.65, decode_pressure_threshold: float = 0.70,
                 queue_overload_factor: float = 3.0, admission_budget_refill: float = 2.0,
                 admission_budget_max: float = 4.0, admission_cost: float = 1.0,
                 priority_weight: float = 1.0, age_bonus: float = 0.05,
                 decode_penalty_weight: float = 0.35, long_decode_token_threshold: int = 256):
        self.estimate_unit_s = estimate_unit_s
        self.alpha = alpha
        self.beta = beta
        self.laxity_threshold = laxity_threshold
        self.ttft_slack_threshold = ttft_slack_threshold
        self.kv_utilization_threshold = kv_utilization_threshold
        self.decode_pressure_threshold = decode_pressure_threshold
        self.queue_overload_factor = queue_overload_factor
        self.admission_budget_refill = admission_budget_refill
        self.admission_budget_max = admission_budget_max
        self.admission_cost = admission_cost
        self.priority_weight = priority_weight
        self.age_bonus = age_bonus
        self.decode_penalty_weight = decode_penalty_weight
        self.long_decode_token_threshold = long_decode_token_threshold
        self._init_state()

    def _init_state(self):
        self.budget = self.admission_budget_max

    def reset(self, view):
        self._init_state()
        self._arrays(view)

    def _refill(self):
        self.budget = min(self.admission_budget_max, self.budget + self.admission_budget_refill)

    def _filling(self) -> bool:
        """Whether the next step's refill would change the bucket (so that step must be asked)."""
        return min(self.admission_budget_max, self.budget + self.admission_budget_refill) != self.budget

    def _arrays(self, view):
        """Per-request constants in numpy (the same floating-point operations as the scalar
        formulas in the docstring, element by element)."""
        p = view.input_tokens.astype(np.float64)
        o = view.predicted_output_tokens.astype(np.float64)
        self._est = estimate_s(p, o, self.alpha, self.beta, self.estimate_unit_s)
        self._ttft_est = self.alpha * p * self.estimate_unit_s
        self._pen = self.decode_penalty_weight * (self.beta * o)
        self._long = view.predicted_output_tokens > self.long_decode_token_threshold

    def schedule(self, view):
        if not view.waiting:
            return Decision()
        self._refill()

        m = view.model
        now = view.now
        d, a, prio = view.deadline_s, view.arrival_s, view.priority
        kv_p = view.kv_used / max(m.max_kv_tokens, 1)
        dec_p = view.n_active / max(m.max_active_sequences, 1)
        queue_p = len(view.waiting) / max(m.max_active_sequences, 1)
        min_lax, min_ttft = -self.laxity_threshold, -self.ttft_slack_threshold

        w = np.fromiter(view.waiting, dtype=np.int64, count=len(view.waiting))
        slack = d[w] - now
        lax_all = slack - self._est[w]
        keep = ~((lax_all < min_lax) | (slack - self._ttft_est[w] < min_ttft))
        cand, lax = w[keep], lax_all[keep]
        if not len(cand):
            return Decision(wake_after_steps=1) if self._filling() else Decision()
        guard = (kv_p >= self.kv_utilization_threshold or dec_p >= self.decode_pressure_threshold
                 or queue_p >= self.queue_overload_factor
                 or sum(lax.tolist()) / len(lax) < 0.0)        # Python's left-to-right sum, as the study

        held = cand[:0]                           # held back only by the long-decode filter
        if guard and kv_p >= self.kv_utilization_threshold:
            back = self._long[cand] & ~(lax < self.LONG_DECODE_UNLOCK_LAXITY_S)
            held = cand[back]
            cand, lax = cand[~back], lax[~back]

        # key (-score, lax, -priority, arrival, id)
        pr, ar = prio[cand], a[cand]
        score = 1.0 / np.maximum(lax, 1e-9) + self.priority_weight * pr + self.age_bonus * (now - ar)
        if guard:
            score = score - self._pen[cand] * dec_p
        candidates = cand[np.lexsort((cand, ar, -pr, lax, -score))]
        limit = max(1, int(self.budget)) if guard else None
        admitted = admit_in_order(view, candidates, limit=limit) if len(candidates) else []
        if guard:
            for _ in admitted:
                self.budget = max(0.0, self.budget - self.admission_cost)
        if len(view.waiting) == len(admitted):
            return Decision(admit=admitted)
        if limit is not None and len(admitted) >= limit and len(admitted) < len(candidates):
            # the cap stopped the walk: more may fit next step
            return Decision(admit=admitted, wake_after_steps=1)
        if self._filling():
            return Decision(admit=admitted, wake_after_steps=1)
        return Decision(admit=admitted, wake_at_s=self._unlock_time(view, admitted, held))

    def _unlock_time(self, view, admitted, held):
        # Every candidate walked and left behind failed the hard limits against capacity that only
        # shrinks until an arrival or completion; what is left is the long-decode filter: the first
        # time one of those that fits gets lax < 0.5, at now = d - est - 0.5.
        if not len(held):
            return NEVER
        m = view.model
        active = view.n_active + len(admitted)
        kv = view.kv_used + sum(int(view.input_tokens[i]) for i in admitted)
        if active + 1 > m.max_sequences:
            return NEVER
        held = held[kv + view.input_tokens[held] <= m.max_kv_tokens]
        if not len(held):
            return NEVER
        return float(((view.deadline_s[held] - self._est[held]) - self.LONG_DECODE_UNLOCK_LAXITY_S).min())

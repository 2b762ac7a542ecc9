"""``slai_faithful``: SLAI (Bari et al. 2025), as the study ran it.

Each (shadow-)decoding request has a last-schedule time ``lst = (now + TBT) - Θ * step``, refreshed
whenever it is served; it is *critical* once ``now >= lst``. Each step, from a 512-token budget:
critical decodes first (1 token each), then in-flight prefill chunks (admission order), then
admissions shortest prompt first (closing at the first request that fails the prompt-only block
watermark, the sequence cap or finds no budget left; engine-limit misfits are skipped; on an engine
with chunked prefill off, at the first whose whole prompt does not fit the budget left, as vLLM
admits then and SLAI's vLLM port plans), and only
then non-critical decodes from the leftover, earliest ``lst`` first. Decoders not served are held
for the step. Θ is 5 steps below 96% real KV use and 10 at or above. No preemption. Prefill is a
shadow: prefilling and new requests are never held and decode from their admission step on.

While one prefill takes the whole budget and every decoder is held, the next steps repeat that
decision up to the prefill's last whole chunk or until the first held decoder turns critical: the
decision says so (``steady``, with those two timers) and the ``lssp`` engine skips those steps.
A step that holds every decoder while one admission takes the budget says, too, that should the
engine refuse that admission (the shadow books prompts only, the engine's KV blocks may be short),
the next steps would repeat it until an arrival or the first held decoder turns critical
(``repeat_if_refused``): ``vllm_v1`` skips those idle steps.
"""

from __future__ import annotations

import bisect
import dataclasses
import math

import numpy as np

from ..engine.api import Decision
from . import register
from ._paged import PagedPolicy
from ..engine.queue import WaitingOrder


@dataclasses.dataclass(frozen=True)
class SlaiRule:
    """SLAI's parameters and rule, written once: the simulator's policy below, the vLLM scheduler
    subclass and the transformers scheduler all use it.

    tbt_s: the time-between-tokens target (the study's single class, "stage0_uniform", is 0.5 s);
    theta_low / theta_high: Θ, in steps, below / at or above ``kv_threshold`` of the KV cache in use;
    decode_limit: most decodes per step; token_budget: tokens per step;
    step_s: the step length Θ counts — the study's 1 ms (a real engine's scheduler may measure its own).
    """

    tbt_s: float = 0.5
    theta_low: int = 5
    theta_high: int = 10
    kv_threshold: float = 0.96
    decode_limit: int = 128
    token_budget: int = 512
    step_s: float = 0.001

    def theta(self, kv_fraction: float) -> int:
        return self.theta_low if kv_fraction < self.kv_threshold else self.theta_high

    def last_schedule_time(self, now: float, kv_fraction: float, step_s: float | None = None) -> float:
        """LST of a decoder served at ``now``: it turns critical once the clock reaches it."""
        return (now + self.tbt_s) - self.theta(kv_fraction) * (self.step_s if step_s is None else step_s)

    @staticmethod
    def split(decoders: list, lst, now: float) -> tuple[list, list]:
        """Decoders (sorted by LST) into critical (``now >= LST``) and the rest; ``lst(r)`` is r's LST."""
        k = bisect.bisect_right(decoders, now, key=lst)
        return decoders[:k], decoders[k:]


#: The study's SLAI.
SLAI = SlaiRule()


@register
class SlaiFaithful(PagedPolicy):
    """SLAI on the simulator. ``rule_params`` override fields of :class:`SlaiRule`."""

    name = "slai_faithful"

    def __init__(self, max_num_seqs: int = 128, block_size: int = 16, watermark: float = 0.01,
                 **rule_params):
        super().__init__(max_num_seqs, block_size, watermark)
        try:
            self.rule = dataclasses.replace(SLAI, **rule_params)
        except TypeError:
            known = ", ".join(f.name for f in dataclasses.fields(SlaiRule))
            raise TypeError(f"slai_faithful: unknown parameter(s) {sorted(rule_params)}; "
                            f"SLAI's are {known}") from None

    def reset(self, view):
        super().reset(view)
        self._max_kv = view.model.max_kv_tokens
        self._lst: dict[int, float] = {}    # last-schedule time of decoders
        self._steady = None                 # see _repeat
        # the admission order, shortest prompt first then id, as one rank per request
        order = np.lexsort((np.arange(view.n_requests), view.input_tokens))
        rank = np.empty(view.n_requests, dtype=np.int64)
        rank[order] = np.arange(view.n_requests)
        self._prompt_rank_array = rank
        self._waiting = WaitingOrder()
        rule = self.rule
        # With a TBT this short a served decoder could turn critical on the next step: walk every step.
        self._never_skip = (rule.tbt_s - rule.theta_high * rule.step_s
                            < 3 * view.model.longest_quiet_step_s)

    def _forget(self, r):
        super()._forget(r)
        self._lst.pop(r, None)

    def _booked(self, view, r):
        return self._inp[r]                 # the block manager holds prompts only: no decode slots

    def _sync(self, view):
        # Steps skipped after a steady decision (see _steady_decision) served no decoder, and the
        # base class takes the prefill's chunks off; steps skipped after any other decision served
        # every decoder.
        skipped = (self._last_step is not None and view.step - self._last_step > 1
                   and self._skip_from is None)
        super()._sync(view)
        if skipped:
            # The policy let the engine skip these steps only when nothing prefilled, nothing was
            # admitted or held and no request left before the last of them: every decoder was served
            # (and its LST refreshed) at each, so its LST is the one of the step just before this
            # call, with Θ from the KV in use when that step started.
            value = self.rule.last_schedule_time(view.prev_step_start_s, view.prev_kv_used / self._max_kv)
            lst = self._lst
            for r, x in self._rem.items():
                if not x:
                    lst[r] = value

    def _repeat(self, view):
        """The decision of a step that repeats the last one, or None.

        The last call served no decoder and admitted nothing: one prefill took the whole budget and
        goes on, every decoder was held. The next step repeats it exactly when the running requests
        are the same (nothing admitted, nothing left), no held decoder has turned critical (their
        LSTs have not moved) and the prefill still has more than a budget left: the same chunk to
        it, no room to admit, the same holds.
        """
        running, prefill, hold, first_lst = self._steady
        if (view.step == self._last_step + 1 and first_lst > view.now
                and self._rem[prefill] > self.rule.token_budget and view.running == running):
            self._rem[prefill] -= self.rule.token_budget
            self._last_step = view.step
            return self._steady_decision(view)
        return None

    def _steady_decision(self, view, admit=None):
        """The decision of a step after which the next ones repeat it (see :meth:`_repeat`): they
        repeat while the prefill has a whole budget left (the one that finishes it included) and
        until the first held decoder turns critical, so the engine may skip them, holding the same
        decoders; the skipped chunks are taken off at the next call. ``admit``: this step's
        admissions (the prefill's own, when it was admitted now)."""
        _, prefill, hold, first_lst = self._steady
        if self._never_skip:
            return Decision(admit=admit or [], hold=hold, wake_after_steps=1)
        wake = self._let_skip(view, [], (prefill, self.rule.token_budget))
        # An admission here holds every running request (see _refused_repeats)
        return Decision(admit=admit or [], hold=hold, wake_after_steps=wake, wake_at_s=first_lst,
                        steady=True, repeat_if_refused=bool(admit))

    def _refused_repeats(self, view, admit, hold, first_lst):
        """The decision of a step that holds every running request (nothing prefills, no decoder is
        served) and proposes admissions: should the engine refuse the first, nothing runs and nothing
        changes but the clock, and the next calls would give this same answer until an arrival (a
        shorter prompt would go first) or until the first held decoder turns critical. The skipped
        steps then serve no decoder (the mark left by _let_skip tells the next _sync so)."""
        self._let_skip(view, [])
        return Decision(admit=admit, hold=hold, wake_at_s=first_lst, repeat_if_refused=True)

    def schedule(self, view):
        if self._steady is not None:
            d = self._repeat(view)
            if d is not None:
                return d
            self._steady = None
        self._sync(view)
        rem, lst = self._rem, self._lst
        now = view.now
        rule = self.rule
        budget, limit = rule.token_budget, rule.decode_limit
        fresh = rule.last_schedule_time(now, view.kv_used / self._max_kv)
        running = view.running
        if any(rem.values()):                       # (after _sync, rem's keys are the running ones)
            prefilling = [r for r in running if rem[r]]
            decoding = [r for r in running if not rem[r]]
        else:
            prefilling, decoding = [], list(running)
        if len(lst) != len(decoding):               # a decoder keeps its LST until it leaves
            for r in decoding:
                if r not in lst:
                    lst[r] = fresh
        decoding.sort()                             # by (LST, id): id first, then a stable sort
        decoding.sort(key=lst.__getitem__)
        critical, non_critical = rule.split(decoding, lst.__getitem__, now)
        served = critical[:limit]
        used = len(served)
        head_left = rem[prefilling[0]] if prefilling and not used else 0
        used = self._prefill(prefilling, budget, used)
        # admission, shortest prompt first (TBT is the same for every request): the waiting queue
        # kept in that fixed order across calls
        rank = self._prompt_rank_array
        waiting = self._waiting.get(view, rank)
        admit, used, closed = self._admit(view, waiting.ids, budget=budget, used=used,
                                          seqs=len(decoding) + len(prefilling),
                                          chunked=getattr(view.model, "enable_chunked_prefill", True),
                                          by_prompt=True)
        # non-critical decodes get only the leftover, one token each, earliest LST first
        extra = max(0, min(budget - used, limit - len(served), len(non_critical)))
        served += non_critical[:extra]
        lst.update(dict.fromkeys(served, fresh))
        hold = frozenset(critical[limit:] + non_critical[extra:])
        if head_left > budget and not admit:
            # the first prefill took the whole budget and goes on; nothing was served
            self._steady = (running, prefilling[0], hold, lst[decoding[0]] if decoding else math.inf)
            return self._steady_decision(view)
        if not served and not prefilling and admit and rem[admit[0]] >= budget:
            # Nothing was served and nothing prefilled: the one admission took the whole budget and
            # has at least as much left, so from the next step it is the prefill above.
            self._steady = (None, admit[0], hold, lst[decoding[0]] if decoding else math.inf)
            return self._steady_decision(view, admit)
        if admit and hold and not served and not prefilling and not self._never_skip:
            return self._refused_repeats(view, admit, hold, lst[decoding[0]])
        if (admit or hold or critical or closed == "budget" or self._never_skip or (prefilling and (
                any(rem[r] for r in prefilling) or len(running) > min(limit, budget)))):
            wake = 1
        else:
            # Every decoder was served and refreshed; nothing prefills any more (the prefills of this
            # step finished, and the next step can serve them with the others: all tracked requests
            # are decoders, nothing was admitted) and the queue closed for reasons fixed until an
            # event (block manager, seqs) or monotone (engine limits), so nothing changes before the
            # next arrival or completion. Θ moves only the LST values, which the next call
            # recomputes exactly as of the last skipped step.
            wake = math.inf
        return Decision(admit=admit, hold=hold, wake_after_steps=wake)

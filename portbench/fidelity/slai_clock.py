"""SLAI's measured clock: the step length the real SLAI scheduler counts Θ in, rebuilt from a run's
step log, and ``slai_faithful`` timed by it for the replay.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd




#: How the real SLAI scheduler (:mod:`portbench.realengine.vllm_slai_scheduler`, ``step_ema`` and
#: its busy-interval bound) measures the step length Θ counts: an exponential moving average, with
#: this weight, of the interval between consecutive scheduler calls that found running requests
#: and came less than :data:`SLAI_BUSY_INTERVAL_S` apart, started from the rule's ``step_s`` at
#: each replay. Written here because that module needs vLLM to import.
SLAI_STEP_EMA = 0.2
SLAI_BUSY_INTERVAL_S = 1.0
#: The spread :class:`MeasuredClockSlai` puts between equal LSTs, per place in admission order.
TIE_SPREAD_S = 1e-12


def slai_measured_step_s(run_steps_frame: pd.DataFrame, *, first_s: float | None = None,
                         ema: float = SLAI_STEP_EMA, busy_interval_s: float = SLAI_BUSY_INTERVAL_S) -> np.ndarray:
    """The step length the real SLAI scheduler counted Θ in at each of a run's steps, rebuilt from
    its step log: at step ``k`` (after its own update) the moving average of the intervals between
    step starts ``start_s[j] − start_s[j−1]``, ``j ≤ k``, of the steps that found running requests
    (``running_before`` > 0) and came under ``busy_interval_s`` apart; ``first_s`` (default: the
    study's :data:`~portbench.policies.slai_faithful.SLAI` ``step_s``) before any. The step start
    stands for the scheduler's own clock read, a few microseconds later in the same step."""
    from ..policies.slai_faithful import SLAI

    frame = run_steps_frame.sort_values("step")
    start = frame["start_s"].to_numpy(dtype=float)
    running = (frame["running_before"].to_numpy() if "running_before" in frame
               else np.r_[0, frame["running"].to_numpy()[:-1]])
    est = float(SLAI.step_s if first_s is None else first_s)
    out = np.empty(len(start))
    for k in range(len(start)):
        if k and running[k] > 0:
            dt = start[k] - start[k - 1]
            if dt < busy_interval_s:
                est += ema * (dt - est)
        out[k] = est
    return out


def _measured_clock_slai_class():
    from ..policies.slai_faithful import SlaiFaithful

    class MeasuredClockSlai(SlaiFaithful):
        """``slai_faithful`` whose Θ counts, at step ``k``, the step length the real scheduler had
        measured by then (``step_s_by_step[k]``, :func:`slai_measured_step_s`; the last value past
        the end) instead of the study's fixed 1 ms: the replayed-cost comparison's SLAI, timed like
        the real one. It walks every step (no skipping: the clock changes from step to step).

        It also breaks ties between decoders of equal LST the real scheduler's way: the real one
        sorts its running list (admission order) by LST with a stable sort, ``slai_faithful`` by
        (LST, request id). Decoders served in the same step share one LST, so under SLAI's
        shortest-prompt-first admission the two orders differ and the engines hold different
        decoders of the same count. After each call the LSTs the call set are spread by
        :data:`TIE_SPREAD_S` per place in the running list (admission order), so a later sort by
        LST keeps admission order among them (at most 128 × 1e-12 s apart: no step boundary moves).
        Everything else is ``slai_faithful``'s."""

        def __init__(self, step_s_by_step, **params):
            super().__init__(**params)
            self._clock = [float(x) for x in step_s_by_step]

        def reset(self, view):
            super().reset(view)
            self._never_skip = True

        def schedule(self, view):
            if self._clock:
                s = self._clock[min(view.step, len(self._clock) - 1)]
                if s != self.rule.step_s:
                    self.rule = dataclasses.replace(self.rule, step_s=s)
            before = dict(self._lst)
            d = super().schedule(view)
            lst = self._lst
            for place, r in enumerate(view.running):
                if r in lst and before.get(r) != lst[r]:
                    lst[r] += place * TIE_SPREAD_S
            return d

    return MeasuredClockSlai


def measured_clock_slai(step_s_by_step, **params):
    """A :class:`MeasuredClockSlai` (``slai_faithful`` with the real scheduler's measured step
    length per step; see :func:`slai_measured_step_s`)."""
    return _measured_clock_slai_class()(step_s_by_step, **params)

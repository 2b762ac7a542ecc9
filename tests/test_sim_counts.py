"""The ``lssp`` engine's per-request token counts against an independent tally.

The engine keeps a running request's count implicitly (a decode clock and a per-request base moved
by holds, completions from a heap); the step-by-step walk uses the same bookkeeping, so the
event-skipping tests cannot see a mistake in it. Here a policy that admits, holds, preempts and lets
the engine skip steps at random keeps its own count of every request's tokens from its decisions
alone, and checks the engine's (``view.decoded``, ``view.decoded_of``, ``view.kv_used``) at every
call, and the first-token and finish times at the end.
"""

import random
from types import SimpleNamespace

import numpy as np
import pytest

from portbench import sim
from portbench.sim import Decision, Policy
from portbench.workload import make_window


class RandomTally(Policy):
    name = "random_tally"
    event_driven = True

    def __init__(self, seed):
        self.rng = random.Random(seed)

    def reset(self, view):
        self.view = view
        self.count = {}                 # request -> tokens it holds now, by this policy's reckoning
        self.first, self.finish = {}, {}    # request -> step of its first / last token
        self.prev = None
        self.last_hold = frozenset()
        self.calls = 0

    def _account(self, view):
        step, ran, preempted = self.prev
        still_waiting = set(view.waiting)      # proposed but not admitted (refused, or never walked)
        out = self._out
        for i in preempted:
            self.count[i] = 0
        for i in ran:
            if i in still_waiting:
                continue
            c = self.count.get(i, 0)
            # a stretch ends with its first completion, so every one that ran did so at each step
            gained = min(view.step - step, out[i] - c)
            self.count[i] = c + gained
            self.first.setdefault(i, step)
            if self.count[i] == out[i]:
                self.finish[i] = step + gained - 1

    def schedule(self, view):
        if self.prev is None:
            self._out = self.true_output
        else:
            self._account(view)
        self.calls += 1
        running, waiting = list(view.running), list(view.waiting)
        rng = self.rng
        repeat = bool(self.last_hold) and self.last_hold <= set(running) and rng.random() < 0.6
        if not repeat and rng.random() < 0.5:
            # (read at some calls only: an engine may keep bookkeeping pending until it is read)
            assert view.decoded_of(running) == [self.count.get(i, 0) for i in running]
            decoded = view.decoded
            for i, c in self.count.items():
                assert decoded[i] == c, (i, view.step)
        assert view.kv_used == sum(int(view.input_tokens[i]) + self.count.get(i, 0) for i in running)
        if repeat:
            # the same hold again, the same object (as a policy repeating its decision returns it)
            preempt, rest, hold = [], running, self.last_hold
        else:
            preempt = [i for i in running if rng.random() < 0.05]
            rest = [i for i in running if i not in preempt]
            hold = frozenset(i for i in rest if rng.random() < 0.3)
        admit = [i for i in waiting if rng.random() < (0.5 if rng.random() < 0.5 else 0.0)]
        self.last_hold = hold
        quiet = not (preempt or hold or admit)
        wake = rng.choice([1, 2, 5, 50]) if quiet else 1
        self.prev = (view.step, [i for i in rest if i not in hold] + admit, preempt)
        return Decision(admit=admit, preempt=preempt, hold=hold, wake_after_steps=wake)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("event_skipping", [True, False])
def test_token_counts_follow_holds_preemptions_and_skips(seed, event_skipping):
    rng = np.random.default_rng(seed)
    n = 40
    outputs = rng.integers(1, 60, n)
    w = make_window("t", "test", np.sort(rng.uniform(0, 0.08, n)), rng.integers(1, 3000, n),
                    outputs, outputs)
    policy = RandomTally(seed)
    policy.true_output = w.output_tokens.tolist()
    r = sim.simulate(w, policy, sim.LsspModel(max_active_sequences=8, max_kv_tokens=12_000),
                     event_skipping=event_skipping)
    assert policy.calls > 20
    # the steps after the last call: the run ended at step n_steps
    policy._account(SimpleNamespace(step=r.n_steps, waiting=policy.view._engine.waiting))
    done = np.flatnonzero(r.completed)
    assert len(done) > 5
    for i in done:
        assert r.finish_s[i] == pytest.approx((policy.finish[i] + 1) * 0.001)
    for i, s in policy.first.items():
        assert r.first_token_s[i] == pytest.approx((s + 1) * 0.001)

"""A vLLM-v1-like engine model with a calibrated step-time cost model.

Same policies, same view, same results as the study's ``lssp`` model, but each step works the way
vLLM v1's scheduler does (see ``VLLM_V1_SEMANTICS`` in the project's spec):

- a per-step **token budget**; requests have *computed* and *target* tokens, and a step gives each
  scheduled request ``min(remaining, budget left)`` tokens — **chunked prefill**;
- **running requests first**, in admission order (a decode takes one token, an unfinished prefill the
  rest of its chunk), then the policy's admissions in its order while budget, sequence slots and KV
  blocks last; admission is **head-of-line** (the first that cannot get blocks stops it) and nothing
  is admitted in a step that preempted;
- a **block-granular KV cache** (16-token blocks); a running request that cannot get a block for its
  new tokens **preempts the most recently admitted** running request (recompute: its KV is dropped,
  its emitted tokens stay emitted, prompt + emitted tokens are prefilled again on resumption); a
  request that would have to preempt itself is skipped, and so is every later running request;
- the **first token** comes at the end of the step that completes the prompt; a request leaves at the
  end of the step that emits its last token;
- the **step time** is ``fixed + per_prefill_token · P + per_decode_seq · D + per_context_token · C``
  (P prefill tokens, D decoding sequences, C context tokens read by the scheduled requests).

Time is kept in integer picoseconds so that a run of steps can be summed in closed form exactly: in a
pure-decode stretch the context grows by D tokens a step, the step times form an arithmetic series,
and the engine jumps over every step in which nothing can change (no arrival, completion, block
exhaustion, prefill or policy timer), bit-identical to walking them one by one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from .sim import NOTHING, EngineView, Policy, RunResult

PS = 10 ** 12          # picoseconds per second


@dataclasses.dataclass(frozen=True)
class StepCost:
    """Step time = fixed + per prefill token + per decoding sequence + per context token read (s)."""

    fixed_s: float = 5.75e-3
    per_prefill_token_s: float = 17.3e-6
    per_decode_seq_s: float = 6.0e-6
    per_context_token_s: float = 0.0

    def picoseconds(self) -> tuple[int, int, int, int]:
        return tuple(int(round(x * PS)) for x in (self.fixed_s, self.per_prefill_token_s,
                                                   self.per_decode_seq_s, self.per_context_token_s))

    @classmethod
    def fit(cls, profile, *, step="step_s", prefill="prefill_tokens", decode="decode_seqs",
            context="kv_context_tokens"):
        """Non-negative least squares on a step profile (one row per measured step).

        Returns the cost model and the fit's relative error (median |pred − obs| ÷ obs).
        """
        from scipy.optimize import nnls

        x = np.column_stack([np.ones(len(profile)), profile[prefill], profile[decode],
                             profile[context] if context in profile else np.zeros(len(profile))])
        y = profile[step].to_numpy(dtype=float)
        coef, _ = nnls(x.astype(float), y)
        pred = x @ coef
        return cls(*map(float, coef)), float(np.median(np.abs(pred - y) / y))


@dataclasses.dataclass(frozen=True)
class VllmV1Model:
    """vLLM-v1-like engine model. Capacity defaults match the study's GPU (64 sequences, 131,072 KV
    tokens); the step cost defaults to a published vLLM fit (Llama-3.1-8B, H100) until replaced by a
    fit to our own engine profiles."""

    name: ClassVar[str] = "vllm_v1"
    max_num_batched_tokens: int = 2048
    max_active_sequences: int = 64
    max_kv_tokens: int = 131072
    block_size: int = 16
    cost: StepCost = StepCost()
    drain_steps: int = 50_000

    @property
    def max_batch_tokens(self) -> int:      # the name the policies' hard-limit check reads
        return self.max_num_batched_tokens

    @property
    def step_s(self) -> float:
        """A nominal step (the fixed cost): what fixed-step policy timers would assume."""
        return self.cost.fixed_s

    def make_engine(self, window, policy, priority=None):
        return _V1Engine(window, policy, self, priority)


class _V1Engine:
    def __init__(self, window, policy: Policy, model: VllmV1Model, priority=None):
        self.model, self.policy = model, policy
        self.n = n = len(window)
        self.arrival_s, self.deadline_s = window.arrival_s, window.deadline_s
        self.input_tokens, self.output_tokens = window.input_tokens, window.output_tokens
        self.predicted = window.predicted_output_tokens
        self.priority = np.ones(n) if priority is None else np.asarray(priority, dtype=np.float64)
        self.arrival_ps = [int(math.ceil(a * PS)) for a in window.arrival_s]
        self.inp = window.input_tokens.tolist()
        self.out = window.output_tokens.tolist()
        self.decoded = [0] * n          # tokens emitted
        self.computed = [0] * n         # tokens whose KV is in the cache
        self.target = list(self.inp)    # tokens to compute before the next token can be emitted
        self.blocks = [0] * n
        self.free_blocks = model.max_kv_tokens // model.block_size
        self.admit_ps = [-1] * n
        self.first_ps = [-1] * n
        self.finish_ps = [-1] * n
        self.waiting: list[int] = []
        self.running: list[int] = []
        self.step = 0
        self.t_ps = 0
        self.last_step_start_ps = 0
        self.n_preemptions = 0
        self._c = model.cost.picoseconds()

    # the view's interface
    def kv_used(self) -> int:
        return sum(self.computed[i] for i in self.running)

    @property
    def now(self) -> float:
        return self.t_ps / PS

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.model.block_size)

    def _preempt(self, i: int) -> None:
        self.running.remove(i)
        self.free_blocks += self.blocks[i]
        self.blocks[i] = 0
        self.computed[i] = 0
        self.target[i] = self.inp[i] + self.decoded[i]
        self.waiting.insert(0, i)
        self.n_preemptions += 1

    def run(self, event_skipping: bool = True) -> None:
        n, m = self.n, self.model
        order = sorted(range(n), key=lambda i: (self.arrival_ps[i], i))
        view = _V1View(self)
        self.policy.reset(view.refresh())
        if n == 0:
            return
        nxt = 0
        self.t_ps = self.arrival_ps[order[0]]
        drain_left = None
        fixed_step_timers = getattr(self.policy, "timers_assume_fixed_steps", False)
        while True:
            while nxt < n and self.arrival_ps[order[nxt]] <= self.t_ps:
                self.waiting.append(order[nxt])
                nxt += 1
            if nxt == n and drain_left is None:
                drain_left = m.drain_steps
            if not self.waiting and not self.running:
                if nxt == n:
                    break
                self.t_ps = self.arrival_ps[order[nxt]]       # idle: jump to the next arrival
                continue
            decision = self.policy.schedule(view.refresh())
            quiet = self._execute_step(decision)
            if drain_left is not None:
                drain_left -= 1
                if drain_left <= 0:
                    break
            if event_skipping and quiet and not fixed_step_timers:
                k = self._quiet_steps(view, order[nxt] if nxt < n else None, drain_left)
                if k > 0:
                    self._bulk_decode(k)
                    if drain_left is not None:
                        drain_left -= k

    def _execute_step(self, d) -> bool:
        """One engine step; True when it was a pure-decode step that changed nothing else."""
        m = self.model
        for i in d.preempt:                       # policy-directed preemption
            if i not in self.running:
                raise RuntimeError(f"policy {self.policy.name!r} preempted request {i}, which is not running")
            self._preempt(i)
        budget = m.max_num_batched_tokens
        scheduled: dict[int, int] = {}            # request -> new tokens this step
        preempted = bool(d.preempt)
        run_list = list(self.running)
        k = 0
        while k < len(run_list) and budget > 0:
            i = run_list[k]
            if i in d.hold:
                k += 1
                continue
            n_new = min(self.target[i] - self.computed[i], budget)
            need = self._blocks_for(self.computed[i] + n_new) - self.blocks[i]
            stuck = False
            while need > self.free_blocks:
                victim = run_list[-1]
                if victim == i:
                    stuck = True
                    break
                run_list.pop()
                budget += scheduled.pop(victim, 0)
                self._preempt(victim)
                preempted = True
            if stuck:
                break
            self.free_blocks -= need
            self.blocks[i] += need
            scheduled[i] = n_new
            budget -= n_new
            k += 1
        # An admission refused for blocks or budget may go through later without any event (the
        # policy's own list can change as KV grows), so such a step is never quiet; one refused only
        # for sequence slots stays refused until a completion.
        refused_for_room = False
        if not preempted:
            waiting = set(self.waiting)
            for i in d.admit:
                if i not in waiting:
                    continue
                if len(self.running) >= m.max_active_sequences:
                    break
                if budget <= 0:
                    refused_for_room = True
                    break
                n_new = min(self.target[i] - self.computed[i], budget)
                need = self._blocks_for(self.computed[i] + n_new) - self.blocks[i]
                if need > self.free_blocks:
                    refused_for_room = True
                    break                          # head-of-line: admission stops here
                self.free_blocks -= need
                self.blocks[i] += need
                self.waiting.remove(i)
                waiting.discard(i)
                self.running.append(i)
                if self.admit_ps[i] < 0:
                    self.admit_ps[i] = self.t_ps
                scheduled[i] = n_new
                budget -= n_new
        # step time from the batch
        c0, cp, cd, cc = self._c
        prefill = sum(v for i, v in scheduled.items() if self.target[i] - self.computed[i] > 1
                      or self.decoded[i] == 0)
        decodes = len(scheduled) - sum(1 for i in scheduled if self.target[i] - self.computed[i] > 1
                                       or self.decoded[i] == 0)
        context = sum(self.computed[i] for i in scheduled)
        self.last_step_start_ps = self.t_ps
        self.t_ps += c0 + cp * prefill + cd * decodes + cc * context
        self.step += 1
        done_any = False
        for i, v in scheduled.items():
            self.computed[i] += v
            if self.computed[i] == self.target[i]:          # a token is emitted
                self.decoded[i] += 1
                if self.first_ps[i] < 0:
                    self.first_ps[i] = self.t_ps
                if self.decoded[i] == self.out[i]:
                    self.finish_ps[i] = self.t_ps
                    self.running.remove(i)
                    self.free_blocks += self.blocks[i]
                    self.blocks[i] = 0
                    done_any = True
                else:
                    self.target[i] += 1
        # Quiet: a pure-decode step where every running request ran and nothing else happened, so the
        # next steps repeat it until an arrival, a completion, block exhaustion or a policy timer.
        admitted = any(i in scheduled for i in d.admit)
        pure_decode = prefill == 0 and all(self.target[i] - self.computed[i] == 1 for i in self.running)
        all_ran = len(scheduled) == len(self.running) + sum(1 for i in scheduled if self.finish_ps[i] >= 0)
        return (pure_decode and all_ran and not d.hold and not preempted and not done_any and not admitted
                and not refused_for_room)

    def _step_ps(self, j: int, D: int, C0: int) -> int:
        c0, _, cd, cc = self._c
        return c0 + cd * D + cc * (C0 + D * j)

    def _span_ps(self, k: int, D: int, C0: int) -> int:
        """Sum of the next ``k`` pure-decode step times (context grows by D a step)."""
        c0, _, cd, cc = self._c
        return k * (c0 + cd * D + cc * C0) + cc * D * (k * (k - 1) // 2)

    def _quiet_steps(self, view, next_arrival, drain_left) -> int:
        """How many next steps are pure decodes in which nothing else can happen."""
        run = self.running
        D = len(run)
        C0 = sum(self.computed[i] for i in run)
        # completions: a request emits its last token in its (out - decoded)-th next step
        k = min(self.out[i] - self.decoded[i] for i in run) - 1 if run else self.model.drain_steps
        # KV blocks: new blocks needed after j steps must stay within the free ones
        lo, hi = 0, k
        while lo < hi:
            mid = (lo + hi + 1) // 2
            need = sum(self._blocks_for(self.computed[i] + mid + 1) - self.blocks[i] for i in run)
            if need <= self.free_blocks:
                lo = mid
            else:
                hi = mid - 1
        k = lo
        # the next arrival: every skipped step must start before it
        if next_arrival is not None:
            limit = self.arrival_ps[next_arrival] - self.t_ps      # steps must start strictly before
            lo, hi = 0, k
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._span_ps(mid, D, C0) < limit:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        wake = self.policy.wake_step(view)
        if wake != math.inf:
            k = min(k, max(0, int(wake) - self.step))
        if drain_left is not None:
            k = min(k, drain_left - 1)
        return max(0, k)

    def _bulk_decode(self, k: int) -> None:
        run = self.running
        D = len(run)
        C0 = sum(self.computed[i] for i in run)
        for i in run:
            new_blocks = self._blocks_for(self.computed[i] + k + 0) - self.blocks[i]
            self.computed[i] += k
            self.decoded[i] += k
            self.target[i] += k
            # after k decode steps the cache holds computed tokens; the next step's token is allocated then
            self.blocks[i] += max(0, new_blocks)
            self.free_blocks -= max(0, new_blocks)
        self.last_step_start_ps = self.t_ps + self._span_ps(k - 1, D, C0)
        self.t_ps += self._span_ps(k, D, C0)
        self.step += k

    def result(self, window) -> RunResult:
        def stamp(ps):
            arr = np.array(ps, dtype=np.float64)
            out = arr / PS
            out[arr < 0] = np.nan
            return out

        return RunResult(window.window_id, self.policy.name, self.model.name, window.arrival_s,
                         window.deadline_s, window.input_tokens, window.output_tokens, self.priority,
                         admit_s=stamp(self.admit_ps), first_token_s=stamp(self.first_ps),
                         finish_s=stamp(self.finish_ps), duration_s=self.last_step_start_ps / PS,
                         n_steps=self.step, n_preemptions=self.n_preemptions)


class _V1View(EngineView):
    """The policies' view, with the engine's own clock (steps are not of fixed length here)."""

    def refresh(self):
        super().refresh()
        self.now = self._engine.now
        return self

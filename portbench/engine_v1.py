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

from .sim import Decision, EngineView, Policy, RunResult

PS = 10 ** 12          # picoseconds per second
_NO_DECISION = Decision()


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
        self.is_waiting = [False] * n
        self.running: list[int] = []
        self.step = 0
        self.t_ps = 0
        self.last_step_start_ps = 0
        self.n_preemptions = 0
        self._c = model.cost.picoseconds()
        self._kv = 0                    # Σ computed tokens over running requests
        self._wait_min = None           # smallest target over waiting requests (None: not known)
        self._admission_only = getattr(policy, "admission_only", False)

    # the view's interface
    def kv_used(self) -> int:
        return self._kv

    @property
    def now(self) -> float:
        return self.t_ps / PS

    def _enqueue(self, i: int, front: bool = False) -> None:
        if front:
            self.waiting.insert(0, i)
        else:
            self.waiting.append(i)
        self.is_waiting[i] = True
        if self._wait_min is not None and self.target[i] < self._wait_min:
            self._wait_min = self.target[i]

    def _preempt(self, i: int) -> None:
        self.running.remove(i)
        self._kv -= self.computed[i]
        self.free_blocks += self.blocks[i]
        self.blocks[i] = 0
        self.computed[i] = 0
        self.target[i] = self.inp[i] + self.decoded[i]
        self._enqueue(i, front=True)
        self.n_preemptions += 1

    def _first_chunk_blocks(self, tokens: int, budget: int) -> int:
        """KV blocks a waiting request (nothing computed) needs to be admitted with ``budget`` tokens."""
        return -(-min(tokens, budget) // self.model.block_size)

    def _admission_impossible(self, budget: int, free_blocks: int) -> bool:
        """No waiting request can be admitted: no slot, no budget, or too few blocks for any of them."""
        if not self.waiting or budget <= 0 or len(self.running) >= self.model.max_active_sequences:
            return True
        if self._wait_min is None:
            self._wait_min = min(self.target[i] for i in self.waiting)
        return self._first_chunk_blocks(self._wait_min, budget) > free_blocks

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
        # An admission-only policy is asked only when some waiting request could be admitted.
        lazy = event_skipping and self._admission_only
        while True:
            while nxt < n and self.arrival_ps[order[nxt]] <= self.t_ps:
                self._enqueue(order[nxt])
                nxt += 1
            if nxt == n and drain_left is None:
                drain_left = m.drain_steps
            if not self.waiting and not self.running:
                if nxt == n:
                    break
                self.t_ps = self.arrival_ps[order[nxt]]       # idle: jump to the next arrival
                continue
            view.refresh()
            quiet, blocked = self._execute_step(None if lazy else self.policy.schedule(view), view)
            if drain_left is not None:
                drain_left -= 1
                if drain_left <= 0:
                    break
            if event_skipping and quiet and not fixed_step_timers:
                k = self._quiet_steps(view, order, nxt, drain_left, blocked)
                if k > 0:
                    self._bulk_decode(k)
                    if drain_left is not None:
                        drain_left -= k

    def _execute_step(self, d, view) -> tuple[bool, bool]:
        """One engine step. ``d`` is the policy's decision, or None to ask the (admission-only) policy
        only if an admission is possible. Returns (quiet, blocked): quiet when it was a pure-decode
        step that changed nothing else, blocked when moreover no waiting request can be admitted
        until something other than decoding happens."""
        m = self.model
        bs = m.block_size
        running, computed, target, blocks, decoded = (self.running, self.computed, self.target,
                                                      self.blocks, self.decoded)
        hold = d.hold if d is not None else ()
        preempted = False
        if d is not None and d.preempt:           # policy-directed preemption
            for i in d.preempt:
                if i not in running:
                    raise RuntimeError(f"policy {self.policy.name!r} preempted request {i}, which is not running")
                self._preempt(i)
            preempted = True
        budget = m.max_num_batched_tokens
        sched: list[int] = []                     # requests scheduled this step ...
        sched_new: list[int] = []                 # ... and their new tokens
        prefill = decodes = context = 0
        run_list = list(running)
        k = 0
        while k < len(run_list) and budget > 0:
            i = run_list[k]
            if i in hold:
                k += 1
                continue
            c = computed[i]
            left = target[i] - c
            n_new = left if left < budget else budget
            need = -(-(c + n_new) // bs) - blocks[i]
            stuck = False
            while need > self.free_blocks:        # preempt the newest running request
                victim = run_list[-1]
                if victim == i:
                    stuck = True
                    break
                run_list.pop()
                self._preempt(victim)
                preempted = True
            if stuck:
                break
            self.free_blocks -= need
            blocks[i] += need
            sched.append(i)
            sched_new.append(n_new)
            if left > 1 or decoded[i] == 0:
                prefill += n_new
            else:
                decodes += 1
            context += c
            budget -= n_new
            k += 1
        all_ran = k == len(run_list)
        # An admission refused for blocks or budget may go through later without any event (the
        # policy's own list can change as KV grows), so such a step is never quiet, unless no waiting
        # request at all could be admitted; one refused only for sequence slots stays refused until
        # a completion.
        refused_for_room = admitted = False
        if not preempted:
            if d is None:
                d = _NO_DECISION if self._admission_impossible(budget, self.free_blocks) else \
                    self.policy.schedule(view)
            for i in d.admit:
                if not self.is_waiting[i]:
                    continue
                if len(running) >= m.max_active_sequences:
                    break
                if budget <= 0:
                    refused_for_room = True
                    break
                c = computed[i]
                left = target[i] - c
                n_new = left if left < budget else budget
                need = -(-(c + n_new) // bs) - blocks[i]
                if need > self.free_blocks:
                    refused_for_room = True
                    break                          # head-of-line: admission stops here
                self.free_blocks -= need
                blocks[i] += need
                self.waiting.remove(i)
                self.is_waiting[i] = False
                if target[i] == self._wait_min:
                    self._wait_min = None
                running.append(i)
                if self.admit_ps[i] < 0:
                    self.admit_ps[i] = self.t_ps
                sched.append(i)
                sched_new.append(n_new)
                if left > 1 or decoded[i] == 0:
                    prefill += n_new
                else:
                    decodes += 1
                context += c
                budget -= n_new
                admitted = True
        # step time from the batch
        c0, cp, cd, cc = self._c
        self.last_step_start_ps = self.t_ps
        self.t_ps += c0 + cp * prefill + cd * decodes + cc * context
        self.step += 1
        t = self.t_ps
        out, first_ps, finish_ps = self.out, self.first_ps, self.finish_ps
        done_any = False
        for i, v in zip(sched, sched_new):
            c = computed[i] + v
            computed[i] = c
            self._kv += v
            if c == target[i]:                     # a token is emitted
                decoded[i] += 1
                if first_ps[i] < 0:
                    first_ps[i] = t
                if decoded[i] == out[i]:
                    finish_ps[i] = t
                    running.remove(i)
                    self._kv -= c
                    self.free_blocks += blocks[i]
                    blocks[i] = 0
                    done_any = True
                else:
                    target[i] = c + 1
        # Blocked: with an admission-only policy, after any step in which every running request is
        # left decoding and no waiting one can be admitted, the next steps are pure decodes until a
        # completion, block exhaustion or an arrival that could be admitted.
        budget_next = m.max_num_batched_tokens - len(running)
        if (self._admission_only and budget_next >= 0 and (running or self.waiting)
                and self._admission_impossible(budget_next, self.free_blocks)
                and all(target[i] - computed[i] == 1 and decoded[i] for i in running)):
            return True, True
        # Quiet: a pure-decode step where every running request ran and nothing else happened, so the
        # next steps repeat it until an arrival, a completion, block exhaustion or a policy timer.
        if prefill or admitted or preempted or done_any or hold or not all_ran:
            return False, False
        return not refused_for_room, False

    def _span_ps(self, k: int, D: int, C0: int) -> int:
        """Sum of the next ``k`` pure-decode step times (context grows by D a step)."""
        c0, _, cd, cc = self._c
        return k * (c0 + cd * D + cc * C0) + cc * D * (k * (k - 1) // 2)

    def _quiet_steps(self, view, order, nxt, drain_left, blocked) -> int:
        """How many next steps are pure decodes in which nothing else can happen (the last of them
        may complete requests: they leave at its end, as they would walking step by step).

        ``blocked``: no waiting request can be admitted during them (and the policy only admits), so
        neither the policy's timers nor arrivals that could not be admitted either end the stretch.
        """
        m = self.model
        bs = m.block_size
        run, computed, blocks = self.running, self.computed, self.blocks
        D = len(run)
        C0 = self._kv
        # completions: a request emits its last token in its (out - decoded)-th next step
        k = min(self.out[i] - self.decoded[i] for i in run) if run else m.drain_steps
        # KV blocks: the blocks the next j steps allocate must all be free now (no preemption)
        lo, hi = 0, k
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if sum(-(-(computed[i] + mid) // bs) - blocks[i] for i in run) <= self.free_blocks:
                lo = mid
            else:
                hi = mid - 1
        k = lo
        # the next arrival that matters: every step of the stretch must start before it
        stop = nxt
        if blocked and k > 0:
            budget = m.max_num_batched_tokens - D
            slot = D < m.max_active_sequences
            end_ps = self.t_ps + self._span_ps(k, D, C0)
            n = self.n
            # The last arrival always stops the stretch: it starts the drain count.
            while stop < n - 1 and self.arrival_ps[order[stop]] < end_ps and not (
                    slot and budget > 0
                    and self._first_chunk_blocks(self.inp[order[stop]], budget) <= self.free_blocks):
                stop += 1
        if stop < self.n and k > 0:
            # the j-th step of the stretch starts at span(j - 1); the largest k with span(k - 1) < limit
            limit = self.arrival_ps[order[stop]] - self.t_ps
            lo, hi = 0, k
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._span_ps(mid - 1, D, C0) < limit:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        if not blocked:
            wake = self.policy.wake_step(view)
            if wake != math.inf:
                k = min(k, max(0, int(wake) - self.step))
        if drain_left is not None:
            k = min(k, drain_left - 1)
        return max(0, k)

    def _bulk_decode(self, k: int) -> None:
        """Run ``k`` pure-decode steps at once; requests whose last token comes in the k-th leave."""
        run = self.running
        D = len(run)
        C0 = self._kv
        bs = self.model.block_size
        computed, blocks, decoded, out = self.computed, self.blocks, self.decoded, self.out
        self.last_step_start_ps = self.t_ps + self._span_ps(k - 1, D, C0)
        self.t_ps += self._span_ps(k, D, C0)
        self.step += k
        self._kv += k * D
        finished = []
        for i in run:
            # after k decode steps the cache holds the computed tokens
            new_blocks = -(-(computed[i] + k) // bs) - blocks[i]
            computed[i] += k
            decoded[i] += k
            self.target[i] += k
            if new_blocks > 0:
                blocks[i] += new_blocks
                self.free_blocks -= new_blocks
            if decoded[i] == out[i]:
                finished.append(i)
        for i in finished:
            self.finish_ps[i] = self.t_ps
            run.remove(i)
            self._kv -= computed[i]
            self.free_blocks += blocks[i]
            blocks[i] = 0

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

"""SLAI (``slai_faithful``) as a vLLM v1 scheduler subclass, plugged in with ``scheduler_cls``.

The simulator's policy (:mod:`portbench.policies.slai_faithful`) in one paragraph: every decoding
request has a *last-schedulable time* ``lst = (time it was last served + TBT) - Θ·step``; it is
*critical* once ``now >= lst``. Each step, from a 512-token budget: critical decodes first (one token
each, at most ``decode_limit``), then in-flight prefill chunks, then admissions **shortest prompt
first** (chunked), and only then the *non-critical* decodes, from whatever budget is left; decodes
that get nothing are *held* for the step (they keep their KV blocks). Θ is 5 below 96% KV use, 10 at or
above.

How it maps onto vLLM's :class:`vllm.v1.core.sched.scheduler.Scheduler` (read from vLLM 0.32.0's
source; the scheduler API is not public and changes between releases):

- **Shortest-prompt-first admission**: :meth:`add_request` sets ``request.priority`` to its prompt
  length before it enters the waiting queue, and the engine runs with ``scheduling_policy="priority"``,
  so vLLM's own waiting heap orders admissions by (prompt length, arrival, id).
- **Critical decodes first, then prefill chunks**: before each :meth:`schedule` the running list is
  reordered (critical decodes by LST, then partially prefilled requests in admission order, then the
  non-critical decodes that will be served, by LST); vLLM's running pass walks it in that order. The
  original admission order is restored afterwards, so nothing else in vLLM sees the reordering.
- **Holding non-critical decodes when the budget is short**: the hook estimates what the prefill
  chunks and the admissions (waiting queue in heap order, chunked, up to the sequence cap and the free
  KV blocks) would take from the budget, and keeps only as many non-critical decodes as fit in the
  rest; the others are taken out of ``self.running`` for that one :meth:`schedule` call and put back
  at their place afterwards (no preemption, no KV freed, no state lost).
- **LST** uses the real clock (``time.monotonic``; :meth:`SlaiScheduler.slai_use_clock` gives it
  another, e.g. ``vllm_native``'s virtual one); ``step`` in ``Θ·step`` is an exponential moving
  average of the measured interval between consecutive busy scheduler calls (the engine's real step
  time), started from the study's 1 ms; ``tbt_s`` (default 0.5 s, the study's single TBT tier) is in
  real seconds. A decode's LST is refreshed whenever vLLM actually scheduled it.

What could not be expressed (the gaps, also listed in :data:`GAPS`):

1. vLLM schedules the *running* pass before the *waiting* pass, so SLAI's "admissions before
   non-critical decodes" is an estimate made before the step: if vLLM admits less than estimated (e.g.
   KV blocks needed by decodes, encoder or connector limits), some decodes were held for nothing; if
   more, admissions can take budget that SLAI would have given to decodes.
2. vLLM still preempts (recompute) when a running request finds no free KV block; the simulator's SLAI
   never preempts. With the priority policy the victim is the running request with the largest
   (priority, arrival), i.e. the longest prompt. Size the KV cache so this does not happen and check
   ``n_preemptions``.
3. Admission is head-of-line in vLLM (a request that finds no KV blocks stops admission), as in the
   simulator's SLAI; but the block watermark of the simulator is not vLLM's (vLLM reserves blocks as
   chunks are scheduled, not the whole prompt up front).
4. TBT tiers: every request has the study's single tier; per-request TBT classes would need a field on
   vLLM's ``Request`` (``priority`` is already used for the prompt length).
5. Prefill is real here (the simulator's SLAI treats prefill as a free "shadow"), so a long prompt's
   chunks really do take the budget for several steps.
"""

from __future__ import annotations

import dataclasses
import math
import time

from vllm.v1.core.sched.scheduler import Scheduler

from ..policies.slai_faithful import SLAI, SlaiRule

QUALNAME = "portbench.realengine.vllm_slai_scheduler.SlaiScheduler"

GAPS = (
    "running pass precedes waiting pass in vLLM: admission budget for non-critical-decode holds is "
    "estimated before the step",
    "vLLM may still preempt (recompute) on KV exhaustion; SLAI never preempts",
    "KV admission check is vLLM's incremental block allocation, not the simulator's prompt watermark",
    "single TBT tier for every request (Request.priority carries the prompt length)",
    "prefill costs real time (the simulator's SLAI prefill is a free shadow)",
)


class SlaiScheduler(Scheduler):
    """vLLM v1 scheduler with SLAI's decode holds and shortest-prompt-first admission.

    Parameters live as attributes (set them with :meth:`slai_configure`; the engine builds the
    scheduler itself, so the constructor keeps vLLM's signature).
    """

    rule: SlaiRule = SLAI               # SLAI's parameters and rule, shared with the simulator
    step_ema: float = 0.2               # smoothing of the measured step length Θ counts (0: the rule's)
    clock = staticmethod(time.monotonic)  # now, in seconds
    _n_held: int = 0                    # decodes held out of ``running`` during vLLM's schedule()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.slai_reset()

    # -- configuration and counters -------------------------------------------------------------
    def slai_configure(self, **params) -> None:
        if "step_ema" in params:
            self.step_ema = params.pop("step_ema")
        known = {f.name for f in dataclasses.fields(SlaiRule)}
        for key in params:
            if key not in known:
                raise KeyError(f"unknown SLAI parameter {key!r}; known: {', '.join(sorted(known))}, step_ema")
        self.rule = dataclasses.replace(SLAI, **params)
        self.slai_reset()

    def slai_use_clock(self, clock) -> None:
        """Read ``clock()`` (seconds) as now, instead of the wall clock (``vllm_native`` steps this
        scheduler in virtual time)."""
        self.clock = clock
        self.slai_reset()

    def slai_reset(self) -> None:
        """Forget LSTs, the step estimate and the counters (between replays on one engine)."""
        self._lst: dict[str, float] = {}
        self._step_s = float(self.rule.step_s)       # the first estimate: the study's 1 ms
        self._last_call: float | None = None
        self.slai_stats = {"calls": 0, "critical_decodes": 0, "held_decodes": 0,
                           "steps_with_holds": 0, "reordered_steps": 0}

    def get_request_counts(self) -> tuple[int, int]:
        """vLLM's (running, waiting) counts, the decodes SLAI holds out of ``running`` for this step
        counted as running: vLLM lifts ``long_prefill_token_threshold`` only when a single request is
        in the engine, and a held decode is one."""
        running, waiting = super().get_request_counts()
        return running + self._n_held, waiting

    # -- admission order ------------------------------------------------------------------------
    def add_request(self, request) -> None:
        if request.request_id not in self.requests:
            # shortest prompt first: the priority vllm_settings states for slai_faithful
            # (priority="prompt"), which vllm_v1 reads for its preemption victim; set here too so
            # that the port keeps its order when plugged in with --scheduler-cls alone (a test
            # checks that the two agree)
            request.priority = int(request.num_prompt_tokens)
        super().add_request(request)

    # -- the step -------------------------------------------------------------------------------
    def _estimate_admission_tokens(self, budget_left: int, n_running: int) -> int:
        """Tokens vLLM's waiting pass would take this step, walking the queue in heap order. A request
        goes in when its first chunk's blocks are free, or, with vLLM's ``scheduler_reserve_full_isl``
        (0.32's default), those of its whole sequence (the blocks a prefix-cache hit would save are
        not counted); the KV manager's watermark is kept free once a request is scheduled."""
        used = 0
        seqs = n_running
        chunked = self.scheduler_config.enable_chunked_prefill
        full = getattr(self.scheduler_config, "scheduler_reserve_full_isl", False)
        kvm = self.kv_cache_manager
        try:
            free_blocks = kvm.block_pool.get_num_free_blocks()
        except AttributeError:                  # a different KV manager: skip the block check
            free_blocks = math.inf
        for req in self.waiting:
            if used >= budget_left or seqs >= self.max_num_running_reqs:
                break
            need = req.num_tokens - req.num_computed_tokens
            take = min(need, budget_left - used)
            if not chunked and need > budget_left - used:
                break
            blocks = -(-(req.num_computed_tokens + take) // self.block_size)
            gate = -(-min(req.num_tokens, self.max_model_len) // self.block_size) if full else blocks
            if seqs:
                gate += getattr(kvm, "watermark_blocks", 0)
            if max(gate, blocks) > free_blocks:
                break
            free_blocks -= blocks
            used += take
            seqs += 1
        return used

    def schedule(self, *args, **kwargs):
        now = self.clock()
        if self._last_call is not None and self.running:
            dt = now - self._last_call
            if dt < 1.0:                         # a busy engine: the interval is one real step
                self._step_s += self.step_ema * (dt - self._step_s)
        self._last_call = now
        self.slai_stats["calls"] += 1

        rule = self.rule
        fresh = rule.last_schedule_time(now, self.get_kv_cache_usage(), self._step_s)
        lst = self._lst
        for rid in [r for r in lst if r not in self.requests]:
            del lst[rid]                         # finished or aborted

        decoding, prefilling = [], []
        for req in self.running:
            # Decoding: the whole prompt computed and one token to go. A prompt's last chunk of
            # one token is still prefill (the simulator's SLAI serves it with the prefill chunks).
            done = req.num_computed_tokens
            (decoding if done >= req.num_prompt_tokens and req.num_tokens - done <= 1 else prefilling).append(req)
        for req in decoding:
            lst.setdefault(req.request_id, fresh)
        decoding.sort(key=lambda r: lst[r.request_id])
        critical, non_critical = rule.split(decoding, lambda r: lst[r.request_id], now)

        budget = self.max_num_scheduled_tokens
        served = critical[:rule.decode_limit]
        used = len(served)
        for req in prefilling:
            used += min(req.num_tokens - req.num_computed_tokens, max(budget - used, 0))
        used += self._estimate_admission_tokens(max(budget - used, 0), len(self.running))
        room = max(0, min(budget - used, rule.decode_limit - len(served)))
        served_nc = non_critical[:room]
        held = critical[rule.decode_limit:] + non_critical[room:]
        self.slai_stats["critical_decodes"] += len(critical)

        order = served + prefilling + served_nc
        original = self.running
        if held or order != original:
            self.slai_stats["reordered_steps"] += 1
            if held:
                self.slai_stats["held_decodes"] += len(held)
                self.slai_stats["steps_with_holds"] += 1
            held_ids = {id(r) for r in held}
            self.running = list(order)
            # Held requests still occupy a sequence slot: shrink the caps for this call. And they
            # are still in the engine: vLLM's request count (get_request_counts) keeps them.
            caps = (self.max_num_running_reqs, self.max_num_active_reqs)
            self.max_num_running_reqs -= len(held)
            self.max_num_active_reqs -= len(held)
            self._n_held = len(held)
            try:
                out = super().schedule(*args, **kwargs)
            finally:
                self.max_num_running_reqs, self.max_num_active_reqs = caps
                self._n_held = 0
                after = self.running
                after_ids = {id(r) for r in after}
                before_ids = {id(r) for r in original}
                self.running = ([r for r in original if id(r) in after_ids or id(r) in held_ids]
                                + [r for r in after if id(r) not in before_ids])
        else:
            out = super().schedule(*args, **kwargs)

        scheduled = out.num_scheduled_tokens
        for req in decoding:
            if req.request_id in scheduled:
                lst[req.request_id] = fresh
        return out

"""SLAI (``slai_faithful``) as a vLLM v1 scheduler subclass, plugged in with ``scheduler_cls``.

The simulator's policy (:mod:`portbench.policies.slai_faithful`) in one paragraph: every decoding
request has a *last-schedulable time* ``lst = (time it was last served + TBT) - Θ·step``; it is
*critical* once ``now >= lst``. Each step, from a 512-token budget: critical decodes first (one token
each, at most ``decode_limit``), then in-flight prefill chunks, then admissions **shortest prompt
first** (chunked), and only then the *non-critical* decodes, from whatever budget is left; decodes
that get nothing are *held* for the step (they keep their KV blocks). Θ is 5 below 96% KV use, 10 at or
above. Its admissions are booked on its own prompt-only block count and its prefill is a *shadow*
(each prefill takes what budget the step has left).

The port does not re-derive that rule: before each of vLLM's :meth:`schedule` calls it asks the
simulator's policy itself (:class:`~portbench.realengine.slai_plan.SlaiPlan`: ``slai_faithful``'s
code, on a view of vLLM's state: its running requests in vLLM's order, its waiting queue, the KV
tokens computed, the clock), so that the step planned is the one the policy plans under the
``vllm_v1`` engine model, shadow block count and shadow prefill included. vLLM then carries the
decision out as ``vllm_v1`` does (:class:`SlaiScheduler` says how; read from vLLM 0.32.0's source,
whose scheduler API is not public and changes between releases). What it cannot express is listed
in :data:`GAPS`.
"""

from __future__ import annotations

import dataclasses
import time

from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from ..policies.slai_faithful import SLAI, SlaiRule
from .slai_plan import SlaiPlan, plan_model

QUALNAME = "portbench.realengine.vllm_slai_scheduler.SlaiScheduler"

GAPS = (
    "the plan is slai_faithful's own (its prompt-only block count and shadow prefill): vLLM's KV "
    "blocks, full-sequence reservation and long-prefill cap decide what its admissions and prefills "
    "get, as in the vllm_v1 model",
    "vLLM may still preempt (recompute) on KV exhaustion; SLAI never preempts",
    "single TBT tier for every request (Request.priority carries the prompt length)",
    "prefill costs real time (the simulator's SLAI prefill is a free shadow)",
    "on the real engine LSTs read the wall clock and Θ counts the measured step",
)

#: The policy's own parameters besides its rule (``SlaiFaithful``'s block manager and sequence cap).
POLICY_PARAMS = ("max_num_seqs", "block_size", "watermark")


class SlaiScheduler(Scheduler):
    """vLLM v1 scheduler that carries out ``slai_faithful``'s own plan of each step: its holds and
    its shortest-prompt-first admissions (:class:`~portbench.realengine.slai_plan.SlaiPlan`).

    Parameters live as attributes (set them with :meth:`slai_configure`; the engine builds the
    scheduler itself, so the constructor keeps vLLM's signature). How it carries the plan out:

    - **Holds**: a held request stays in ``self.running`` (so it still counts for vLLM's sequence cap,
      its request count and its choice of preemption victim, as in ``vllm_v1``), and vLLM's running pass
      passes over it for this one call (its ``next_decode_eligible_step`` is set past the step, then
      restored). The other running requests are walked in vLLM's own order (admission order), each
      taking what vLLM gives it (its chunk, the long-prefill cap, KV blocks; preemption is vLLM's).
    - **Admissions**: vLLM's waiting pass walks the policy's proposals, in the policy's order (shortest
      prompt first, then arrival), and nothing else: for the call its waiting queue is a FCFS queue of
      them; the other waiting requests wait in the real queue, put back afterwards. vLLM stops at the
      first that does not fit (head-of-line: KV blocks, with ``scheduler_reserve_full_isl`` those of the
      whole prompt; the sequence cap; the budget), as ``vllm_v1`` stops.
    - **Priorities**: :meth:`add_request` sets ``request.priority`` to the prompt length (the priority
      :mod:`~portbench.realengine.vllm_settings` states for ``slai_faithful``), with
      ``scheduling_policy="priority"``: vLLM's waiting heap is then in the policy's order, and vLLM's
      preemption victim is the running request with the largest (prompt, arrival), ``vllm_v1``'s.
    - **LST** uses the real clock (``time.monotonic``; :meth:`SlaiScheduler.slai_use_clock` gives it
      another, e.g. ``vllm_native``'s virtual one); ``step`` in ``Θ·step`` is an exponential moving
      average of the measured interval between consecutive busy scheduler calls (the engine's real step
      time), started from the study's 1 ms (``step_ema=0``: the rule's fixed step, as in the simulator);
      ``tbt_s`` (default 0.5 s, the study's single TBT tier) is in real seconds.
    """

    rule: SlaiRule = SLAI               # SLAI's parameters and rule, shared with the simulator
    step_ema: float = 0.2               # smoothing of the measured step length Θ counts (0: the rule's)
    clock = staticmethod(time.monotonic)  # now, in seconds
    policy_params: dict = {}            # the policy's max_num_seqs (default: the engine's), block
                                        # size and watermark (see slai_configure)
    _stash = None                       # the real waiting queue, while vLLM walks the plan's proposals

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.slai_reset()

    # -- configuration and counters -------------------------------------------------------------
    def slai_configure(self, **params) -> None:
        """SLAI's rule parameters (:class:`SlaiRule`'s fields), ``step_ema``, and the policy's own
        ``max_num_seqs``, ``block_size``, ``watermark`` (its block manager's)."""
        if "step_ema" in params:
            self.step_ema = params.pop("step_ema")
        own = {k: params.pop(k) for k in POLICY_PARAMS if k in params}
        known = {f.name for f in dataclasses.fields(SlaiRule)}
        for key in params:
            if key not in known:
                raise KeyError(f"unknown SLAI parameter {key!r}; known: {', '.join(sorted(known))}, "
                               f"step_ema, {', '.join(POLICY_PARAMS)}")
        self.rule = dataclasses.replace(SLAI, **params)
        self.policy_params = own
        self.slai_reset()

    def slai_use_clock(self, clock) -> None:
        """Read ``clock()`` (seconds) as now, instead of the wall clock (``vllm_native`` steps this
        scheduler in virtual time)."""
        self.clock = clock
        self.slai_reset()

    def slai_reset(self) -> None:
        """A fresh plan (the policy reset), step estimate and counters (between replays on one engine)."""
        sc = self.scheduler_config
        model = plan_model(max_kv_tokens=(self.kv_cache_config.num_blocks - 1) * self.block_size,
                           max_active_sequences=sc.max_num_seqs,
                           max_num_batched_tokens=self.max_num_scheduled_tokens,
                           enable_chunked_prefill=sc.enable_chunked_prefill, block_size=self.block_size)
        params = {"max_num_seqs": sc.max_num_seqs, **self.policy_params}
        self._plan = SlaiPlan(model, self.rule, self._waiting_ids, self._decoded, **params)
        self._index: dict[str, int] = {}        # vLLM's request id -> the plan's request id
        self._request_of: list = []             # the plan's request id -> vLLM's request
        self._step_s = float(self.rule.step_s)  # the first estimate: the study's 1 ms
        self._last_call: float | None = None
        self.slai_stats = {"calls": 0, "held_decodes": 0, "steps_with_holds": 0,
                           "proposed_admissions": 0, "admitted": 0, "steps_with_refusals": 0}

    def get_request_counts(self) -> tuple[int, int]:
        """vLLM's (running, waiting) counts; while vLLM walks the plan's proposals, the requests
        waiting apart from them count as waiting too (vLLM lifts ``long_prefill_token_threshold``
        only when a single request is in the engine)."""
        running, waiting = super().get_request_counts()
        if self._stash is not None:
            waiting += len(self._stash) - len(self.waiting)
        return running, waiting

    # -- requests and the plan's ids ------------------------------------------------------------
    def add_request(self, request) -> None:
        new = request.request_id not in self.requests
        if new:
            # shortest prompt first: the priority vllm_settings states for slai_faithful
            # (priority="prompt"), which vllm_v1 reads for its preemption victim; set here too so
            # that the port keeps its order when plugged in with --scheduler-cls alone (a test
            # checks that the two agree)
            request.priority = int(request.num_prompt_tokens)
        super().add_request(request)
        if new and request.request_id in self.requests:
            self._id_of(request, waiting=True)

    def _id_of(self, request, waiting: bool = False) -> int:
        """The plan's id of ``request``, described to the plan when first seen (``waiting``: it is in
        the waiting queue)."""
        i = self._index.get(request.request_id)
        if i is None:
            i = self._plan.arrive(int(request.num_prompt_tokens), float(request.arrival_time), waiting)
            self._index[request.request_id] = i
            self._request_of.append(request)
        return i

    def _waiting_ids(self) -> list:
        """The waiting requests' plan ids, in vLLM's queue order."""
        return [self._index[r.request_id] for r in self.waiting]

    def _decoded(self, ids) -> list:
        """The tokens each of the plan's ``ids`` has produced (kept by vLLM across preemptions)."""
        request_of = self._request_of
        return [request_of[i].num_output_tokens for i in ids]

    def _sync_queue(self) -> None:
        """Tell the plan of waiting requests that left the queue other than by admission (aborted)
        or joined it unseen: only when the counts disagree (admissions and preemptions are told as
        they happen)."""
        plan = self._plan
        if len(self.waiting) != len(plan.in_queue):
            plan.resync({self._id_of(r) for r in self.waiting})

    # -- the step -------------------------------------------------------------------------------
    def _measure_step(self, now: float) -> None:
        """Θ's step: the moving average of the interval between busy calls (``step_ema`` > 0)."""
        if self.step_ema and self._last_call is not None and self.running:
            dt = now - self._last_call
            if dt < 1.0:                         # a busy engine: the interval is one real step
                self._step_s += self.step_ema * (dt - self._step_s)
                self._plan.use_step(self._step_s)
        self._last_call = now

    def schedule(self, *args, **kwargs):
        now = self.clock()
        self._measure_step(now)
        self._sync_queue()
        running = self.running
        ids = [self._id_of(r) for r in running]
        decision = self._plan.decide(now, ids, sum(r.num_computed_tokens for r in running))
        return self._carry_out(decision, args, kwargs)

    def _carry_out(self, decision, args, kwargs):
        """vLLM's :meth:`schedule` with ``decision``'s holds passed over and only its admissions
        walked, in its order (see the module's docstring)."""
        if decision.preempt:
            raise RuntimeError("slai_faithful preempted: its vLLM port carries out holds and admissions only")
        request_of = self._request_of
        held = [request_of[i] for i in decision.hold]
        admit = [r for r in (request_of[i] for i in decision.admit)
                 if r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)]
        # schedule() counts this call as step current_step + 1: eligible again at the next one
        saved = [(r, r.next_decode_eligible_step) for r in held]
        for r, eligible in saved:
            r.next_decode_eligible_step = max(eligible, self.current_step + 2)
        stash, queue = self.waiting, create_request_queue(SchedulingPolicy.FCFS)
        for r in admit:
            queue.add_request(r)
        self.waiting, self._stash = queue, stash
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            self.waiting, self._stash = stash, None
            for r, eligible in saved:
                r.next_decode_eligible_step = eligible
            taken = self._put_back(queue, admit)
        stats = self.slai_stats
        stats["calls"] += 1
        stats["held_decodes"] += len(held)
        stats["steps_with_holds"] += bool(held)
        stats["proposed_admissions"] += len(admit)
        stats["admitted"] += taken
        stats["steps_with_refusals"] += taken < len(admit)
        return out

    def _put_back(self, queue, admit: list) -> int:
        """After vLLM's call: the admitted proposals leave the real waiting queue, the requests vLLM
        preempted in the call (put in ``queue``) join it, and the plan is told. Returns the number
        admitted."""
        plan, index = self._plan, self._index
        left = {id(r) for r in queue}
        proposed = {id(r) for r in admit}
        taken = [r for r in admit if id(r) not in left]
        if taken:
            self.waiting.remove_requests(taken)
            for r in taken:
                plan.left_queue(index[r.request_id])
        back = [r for r in queue if id(r) not in proposed]
        for r in reversed(back):                 # (a FCFS queue keeps their order)
            self.waiting.prepend_request(r)
        for r in back:
            plan.joined_queue(self._id_of(r))
        return len(taken)

"""``guaranteed_no_evict``: TensorRT-LLM's default capacity rule, admission with the whole output reserved.

Design followed: TensorRT-LLM's capacity scheduler, ``CapacitySchedulerPolicy.GUARANTEED_NO_EVICT``
(``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp``; its Python port ``GuaranteedNoEvictPolicy``
and ``NoEvictScheduledBlocksManager`` in ``tensorrt_llm/_torch/pyexecutor/scheduler/``). A step
starts from the free KV blocks and first takes off, for every request already generating, the
blocks it still needs to *complete* (to its ``max_new_tokens``); then the pending requests, in queue
order, are admitted while one sequence slot is left and the blocks the request needs to complete
(prompt and whole output) are still available, each admission taking its blocks off; the first
request that does not fit stops the walk (``break``: head-of-line). Nothing running is ever evicted.

In portbench the output a request will need is its **predicted** output
(``view.predicted_output_tokens``; the engine knows no ``max_new_tokens``), so the policy reads
predictions and the prediction-error sweep applies. The room is ``max_kv_tokens`` less, for every
running request, ``prompt + predicted output`` (TensorRT-LLM's free blocks less the blocks to
completion are the cache less each running request's whole reservation, as long as no request
outgrows its reservation; here one can, when its output was under-predicted, and its reservation
stays ``prompt + predicted`` so that the decision changes only at an arrival or a completion). KV is
counted in the engine's blocks where it has them (``vllm_v1``: ``ceil(tokens / block_size)`` per
request) and in tokens under ``lssp``. The walk is the queue's order (arrival, preempted requests
in front), head-of-line under both engine models.

What is guaranteed: with exact predictions (``prederr0``) no running request ever needs KV beyond
the cache, so the ``vllm_v1`` engine never preempts and ``lssp``'s KV never passes its cap. With
prediction error a request may outgrow its reservation; the engine's own rule then applies
(``vllm_v1`` preempts the newest admission; ``lssp`` lets KV pass the cap).

**TensorRT-LLM's other rule, ``MAX_UTILIZATION``, is not a separate policy here.** It
(``MaxUtilizationPolicy``, same sources) walks the active requests in order, schedules each that can
get the blocks of its *next step*, and when one cannot, pauses the most recently started request
and tries again — admission on the next step's blocks and eviction of the newest on KV growth. Under
``vllm_v1`` with ``reserve_full_isl=False`` that is the engine's own behaviour with the queue in
arrival order, i.e. ``fifo`` (the engine admits a request that can get its first chunk's blocks and,
when a running request cannot grow, preempts the newest admission); with vLLM 0.32's default
(``reserve_full_isl=True``) the engine admits only a request whose whole prompt's blocks are free, a
stricter admission than MAX_UTILIZATION's. Under ``lssp`` it is not meaningful: that engine never evicts
and lets KV pass its cap, so a rule whose point is what to evict when the cache runs out has nothing
to act on; its admission half is again ``fifo``. Registering it would add a duplicate of ``fifo``.
"""

from __future__ import annotations

import numpy as np

from ..engine.api import Decision, Policy
from . import register


@register
class GuaranteedNoEvict(Policy):
    """Admit in queue order while prompt + predicted output fits the cache left after every running
    request's reservation; stop at the first that does not (TensorRT-LLM ``GUARANTEED_NO_EVICT``)."""

    name = "guaranteed_no_evict"
    admission_only = True           # only admits, from the view alone
    event_driven = True             # the room changes only when the running set does

    def reset(self, view):
        need = (view.input_tokens.astype(np.int64)
                + view.predicted_output_tokens.astype(np.int64))
        bs = getattr(view.model, "block_size", None)
        if bs:                       # the engine's blocks: whole blocks per request
            need = -(-need // int(bs)) * int(bs)
        self._need = need

    def schedule(self, view):
        m = view.model
        need = self._need
        room = m.max_kv_tokens - int(need[list(view.running)].sum()) if view.running else m.max_kv_tokens
        slots = m.max_sequences - view.n_active
        admit = []
        for i in view.waiting:
            if slots <= 0 or need[i] > room:
                break                # head-of-line, as TensorRT-LLM's walk
            admit.append(i)
            room -= int(need[i])
            slots -= 1
        return Decision(admit=admit)

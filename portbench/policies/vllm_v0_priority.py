"""``vllm_v0_priority``: vLLM v0's ``priority`` scheduling, with the SLO deadline as the priority.

This is not what vLLM v1 ships. vLLM v1's ``--scheduling-policy priority`` with priority = deadline is
``edf`` under the ``vllm_v1`` engine model (registered alias ``vllm_v1_priority``); this policy adds
v0's waiting-triggered eviction on top of that order. Stored tables made before the rename call it
``vllm_priority`` (an alias that resolves here).

Design followed (vllm-project/vllm): the v1 scheduler (``vllm/v1/core/sched/scheduler.py``) keeps
the waiting queue as a heap ordered by ``(priority, arrival_time)`` (lower value first) and, when it
must preempt, evicts ``max(running, key=(priority, arrival_time))`` — the lowest-priority, latest
request. Here ``priority = deadline_s``: an earlier SLO deadline is a higher priority (as the vLLM
real-engine backend already maps ``edf``).

How it maps onto portbench, where the engine owns KV and the admission rule:

- the waiting queue is proposed in ``(deadline, arrival, id)`` order; the engine model decides what
  happens to a request that does not fit (skipped under ``lssp``, head-of-line under ``vllm_v1``,
  as vLLM's ``break``);
- **priority preemption** (``evict``): when the highest-priority waiting requests do not fit the
  engine as it is (no sequence slot, or a prompt not in the KV room), each in turn evicts running
  requests of strictly lower priority, lowest first, if that makes it fit (and evicts nothing when
  even all of them would not); see :func:`portbench.engine.queue.admit_by_key`. vLLM v1 itself only
  preempts when a *running* request cannot grow its KV; the waiting-triggered rule is vLLM v0's
  ``Scheduler._schedule_priority_preemption`` (``vllm/core/scheduler.py``: the queue head evicts
  lower priorities until it can be scheduled), which v1 dropped. The engine's own growth preemption
  stays the engine's: ``vllm_v1`` evicts as vLLM v1's priority scheduling does, the running request
  of largest (priority, arrival) (here priority = the key's rank); ``lssp`` never evicts.

Priorities are static, so no timer: over a skipped stretch KV only grows, which can only turn a
fitting request or a feasible eviction into an unfeasible one.
"""

from ..engine.queue import KeyPolicy
from . import register


@register
class VllmV0Priority(KeyPolicy):
    """vLLM v0's ``priority`` policy with ``priority = deadline``; a waiting request evicts strictly
    lower priorities."""

    name = "vllm_v0_priority"
    evict = True

    def key(self, view, ids):
        return view.deadline_s[ids]

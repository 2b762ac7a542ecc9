"""``cache_aware_sjf``: shortest job first, where a job is the work its prefix cache does not skip.

Design followed: SGLang's ``--schedule-policy shortest-prefill-first`` measure of a request's work
(``python/sglang/srt/managers/schedule_policy.py``: ``SchedulePolicy._shortest_prefill_work``, the
prompt — and output after a retraction — less the tokens its radix-cache match holds), extended
with the study's predicted output so that it is shortest job first rather than shortest prefill
first: the waiting request with the least ``(prompt - cached_prefix) + predicted output`` tokens
goes first (``view.cached_prefix``: the whole 16-token KV blocks a hit would skip now).

For a request preempted after ``d`` tokens the terms telescope to what is left: its sequence
``prompt + d`` less the cached blocks must be computed again, and ``predicted - d`` tokens remain
to be produced, which sum to the same key (the output term is not clipped at zero when a request
outruns its prediction). Differences from SGLang's shortest-prefill-first: the output term (SGLang
ranks by prefill alone, at least one token); no in-batch deferral of requests that share an uncached
prefix (see :mod:`portbench.policies.lpm`: our engines share a prefix within the step); ties keep
the engine's queue order (arrival, preempted requests in front) where SGLang's go to the earlier
entry into its queue; no aging.

With no prefix cache (``cached_prefix`` all zero, the ``lssp`` engine) it is shortest job first on
``prompt + predicted output`` tokens. The policy reads predictions, so the prediction-error sweep
applies to it. The engine model decides what happens to a request that does not fit (skipped under
``lssp``, head-of-line under ``vllm_v1``). No preemption.
"""

from __future__ import annotations

from ..engine.queue import KeyPolicy
from . import register


@register
class CacheAwareSjf(KeyPolicy):
    """Fewest uncached prompt tokens plus predicted output tokens first."""

    name = "cache_aware_sjf"

    def key(self, view, ids):
        return view.input_tokens[ids] - view.cached_prefix(ids) + view.predicted_output_tokens[ids]

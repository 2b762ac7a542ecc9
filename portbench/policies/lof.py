"""``lof``: longest output first, SGLang's ``--schedule-policy lof``.

Design followed: SGLang's cache-agnostic ``LOF`` policy (``python/sglang/srt/managers/
schedule_policy.py``) sorts the waiting queue by the requested output length, longest first (its
``max_new_tokens``: the only output length an engine knows before decoding). Here the output length
is the study's *predicted* output (``view.predicted_output_tokens``), so the policy reads predictions
and the prediction-error sweep applies to it. Ties keep the queue's order (arrival, preempted
requests in front). The engine model decides what happens to a request that does not fit (skipped
under ``lssp``, head-of-line under ``vllm_v1``). No preemption, no state, no use of the clock.
"""

from ..engine.queue import KeyPolicy
from . import register


@register
class Lof(KeyPolicy):
    """Longest predicted output first."""

    name = "lof"

    def key(self, view, ids):
        return -view.predicted_output_tokens[ids]

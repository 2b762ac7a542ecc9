"""``lpm``: longest prefix match first, SGLang's ``--schedule-policy lpm`` (its default).

Design followed: SGLang's cache-aware ``LPM`` policy (``python/sglang/srt/managers/
schedule_policy.py``: ``SchedulePolicy.calc_priority``, ``_determine_active_policy``,
``_sort_by_longest_prefix``). Before each prefill pass SGLang matches every waiting request (its
prompt, and its output after a retraction) against the radix cache and sorts the queue by the
matched length, longest first, stably. With more than 128 requests waiting it skips the matching
and sorting and serves the queue as it stands (FCFS): which order is in force depends on the load.

Here the match is ``view.cached_prefix`` (the whole 16-token KV blocks a hit would skip now, at
most all tokens but one, as SGLang caps its match at the input less one token), and ties — and the
whole queue above 128 waiting — keep the engine's queue order (arrival, preempted requests in
front). Differences from SGLang:

- SGLang sorts its queue in place, so its ties and its FCFS fallback keep the order of its previous
  sort; this policy holds no state across steps, so they keep the engine's queue order instead.
- SGLang's radix cache matches single tokens (page size 1 by default); the engines here match
  whole 16-token blocks (SGLang with ``--page-size 16``).
- SGLang's in-batch prefix deprioritisation is left out: a request whose cache match is at most 32
  tokens but which shares at least 32 prompt tokens with a request ahead of it in the queue goes to
  the back, so that one batch does not prefill the same uncached prefix twice (SGLang adds a prefix
  to its tree only after its batch runs). Our engines compute each hit when the request is admitted
  and cache a full block as soon as it is scheduled (vLLM's rule), so a request admitted after
  another in the same step already hits their shared prefix: the duplicate prefill it defers does
  not occur. (It would also need the waiting requests' prompt contents, which the view does not
  carry.)

With no prefix cache (``cached_prefix`` all zero, the ``lssp`` engine) the policy is ``fifo``. The
engine model decides what happens to a request that does not fit (skipped under ``lssp``,
head-of-line under ``vllm_v1``). No preemption.
"""

from __future__ import annotations

import numpy as np

from ..engine.queue import KeyPolicy
from . import register


@register
class Lpm(KeyPolicy):
    """Longest cached prefix first; FCFS when more than ``FCFS_ABOVE`` requests wait."""

    name = "lpm"

    #: SGLang's switch to FCFS: above this many waiting requests the queue is not sorted.
    FCFS_ABOVE = 128

    def key(self, view, ids):
        if len(view.waiting) > self.FCFS_ABOVE:
            return np.zeros(len(ids), dtype=np.int64)
        return -view.cached_prefix(ids)

"""``srpt_oracle``: shortest remaining processing time on the TRUE output length — an ORACLE.

An upper bound, not a scheduler: no real engine knows a request's output length in advance. It is
the clairvoyant SRPT baseline FastServe compares against (``SRPT`` in LLMServe/FastServe
``fastserve/scheduler.py``: remaining = ``max_tokens`` minus tokens generated, the batch rebuilt
each iteration shortest-remaining first).

Remaining = true output − generated tokens (``view.decoded``: a recompute preemption under ``lssp``
resets it, so an evicted request's remaining is its whole output again; ``vllm_v1`` keeps the
emitted tokens). The waiting queue is walked in ``(remaining, arrival, id)`` order and admitted while
it fits (misfits skipped under ``lssp``, head-of-line under ``vllm_v1``); a request that does not fit
evicts running requests of strictly longer remaining, the longest first, when that makes it fit (the
walk of :func:`~portbench.engine.queue.admit_by_key`: evictions only for the top-ranked
requests that do not fit the engine as it is).

**The oracle's one privilege**: the view hides true output lengths; this policy declares
``needs_true_lengths = True`` and reads them once, in :meth:`reset`, from the engine behind the view
(``view._engine.output_tokens``). Nothing else reads past the view. Real-engine backends must refuse
any policy with ``needs_true_lengths``.

No timer: waiting requests' remaining is fixed between events and a running request's only falls
(it can only stop being evictable), and KV only grows over a skipped stretch.
"""

from __future__ import annotations

import numpy as np

from ..engine.api import Decision, Policy
from . import register
from ..engine.queue import WaitingOrder, admit_by_key, arrival_rank, ranked_key


@register
class SrptOracle(Policy):
    """Shortest true remaining output first, preemptive (an oracle bound; simulator only)."""

    name = "srpt_oracle"
    event_driven = True
    #: Reads the true output lengths (through the engine, in ``reset``): simulator only.
    needs_true_lengths = True

    def reset(self, view):
        self.true_output_tokens = np.array(view._engine.output_tokens, dtype=np.int64)
        self.true_output_tokens.setflags(write=False)
        self._tie = arrival_rank(view)
        self._waiting = WaitingOrder()      # a waiting request's remaining output is fixed

    def schedule(self, view):
        dec = view.decoded
        out, tie = self.true_output_tokens, self._tie
        # (remaining, running before waiting, arrival): equals never evict one another
        waiting = self._waiting.get(
            view, lambda w: ranked_key(np.maximum(out[w] - dec[w], 0), w, len(w), tie))
        admit, preempt = admit_by_key(
            view, waiting, lambda r: ranked_key(np.maximum(out[r] - dec[r], 0), r, 0, tie), decoded=dec)
        return Decision(admit=admit, preempt=preempt)

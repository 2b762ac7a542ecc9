"""``vllm_chunked_prefill_faithful``: vLLM v0.4.2 chunked prefill, as the study ran it.

One 512-token budget per step is shared by decodes (1 token each) and prefill chunks. The running
requests, decoding and (shadow-)prefilling mixed, are served oldest arrival first until the budget
is gone (then the rest get nothing *in the policy's accounting*); a decoder that finds no free block
preempts the newest unprocessed request of the mixed list. Admission walks the queue in order and
closes at the first request that fails the block watermark, finds no budget left or the sequence
cap; engine-limit misfits are skipped. An admitted request takes ``min(prompt, leftover)`` as its
first chunk. The prefill progress is a shadow: the engine decodes every admitted request from its
admission step on (the study's Phase-1 mode).
"""

from __future__ import annotations

from collections import deque

from ..engine.api import Decision
from . import register
from ._paged import PagedPolicy


@register
class VllmChunkedPrefillFaithful(PagedPolicy):
    name = "vllm_chunked_prefill_faithful"

    def __init__(self, max_num_batched_tokens: int = 512, max_num_seqs: int = 256,
                 block_size: int = 16, watermark: float = 0.01):
        super().__init__(max_num_seqs, block_size, watermark)
        self.max_num_batched_tokens = max_num_batched_tokens

    def schedule(self, view):
        self._sync(view)
        rem = self._rem
        budget = self.max_num_batched_tokens
        # 1. running pass over the mixed list, oldest arrival first
        ordered = self._arrival_sorted(rem)
        used = seqs = 0
        kept, preempted = [], []
        prefilled = False
        # When the free blocks cover every decoder the budget reaches, no decoder preempts anyone and
        # the walk is that prefix, taken at once; otherwise it is walked request by request.
        decoders, chunks = self._budget_prefix(ordered, budget)
        steady = None
        if self._bm.append_slots_if_room(decoders):
            for c, n in chunks:
                rem[c] -= n
                used += n
            used += len(decoders)
            seqs = len(decoders) + len(chunks)
            kept, prefilled = decoders, bool(chunks)
            pending = deque()
            if len(chunks) == 1 and used == budget and rem[chunks[0][0]] > 0:
                # one prefill took the whole budget the decoders before it left, and goes on
                steady = chunks[0]
        else:
            pending = deque(ordered)
        while pending:
            c = pending[0]
            left = budget - used
            rc = rem[c]
            n = (1 if left >= 1 else 0) if rc == 0 else min(rc, max(0, left))
            if n == 0:
                break
            pending.popleft()
            if rc == 0:
                if self._reserve(c, pending, preempted):
                    kept.append(c)
                    used += 1
                    seqs += 1
            else:
                rem[c] = rc - n
                used += n
                seqs += 1
                prefilled = True
        # 2. admission in queue order
        admit = self._admit(view, view.waiting, budget=budget, used=used, seqs=seqs, chunked=True,
                            skip=set(preempted)).admit
        if admit or preempted:
            wake = 1
        elif steady is not None:
            # The next steps repeat this one (the same prefix of the list served, the same chunk
            # to the prefill, no room to admit) while the prefill has a whole chunk left.
            wake = self._let_skip(view, kept, steady)
        elif prefilled or any(rem.values()):
            wake = 1
        else:
            # Skipped steps have no prefill in flight and no preemption: the same decoders are
            # scheduled at each of them, one slot each.
            wake = self._let_skip(view, kept)
        return Decision(admit=admit, preempt=preempted, wake_after_steps=wake)

    def _budget_prefix(self, ordered, budget: int) -> tuple[list, list]:
        """The running pass's walk over the mixed list without its block checks: the decoders it
        serves (one token each) and the prefill chunks ``(request, tokens)``, oldest first, until
        the budget is gone."""
        rem = self._rem
        used = 0
        decoders, chunks = [], []
        for c in ordered:
            rc = rem[c]
            if rc == 0:
                if budget - used < 1:
                    break
                decoders.append(c)
                used += 1
            else:
                n = min(rc, budget - used)
                if n <= 0:
                    break
                chunks.append((c, n))
                used += n
        return decoders, chunks

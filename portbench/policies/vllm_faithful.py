"""``vllm_faithful``: vLLM v0.1.0 FCFS with a paged-KV block manager, as the study ran it.

Each step: the running requests, oldest arrival first, each append one KV slot; a request that finds
no free block preempts the newest unprocessed one (recompute: its tokens are lost and it goes back to
the queue front), or itself when none is left. Then the queue is walked in order and admission
**closes** at the first request that fails the block watermark (``prompt + 1`` tokens), the token
budget (Σ admitted prompts + #running ≤ 2560) or the sequence cap; a request that fails only the
engine's hard limits is skipped. No prefill modelling: the whole prompt is charged at admission.
"""

from __future__ import annotations

from collections import deque

from ..sim import Decision
from . import register
from ._paged import PagedPolicy


@register
class VllmFaithful(PagedPolicy):
    name = "vllm_faithful"

    def __init__(self, max_num_batched_tokens: int = 2560, max_num_seqs: int = 256,
                 block_size: int = 16, watermark: float = 0.01):
        super().__init__(max_num_seqs, block_size, watermark)
        self.max_num_batched_tokens = max_num_batched_tokens

    def schedule(self, view):
        self._sync(view)
        # 1. running pass, oldest arrival first
        pending = deque(sorted(self._rem, key=self._key.__getitem__))
        kept, preempted = [], []
        while pending:
            c = pending.popleft()
            if self._reserve(c, pending, preempted):
                kept.append(c)
        # 2. admission in queue order, whole prompts plus the first slot; each kept request takes 1 token
        admit = self._admit(view, view.waiting, budget=self.max_num_batched_tokens, used=len(kept),
                            seqs=len(kept), chunked=False, extra_tokens=1, skip=set(preempted)).admit
        self._kept = kept
        if admit or preempted:
            self._wake = view.step + 1
        else:
            # Budget, seqs and the queue are fixed until an event and free blocks only fall, so
            # the only timer is the first step at which a kept request needs a block that is not there.
            # Skipped steps are therefore ones where every kept request appended one slot.
            self._wake = view.step + self._bm.steps_to_exhaustion(kept)
        return Decision(admit=admit, preempt=preempted)

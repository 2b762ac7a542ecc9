"""``vllm_faithful``: vLLM v0.1.0 FCFS with a paged-KV block manager, as the study ran it.

Each step: the running requests, oldest arrival first, each append one KV slot; a request that finds
no free block preempts the newest unprocessed one (recompute: its tokens are lost and it goes back to
the queue front), or itself when none is left. Then the queue is walked in order and admission
**closes** at the first request that fails the block watermark (``prompt + 1`` tokens), the token
budget (Σ admitted prompts + #running ≤ 2560) or the sequence cap; a request that fails only the
engine's hard limits is skipped. No prefill modelling: the whole prompt is charged at admission.

``oversize`` (an ablation of the head-of-line hypothesis; the study's rule is ``"block"``): what
happens to a prompt larger than the whole budget, which under ``"block"`` closes admission for good
once it reaches the head of the queue. ``"reject"``: such requests are never admitted and never
block (they count as not completed); ``"chunk"``: such a prompt is admitted alone, taking what is
left of the step's budget, as a chunked-prefill engine would.
"""

from __future__ import annotations

from ..engine.api import Decision
from . import register
from ._paged import PagedPolicy

OVERSIZE = ("block", "reject", "chunk")


@register
class VllmFaithful(PagedPolicy):
    name = "vllm_faithful"

    def __init__(self, max_num_batched_tokens: int = 2560, max_num_seqs: int = 256,
                 block_size: int = 16, watermark: float = 0.01, oversize: str = "block"):
        super().__init__(max_num_seqs, block_size, watermark)
        if oversize not in OVERSIZE:
            raise ValueError(f"oversize must be one of {OVERSIZE}, got {oversize!r}")
        self.max_num_batched_tokens = max_num_batched_tokens
        self.oversize = oversize

    def schedule(self, view):
        self._sync(view)
        # 1. running pass, oldest arrival first
        kept, preempted = self._running_pass(self._arrival_sorted(self._rem))
        # 2. admission in queue order, whole prompts plus the first slot; each kept request takes 1 token
        budget = self.max_num_batched_tokens
        queue = view.waiting
        if self.oversize == "reject":
            queue = [i for i in queue if self._inp[i] <= budget]
        admit = self._admit(view, queue, budget=budget, used=len(kept), seqs=len(kept), chunked=False,
                            extra_tokens=1, skip=set(preempted),
                            oversize_chunked=self.oversize == "chunk").admit
        if admit or preempted:
            wake = 1
        else:
            # Budget, seqs and the queue are fixed until an event and free blocks only fall, so
            # the only timer is the first step at which a kept request needs a block that is not there.
            # Skipped steps are therefore ones where every kept request appended one slot.
            wake = self._let_skip(view, kept)
        return Decision(admit=admit, preempt=preempted, wake_after_steps=wake)

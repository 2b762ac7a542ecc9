"""``sarathi_faithful``: Sarathi-Serve stall-free batching, as the study ran it.

Each step: every (shadow-)decoding request appends one KV slot first, oldest arrival first; one that
finds no free block preempts the newest unprocessed *decoder* (recompute). Then in-flight prefills,
oldest first, take chunks from what is left of a 512-token per-step budget, and admission walks the
queue in order, closing at the first request that fails the block watermark, the sequence cap or
finds no budget left; engine-limit misfits are skipped. The prefill progress is a shadow: the engine
decodes every admitted request from its admission step on (the study's Phase-1 mode).
"""

from __future__ import annotations

from ..engine.api import Decision
from . import register
from ._paged import PagedPolicy


@register
class SarathiFaithful(PagedPolicy):
    name = "sarathi_faithful"

    def __init__(self, chunk_size: int = 512, max_num_seqs: int = 128, block_size: int = 16,
                 watermark: float = 0.01):
        super().__init__(max_num_seqs, block_size, watermark)
        self.chunk_size = chunk_size

    def schedule(self, view):
        self._sync(view)
        rem = self._rem
        budget = self.chunk_size
        # 1a. decodes first, oldest arrival first; victims from the back of the decoders
        kept, preempted = self._running_pass(self._arrival_sorted([r for r, x in rem.items() if not x]))
        used = len(kept)
        # 1b. in-flight prefills take chunks from the leftover
        prefillers = self._arrival_sorted([r for r, x in rem.items() if x])
        head_chunk = budget - used                  # what the first of them may take
        head_left = rem[prefillers[0]] if prefillers else 0
        used = self._prefill(prefillers, budget, used)
        # 2. admission in queue order
        admit = self._admit(view, view.waiting, budget=budget, used=used,
                            seqs=len(kept) + len(prefillers), chunked=True, skip=set(preempted)).admit
        if admit or preempted:
            wake = 1
        elif 0 < head_chunk < head_left:
            # The first prefill took the whole budget left and goes on: the next steps repeat this
            # one (same decoders, the same chunk to it, no room to admit) while it lasts.
            wake = self._let_skip(view, kept, (prefillers[0], head_chunk))
        elif prefillers or any(rem.values()):
            wake = 1
        else:
            # Skipped steps have no prefill in flight and no preemption: every decoder appends
            # one slot per step.
            wake = self._let_skip(view, kept)
        return Decision(admit=admit, preempt=preempted, wake_after_steps=wake)

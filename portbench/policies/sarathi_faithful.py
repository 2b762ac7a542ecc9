"""``sarathi_faithful``: Sarathi-Serve stall-free batching, as the study ran it.

Each step: every (shadow-)decoding request appends one KV slot first, oldest arrival first; one that
finds no free block preempts the newest unprocessed *decoder* (recompute). Then in-flight prefills,
oldest first, take chunks from what is left of a 512-token per-step budget, and admission walks the
queue in order, closing at the first request that fails the block watermark, the sequence cap or
finds no budget left; engine-limit misfits are skipped. The prefill progress is a shadow: the engine
decodes every admitted request from its admission step on (the study's Phase-1 mode).
"""

from __future__ import annotations

import math
from collections import deque

from ..sim import Decision, Policy
from . import register
from ._blocks import BlockManager, reserve_slot
from ._common import fits


@register
class SarathiFaithful(Policy):
    name = "sarathi_faithful"

    def __init__(self, chunk_size: int = 512, max_num_seqs: int = 128, block_size: int = 16,
                 watermark: float = 0.01):
        self.chunk_size = chunk_size
        self.max_num_seqs = max_num_seqs
        self.block_size = block_size
        self.watermark = watermark

    def reset(self, view):
        self._bm = BlockManager(view.model.max_kv_tokens, self.block_size, self.watermark)
        self._max_seqs = min(self.max_num_seqs, view.model.max_active_sequences)
        self._inp = [int(x) for x in view.input_tokens]
        self._key = [(float(a), i) for i, a in enumerate(view.arrival_s)]
        self._rem: dict[int, int] = {}      # shadow prefill left, per tracked request
        self._last_step = None
        self._kept: list[int] = []          # decoders that appended a slot at the last call
        self._wake = math.inf

    def _sync(self, view) -> None:
        bm, rem = self._bm, self._rem
        running = set(view.running)
        for r in [r for r in rem if r not in running]:
            bm.free(r)
            del rem[r]
        skipped = 0 if self._last_step is None else view.step - self._last_step - 1
        if skipped > 0:
            # Skipped steps had no prefill in flight and no preemption: every decoder appended
            # one slot per step.
            for r in self._kept:
                if r in rem:
                    bm.append_slot(r, skipped)
        for r in view.running:                # adopt (defensive; never fires in normal runs)
            if r not in rem:
                bm.allocate(r, self._inp[r] + int(view.decoded[r]))
                rem[r] = 0
        self._last_step = view.step

    def schedule(self, view):
        self._sync(view)
        bm, rem = self._bm, self._rem
        budget = self.chunk_size
        key = self._key.__getitem__
        # 1a. decodes first, oldest arrival first; victims from the back of the decoders
        pending = deque(sorted((r for r in rem if rem[r] == 0), key=key))
        kept, preempted = [], []
        while pending:
            c = pending.popleft()
            if reserve_slot(bm, c, pending, preempted, rem.__delitem__):
                kept.append(c)
        used = len(kept)
        # 1b. in-flight prefills take chunks from the leftover
        prefillers = sorted((r for r in rem if rem[r] > 0), key=key)
        for r in prefillers:
            chunk = min(rem[r], budget - used)
            if chunk <= 0:
                continue
            rem[r] -= chunk
            used += chunk
        # 2. admission in queue order
        seqs = len(kept) + len(prefillers)
        active, kv = view.n_active, view.kv_used
        gone = set(preempted)
        admit = []
        for i in view.waiting:
            if i in gone:
                continue
            p = self._inp[i]
            if not bm.can_allocate(p):
                break
            if seqs + 1 > self._max_seqs:
                break
            chunk = min(p, budget - used)
            if chunk <= 0:
                break
            if not fits(view, active, kv, p):
                continue
            bm.allocate(i, p)
            rem[i] = p - chunk
            used += chunk
            seqs += 1
            admit.append(i)
            active += 1
            kv += p
        self._kept = kept
        if admit or preempted or prefillers or any(rem.values()):
            self._wake = view.step + 1
        else:
            self._wake = view.step + bm.steps_to_exhaustion(kept)
        return Decision(admit=admit, preempt=preempted)

    def wake_step(self, view):
        return self._wake

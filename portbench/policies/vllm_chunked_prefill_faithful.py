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

import math
from collections import deque

from ..sim import Decision, Policy
from . import register
from ._blocks import BlockManager, reserve_slot
from ._common import fits


@register
class VllmChunkedPrefillFaithful(Policy):
    name = "vllm_chunked_prefill_faithful"

    def __init__(self, max_num_batched_tokens: int = 512, max_num_seqs: int = 256,
                 block_size: int = 16, watermark: float = 0.01):
        self.max_num_batched_tokens = max_num_batched_tokens
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
            # Skipped steps had no prefill in flight and no preemption: the same decoders were
            # scheduled at each of them, one slot each.
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
        budget = self.max_num_batched_tokens
        # 1. running pass over the mixed list, oldest arrival first
        pending = deque(sorted(rem, key=self._key.__getitem__))
        used = seqs = 0
        kept, preempted = [], []
        prefilled = False
        while pending:
            c = pending[0]
            left = budget - used
            rc = rem[c]
            n = (1 if left >= 1 else 0) if rc == 0 else min(rc, max(0, left))
            if n == 0:
                break
            pending.popleft()
            if rc == 0:
                if reserve_slot(bm, c, pending, preempted, rem.__delitem__):
                    kept.append(c)
                    used += 1
                    seqs += 1
            else:
                rem[c] = rc - n
                used += n
                seqs += 1
                prefilled = True
        # 2. admission in queue order
        active, kv = view.n_active, view.kv_used
        gone = set(preempted)
        admit = []
        for i in view.waiting:
            if i in gone:
                continue
            p = self._inp[i]
            if not bm.can_allocate(p):
                break
            n = min(p, max(0, budget - used))
            if n == 0 or seqs + 1 > self._max_seqs:
                break
            if not fits(view, active, kv, p):
                continue
            bm.allocate(i, p)
            rem[i] = p - n
            used += n
            seqs += 1
            admit.append(i)
            active += 1
            kv += p
        self._kept = kept
        if admit or preempted or prefilled or any(rem.values()):
            self._wake = view.step + 1
        else:
            self._wake = view.step + bm.steps_to_exhaustion(kept)
        return Decision(admit=admit, preempt=preempted)

    def wake_step(self, view):
        return self._wake

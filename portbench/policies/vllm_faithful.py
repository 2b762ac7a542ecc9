"""``vllm_faithful``: vLLM v0.1.0 FCFS with a paged-KV block manager, as the study ran it.

Each step: the running requests, oldest arrival first, each append one KV slot; a request that finds
no free block preempts the newest unprocessed one (recompute: its tokens are lost and it goes back to
the queue front), or itself when none is left. Then the queue is walked in order and admission
**closes** at the first request that fails the block watermark (``prompt + 1`` tokens), the token
budget (Σ admitted prompts + #running ≤ 2560) or the sequence cap; a request that fails only the
engine's hard limits is skipped. No prefill modelling: the whole prompt is charged at admission.
"""

from __future__ import annotations

import math
from collections import deque

from ..sim import Decision, Policy
from . import register
from ._blocks import BlockManager, reserve_slot
from ._common import fits


@register
class VllmFaithful(Policy):
    name = "vllm_faithful"

    def __init__(self, max_num_batched_tokens: int = 2560, max_num_seqs: int = 256,
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
        self._last_step = None
        self._kept: list[int] = []          # requests that appended a slot at the last call
        self._wake = math.inf

    def _sync(self, view) -> None:
        """Reconcile completions, then replay the appends of steps the engine skipped."""
        bm = self._bm
        running = set(view.running)
        for r in [r for r in bm.tokens if r not in running]:
            bm.free(r)
        skipped = 0 if self._last_step is None else view.step - self._last_step - 1
        if skipped > 0:
            # The engine skipped only steps where nothing could change: every kept request
            # appended one slot per step and none needed a block that was not there.
            for r in self._kept:
                if r in bm:
                    bm.append_slot(r, skipped)
        for r in view.running:                # adopt (defensive; never fires in normal runs)
            if r not in bm:
                bm.allocate(r, self._inp[r] + int(view.decoded[r]))
        self._last_step = view.step

    def schedule(self, view):
        self._sync(view)
        bm = self._bm
        key = self._key
        # 1. running pass, oldest arrival first
        pending = deque(sorted(bm.tokens, key=key.__getitem__))
        kept, preempted = [], []
        while pending:
            c = pending.popleft()
            if reserve_slot(bm, c, pending, preempted):
                kept.append(c)
        # 2. admission in queue order; close at the first block/budget/seqs misfit
        batched = seqs = len(kept)
        active, kv = view.n_active, view.kv_used   # victims still count here, as in the study
        gone = set(preempted)
        admit = []
        for i in view.waiting:
            if i in gone:
                continue
            p = self._inp[i]
            if not bm.can_allocate(p + 1):
                break
            if batched + p > self.max_num_batched_tokens:
                break
            if seqs + 1 > self._max_seqs:
                break
            if not fits(view, active, kv, p):
                continue
            bm.allocate(i, p + 1)
            admit.append(i)
            batched += p
            seqs += 1
            active += 1
            kv += p
        self._kept = kept
        if admit or preempted:
            self._wake = view.step + 1
        else:
            # Budget, seqs and the queue are fixed until an event and free blocks only fall, so
            # the only timer is the first step at which a kept request needs a block that is not there.
            self._wake = view.step + bm.steps_to_exhaustion(kept)
        return Decision(admit=admit, preempt=preempted)

    def wake_step(self, view):
        return self._wake

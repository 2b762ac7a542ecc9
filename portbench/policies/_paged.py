"""The state and the admission walk shared by the ``*_faithful`` policies, which keep a paged-KV
block manager (:mod:`._blocks`) inside the policy.

A :class:`PagedPolicy` tracks every running request in its block manager and in ``_rem``, the
shadow prefill left per request (always 0 for a policy that charges whole prompts at admission).
Each call starts with :meth:`PagedPolicy._sync`, which brings that state up to the engine's:

1. requests that left the engine (completed) are freed and forgotten;
2. if the policy let the engine skip steps after its last call (:meth:`~PagedPolicy._let_skip`),
   the bookings of the decoders it kept then follow the engine's own count of their tokens
   (``view.decoded_of``): one slot per token decoded in the skipped steps; and a prefill that took
   the whole budget left then took it again at each skipped step;
3. running requests the policy does not track are adopted (defensive; never fires in normal runs).

Admission (:meth:`PagedPolicy._admit`) walks a queue in order and *closes* at the first request
that fails the block watermark, the sequence cap or the step's token budget; a request that fails
only the engine's hard limits (:func:`._common.fits`) is skipped.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np

from ..engine.api import Policy
from ._blocks import BlockManager, reserve_slot
from ._common import fits


class Admission(NamedTuple):
    admit: list                 # admitted request ids, in walk order
    used: int                   # the step's budget used, admissions included
    closed: str | None          # what closed the walk: "blocks", "seqs", "budget", "limits"; None if it ran out


class PagedPolicy(Policy):
    """A policy with a block manager (``_bm``) and shadow prefill (``_rem``) over tracked requests."""

    event_driven = True     # each subclass names its timers (see its docstring)

    def __init__(self, max_num_seqs: int, block_size: int, watermark: float):
        self.max_num_seqs = max_num_seqs
        self.block_size = block_size
        self.watermark = watermark

    def reset(self, view):
        self._bm = BlockManager(view.model.max_kv_tokens, self.block_size, self.watermark)
        self._max_seqs = min(self.max_num_seqs, view.model.max_active_sequences)
        self._inp = [int(x) for x in view.input_tokens]
        self._key = [(float(a), i) for i, a in enumerate(view.arrival_s)]   # arrival order
        # ids in arrival order are ids in increasing order when arrivals are sorted (as in a window)
        self._ids_in_arrival_order = bool(np.all(np.diff(view.arrival_s) >= 0))
        self._rem: dict[int, int] = {}      # shadow prefill left, per tracked request
        self._last_step = None
        self._skip_from = None              # (kept decoders, their decoded counts, prefill) when skipping was let

    def _arrival_sorted(self, ids) -> list:
        """``ids`` in arrival order (ties by id)."""
        if self._ids_in_arrival_order:
            return sorted(ids)
        return sorted(ids, key=self._key.__getitem__)

    # --- reconciliation ------------------------------------------------------------------------

    def _forget(self, r: int) -> None:
        """Drop the per-request state of ``r`` besides its blocks (freed by the caller)."""
        del self._rem[r]

    def _booked(self, view, r: int) -> int:
        """The tokens an adopted running request holds in the block manager."""
        return self._inp[r] + int(view.decoded[r])

    def _sync(self, view) -> None:
        """Reconcile completions, replay the steps the engine skipped, adopt untracked requests."""
        bm, rem = self._bm, self._rem
        running = view.running
        if len(running) == len(rem) and all(map(rem.__contains__, running)):
            changed = gone = ()                     # the usual case: the same requests
        else:
            changed = rem.keys() ^ set(running)     # left the engine, or running untracked
            gone = changed & rem.keys()
        for r in gone:                              # left (the order does not matter)
            bm.free(r)
            self._forget(r)
        skip_from, self._skip_from = self._skip_from, None
        if skip_from is not None and view.step - self._last_step > 1:
            kept, decoded_then, prefill = skip_from
            # the slot of the last call's own step was booked then; one more per token since
            for r, d, d0 in zip(kept, view.decoded_of(kept), decoded_then):
                if r in rem and d - d0 > 1:
                    bm.append_slot(r, d - d0 - 1)
            if prefill is not None and prefill[0] in rem:
                c, chunk = prefill
                rem[c] -= (view.step - self._last_step - 1) * chunk
        if len(changed) > len(gone):        # adopt (defensive; never fires in normal runs)
            for r in running:
                if r not in rem:
                    bm.allocate(r, self._booked(view, r))
                    rem[r] = 0
        self._last_step = view.step

    def _let_skip(self, view, kept: list, prefill: tuple[int, int] | None = None) -> float:
        """The timer of a call after which the engine may skip steps: the first step at which one of
        the ``kept`` decoders (one slot each per step) would need a block that is not there.

        ``prefill = (c, chunk)``: request ``c`` is prefilling and took ``chunk`` tokens, the whole
        budget the decoders left, without finishing; nothing else prefills or may be admitted while
        it does. The next steps then repeat this one as long as ``c`` still has a whole chunk left
        (the one that finishes it included); the step after them may differ. Remembers the decoded
        counts and the prefill for the next :meth:`_sync`."""
        self._skip_from = (kept, view.decoded_of(kept), prefill)
        timer = self._bm.steps_to_exhaustion(kept)
        if prefill is not None:
            c, chunk = prefill
            timer = min(timer, self._rem[c] // chunk + 1)
        return timer

    # --- the step's pieces ---------------------------------------------------------------------

    def _running_pass(self, decoders: list) -> tuple[list, list]:
        """vLLM's running pass: each of ``decoders``, in order, appends a slot, preempting from the
        back when no block is free (:meth:`_reserve`). Returns (kept, preempted)."""
        if self._bm.append_slots_if_room(decoders):          # the common case: nobody is short
            return decoders, []
        pending = deque(decoders)
        kept, preempted = [], []
        while pending:
            c = pending.popleft()
            if self._reserve(c, pending, preempted):
                kept.append(c)
        return kept, preempted

    def _reserve(self, c: int, pending, preempted: list) -> bool:
        """:func:`._blocks.reserve_slot` for decoder ``c``; victims are forgotten as well."""
        return reserve_slot(self._bm, c, pending, preempted, self._forget)

    def _prefill(self, prefillers, budget: int, used: int) -> int:
        """In-flight prefills, in the given order, take chunks from the budget left; returns ``used``."""
        rem = self._rem
        for r in prefillers:
            chunk = min(rem[r], budget - used)
            if chunk <= 0:
                continue
            rem[r] -= chunk
            used += chunk
        return used

    def _book(self, admit: list, i: int, p: int, chunk: int, chunked: bool, extra_tokens: int) -> None:
        """Admit ``i`` (prompt ``p``, first chunk ``chunk``): book its blocks, its prefill left."""
        self._bm.allocate(i, p + extra_tokens)
        self._rem[i] = p - chunk if chunked else 0
        admit.append(i)

    def _admit(self, view, queue, *, budget: int, used: int, seqs: int, chunked: bool,
               extra_tokens: int = 0, skip=(), oversize_chunked: bool = False,
               by_prompt: bool = False) -> Admission:
        """Walk ``queue`` in order from ``used`` budget tokens and ``seqs`` sequences already taken.

        For each request (prompt ``p``) not in ``skip`` (this step's victims), in this order:

        * close ("blocks") if the block manager cannot allocate ``p + extra_tokens`` tokens;
        * close ("seqs") if one more sequence passes the sequence cap;
        * close ("budget") if the budget has no room: with ``chunked`` the request's first chunk is
          ``min(p, budget - used)`` and must be positive, otherwise its whole prompt must fit —
          except, with ``oversize_chunked``, a prompt larger than the whole budget, which takes what
          is left of it (an ablation, not the study's rule);
        * skip it if it fails the engine's hard limits (this step's victims still count there,
          as in the study);
        * else book ``p + extra_tokens`` tokens, leave ``p - chunk`` to prefill and count it.

        ``by_prompt``: the queue is in order of prompt length (shortest first). The first request
        that fails the engine's hard limits then ends the walk ("limits"): every later one, with a
        prompt at least as long, fails them too and can only be skipped or close it on blocks.
        """
        bm, inp = self._bm, self._inp
        active, kv = view.n_active, view.kv_used
        admit = []
        if isinstance(queue, np.ndarray):
            queue = queue.tolist()
        for i in queue:
            if i in skip:
                continue
            p = inp[i]
            if not bm.can_allocate(p + extra_tokens):
                return Admission(admit, used, "blocks")
            if seqs + 1 > self._max_seqs:
                return Admission(admit, used, "seqs")
            if chunked or (oversize_chunked and p > budget):
                chunk = min(p, budget - used)
                closed = chunk <= 0
            else:
                chunk = p
                closed = used + p > budget
            if closed:
                return Admission(admit, used, "budget")
            if not fits(view, active, kv, p):
                if by_prompt:
                    return Admission(admit, used, "limits")
                continue
            self._book(admit, i, p, chunk, chunked, extra_tokens)
            used += chunk
            seqs += 1
            active += 1
            kv += p
        return Admission(admit, used, None)

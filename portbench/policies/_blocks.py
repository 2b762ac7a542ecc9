"""A paged-KV block manager, as the study's ``*_faithful`` policies keep one inside the policy.

Only counts matter (block numbers and free-list order never change a decision):

* ``num_blocks = max_kv_tokens // block_size``; ``watermark_blocks = int(watermark * num_blocks)``;
* ``blocks(n) = ceil(n / block_size)`` (0 for ``n <= 0``);
* ``can_allocate(n)``: ``free - blocks(n) >= watermark_blocks`` (the watermark guards new allocations only);
* ``can_append_slot(r)``: the next token fits r's last block, or at least one block is free;
* ``append_slot(r)``: one more token, taking a new block when the count crosses a block boundary;
* ``free(r)``: all of r's blocks return.

A request's table always holds exactly ``blocks(tokens)`` blocks, so appending the next token
needs a new block exactly when the current token count is a multiple of the block size.
"""

from __future__ import annotations

import math


class BlockManager:
    def __init__(self, max_kv_tokens: int, block_size: int = 16, watermark: float = 0.01):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size!r}")
        self.block_size = int(block_size)
        self.num_blocks = int(max_kv_tokens) // self.block_size
        self.watermark_blocks = int(watermark * self.num_blocks)
        self.free_blocks = self.num_blocks
        self.tokens: dict[int, int] = {}       # request id -> tokens booked
        self.table: dict[int, int] = {}        # request id -> blocks held

    def __contains__(self, r) -> bool:
        return r in self.tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def blocks(self, n: int) -> int:
        return 0 if n <= 0 else -(-n // self.block_size)

    def can_allocate(self, n: int) -> bool:
        return self.free_blocks - self.blocks(n) >= self.watermark_blocks

    def allocate(self, r: int, n: int) -> None:
        b = self.blocks(n)
        self.tokens[r] = n
        self.table[r] = b
        self.free_blocks -= b

    def can_append_slot(self, r: int) -> bool:
        return self.blocks(self.tokens[r] + 1) <= self.table[r] or self.free_blocks >= 1

    def append_slot(self, r: int, k: int = 1) -> None:
        """``k`` appends at once (the caller guarantees none of them would have failed)."""
        t = self.tokens[r] + k
        b = self.blocks(t)
        self.free_blocks -= b - self.table[r]
        self.tokens[r] = t
        self.table[r] = b
        if self.free_blocks < 0:
            raise AssertionError(f"block manager overdrawn by request {r}")

    def append_slots_if_room(self, ids) -> bool:
        """One ``append_slot`` for each of ``ids`` if the free blocks cover every one that needs a
        new block (then none of them would fail, in any order); else change nothing, return False."""
        bs, tokens = self.block_size, self.tokens
        need = [r for r in ids if tokens[r] % bs == 0]      # the next token starts a new block
        if len(need) > self.free_blocks:
            return False
        for r in ids:
            tokens[r] += 1
        table = self.table
        for r in need:
            table[r] += 1
        self.free_blocks -= len(need)
        return True

    def free(self, r: int) -> None:
        del self.tokens[r]
        self.free_blocks += self.table.pop(r)

    def steps_to_exhaustion(self, ids) -> float:
        """If each of ``ids`` (in this order) appends one token per future step, the number ``j >= 1``
        of steps ahead at which some append first finds no free block (a preemption); inf if none.

        A request holding T tokens needs a new block at future step j when T + j - 1 is a multiple of
        the block size, so its crossings come at x, x + bs, ... with x in 1..bs. Writing
        j = m * bs + r (0 <= r < bs), the crossings up to and including step j number
        m * R + #{x <= r} over the R requests; the appends of a step fail once that exceeds the free
        blocks, which gives j in closed form.
        """
        bs = self.block_size
        xs = sorted((1 - self.tokens[r]) % bs or bs for r in ids)
        if not xs:
            return math.inf
        m, rem = divmod(self.free_blocks, len(xs))
        x = xs[rem]                       # the (rem + 1)-th crossing within a block period
        return m * bs + x if x < bs else (m + 1) * bs


def reserve_slot(bm: BlockManager, c: int, pending, preempted: list, drop=None) -> bool:
    """vLLM's running-pass step for a decoding request ``c`` (already taken off ``pending``).

    While ``c`` cannot append a slot, preempt the back of ``pending`` (the newest arrival not yet
    processed), or ``c`` itself when nothing is left; victims are freed, appended to ``preempted``
    and passed to ``drop`` (to forget other per-request state). On success, append ``c``'s slot.
    """
    while not bm.can_append_slot(c):
        victim = pending.pop() if pending else c
        bm.free(victim)
        preempted.append(victim)
        if drop is not None:
            drop(victim)
        if victim == c:
            return False
    bm.append_slot(c)
    return True

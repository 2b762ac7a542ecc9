"""What a prefix cache can share between requests: each KV block's key, and prompt token ids that
make vLLM's own block hashing see the same sharing.

A prefix-hashed source (Mooncake's traces, ``mooncake_conversation``) gives each request a list of
hash ids, one per ``block_tokens`` (512) prompt tokens, chained: two requests with the same hash id
at a position share every token up to the end of that 512-token block. The engine's cache works in
its own KV blocks (16 tokens), so each 16-token block of a prompt is keyed by the chain of hash ids
up to its 512-token block and its offset there; two requests' blocks share a key exactly when their
tokens up to the block's end are the same. Every other block is its own: a block past the hash list,
a block that holds an output token (the last, partly-prompt block too), and every block of a request
without hash ids (the study's windows carry no prompt contents: nothing is shared, as on the real
engine with distinct prompts).

:func:`prompt_token_ids` writes prompts with that sharing for vLLM (its scheduler in virtual time,
or the real engine): the tokens of a 512-token block are a fixed function of its hash id and the
position in it, and tokens where the trace says nothing are distinct random ids. vLLM's chained
block hashes then match exactly where the keys do (barring a 64-bit hash collision).
"""

from __future__ import annotations

import numpy as np

#: Token ids are drawn below this (Llama's vocabulary) and from 3 up (past the special tokens).
VOCAB = 32000
_LOW = 3


def block_keys(window, block_size: int, history_from: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """The key of every KV block each request of ``window`` can hold (its prompt and output).

    Returns ``(keys, offsets, n_keys)``: request ``i``'s blocks are ``keys[offsets[i]:offsets[i+1]]``
    (``ceil((input + output) / block_size)`` of them), keys are below ``n_keys`` (not all used), and
    two blocks share a key only when they hold the same tokens after the same prefix. With
    ``history_from``, the requests of ``window.history[history_from:]`` follow the window's own (rows
    ``len(window)`` on), keyed together with them (a warm cache: :func:`warm_history_start`)."""
    inp = np.asarray(window.input_tokens, dtype=np.int64)
    out = np.asarray(window.output_tokens, dtype=np.int64)
    hashes = getattr(window, "block_hashes", None)
    if history_from is not None:
        hist = window.history
        if hashes is None or hist is None:
            raise ValueError(f"window {window.window_id}: a warm cache needs the window's block hashes "
                             f"and its history (load it with history=True)")
        inp = np.concatenate((inp, np.asarray(hist.input_tokens[history_from:], dtype=np.int64)))
        out = np.concatenate((out, np.asarray(hist.output_tokens[history_from:], dtype=np.int64)))
        hashes = tuple(hashes) + tuple(hist.block_hashes[history_from:])
    hash_tokens = int(window.meta["block_tokens"]) if hashes is not None else 0
    return keys_of_columns(inp, out, hashes, hash_tokens, block_size, window.window_id)


def keys_of_columns(inp, out, hashes, hash_tokens: int, block_size: int, name: str = ""):
    """:func:`block_keys` on raw columns (prompt and output tokens, hash lists or None)."""
    n_blocks = -(-(inp + out) // block_size)
    offsets = np.zeros(len(inp) + 1, dtype=np.int64)
    np.cumsum(n_blocks, out=offsets[1:])
    keys = np.empty(int(offsets[-1]), dtype=np.int64)
    if hashes is None:
        keys[:] = np.arange(len(keys))
        return keys, offsets, len(keys)
    if hash_tokens % block_size:
        raise ValueError(f"window {name}: its {hash_tokens}-token hash blocks are not "
                         f"whole {block_size}-token KV blocks")
    per_hash = hash_tokens // block_size
    node_of: dict = {}          # (parent node, hash id) -> node: the chain of hash ids so far
    for i, h in enumerate(hashes):
        shared = min(int(inp[i]) // block_size, len(h) * per_hash)     # whole prompt blocks
        nodes = np.empty(-(-shared // per_hash), dtype=np.int64)
        node = -1
        for g in range(len(nodes)):
            node = nodes[g] = node_of.setdefault((node, int(h[g])), len(node_of))
        j = np.arange(shared)
        row = keys[offsets[i]:offsets[i + 1]]
        row[:shared] = nodes[j // per_hash] * per_hash + j % per_hash      # (node, block in it)
        row[shared:] = -1
    n_shared = len(node_of) * per_hash
    own = keys < 0
    keys[own] = n_shared + np.arange(int(own.sum()))
    return keys, offsets, n_shared + int(own.sum())


def warm_history_start(window, n_blocks: int, block_size: int) -> int:
    """Where a warm cache of ``n_blocks`` KV blocks starts serving ``window.history``: the latest
    requests whose blocks, counted once per distinct 512-token hash chain (and every block past a
    request's hash list as its own), number at least ``n_blocks`` (0: the whole history has fewer).
    An LRU cache after serving every earlier request holds only blocks of these, so serving them
    alone leaves the same cache."""
    hist = window.history
    if hist is None:
        raise ValueError(f"window {window.window_id}: no history to warm the cache with (load it "
                         f"with history=True)")
    per_hash = hist.block_tokens // block_size
    seen: set = set()
    count = 0
    for r in range(len(hist) - 1, -1, -1):
        h = hist.block_hashes[r]
        inp, total = int(hist.input_tokens[r]), int(hist.input_tokens[r] + hist.output_tokens[r])
        shared = min(inp // block_size, len(h) * per_hash)
        chains = -(-shared // per_hash)
        new = 0
        for g in range(chains):
            if (g, int(h[g]), int(h[g - 1]) if g else -1) not in seen:
                seen.add((g, int(h[g]), int(h[g - 1]) if g else -1))
                new += 1
        count += new * per_hash + (-(-total // block_size) - shared)
        if count >= n_blocks:
            return r
    return 0


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fixed, well-spread function of a uint64 array."""
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def prompt_token_ids(n_tokens: int, hash_ids, hash_tokens: int, rng: np.random.Generator) -> list:
    """A prompt of ``n_tokens`` ids for vLLM whose 512-token blocks follow ``hash_ids`` (see the
    module docstring): the ``hash_tokens`` tokens of a hash id's block are a function of the id and
    the position; tokens past the hash list are drawn from ``rng`` (distinct from any other)."""
    hash_ids = np.asarray(hash_ids if hash_ids is not None else (), dtype=np.int64)
    n_hashed = min(n_tokens, len(hash_ids) * hash_tokens)
    pos = np.arange(n_hashed, dtype=np.uint64)
    seeds = hash_ids[(pos // np.uint64(hash_tokens)).astype(np.int64)].astype(np.uint64)
    with np.errstate(over="ignore"):
        hashed = _mix(seeds * np.uint64(hash_tokens) + pos % np.uint64(hash_tokens))
    ids = (hashed % np.uint64(VOCAB - _LOW)).astype(np.int64) + _LOW
    rest = rng.integers(_LOW, VOCAB, size=n_tokens - n_hashed)
    return np.concatenate((ids, rest)).tolist()


def output_token_id(request: int) -> int:
    """The token every output of request ``request`` is: distinct per request (below ``VOCAB``
    requests), so that no two requests share a block that holds an output."""
    return _LOW + request % (VOCAB - _LOW)

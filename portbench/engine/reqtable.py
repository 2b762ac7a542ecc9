"""The ``vllm_v1`` engine model's per-request state: one int64 table, a row per request, these
columns (its compiled loops and :mod:`portbench.engine.blockpool` read and write them by name).

- ``INP``, ``OUT``: prompt and output tokens;
- ``COMPUTED``: tokens whose KV is held; ``TARGET``: tokens to compute before the next token can be
  emitted (the prompt; prompt + output so far after a preemption);
- ``BLOCKS``: KV blocks held; ``DECODED``: tokens emitted;
- ``FIRST``, ``FINISH``: first-token and finish times in picoseconds (-1: not yet).
"""

INP, OUT, COMPUTED, TARGET, BLOCKS, DECODED, FIRST, FINISH = range(8)

"""The policy author's import path for key policies, kept stable: see :mod:`portbench.engine.queue`."""

from .engine.queue import (FixedData, KeyPolicy, Ranked, WaitingOrder, admit_by_key, arrival_rank,  # noqa: F401
                           rank_by, ranked_key)

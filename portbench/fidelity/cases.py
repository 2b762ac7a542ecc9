"""A real-engine case by its tag (its runs, requests, steps and windows, read through
:mod:`portbench.results`) and the step log's common readings (the run keys, each step's batch shape,
the steps of the kept attempts).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import results
from ..engine.stepcost import RUN_KEYS, SHAPES, batch_shape, run_steps  # noqa: F401  (the step log's readings)


# --- a real-engine case by its tag ----------------------------------------------------------------
#: The headline real-engine case (max_model_len 2,560 for vllm_faithful, 32,768 for slai_faithful).
GUARDED_TAG = "vllm_cpu_guarded"
#: The same RQ6 case with the same max_model_len (2,560) for both policies, each step's batch and
#: each request's submission logged.
EQUAL_TAG = "vllm_cpu_equal"


def case_tag(tag: str) -> str:
    """A case's set-up tag, as its files are named (:func:`portbench.results.setup_tag`):
    ``vllm_cpu_equal`` and ``vllm_cpu_equal_case`` name the same case."""
    return results.setup_tag(tag)


def load_case(tag: str = GUARDED_TAG, *, data_dir=None) -> dict:
    """A committed real-engine case's runs, requests, steps, windows (window_id → Window) and
    ``profile_cost``: the :class:`~portbench.engine.StepCost` fitted to the step profile (the
    case's own refitted cost; a case without its own profile takes the guarded case's, measured on
    the same host with the same model shape), and ``cost_tag``, the set-up it came from."""
    from .. import store as _store
    from ..engine.stepcost import StepCost

    case = results.load_case(results.case_of(tag).tag, data_dir)
    runs = case.runs
    costed = case if case.has("cost") else results.case_of(GUARDED_TAG, data_dir)
    return {"tag": case.setup, "runs": runs, "requests": case.requests, "steps": case.steps,
            "windows": {w.window_id: w for w in _store.load_windows(window_ids=sorted(set(runs["window_id"])))},
            "profile_cost": StepCost(**costed.cost["cost"]), "cost_tag": costed.setup}


def run_rows(frame: pd.DataFrame, run) -> pd.DataFrame:
    sel = np.ones(len(frame), dtype=bool)
    for k in RUN_KEYS:
        if k in frame:
            sel &= (frame[k] == run[k]).to_numpy()
    return frame[sel]

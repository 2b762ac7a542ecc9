"""A real-engine case by its tag (its runs, requests, steps and windows) and the step log's common
readings (the run keys, each step's batch shape, the steps of the kept attempts).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..engine.stepcost import RUN_KEYS, SHAPES, batch_shape, run_steps  # noqa: F401  (the step log's readings)


# --- a real-engine case by its tag ----------------------------------------------------------------
#: The headline real-engine case (max_model_len 2,560 for vllm_faithful, 32,768 for slai_faithful).
GUARDED_TAG = "vllm_cpu_guarded"
#: The same RQ6 case with the same max_model_len (2,560) for both policies, each step's batch and
#: each request's submission logged.
EQUAL_TAG = "vllm_cpu_equal"


def case_tag(tag: str) -> str:
    """A case's tag as its files are named (``<tag>_case_runs.parquet``): ``vllm_cpu_equal`` and
    ``vllm_cpu_equal_case`` name the same case."""
    return tag[: -len("_case")] if tag.endswith("_case") else tag


def load_case(tag: str = GUARDED_TAG, *, data_dir=None) -> dict:
    """A committed real-engine case's runs, requests, steps, windows (window_id → Window) and
    ``profile_cost``: the :class:`~portbench.engine.StepCost` fitted to the step profile
    (``<tag>_cost.json``; a case without its own profile takes the guarded case's, measured on the
    same host with the same model shape), and ``cost_tag``, the tag it came from."""
    import json

    from .. import store as _store
    from ..engine.stepcost import StepCost
    from ..realengine.study import realengine_dir

    tag = case_tag(tag)
    d = realengine_dir(data_dir)
    runs = pd.read_parquet(d / f"{tag}_case_runs.parquet")
    cost_tag = tag if (d / f"{tag}_cost.json").exists() else GUARDED_TAG
    return {"tag": tag, "runs": runs,
            "requests": pd.read_parquet(d / f"{tag}_case_requests.parquet"),
            "steps": pd.read_parquet(d / f"{tag}_case_steps.parquet"),
            "windows": {w.window_id: w for w in _store.load_windows(window_ids=sorted(set(runs["window_id"])))},
            "profile_cost": StepCost(**json.loads((d / f"{cost_tag}_cost.json").read_text())["cost"]),
            "cost_tag": cost_tag}


def run_rows(frame: pd.DataFrame, run) -> pd.DataFrame:
    sel = np.ones(len(frame), dtype=bool)
    for k in RUN_KEYS:
        if k in frame:
            sel &= (frame[k] == run[k]).to_numpy()
    return frame[sel]

"""Workload characterisation: per-window descriptors and what sets each window's λ_ref."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .engine import LsspModel, simulate
from .policies import make_policy
from .workload import Window, scale

#: vllm_faithful admits a prompt whole against this per-step budget (the head-of-line hypothesis).
VLLM_V0_BUDGET = 2560


def window_descriptors(windows: list[Window]) -> pd.DataFrame:
    """One row per window: size, rate, burstiness and token statistics (trace time, scale 1)."""
    rows = []
    for w in windows:
        gaps = np.diff(w.arrival_s)
        rows.append({
            "source": w.source, "window_id": w.window_id, "n_requests": len(w),
            "duration_s": w.duration_s,
            "rate_rps": (len(w) - 1) / w.duration_s if w.duration_s > 0 else np.nan,
            "gap_cv": gaps.std() / gaps.mean() if gaps.mean() > 0 else np.nan,
            "share_same_instant": float(np.mean(gaps == 0)),
            "input_mean": w.input_tokens.mean(), "input_p50": np.median(w.input_tokens),
            "input_p95": np.percentile(w.input_tokens, 95), "input_max": int(w.input_tokens.max()),
            "output_mean": w.output_tokens.mean(), "output_p50": np.median(w.output_tokens),
            "output_p95": np.percentile(w.output_tokens, 95), "output_max": int(w.output_tokens.max()),
            "prompts_over_vllm_budget": int((w.input_tokens > VLLM_V0_BUDGET).sum()),
            "prediction_ratio_mean": float(np.mean(w.predicted_output_tokens / w.output_tokens)),
            "paper_lambda_ref": w.meta.get("paper_lambda_ref", np.nan),
        })
    return pd.DataFrame(rows)


def knee_cause(window: Window, lambda_ref: float, *, model=None, overshoot: float = 1e-6) -> dict:
    """Why FIFO misses its first deadline just above λ_ref: queueing, or the request's own length?

    Runs FIFO at ``lambda_ref * (1 + overshoot)`` and looks at the requests that miss. For each, the
    wait (admission − arrival) and the service time (output tokens × step) are compared with its
    slack: with zero wait the miss is *intrinsic* (slack ÷ λ shorter than its own decode time, which
    no scheduler can fix); otherwise it is *queueing*.
    """
    model = model or LsspModel()
    scaled = scale(window, lambda_ref * (1 + overshoot))
    result = simulate(scaled, make_policy("fifo"), model)
    done = result.completed
    late = np.flatnonzero(done & (result.finish_s > result.deadline_s))
    if late.size == 0:
        return {"window_id": window.window_id, "n_late": 0, "cause": "none"}
    i = int(late[0])
    wait = float(result.admit_s[i] - result.arrival_s[i])
    service = float(result.finish_s[i] - result.admit_s[i])
    slack = float(result.deadline_s[i] - result.arrival_s[i])
    # Visibility waits for the next step start: anything under one step is not queueing.
    intrinsic = wait < model.step_s and service > slack - model.step_s
    return {"window_id": window.window_id, "n_late": int(late.size), "request": i,
            "wait_s": wait, "service_s": service, "slack_s": slack,
            "output_tokens": int(window.output_tokens[i]),
            "predicted_output_tokens": int(window.predicted_output_tokens[i]),
            "cause": "intrinsic" if intrinsic else "queueing"}

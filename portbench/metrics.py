"""Per-run metrics (placeholder: SLO violation rate for calibration)."""

import numpy as np


def slo_violation_rate(result) -> float:
    """Violated ÷ completed, where violated = completed strictly after its deadline; 1.0 if none completed."""
    done = result.completed
    n = int(done.sum())
    if n == 0:
        return 1.0
    return float((result.finish_s[done] > result.deadline_s[done]).sum()) / n

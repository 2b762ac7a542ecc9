"""Per-window load calibration (λ_ref) and the six operating regions.

λ_ref is the compression factor at which FIFO's SLO-violation rate crosses 0.5%: bisection over
log10 λ in [−2, 4], 30 steps. With 200 requests "< 0.5%" means zero violations, so λ_ref is where the
first request misses its deadline. Regions are fixed multiples of λ_ref.
"""

from __future__ import annotations

import dataclasses

from . import sim
from .metrics import slo_violation_rate
from .policies import make_policy
from .workload import Window, scale

#: Operating regions as multiples of λ_ref, light to heavy.
REGIONS = {"LOW": 0.5, "PRE_KNEE": 0.8, "KNEE": 1.0, "POST_KNEE": 1.1, "OVERLOAD": 1.2,
           "HIGH_PRESSURE": 1.5}

VIOLATION_THRESHOLD = 0.005
LOG10_BOUNDS = (-2.0, 4.0)
BISECTION_STEPS = 30


@dataclasses.dataclass(frozen=True)
class Calibration:
    """λ_ref of one window. ``pinned`` is ``"low"``/``"high"`` when the search hit a bound."""

    window_id: str
    lambda_ref: float
    pinned: str | None
    n_simulations: int


def region_factor(region: str) -> float:
    try:
        return REGIONS[region]
    except KeyError:
        raise KeyError(f"unknown region {region!r}; regions: {', '.join(REGIONS)}") from None


def violation_rate_at(window: Window, factor: float, policy: str = "fifo", model=None) -> float:
    """FIFO's (or ``policy``'s) SLO-violation rate with the window compressed by ``factor``."""
    return slo_violation_rate(sim.simulate(scale(window, factor), make_policy(policy), model))


def bisect_log10(ok, lo: float, hi: float, steps: int) -> tuple[float, str | None]:
    """Bisection on log10 λ for a knee: ``ok(log10 λ)`` is True below it (the lighter loads).

    Probes ``lo``, then ``hi``, then ``steps`` midpoints. Returns (λ, pinned): λ is 10 to the middle of
    the last bracket; ``pinned`` is ``"low"`` when not even ``lo`` is ok (λ = 10 ** lo), ``"high"``
    when even ``hi`` is (λ = 10 ** hi), else None.
    """
    if not ok(lo):
        return 10.0 ** lo, "low"
    if ok(hi):
        return 10.0 ** hi, "high"
    for _ in range(steps):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return 10.0 ** ((lo + hi) / 2), None


def find_lambda_ref(window: Window, *, policy: str = "fifo", model=None,
                    threshold: float = VIOLATION_THRESHOLD, log10_bounds=LOG10_BOUNDS,
                    steps: int = BISECTION_STEPS) -> Calibration:
    """Bisection on log10 λ for the knee where the violation rate reaches ``threshold``."""

    def ok(log_lambda):
        return violation_rate_at(window, 10.0 ** log_lambda, policy, model) < threshold

    lam, pinned = bisect_log10(ok, *map(float, log10_bounds), steps)
    n_simulations = {"low": 1, "high": 2, None: steps + 2}[pinned]
    return Calibration(window.window_id, lam, pinned, n_simulations)

"""Per-window load calibration (λ_ref) and the six operating regions.

λ_ref is the compression factor at which FIFO's SLO-violation rate crosses 0.5%: bisection over
log10 λ in [−2, 4], 30 steps. With 200 requests "< 0.5%" means zero violations, so λ_ref is where the
first request misses its deadline. Regions are fixed multiples of λ_ref.

Two knees (:data:`KNEES`): the study's counts every request; the *attainable* knee leaves out of the
count, at each probed λ, the requests no scheduler can meet there: those whose compressed SLO slack
is shorter than their own service time on an idle engine (:func:`solo_service_s`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .engine import LsspModel, RunResult, simulate, visible_steps
from .metrics import slo_violation_rate
from .policies import make_policy
from .workload import Window, scale

#: Operating regions as multiples of λ_ref, light to heavy.
REGIONS = {"LOW": 0.5, "PRE_KNEE": 0.8, "KNEE": 1.0, "POST_KNEE": 1.1, "OVERLOAD": 1.2,
           "HIGH_PRESSURE": 1.5}

VIOLATION_THRESHOLD = 0.005
#: The knees λ_ref can be found at: ``study`` (every request counts) and ``attainable``.
KNEES = ("study", "attainable")
LOG10_BOUNDS = (-2.0, 4.0)
BISECTION_STEPS = 30


@dataclasses.dataclass(frozen=True)
class Calibration:
    """λ_ref of one window. ``pinned`` is ``"low"``/``"high"`` when the search hit a bound."""

    window_id: str
    lambda_ref: float
    pinned: str | None
    n_simulations: int          # runs simulated (probes answered from an identical run not counted)


def region_factor(region: str) -> float:
    try:
        return REGIONS[region]
    except KeyError:
        raise KeyError(f"unknown region {region!r}; regions: {', '.join(REGIONS)}") from None


def violation_rate_at(window: Window, factor: float, policy: str = "fifo", model=None) -> float:
    """FIFO's (or ``policy``'s) SLO-violation rate with the window compressed by ``factor``."""
    return slo_violation_rate(simulate(scale(window, factor), make_policy(policy), model))


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


def solo_service_s(window: Window, model=None) -> np.ndarray:
    """Each request's service time, from its admission to its last token, when served alone on an
    idle engine (FIFO, the requests spread so far apart that no two overlap; no prefix cache is
    shared). It does not depend on the compression."""
    model = model or LsspModel()
    n = len(window)
    gap = 60.0
    while True:
        arrival = np.arange(n, dtype=np.float64) * gap
        spaced = dataclasses.replace(window, arrival_s=arrival, deadline_s=arrival + 1e12, block_hashes=None,
                                     meta={k: v for k, v in window.meta.items() if k != "block_tokens"})
        run = simulate(spaced, make_policy("fifo"), model)
        if run.completed.all() and np.all(run.finish_s[:-1] < arrival[1:]):
            return run.finish_s - run.admit_s
        if gap > 1e6:
            raise RuntimeError(f"window {window.window_id}: a request does not finish alone on an idle "
                               f"engine within {gap:g} s")
        gap *= 10


def attainable(scaled: Window, solo_s: np.ndarray, model=None) -> np.ndarray:
    """The requests of ``scaled`` (a compressed window, or a run of one) that some scheduler could meet: the earliest
    an idle engine can start one (its arrival, or on a fixed-step engine the first step start at or
    after it) plus its solo service time (:func:`solo_service_s`) is within its deadline."""
    model = model or LsspModel()
    start = (visible_steps(scaled.arrival_s, model.step_s) * model.step_s if model.fixed_steps
             else scaled.arrival_s)
    return start + solo_s <= scaled.deadline_s


def find_lambda_ref(window: Window, *, policy: str = "fifo", model=None,
                    threshold: float = VIOLATION_THRESHOLD, log10_bounds=LOG10_BOUNDS,
                    steps: int = BISECTION_STEPS, knee: str = "study") -> Calibration:
    """Bisection on log10 λ for the knee where the violation rate reaches ``threshold``.

    ``knee="attainable"`` counts only the requests some scheduler could meet at each probed load
    (:func:`attainable`), searching up from the study's knee (:func:`_upward_bracket`).

    FIFO on an engine with fixed steps sees the arrivals only through the step at which each becomes
    visible: two compressions that give every request the same step give the same run, step for
    step, and only the deadlines differ. The bisection's last probes lie that close together, so a
    probe whose visible steps match an earlier one's takes that run's completion times and checks
    them against its own deadlines (on 24 windows, 44% of the probes) — the same answer as
    simulating it again.
    """
    if knee not in KNEES:
        raise ValueError(f"unknown knee {knee!r}; knees: {', '.join(KNEES)}")
    model = model or LsspModel()
    solo_s = solo_service_s(window, model) if knee == "attainable" else None

    def rate(run):
        return slo_violation_rate(run, None if solo_s is None else attainable(run, solo_s, model))

    reuse = policy == "fifo" and model.fixed_steps
    runs: dict[bytes, RunResult] = {}         # visible steps -> FIFO's run
    n_simulations = 0

    def ok(log_lambda):
        nonlocal n_simulations
        factor = 10.0 ** log_lambda
        if not reuse:
            n_simulations += 1
            return rate(simulate(scale(window, factor), make_policy(policy), model)) < threshold
        scaled = scale(window, factor)
        key = visible_steps(scaled.arrival_s, model.step_s).tobytes()
        run = runs.get(key)
        if run is None:
            run = runs[key] = simulate(scaled, make_policy(policy), model)
            n_simulations += 1
        else:
            run = dataclasses.replace(run, arrival_s=scaled.arrival_s, deadline_s=scaled.deadline_s)
        return rate(run) < threshold

    lo, hi = map(float, log10_bounds)
    if knee == "attainable":
        lo, hi = _upward_bracket(ok, find_lambda_ref(window, policy=policy, model=model, threshold=threshold,
                                                     log10_bounds=log10_bounds, steps=steps), hi)
    lam, pinned = bisect_log10(ok, lo, hi, steps)
    return Calibration(window.window_id, lam, pinned, n_simulations)


def _upward_bracket(ok, study: Calibration, top: float) -> tuple[float, float]:
    """The attainable knee's bracket: from the study's knee (which it cannot be below: leaving
    requests out only removes misses) up by doublings of λ to the first load that is not ok, or to
    ``top``. With every request left out at extreme loads, "ok" is not monotone far above the
    knee, so the search walks up from below rather than probing the upper bound first."""
    lo = float(np.log10(study.lambda_ref))
    if study.pinned == "high":
        return lo, top
    step = float(np.log10(2.0))
    while lo + step < top and ok(lo + step):
        lo += step
    return lo, min(lo + step, top)

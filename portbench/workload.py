"""Workload windows: a window is a handful of numpy arrays plus metadata.

A window is an independent episode of consecutive requests that starts from an empty engine at
its own t = 0. Arrivals are in seconds at the trace's own rate (time scale 1). Compressing a window
by a factor ``s`` (``scale``) divides every inter-arrival gap *and* every request's SLO slack by
``s``, as the study's load calibration does. ``with_prediction_error`` re-draws the predicted
output lengths at another error level than the study's 20% (deadlines kept).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

#: The study's SLO: deadline = arrival + multiplier * (PREFILL_S_PER_TOKEN * input
#: + DECODE_S_PER_TOKEN * predicted_output).
BASE_SLO_MULTIPLIER = 20.0
PREFILL_S_PER_TOKEN = 0.0004
DECODE_S_PER_TOKEN = 0.02
#: Relative error of the synthetic output-length predictions, and their upper clip (the study's).
PREDICTION_RELATIVE_ERROR = 0.20
MAX_PREDICTED_OUTPUT_TOKENS = 4096
#: The largest relative error :func:`with_prediction_error` accepts (500%: log-normal σ ≈ 1.80).
MAX_PREDICTION_RELATIVE_ERROR = 5.0


@dataclasses.dataclass(frozen=True, eq=False)
class History:
    """The trace's requests before a window, in arrival order, for a warm prefix cache: their prompt
    and output tokens and prompt-block hash ids (``block_tokens`` prompt tokens a hash). No times:
    a warm cache is what serving them one after another leaves (see
    :mod:`portbench.engine.blockpool`)."""

    input_tokens: np.ndarray
    output_tokens: np.ndarray
    block_hashes: tuple
    block_tokens: int

    def __post_init__(self):
        n = len(self.input_tokens)
        if len(self.output_tokens) != n or len(self.block_hashes) != n:
            raise ValueError(f"History: {n} input counts, {len(self.output_tokens)} output counts, "
                             f"{len(self.block_hashes)} hash lists")
        object.__setattr__(self, "block_hashes", tuple(self.block_hashes))

    def __len__(self) -> int:
        return len(self.input_tokens)


@dataclasses.dataclass(frozen=True, eq=False)
class Window:
    """One workload window.

    ``arrival_s`` starts at 0 and is non-decreasing; ``deadline_s`` is each request's SLO deadline on
    the same clock. ``time_scale`` records the compression already applied (1.0 for a frozen window);
    ``slo_multiplier`` the SLO definition the deadlines were built with. ``block_hashes``: a
    prefix-hashed source's prompt-block hash ids, one int64 array per request (``meta["block_tokens"]``
    prompt tokens a hash; see :mod:`portbench.engine.prefix`), or None where the source has none.
    ``history``: the trace's requests before the window (:class:`History`), for an engine model that
    starts with a warm prefix cache; None unless loaded (``store.load_window(..., history=True)``).
    """

    window_id: str
    source: str
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    predicted_output_tokens: np.ndarray
    deadline_s: np.ndarray
    slo_multiplier: float = BASE_SLO_MULTIPLIER
    time_scale: float = 1.0
    meta: Mapping = dataclasses.field(default_factory=dict)
    block_hashes: tuple | None = None
    history: History | None = None

    def __post_init__(self):
        n = len(self.arrival_s)
        if self.block_hashes is not None:
            if len(self.block_hashes) != n:
                raise ValueError(f"window {self.window_id}: block_hashes has {len(self.block_hashes)} "
                                 f"entries, arrival_s has {n}")
            if "block_tokens" not in self.meta:
                raise ValueError(f"window {self.window_id}: block_hashes without meta['block_tokens']")
            object.__setattr__(self, "block_hashes", tuple(self.block_hashes))
        for name in ("input_tokens", "output_tokens", "predicted_output_tokens", "deadline_s"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"window {self.window_id}: {name} has {len(getattr(self, name))} "
                                 f"entries, arrival_s has {n}")
        for name in ("arrival_s", "input_tokens", "output_tokens", "predicted_output_tokens", "deadline_s"):
            getattr(self, name).setflags(write=False)
        object.__setattr__(self, "meta", dict(self.meta))   # a copy: callers' dicts stay theirs

    def __repr__(self) -> str:
        return (f"Window({self.window_id!r}, source={self.source!r}, n_requests={len(self)}, "
                f"duration_s={self.duration_s:.6g}, time_scale={self.time_scale:.6g}, "
                f"slo_multiplier={self.slo_multiplier:g})")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def n_requests(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0


def slo_deadlines(arrival_s, input_tokens, predicted_output_tokens,
                  multiplier: float = BASE_SLO_MULTIPLIER) -> np.ndarray:
    """The study's SLO deadline of each request (uses the *predicted* output length)."""
    if not multiplier > 0:
        raise ValueError(f"SLO multiplier must be positive, got {multiplier!r}")
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    budget = multiplier * (PREFILL_S_PER_TOKEN * np.asarray(input_tokens, dtype=np.float64)
                           + DECODE_S_PER_TOKEN * np.asarray(predicted_output_tokens, dtype=np.float64))
    return arrival_s + budget


def make_window(window_id: str, source: str, arrival_s, input_tokens, output_tokens,
                predicted_output_tokens=None, *, slo_multiplier: float = BASE_SLO_MULTIPLIER,
                prediction_seed: int | None = None, meta: Mapping | None = None,
                block_hashes=None) -> Window:
    """Build a window from raw columns: validate, rebase arrivals to 0, add deadlines.

    Predicted lengths are synthesised (``synthesize_predictions``) when not given; that needs
    ``prediction_seed``. ``block_hashes``: see :class:`Window`.
    """
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    input_tokens = np.asarray(input_tokens, dtype=np.int64)
    output_tokens = np.asarray(output_tokens, dtype=np.int64)
    if len(arrival_s) == 0:
        raise ValueError(f"window {window_id}: no requests")
    if not np.all(np.isfinite(arrival_s)):
        raise ValueError(f"window {window_id}: non-finite arrival time")
    if np.any(np.diff(arrival_s) < 0):
        raise ValueError(f"window {window_id}: arrivals are not sorted")
    if np.any(input_tokens <= 0) or np.any(output_tokens <= 0):
        raise ValueError(f"window {window_id}: token counts must be positive")
    if predicted_output_tokens is None:
        if prediction_seed is None:
            raise ValueError(f"window {window_id}: no predicted output lengths and no prediction_seed")
        predicted_output_tokens = synthesize_predictions(output_tokens, seed=prediction_seed)
    predicted_output_tokens = np.asarray(predicted_output_tokens, dtype=np.int64)
    arrival_s = arrival_s - arrival_s[0]
    deadline_s = slo_deadlines(arrival_s, input_tokens, predicted_output_tokens, slo_multiplier)
    return Window(window_id, source, arrival_s, input_tokens, output_tokens, predicted_output_tokens,
                  deadline_s, slo_multiplier=float(slo_multiplier), meta=meta or {},
                  block_hashes=block_hashes)


def with_slo(window: Window, multiplier: float) -> Window:
    """The same window with deadlines rebuilt for another SLO multiplier (at its current scale)."""
    if window.time_scale != 1.0:
        # Deadlines at scale s are arrival + budget / s; rebuild at scale 1 and rescale.
        raise ValueError("with_slo() expects an unscaled window: apply scale() afterwards")
    deadline_s = slo_deadlines(window.arrival_s, window.input_tokens, window.predicted_output_tokens,
                               multiplier)
    return dataclasses.replace(window, deadline_s=deadline_s, slo_multiplier=float(multiplier))


def scale(window: Window, factor: float) -> Window:
    """Compress a window's time by ``factor``: gaps and SLO slack are both divided by it.

    The scaled arrivals accumulate the scaled gaps one by one from 0 (as the study's helper does),
    and each scaled deadline is the scaled arrival plus the request's slack divided by ``factor``.
    """
    factor = float(factor)
    if not (np.isfinite(factor) and factor > 0):
        raise ValueError(f"scale factor must be a positive finite number, got {factor!r}")
    gaps = np.maximum(np.diff(window.arrival_s), 0.0) / factor
    arrival_s = np.empty_like(window.arrival_s)
    arrival_s[0] = 0.0
    np.cumsum(gaps, out=arrival_s[1:])
    slack = np.maximum(window.deadline_s - window.arrival_s, 0.0)
    deadline_s = arrival_s + slack / factor
    return dataclasses.replace(window, arrival_s=arrival_s, deadline_s=deadline_s,
                               time_scale=window.time_scale * factor)


def synthesize_predictions(output_tokens, *, seed: int,
                           relative_error: float = PREDICTION_RELATIVE_ERROR) -> np.ndarray:
    """Seeded synthetic output-length predictions: true length times log-normal noise.

    The noise is exp(N(0, σ²)) with σ chosen so that its standard deviation relative to its mean is
    ``relative_error`` (σ² = ln(1 + e²)), without mean correction; predictions are rounded half to
    even and clipped to [1, 4096] tokens, as in the study.
    """
    if relative_error < 0:
        raise ValueError(f"relative_error must be >= 0, got {relative_error!r}")
    output_tokens = np.asarray(output_tokens, dtype=np.float64)
    sigma = np.sqrt(np.log1p(relative_error ** 2))
    rng = np.random.default_rng(seed)
    noise = np.exp(rng.normal(0.0, sigma, size=output_tokens.shape))
    return np.clip(np.rint(output_tokens * noise), 1, MAX_PREDICTED_OUTPUT_TOKENS).astype(np.int64)


def check_prediction_error(relative_error) -> float:
    """``relative_error`` as a float in [0, MAX_PREDICTION_RELATIVE_ERROR]; ValueError naming it otherwise."""
    try:
        value = float(relative_error)
    except (TypeError, ValueError):
        raise ValueError(f"prediction relative error must be a number, got {relative_error!r}") from None
    if isinstance(relative_error, bool) or not 0.0 <= value <= MAX_PREDICTION_RELATIVE_ERROR:
        raise ValueError(f"prediction relative error must be in [0, {MAX_PREDICTION_RELATIVE_ERROR:g}] "
                         f"(0.2 = the study's 20%), got {relative_error!r}")
    return value


def with_prediction_error(window: Window, relative_error: float, *, seed: int | None = None) -> Window:
    """The window with its predicted output lengths re-synthesised at ``relative_error``.

    The same seeded draw as the study's (:func:`synthesize_predictions` with the window's own
    ``synthesis_seed`` from its metadata, or ``seed``), only with another error level: at the
    study's 0.2 the window is returned unchanged (its frozen predictions, bit for bit), at 0 the
    predictions are the true lengths (clipped to [1, 4096] as the study clips). The same standard
    normal draws are scaled by σ = sqrt(ln(1 + e²)), so the levels are nested: each request's noise
    keeps its sign and only grows with the level.

    Deadlines are kept: an SLO is a property of the request (the study's deadline, built from its
    20% prediction), not of the predictor, so only what prediction-aware policies see changes.
    Apply :func:`with_slo` *before* this (it rebuilds deadlines from the predictions it finds);
    scaling commutes with it.
    """
    error = check_prediction_error(relative_error)
    if error == PREDICTION_RELATIVE_ERROR and seed is None:
        return window
    if seed is None:
        seed = window.meta.get("synthesis_seed")
        if seed is None or seed != seed:
            raise ValueError(f"window {window.window_id}: no synthesis_seed in its metadata to "
                             "re-synthesise predictions with; pass seed=")
    predicted = synthesize_predictions(window.output_tokens, seed=int(seed), relative_error=error)
    return dataclasses.replace(window, predicted_output_tokens=predicted,
                               meta={**window.meta, "prediction_relative_error": error})

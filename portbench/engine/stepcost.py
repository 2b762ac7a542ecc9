"""Every step-cost model of the engine models, its fit and its cross-validation, in one place.

A step-cost model times one engine step from its batch: :class:`StepCost` (linear in prefill tokens,
decoding sequences and context tokens, plus the inter-step gap; the ``vllm_v1`` model's own),
:class:`ShapedStepCost` (linear per batch shape), :class:`RichStepCost` (more terms, fitted by
median relative error) and :class:`ScaledStepCost` (another cost times a factor). They share one
interface: ``picoseconds()`` and ``fixed_s`` for the engine's nominal step, and, where a model times
each step itself, ``step_ps(step, start_ps, prefill, decodes, context, scheduled)``. Each has a
``fit`` on a real engine's step log (:func:`run_steps` reads one), and :func:`cross_validated_costs`
fits them with each window's fold held out.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import pandas as pd

PS = 10 ** 12          # picoseconds per second


@dataclasses.dataclass(frozen=True)
class StepCost:
    """Step time = fixed + per prefill token + per decoding sequence + per context token read (s),
    plus ``gap_s``: the engine's time between the end of one step and the start of the next (its own
    bookkeeping and the serving loop's), added to every step. The default gap of 0 leaves every
    simulation as it was without the term.

    A cost object may instead time each step itself: one with a method ``step_ps(step, start_ps,
    prefill, decodes, context, scheduled)`` (the step's index and start in picoseconds, its prefill
    tokens, decoding sequences, context tokens and scheduled requests; returns its time, gap included,
    in integer picoseconds) is asked at every step, and the engine then walks every step (no
    closed-form pure-decode or idle stretch). It still needs ``picoseconds()`` and ``fixed_s`` (the
    model's nominal step and quiet-step bound): :class:`ShapedStepCost` below, and
    :mod:`portbench.fidelity`'s replay of a real run's recorded step times."""

    fixed_s: float = 5.75e-3
    per_prefill_token_s: float = 17.3e-6
    per_decode_seq_s: float = 6.0e-6
    per_context_token_s: float = 0.0
    gap_s: float = 0.0

    def picoseconds(self) -> tuple[int, int, int, int, int]:
        """(fixed, per prefill token, per decoding sequence, per context token, gap) in integer ps."""
        return tuple(int(round(x * PS)) for x in (self.fixed_s, self.per_prefill_token_s,
                                                   self.per_decode_seq_s, self.per_context_token_s,
                                                   self.gap_s))

    #: Bins of the per-range fit error (left-closed edges; the last bin is open).
    PREFILL_BINS: ClassVar[tuple] = (0, 1, 129, 513, 1025, 2561)
    DECODE_BINS: ClassVar[tuple] = (0, 1, 9, 33, 129)

    @classmethod
    def fit(cls, profile, *, step="step_s", prefill="prefill_tokens", decode="decode_seqs",
            context="kv_context_tokens", gap="gap_s", by_range: bool = False):
        """Non-negative least squares on a step profile (one row per measured step).

        ``gap_s`` is the median of the profile's ``gap`` column where it has one (else 0).
        Returns the cost model and the fit's relative error (median |pred − obs| ÷ obs of the step
        time, gap excluded); with ``by_range=True`` also a table of that error by prefill-token bin
        and decoding-sequence bin (:attr:`PREFILL_BINS`, :attr:`DECODE_BINS`): columns
        ``prefill_bin, decode_bin, n, median_rel_error, median_step_s``.
        """
        from scipy.optimize import nnls

        x = np.column_stack([np.ones(len(profile)), profile[prefill], profile[decode],
                             profile[context] if context in profile else np.zeros(len(profile))])
        y = profile[step].to_numpy(dtype=float)
        coef, _ = nnls(x.astype(float), y)
        pred = x @ coef
        rel = np.abs(pred - y) / y
        gap_s = 0.0
        if gap in profile:
            gaps = profile[gap].to_numpy(dtype=float)
            gaps = gaps[np.isfinite(gaps)]
            gap_s = float(max(0.0, np.median(gaps))) if gaps.size else 0.0
        cost = cls(*map(float, coef), gap_s=gap_s)
        if not by_range:
            return cost, float(np.median(rel))

        def label(edges, values):
            names = [f"{a}" if b == a + 1 else f"{a}-{b - 1}" for a, b in zip(edges[:-1], edges[1:])]
            names.append(f">={edges[-1]}")
            idx = np.searchsorted(np.asarray(edges), np.asarray(values, dtype=float), side="right") - 1
            return [names[i] if i >= 0 else f"<{edges[0]}" for i in idx]

        frame = pd.DataFrame({"prefill_bin": label(cls.PREFILL_BINS, profile[prefill]),
                              "decode_bin": label(cls.DECODE_BINS, profile[decode]),
                              "rel_error": rel, "step_s": y})
        table = (frame.groupby(["prefill_bin", "decode_bin"], sort=False)
                 .agg(n=("rel_error", "size"), median_rel_error=("rel_error", "median"),
                      median_step_s=("step_s", "median")).reset_index())
        return cost, float(np.median(rel)), table


# --- the real engine's step log ------------------------------------------------------------------
#: The columns that name one real run (a window, a policy, a repetition).
RUN_KEYS = ["window_id", "policy", "repetition"]

#: Batch shapes of a step: prompt tokens only, one-token decodes only, or both in the same step.
SHAPES = ("prefill only", "decode only", "mixed")


def batch_shape(prefill, decode) -> np.ndarray:
    """Each step's batch shape (:data:`SHAPES`; "empty" when nothing was scheduled)."""
    p, d = np.asarray(prefill) > 0, np.asarray(decode) > 0
    return np.select([p & ~d, ~p & d, p & d], list(SHAPES), "empty")


def run_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The kept attempt's steps of each run, in order, with ``end_s`` (start + duration), ``busy``
    (the engine had unfinished requests after the step, so the next step followed at once),
    ``gap_s`` (the next step's start − this step's end, where busy) and ``shape``."""
    if "kept" in steps:
        steps = steps[steps["kept"].astype(bool)]
    missing = {"start_s", "duration_s", "prefill_tokens", "decode_seqs", "context_tokens",
               "scheduled_seqs", "running", "waiting"} - set(steps.columns)
    if missing:
        raise ValueError(f"step log lacks columns {sorted(missing)}")
    steps = steps.sort_values(RUN_KEYS + ["step"]).reset_index(drop=True)
    end = steps["start_s"] + steps["duration_s"]
    same = (steps[RUN_KEYS].shift(-1) == steps[RUN_KEYS]).all(axis=1)
    busy = same & (steps["running"] + steps["waiting"] > 0)
    nxt = steps["start_s"].shift(-1)
    return steps.assign(end_s=end, busy=busy, next_start_s=nxt.where(same),
                        gap_s=(nxt - end).where(busy),
                        shape=batch_shape(steps["prefill_tokens"], steps["decode_seqs"]))


def linear_step_ps(cost, prefill: int, decodes: int, context: int) -> int:
    """One step's time (ps, the gap included) by ``cost``'s linear coefficients
    (``cost.picoseconds()``), as the ``vllm_v1`` engine times a step without a per-step cost."""
    c0, cp, cd, cc, cg = cost.picoseconds()
    return c0 + cg + cp * prefill + cd * decodes + cc * context


def predicted_step_s(cost, prefill, decode, context) -> np.ndarray:
    """The cost model's step time (gap excluded) for batches given column by column."""
    return (cost.fixed_s + cost.per_prefill_token_s * np.asarray(prefill, dtype=float)
            + cost.per_decode_seq_s * np.asarray(decode, dtype=float)
            + cost.per_context_token_s * np.asarray(context, dtype=float))


def step_ratios(steps: pd.DataFrame, cost) -> pd.DataFrame:
    """Each run's **step ratio**: the median, over the steps of a real-engine case's step log, of the
    real step time ÷ ``cost``'s time for the same batch (about 1 when the engine ran at its profiled
    speed). Columns ``window_id, policy, repetition, step_ratio``; only the kept attempt's steps
    where the log says which (``kept``)."""
    if "kept" in steps:
        steps = steps[steps["kept"].astype(bool)]
    keys = ["window_id", "policy", "repetition"]
    ratio = steps["duration_s"] / predicted_step_s(cost, steps["prefill_tokens"], steps["decode_seqs"],
                                                  steps["context_tokens"])
    return steps.assign(step_ratio=ratio).groupby(keys)["step_ratio"].median().reset_index()


# --- the step cost, cross-validated by window -----------------------------------------------------
#: A step of at most this many tokens (prefill tokens + decoding sequences) is in the small-batch
#: range, where the cases run most of their steps.
SMALL_BATCH_TOKENS = 512


class ShapedStepCost:
    """A richer step cost: a separate non-negative linear fit (fixed + per prefill token + per
    decoding sequence + per context token) for each batch shape (:data:`SHAPES`), each fitted to
    the relative error (the linear :class:`StepCost` fits the absolute one,
    which the few long prefill steps dominate), plus the gap.
    The ``vllm_v1`` engine takes it through its per-step hook (``step_ps``); ``picoseconds()`` and
    ``fixed_s`` are the pooled linear fit's (``pooled``), for the model's nominal bounds."""

    def __init__(self, coef: dict, pooled, gap_s: float):

        missing = set(SHAPES) - set(coef)
        if missing:
            raise ValueError(f"ShapedStepCost needs coefficients for every shape; missing {sorted(missing)}")
        self.coef, self.pooled, self.gap_s = coef, pooled, gap_s
        self.fixed_s = pooled.fixed_s
        self._ps = {k: tuple(int(round(x * PS)) for x in v) for k, v in coef.items()}
        self._gap_ps = int(round(gap_s * PS))

    @classmethod
    def fit(cls, steps: pd.DataFrame):
        """Fit on a step log (``duration_s``, ``prefill_tokens``, ``decode_seqs``,
        ``context_tokens``, optionally ``gap_s``); a shape without steps takes the pooled fit."""
        from scipy.optimize import nnls

        pooled = fit_linear(steps)
        shape = batch_shape(steps["prefill_tokens"], steps["decode_seqs"])
        coef = {}
        for name in SHAPES:
            g = steps[shape == name]
            if len(g) < 8:
                coef[name] = (pooled.fixed_s, pooled.per_prefill_token_s, pooled.per_decode_seq_s,
                              pooled.per_context_token_s)
                continue
            x = np.column_stack([np.ones(len(g)), g["prefill_tokens"], g["decode_seqs"], g["context_tokens"]])
            y = g["duration_s"].to_numpy(dtype=float)
            # rows divided by the measured time: least squares of the *relative* error
            coef[name] = tuple(map(float, nnls(x.astype(float) / y[:, None], np.ones(len(y)))[0]))
        return cls(coef, pooled, pooled.gap_s)

    def predict(self, prefill, decode, context) -> np.ndarray:
        """Step time (s, gap excluded) of batches given column by column."""
        prefill, decode, context = (np.asarray(v, dtype=float) for v in (prefill, decode, context))
        shape = batch_shape(prefill, decode)
        out = np.full(len(prefill), np.nan)
        for name, (c0, cp, cd, cc) in self.coef.items():
            m = shape == name
            out[m] = c0 + cp * prefill[m] + cd * decode[m] + cc * context[m]
        return out

    def picoseconds(self):
        return self.pooled.picoseconds()

    def step_ps(self, step, start_ps, prefill, decodes, context, scheduled) -> int:
        name = "mixed" if prefill and decodes else "prefill only" if prefill else "decode only"
        c0, cp, cd, cc = self._ps[name]
        return c0 + self._gap_ps + cp * prefill + cd * decodes + cc * context


#: The terms of :class:`RichStepCost`, per batch shape: a fixed time, per prefill token, per
#: decoding sequence, per context token (attention reads of the tokens already computed) and per
#: unit of the prefill chunks' own attention (``prefill_tokens² ÷ (2 · prefill sequences)``: the
#: token pairs inside the chunks when the step's prefill tokens are split evenly over its prefilling
#: sequences).
RICH_TERMS = ("fixed", "prefill_tokens", "decode_seqs", "context_tokens", "prefill_attention")


def prefill_attention(prefill, decode, scheduled) -> np.ndarray:
    """The prefill chunks' own attention work of each step (token pairs, see :data:`RICH_TERMS`);
    ``scheduled``: the step's scheduled sequences (its prefilling ones: scheduled − decodes, at
    least 1 where it prefills)."""
    prefill = np.asarray(prefill, dtype=float)
    seqs = np.maximum(np.asarray(scheduled, dtype=float) - np.asarray(decode, dtype=float), 1.0)
    return prefill * prefill / (2.0 * seqs)


def rich_design(prefill, decode, context, scheduled) -> np.ndarray:
    prefill, decode, context = (np.asarray(v, dtype=float) for v in (prefill, decode, context))
    return np.column_stack([np.ones(len(prefill)), prefill, decode, context,
                            prefill_attention(prefill, decode, scheduled)])


def fit_median_relative(x: np.ndarray, y: np.ndarray, *, iterations: int = 30) -> np.ndarray:
    """Non-negative coefficients ``c`` that minimise the summed |x·c − y| ÷ y (least absolute
    relative error, so the fit aims at the median relative error and no few long steps dominate it),
    by iteratively reweighted non-negative least squares from the relative least-squares fit."""
    from scipy.optimize import nnls

    a = np.asarray(x, dtype=float) / np.asarray(y, dtype=float)[:, None]
    ones = np.ones(len(a))
    # columns that are zero throughout (a term a shape never has) keep a zero coefficient
    used = np.flatnonzero(np.abs(a).max(axis=0) > 0) if len(a) else np.arange(a.shape[1])
    c = np.zeros(a.shape[1])
    if not len(a):
        return c
    au = a[:, used]
    cu = nnls(au, ones)[0]
    for _ in range(iterations):
        w = np.sqrt(1.0 / np.maximum(np.abs(au @ cu - 1.0), 1e-3))
        cu = nnls(au * w[:, None], w)[0]
    c[used] = cu
    return c


class RichStepCost:
    """The richer step cost: for each batch shape (:data:`SHAPES`) its own non-negative
    coefficients for the terms of :data:`RICH_TERMS` — a fixed time per shape, prefill tokens,
    decoding sequences, context tokens and the prefill chunks' own attention — fitted to the least
    absolute *relative* error (:func:`fit_median_relative`), then (``match_total``, the default)
    scaled so that the shape's predicted steps add up to their measured total; plus the mean gap
    between busy steps. A shape with fewer than 8 steps takes the fit over every step.

    Why the total: a request's latency is a *sum* of step times, and a real step log is skewed to
    the right (most steps near the typical time, a few much slower: the host's jitter, the
    allocator, the scheduler's own work on a long queue). A fit aimed at the median step predicts
    the typical step well and every sum short — by 6–9% of the busy time on the committed CPU
    cases, which the queue then amplifies into latencies 12–15% short (median). The shape's relative terms
    come from the robust fit, its level from the total. Like
    :class:`ShapedStepCost`, the ``vllm_v1`` engine takes it through its per-step hook
    (``step_ps``, which knows the step's scheduled sequences); ``picoseconds()`` and ``fixed_s`` are
    the pooled linear fit's, for the model's nominal bounds."""

    def __init__(self, coef: dict, pooled, gap_s: float):

        missing = set(SHAPES) - set(coef)
        if missing:
            raise ValueError(f"RichStepCost needs coefficients for every shape; missing {sorted(missing)}")
        bad = {k: v for k, v in coef.items() if len(v) != len(RICH_TERMS)}
        if bad:
            raise ValueError(f"RichStepCost needs {len(RICH_TERMS)} coefficients {RICH_TERMS} per shape; "
                             f"got {bad}")
        self.coef = {k: tuple(map(float, v)) for k, v in coef.items()}
        self.pooled, self.gap_s = pooled, gap_s
        self.fixed_s = pooled.fixed_s
        self._gap_ps = int(round(gap_s * PS))
        self._ps = {k: tuple(x * PS for x in v) for k, v in self.coef.items()}

    @classmethod
    def fit(cls, steps: pd.DataFrame, *, match_total: bool = True):
        """Fit on a step log (``duration_s``, ``prefill_tokens``, ``decode_seqs``,
        ``context_tokens``, ``scheduled_seqs``, optionally ``gap_s``, as :func:`run_steps` gives
        them). ``match_total=False``: the robust fit alone (aimed at the
        median step; its totals fall short)."""
        pooled = fit_linear(steps)
        x = rich_design(steps["prefill_tokens"], steps["decode_seqs"], steps["context_tokens"],
                         steps["scheduled_seqs"])
        y = steps["duration_s"].to_numpy(dtype=float)
        shape = batch_shape(steps["prefill_tokens"], steps["decode_seqs"])
        everything = None
        coef = {}
        for name in SHAPES:
            m = shape == name
            if m.sum() < 8:
                m = np.ones(len(y), dtype=bool)
                if everything is None:
                    everything = fit_median_relative(x, y)
                c = everything
            else:
                c = fit_median_relative(x[m], y[m])
            if match_total:
                predicted = float((x[m] @ c).sum())
                c = c * (float(y[m].sum()) / predicted if predicted > 0 else 1.0)
            coef[name] = tuple(c)
        gap_s = pooled.gap_s
        if match_total and "gap_s" in steps:
            busy = steps["gap_s"].dropna()
            gap_s = float(busy.mean()) if len(busy) else gap_s
        return cls(coef, pooled, gap_s)

    def predict(self, prefill, decode, context, scheduled=None) -> np.ndarray:
        """Step time (s, gap excluded) of batches given column by column (``scheduled``: the steps'
        scheduled sequences; None: one prefilling sequence per prefilling step)."""
        prefill = np.asarray(prefill, dtype=float)
        decode = np.asarray(decode, dtype=float)
        if scheduled is None:
            scheduled = decode + (prefill > 0)
        x = rich_design(prefill, decode, context, scheduled)
        shape = batch_shape(prefill, decode)
        out = np.full(len(prefill), np.nan)
        for name, c in self.coef.items():
            m = shape == name
            out[m] = x[m] @ np.asarray(c)
        return out

    def table(self) -> pd.DataFrame:
        """The coefficients, a row per shape and a column per term (s per unit)."""
        return pd.DataFrame(self.coef, index=list(RICH_TERMS)).T.rename_axis("shape")

    def picoseconds(self):
        return self.pooled.picoseconds()

    def step_ps(self, step, start_ps, prefill, decodes, context, scheduled) -> int:
        name = "mixed" if prefill and decodes else "prefill only" if prefill else "decode only"
        c0, cp, cd, cc, ca = self._ps[name]
        attn = prefill * prefill / (2.0 * max(scheduled - decodes, 1)) if prefill else 0.0
        return max(1, int(round(c0 + cp * prefill + cd * decodes + cc * context + ca * attn))) + self._gap_ps


class ScaledStepCost:
    """Another per-step cost with every step's time (gap included) multiplied by ``factor``: the
    cost as it would run at a known speed level (a separate reading, not a prediction)."""

    def __init__(self, cost, factor: float):
        self.cost, self.factor = cost, float(factor)
        self.fixed_s = cost.fixed_s
        self.gap_s = getattr(cost, "gap_s", 0.0)

    def picoseconds(self):
        return self.cost.picoseconds()

    def step_ps(self, step, start_ps, prefill, decodes, context, scheduled) -> int:
        if hasattr(self.cost, "step_ps"):
            base = self.cost.step_ps(step, start_ps, prefill, decodes, context, scheduled)
        else:
            base = linear_step_ps(self.cost, prefill, decodes, context)
        return max(1, int(round(base * self.factor)))


def fit_linear(steps: pd.DataFrame):
    """:class:`StepCost` fitted to a real step log (gap: the median busy gap)."""

    cost, _ = StepCost.fit(steps, step="duration_s", context="context_tokens", gap="gap_s")
    return cost


def predict_step_s(cost, prefill, decode, context, scheduled=None) -> np.ndarray:
    """Any of the cost models' step time (s, gap excluded); ``scheduled`` (the steps' scheduled
    sequences) is used by :class:`RichStepCost` only."""
    if isinstance(cost, RichStepCost):
        return cost.predict(prefill, decode, context, scheduled)
    if hasattr(cost, "predict"):
        return cost.predict(prefill, decode, context)
    return predicted_step_s(cost, prefill, decode, context)


#: The step-cost models that can be cross-validated, by name: the linear
#: :class:`StepCost`, the per-shape :class:`ShapedStepCost`, the
#: :class:`RichStepCost` and, for comparison, its robust fit alone (``rich_median``: aimed at the
#: median step, its totals short).
COST_KINDS = {"linear": fit_linear, "shaped": ShapedStepCost.fit, "rich": RichStepCost.fit,
              "rich_median": lambda steps: RichStepCost.fit(steps, match_total=False)}


def window_folds(window_ids, sources, k: int = 4) -> dict:
    """window_id → fold (0..k-1): each source's windows dealt round-robin in name order, so every
    fold holds windows of every source."""
    if k < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, got k={k}")
    pairs = sorted(set(zip(sources, window_ids)))
    out, seen = {}, {}
    for src, w in pairs:
        out[w] = seen.get(src, 0) % k
        seen[src] = seen.get(src, 0) + 1
    return out


def cross_validated_costs(steps: pd.DataFrame, runs: pd.DataFrame, *, k: int = 4, kind: str = "linear",
                          by_policy: bool = True) -> dict:
    """(fold, policy) → cost model fitted on that policy's steps of the other folds' windows only
    (``kind``: one of :data:`COST_KINDS`); also ``"folds"``: window_id → fold.

    Each policy gets its own fit: a real step is the engine's whole ``step()``, and on the
    committed CPU cases batches of the same counts take longer in total under ``slai_faithful``'s
    port than under vLLM's own scheduler (one rich fit for both predicts ``slai_faithful``'s total
    1.6–2.8% short and ``vllm_faithful``'s 2.4–3.9% long; the ``schedule()`` time logged apart
    differs between them by at most 1% of the step time, and the rest is not in the step's counts).
    ``by_policy=False``: one fit over every policy's steps, the same for each policy."""
    if kind not in COST_KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, COST_KINDS))}, got {kind!r}")
    src = runs.groupby("window_id")["source"].first()
    folds = window_folds(src.index.tolist(), src.tolist(), k)
    steps = run_steps(steps)
    fold = steps["window_id"].map(folds)
    if fold.isna().any():
        raise ValueError(f"steps of windows without a run: {sorted(set(steps.loc[fold.isna(), 'window_id']))[:5]}")
    fit = COST_KINDS[kind]
    policies = sorted(set(steps["policy"]))
    if by_policy:
        out = {(f, p): fit(steps[(fold != f) & (steps["policy"] == p)]) for f in range(k) for p in policies}
    else:
        pooled = {f: fit(steps[fold != f]) for f in range(k)}
        out = {(f, p): pooled[f] for f in range(k) for p in policies}
    out["folds"] = folds
    return out


def cross_validated_step_error(steps: pd.DataFrame, runs: pd.DataFrame, *, k: int = 4,
                               kind: str = "linear", by_policy: bool = True) -> pd.DataFrame:
    """Every step's time predicted by the cost fitted on its policy's steps without its window's
    fold (:func:`cross_validated_costs`): the step log with
    ``predicted_s``, ``rel_error`` (|predicted − measured| ÷ measured), ``shape``, ``small``
    (at most :data:`SMALL_BATCH_TOKENS` batch tokens) and ``fold``."""
    costs = cross_validated_costs(steps, runs, k=k, kind=kind, by_policy=by_policy)
    steps = run_steps(steps)
    fold = steps["window_id"].map(costs["folds"]).to_numpy()
    pred = np.full(len(steps), np.nan)
    policy = steps["policy"].to_numpy()
    for f, p in (key for key in costs if key != "folds"):
        m = (fold == f) & (policy == p)
        pred[m] = predict_step_s(costs[(f, p)], steps.loc[m, "prefill_tokens"], steps.loc[m, "decode_seqs"],
                                 steps.loc[m, "context_tokens"], steps.loc[m, "scheduled_seqs"])
    rel = np.abs(pred - steps["duration_s"].to_numpy()) / steps["duration_s"].to_numpy()
    small = (steps["prefill_tokens"] + steps["decode_seqs"]) <= SMALL_BATCH_TOKENS
    return steps.assign(predicted_s=pred, rel_error=rel, small=small, fold=fold)


def step_error_table(errors: pd.DataFrame) -> pd.DataFrame:
    """Median and p90 relative step-time error and the step count, overall, in the small-batch
    range and per batch shape (rows), from :func:`cross_validated_step_error`."""
    groups = [("all steps", errors), (f"small batch (≤ {SMALL_BATCH_TOKENS} tokens)", errors[errors["small"]])]
    groups += [(s, errors[errors["shape"] == s]) for s in SHAPES]
    return pd.DataFrame([{"steps": name, "n": len(g), "median": float(g["rel_error"].median()),
                          "p90": float(g["rel_error"].quantile(0.9))} for name, g in groups]).set_index("steps")


# --- per-request latency with the cross-validated cost, and the stored counterpart ---------------
def run_speed_factors(steps: pd.DataFrame, runs: pd.DataFrame, *, k: int = 4, kind: str = "rich") -> pd.DataFrame:
    """Each run's own speed level against the cross-validated cost: the measured total of the
    run's decode-only steps ÷ the total the cost fitted without its window's fold predicts for them
    (1: the run ran at the cost's speed; a total, as the cost is matched to totals). It reads the
    run's *own measured steps*, so a counterpart scaled by it (:func:`counterpart_requests` with
    ``speed_known``) is not a prediction: it separates the host's speed drift between runs from the
    model's error. Columns: the run's keys and ``speed_factor``."""
    err = cross_validated_step_error(steps, runs, k=k, kind=kind)
    dec = err[err["shape"] == "decode only"]
    total = dec.groupby(RUN_KEYS)[["duration_s", "predicted_s"]].sum()
    return (total["duration_s"] / total["predicted_s"]).rename("speed_factor").reset_index()

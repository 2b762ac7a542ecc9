"""The simulator in a real run's configuration: the same windows, load, limits and client.

The `lssp` campaign predicts the study's case under the study's *simulated* rules (its budget,
its SLO and load calibration). A real run differs in configuration: in the study's real-system
configuration (:data:`portbench.realengine.vllm_backend.STUDY_ENGINE`) both policies ran with a
32,768-token budget and ``max_model_len``, 256 sequences, and a load generator of 32 client threads,
so at most 32 requests were in flight and a due request waited for a free thread (its deadline
still counting from its trace arrival). :func:`predict_runs` simulates exactly that, per real run:
the `vllm_v1` engine model with the case's cross-validated step cost, the run's window at the run's
load (its real λ_ref × the region's factor), its limits, and the client's cap
(:func:`capped_submissions`).

The cap is the client's, not the engine's, so it is applied around the engine model rather than
inside it: with 32 workers taking requests in arrival order, request *i* is submitted when it is due
and a worker is free, and a worker frees when its request finishes — which depends on when the
requests were submitted. :func:`capped_submissions` finds the submission times as a fixed point:
simulate, recompute every submission from the finishes, simulate again, until the submissions no
longer change. A fixed point is a trajectory of the capped system (the engine model is causal and
deterministic); one not reached in ``max_iterations`` is an error.

Chunked prefill is off there, as in the real engine (``VllmV1Model(enable_chunked_prefill=False)``):
a waiting prompt that does not fit the step's budget left stops admission. (Before the model had
that rule it chunked prompts to the budget; :func:`budget_exposure` counts the windows where that
could matter: those with ``max_in_flight`` consecutive prompts adding up to more than the budget.)
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np
import pandas as pd

from . import fidelity
from .engine import simulate
from .engine.vllm_v1 import VllmV1Model
from .metrics import cell_metrics
from .workload import Window, scale

RUN_KEYS = ["window_id", "policy", "repetition"]

#: The study's real-system configuration in the engine model's terms: the limits of
#: :data:`portbench.realengine.vllm_backend.STUDY_ENGINE` (32,768-token budget and ``max_model_len``,
#: 256 sequences, 32 in flight), and each policy's own budget raised to the engine's, as the real
#: ports ran (``vllm_faithful``'s whole-prompt admission budget; SLAI's plugin takes the engine's
#: ``max_num_scheduled_tokens``, its decode limit stays 128).
STUDY_CONFIG = {"budget": 32768, "seqs": 256, "max_model_len": 32768, "max_in_flight": 32,
                "enable_chunked_prefill": False,
                "policy_params": {"vllm_faithful": {"max_num_batched_tokens": 32768, "max_num_seqs": 256},
                                  "slai_faithful": {"token_budget": 32768, "max_num_seqs": 256}}}


def capped_submissions(arrival_s: np.ndarray, finish_s: np.ndarray, max_in_flight: int) -> np.ndarray:
    """When each request reaches the engine from a pool of ``max_in_flight`` workers that take the
    requests in arrival order: request *i* starts at its arrival or when a worker frees (the
    earliest finish of the requests the workers hold), whichever is later. ``finish_s``: each
    request's finish (NaN: never served, which frees its worker at once)."""
    cap = int(max_in_flight)
    if cap < 1:
        raise ValueError(f"max_in_flight must be >= 1 (got {max_in_flight})")
    free = [0.0] * cap
    heapq.heapify(free)
    submit = np.empty(len(arrival_s))
    for i, (a, f) in enumerate(zip(np.asarray(arrival_s, dtype=float), np.asarray(finish_s, dtype=float))):
        start = max(a, heapq.heappop(free))
        submit[i] = start
        heapq.heappush(free, f if np.isfinite(f) and f > start else start)
    return submit


def run_capped(window: Window, simulate, max_in_flight: int | None, *, max_iterations: int = 200,
               tol_s: float = 1e-9):
    """``simulate(window)`` (a RunResult) with at most ``max_in_flight`` requests in flight
    (:func:`capped_submissions`, iterated to its fixed point). Returns ``(RunResult, submit_s,
    iterations)``: the result on the trace's clock (arrivals and deadlines as in ``window``), each
    request's submission, and the iterations taken (1: the cap never bound)."""
    if max_in_flight is None:
        return simulate(window), window.arrival_s.copy(), 1
    submit = window.arrival_s.astype(float).copy()
    for k in range(1, max_iterations + 1):
        result = simulate(dataclasses.replace(window, arrival_s=submit))
        nxt = capped_submissions(window.arrival_s, result.finish_s, max_in_flight)
        if np.allclose(nxt, submit, rtol=0, atol=tol_s):
            return (dataclasses.replace(result, arrival_s=window.arrival_s.copy()), submit, k)
        submit = nxt
    raise RuntimeError(f"window {window.window_id}: the in-flight cap's submissions did not settle in "
                       f"{max_iterations} iterations")


def simulate_configured(window: Window, policy: str, cost, *, budget: int, seqs: int, max_model_len=None,
                        max_in_flight: int | None = None, policy_params: dict | None = None,
                        kv_tokens: int = 500_000, enable_chunked_prefill: bool = True):
    """One `vllm_v1` run of ``policy`` on ``window`` (already scaled) with the given token budget,
    sequence cap, ``max_model_len`` (the real refusal rule), client cap, chunked prefill on or off
    and the policy's own parameters (``policy_params``: {policy: keyword arguments}, over the
    fidelity chapter's defaults). Returns ``(RunResult, refused mask, submit_s, iterations)``."""
    from .policies import make_policy

    refused = fidelity.real_refused(window, max_model_len)
    model = VllmV1Model(max_num_batched_tokens=int(budget), max_active_sequences=int(seqs),
                        max_kv_tokens=kv_tokens, cost=cost, enable_chunked_prefill=enable_chunked_prefill)
    params = {**fidelity.REAL_COUNTERPARTS.get(policy, {}).get("params", {}),
              **(policy_params or {}).get(policy, {})}
    result, submit, iterations = run_capped(
        fidelity.served_part(window, refused), lambda w: simulate(w, make_policy(policy, **params), model),
        max_in_flight)
    submit_full = np.full(len(window), np.nan)
    submit_full[~refused] = submit
    return fidelity.on_full_window(window, result, refused), refused, submit_full, iterations


def predict_runs(runs: pd.DataFrame, steps: pd.DataFrame, windows: dict, *, budget: int, seqs: int,
                 max_model_len=None, max_in_flight: int | None = None, policy_params: dict | None = None,
                 enable_chunked_prefill: bool = True, k: int = 4, kind: str = "rich",
                 only=None) -> pd.DataFrame:
    """The simulator's prediction for every (window, policy) of a real case, in the case's own
    configuration: each window at the runs' load factor, the `vllm_v1` model with the cost fitted
    (``kind``, per policy) on the case's steps in the other folds of windows
    (:func:`portbench.fidelity.cross_validated_costs`), the given limits and client cap. One row
    per (source, window, policy): ``load_factor``, ``iterations`` (of the cap's fixed point),
    ``n_refused`` and every metric of :func:`portbench.metrics.cell_metrics`. ``only``: predict these
    windows alone (the costs are still fitted on every window).

    The costs are fitted on as many runs of each (window, policy) as the fewest any has (its
    lowest-numbered repetitions, :func:`balanced_runs`): a case that adds repetitions to one source
    to settle its interval would otherwise weigh that source's steps more in every other source's
    cost, and the prediction for a window would move with how often the other windows were run."""
    fit_runs = balanced_runs(runs)
    keys = ["window_id", "policy", "repetition"]
    fit_steps = steps.merge(fit_runs[keys], on=keys, how="inner")
    costs = fidelity.cross_validated_costs(fit_steps, fit_runs, k=k, kind=kind, by_policy=True)
    rows = []
    for (src, wid, pol), g in runs.groupby(["source", "window_id", "policy"]):
        if only is not None and wid not in only:
            continue
        load = float(g["load_factor"].iloc[0])
        w = scale(windows[wid], load)
        cost = costs[(costs["folds"][wid], pol)]
        result, refused, _, iterations = simulate_configured(
            w, pol, cost, budget=budget, seqs=seqs, max_model_len=max_model_len, max_in_flight=max_in_flight,
            policy_params=policy_params, enable_chunked_prefill=enable_chunked_prefill)
        rows.append({"source": src, "window_id": wid, "policy": pol, "load_factor": load,
                     "iterations": iterations, "n_refused": int(refused.sum()),
                     **cell_metrics(result)})
    return pd.DataFrame(rows)


def balanced_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with as many runs of each (window, policy) as the fewest any has: the ones with the
    lowest repetition numbers."""
    order = runs.groupby(["window_id", "policy"])["repetition"].rank(method="first")
    fewest = int(runs.groupby(["window_id", "policy"]).size().min())
    return runs[order <= fewest]


def budget_exposure(windows, budget: int, max_in_flight: int) -> int:
    """How many of ``windows`` have ``max_in_flight`` consecutive requests whose prompts add up to more
    than ``budget`` tokens: only there can a model that chunks prompts and an engine that admits
    whole prompts part at the budget."""
    n = 0
    for w in windows:
        tokens = np.asarray(w.input_tokens, dtype=np.int64)
        k = min(int(max_in_flight), len(tokens))
        sums = np.convolve(tokens, np.ones(k, dtype=np.int64), mode="valid")
        n += bool(len(sums) and sums.max() > int(budget))
    return n


def repetition_resampled_delta(runs: pd.DataFrame, *, policies=("slai_faithful", "vllm_faithful"),
                               metric: str = "anwg", n_resamples: int = 2000, seed: int = 0,
                               paired: bool = True) -> pd.DataFrame:
    """Per source, the mean ``policies[0] − policies[1]`` over windows, with a 95% bootstrap interval
    that resamples both the windows and, within each drawn window, its repetitions: the interval then
    carries the run-to-run noise as well as the spread between windows.

    ``paired`` (the case's design): a window's repetition is a pair, the two policies' runs of the
    same window and repetition, which the case runs back to back (:func:`portbench.realengine.study.
    run_case` plans repetition, then window, then policy), so that both meet the host's speed of the
    same minutes; the pairs are drawn with replacement, and a repetition that lacks one policy's run
    is left out. Unpaired, each policy's repetitions are drawn apart, as if the two runs of a
    repetition had nothing in common: the host's swings between repetitions then count as noise in
    the difference. Columns ``source, n_windows, repetitions`` (the fewest of a window: pairs, or
    runs of one policy), ``repetitions_max``, ``delta, ci_low, ci_high, half_width``, and
    ``pair_corr`` (paired: the correlation of the two policies' values over the pairs, windows
    pooled after their own means are taken out)."""
    rng = np.random.default_rng(seed)
    a, b = policies
    rows = []
    for src, g in runs.groupby("source"):
        per, counts, centred = {}, [], []
        for wid, gw in g.groupby("window_id"):
            if paired:
                both = gw.pivot_table(index="repetition", columns="policy", values=metric, aggfunc="first")
                if a not in both or b not in both:
                    continue
                both = both[[a, b]].dropna()
                if not len(both):
                    continue
                per[wid] = [(+1, both[a].to_numpy(dtype=float) - both[b].to_numpy(dtype=float))]
                counts.append(len(both))
                centred.append((both - both.mean()).to_numpy(dtype=float))
            else:
                xa = gw.loc[gw["policy"] == a, metric].to_numpy(dtype=float)
                xb = gw.loc[gw["policy"] == b, metric].to_numpy(dtype=float)
                if len(xa) and len(xb):
                    per[wid] = [(+1, xa), (-1, xb)]
                    counts += [len(xa), len(xb)]
        if not per:
            continue
        keys = list(per)
        # per window: (sign, values) whose signed means add up to its difference
        point = float(np.mean([sum(sign * x.mean() for sign, x in per[w]) for w in keys]))
        draws = np.empty(n_resamples)
        for i in range(n_resamples):
            total = 0.0
            for j in rng.integers(0, len(keys), len(keys)):
                for sign, x in per[keys[j]]:
                    total += sign * x[rng.integers(0, len(x), len(x))].mean()
            draws[i] = total / len(keys)
        lo, hi = np.percentile(draws, [2.5, 97.5])
        corr = np.nan
        if paired:
            c = np.vstack(centred)
            if len(c) > 2 and c.std(axis=0).min() > 0:
                corr = float(np.corrcoef(c[:, 0], c[:, 1])[0, 1])
        rows.append({"source": src, "n_windows": len(keys), "repetitions": int(min(counts)),
                     "repetitions_max": int(max(counts)), "delta": point,
                     "ci_low": float(lo), "ci_high": float(hi), "half_width": float((hi - lo) / 2),
                     "pair_corr": corr})
    return pd.DataFrame(rows)

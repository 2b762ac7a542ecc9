"""The schedule comparison: a real run replayed in the ``vllm_v1`` model with its own recorded step
times (:class:`ReplayedStepTimes`), compared step by step and request by request, and every
disagreement classed.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..workload import scale
from .cases import RUN_KEYS, run_rows, run_steps
from .counterpart import REAL_COUNTERPARTS, run_limits, simulate_counterpart
from .slai_clock import measured_clock_slai, slai_measured_step_s
from ..engine.stepcost import PS, linear_step_ps


# --- replayed cost: the k-th simulated step takes as long as the real k-th step did --------------
class ReplayedStepTimes:
    """A step cost for :class:`portbench.engine.VllmV1Model` that replays one real run's step
    times: step ``k`` ends where the real step ``k`` was followed by the real step ``k + 1`` (its
    start), or at the real step's end where the real engine then waited for an arrival; so each
    simulated step starts when the real one did, whatever the batch. Steps beyond the real run's
    last are timed by ``fallback`` (a :class:`~portbench.engine.StepCost`); ``beyond`` counts them.
    Every step's batch is logged (:meth:`log`): its counts always, and which requests ran with how
    many tokens when :meth:`attach` has given it the engine (``simulate_counterpart(on_engine=
    replay.attach)``)."""

    def __init__(self, run_steps_frame: pd.DataFrame, fallback):

        frame = run_steps_frame.sort_values("step")
        if len(frame) and not (frame["step"].to_numpy() == np.arange(len(frame))).all():
            raise ValueError("a run's step log must number its steps 0, 1, 2, ... without gaps")
        self.fallback = fallback
        self.fixed_s = fallback.fixed_s
        target = np.where(frame["busy"].to_numpy(dtype=bool), frame["next_start_s"].to_numpy(),
                          frame["end_s"].to_numpy())
        self._target_ps = np.round(target * PS).astype(np.int64).tolist()
        self._rows: list[tuple] = []
        self.beyond = 0
        self._engine, self._index = None, None

    def attach(self, engine, index) -> None:
        """Log each step's batch from ``engine`` (a ``vllm_v1`` engine about to run; read only: its
        batch table at the moment the step is timed) with ``index`` (the engine's request id → the
        window's request index)."""
        self._engine, self._index = engine, np.asarray(index, dtype=np.int64)

    def picoseconds(self):
        return self.fallback.picoseconds()

    def step_ps(self, step, start_ps, prefill, decodes, context, scheduled) -> int:
        if step < len(self._target_ps):
            dur = max(1, self._target_ps[step] - start_ps)
        else:
            dur = linear_step_ps(self.fallback, prefill, decodes, context)
            self.beyond += 1
        batch = None
        if self._engine is not None:
            rows = self._engine._sched[:scheduled].tolist()
            batch = {int(self._index[i]): int(n) for i, n in rows}
        self._rows.append((step, start_ps, start_ps + dur, prefill, decodes, context, scheduled, batch))
        return dur

    def log(self) -> pd.DataFrame:
        """The simulated steps: ``step, start_ps, end_ps, prefill_tokens, decode_seqs,
        context_tokens, scheduled_seqs, batch`` (``{request index: tokens}``; None unless attached)."""
        return pd.DataFrame(self._rows, columns=["step", "start_ps", "end_ps", "prefill_tokens", "decode_seqs",
                                                 "context_tokens", "scheduled_seqs", "batch"])


def _step_index(times, edges, *, tol: float = 1e-7) -> np.ndarray:
    """For each time (s) the index of the step edge (sorted step starts or ends, s) within ``tol``
    of it; -1 where none is (and for NaN)."""
    times, edges = np.asarray(times, dtype=float), np.asarray(edges, dtype=float)
    out = np.full(len(times), -1, dtype=np.int64)
    if not len(edges):
        return out
    j = np.searchsorted(edges, times)
    for cand in (np.clip(j - 1, 0, len(edges) - 1), np.clip(j, 0, len(edges) - 1)):
        hit = (out < 0) & (np.abs(edges[cand] - times) <= tol)
        out[hit] = cand[hit]
    return out


def request_steps(admit_s, first_s, finish_s, starts, ends) -> pd.DataFrame:
    """Each request's step of admission (the step starting at its admission time; one admitted
    and finished between two reads of the running queue carries its first token's time, the end of
    that step), of its first token and of its finish (the steps ending then); -1: never."""
    admit = _step_index(admit_s, starts)
    at_end = _step_index(admit_s, ends)
    admit = np.where(admit < 0, at_end, admit)
    return pd.DataFrame({"admit_step": admit, "first_step": _step_index(first_s, ends),
                         "finish_step": _step_index(finish_s, ends)})


#: What a step of the replayed-cost comparison compares, real against simulated.
STEP_FIELDS = ("scheduled_seqs", "prefill_tokens", "decode_seqs")
#: What a request of it compares: the step of its admission, of its first token and of its finish.
REQUEST_FIELDS = ("admit_step", "first_step", "finish_step")

#: The classes of a disagreement (an *episode*: consecutive steps that disagree, named by its first).
RACE = "arrival racing a step"
SLAI_CLOCK = "SLAI's critical-decode clock"
LENGTH = "one schedule runs longer"
SAME_SHAPE = "same batch shapes, other requests"
DOWNSTREAM = "downstream of an earlier disagreement"
LAST_PROMPT_TOKEN = "SLAI holds a prompt's last token"
ID_TIE = "a tie broken by the request id's text"
OTHER = "unexplained"
DISAGREEMENT_CLASSES = {
    RACE: "a request reached the two engines at different steps: the real serving loop reads its clock "
          "once, submits what has arrived by then and starts the step a little later, so a request "
          "arriving in between waits for the next step there, while the model, whose step starts at "
          "the real step's start, counts it (where the requests log has submit_step, the step "
          "each request was submitted before, this is read from the log; else inferred from an "
          "arrival between the real step before and this one)",
    SLAI_CLOCK: "the two SLAIs serve a different number of decodes: the real scheduler counts Θ in a "
                "moving average of its measured step interval (starting from 1 ms), the study's policy "
                "in a fixed 1 ms, so a decoder turns critical at another step (the replay gives the "
                "model the real scheduler's measured step length by default, slai_clock='measured')",
    LENGTH: "the schedules agree on every step both ran, but one ran more steps",
    LAST_PROMPT_TOKEN: "a request with one prompt token left to compute ran it on one side only: the real "
                       "SLAI scheduler (portbench.realengine.vllm_slai_scheduler) counts a running request "
                       "with at most one token left to compute as a decode, so a prompt's last one-token "
                       "chunk gets a decode's fresh LST and is held like a non-critical decode when "
                       "admissions take the budget; the model's SLAI finishes the prompt as an in-flight "
                       "prefill chunk, before admissions (read from both steps' batches; where the "
                       "real step log lacks them, inferred: the model ran one more request, a one-token "
                       "chunk completing its prompt, with the same prefill tokens and decodes)",
    ID_TIE: "the batches differ only by requests of the same prompt length and the same arrival: the "
            "real engine's priority queue breaks the tie by the request id as text (the port's ids "
            "r<k>-<index>-<hex>, so index 10 comes before 9), the model by the index (read from both "
            "steps' batches)",
    SAME_SHAPE: "the steps have the same batch shape (scheduled sequences, prefill tokens, decodes), "
                "yet other requests ran (where both steps' batches are logged), or a request was "
                "admitted, started or finished at another step",
    DOWNSTREAM: "a request was already admitted, started or finished at another step before this "
                "episode began: the two engines no longer hold the same requests, so the episode "
                "follows from an earlier one",
    OTHER: "none of the above",
}


def _episodes(equal: np.ndarray) -> list[tuple[int, int]]:
    """(first, last + 1) of each run of False in ``equal``."""
    bad = np.flatnonzero(~equal)
    if not len(bad):
        return []
    cuts = np.flatnonzero(np.diff(bad) > 1)
    starts = np.r_[bad[0], bad[cuts + 1]]
    ends = np.r_[bad[cuts] + 1, bad[-1] + 1]
    return list(zip(starts.tolist(), ends.tolist()))


def raced(k: int, real_visible, sim_visible, served) -> np.ndarray:
    """The served requests that step ``k`` could schedule on one engine and not on the other:
    ``real_visible`` is each request's first step the real engine could schedule it (the requests
    log's ``submit_step``; -1: never submitted), ``sim_visible`` the model's (its first step
    starting at or after the arrival). Returns their window indices."""
    rv, sv = np.asarray(real_visible, dtype=np.int64), np.asarray(sim_visible, dtype=np.int64)
    ok = np.asarray(served, dtype=bool) & (rv >= 0) & (sv >= 0)
    lo, hi = np.minimum(rv, sv), np.maximum(rv, sv)
    return np.flatnonzero(ok & (lo <= k) & (k < hi))


def _batch_rule(k: int, policy: str, real: pd.DataFrame, sim: pd.DataFrame, arrival_s, input_tokens) -> str:
    """:data:`LAST_PROMPT_TOKEN` or :data:`ID_TIE` where step ``k``'s logged batches show it, else ""."""
    if input_tokens is None or "batch" not in sim or sim["batch"].iloc[k] is None:
        return ""
    sb = sim["batch"].iloc[k]
    rb = real["batch"].iloc[k] if "batch" in real else None
    if rb is None:
        # only the model's batch is known (a step log without ``scheduled``): the model ran one more
        # request, a one-token chunk that completes its prompt, and otherwise the same counts
        if policy != "slai_faithful":
            return ""
        counts = [(int(real[f].iloc[k]), int(sim[f].iloc[k])) for f in STEP_FIELDS]
        if counts[0][1] != counts[0][0] + 1 or counts[1][0] != counts[1][1] or counts[2][0] != counts[2][1]:
            return ""
        inp = np.asarray(input_tokens)
        for i, n in sb.items():
            if n == 1 and sum(b.get(i, 0) for b in sim["batch"].iloc[:k]) == int(inp[i]) - 1:
                return LAST_PROMPT_TOKEN
        return ""
    diff = [i for i in set(rb) | set(sb) if rb.get(i, 0) != sb.get(i, 0) and isinstance(i, (int, np.integer))]
    if not diff:
        return ""
    inp = np.asarray(input_tokens)
    if policy == "slai_faithful":
        for i in diff:
            if {rb.get(i, 0), sb.get(i, 0)} == {0, 1}:
                done = sum(b.get(i, 0) for b in real["batch"].iloc[:k])
                if done == int(inp[i]) - 1:
                    return LAST_PROMPT_TOKEN
    arr = np.asarray(arrival_s)
    if (sorted(rb.values()) == sorted(sb.values()) and len({(int(inp[i]), float(arr[i])) for i in diff}) == 1):
        return ID_TIE
    return ""


def classify_episode(k: int, policy: str, real: pd.DataFrame, sim: pd.DataFrame, arrival_s,
                     served, *, real_visible=None, sim_visible=None, input_tokens=None) -> str:
    """The class (:data:`DISAGREEMENT_CLASSES`) of an episode of disagreeing steps starting at
    step ``k`` (both schedules ran it): a race when a served request could be scheduled at step
    ``k`` on one engine and not on the other — read from ``real_visible``/``sim_visible`` where
    given (:func:`raced`), else inferred from an arrival between the real previous step's end and
    step ``k``'s start; where both steps' batches are logged (``batch``) and ``input_tokens`` given,
    the two rules they show (:data:`LAST_PROMPT_TOKEN`, :data:`ID_TIE`); SLAI's clock when the
    decode counts differ under ``slai_faithful``; the same shapes when the counts agree (so the
    batches' requests differ); else unexplained."""
    if real_visible is not None and sim_visible is not None:
        if len(raced(k, real_visible, sim_visible, served)):
            return RACE
    else:
        start = real["start_s"].iloc[k]
        before = real["end_s"].iloc[k - 1] if k > 0 else start - 1e-3
        a = np.asarray(arrival_s)[np.asarray(served, dtype=bool)]
        if ((a > before) & (a <= start)).any():
            return RACE
    rule = _batch_rule(k, policy, real, sim, arrival_s, input_tokens)
    if rule:
        return rule
    if policy == "slai_faithful" and real["decode_seqs"].iloc[k] != sim["decode_seqs"].iloc[k]:
        return SLAI_CLOCK
    fields = list(STEP_FIELDS)
    if set(fields) <= set(real) & set(sim) and (real[fields].iloc[k].to_numpy() == sim[fields].iloc[k].to_numpy()).all():
        return SAME_SHAPE
    return OTHER


def real_batches(steps: pd.DataFrame):
    """Each logged step's batch, ``{request index: tokens}`` (the step log's ``scheduled``,
    :func:`portbench.realengine.vllm_backend.parse_scheduled`); None where the log has no
    ``scheduled`` column (logs written before 2026-12)."""
    from ..realengine.vllm_backend import parse_scheduled

    if "scheduled" not in steps:
        return None
    return [{(int(k) if k.isdigit() else k): n for k, n in parse_scheduled(t).items()}
            for t in steps["scheduled"].tolist()]


def compare_schedules(real_steps: pd.DataFrame, sim_steps: pd.DataFrame, real_req: pd.DataFrame,
                      sim_req: pd.DataFrame, *, policy: str, arrival_s, served, real_visible=None,
                      sim_visible=None, input_tokens=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One run's real and replayed-cost schedules, step by step and request by request.

    ``real_steps``/``sim_steps``: the steps in order (:data:`STEP_FIELDS`; the real ones also
    ``start_s``, ``end_s``; where both have a ``batch`` column of ``{request index: tokens}`` —
    :func:`real_batches`, :meth:`ReplayedStepTimes.log` — each step's exact set of requests and
    their tokens is compared too); ``real_req``/``sim_req``: :data:`REQUEST_FIELDS` per request (in
    window order); ``served``: the requests neither side refused; ``real_visible``/``sim_visible``
    (optional, per request): the first step each engine could schedule it, for the race class
    (:func:`raced`); ``input_tokens`` (optional, per request): the prompts, for the rules the
    batches show (:func:`classify_episode`). Returns (steps, requests): a row per step index of the longer schedule with
    ``agree_counts`` (the counts of :data:`STEP_FIELDS` agree), ``agree_batch`` (the exact batches
    agree; NaN where not logged on both sides), ``agree`` (both) and ``cls`` (the class of the
    episode it belongs to, "" where it agrees), and a row per served request with ``agree`` and
    ``cls``.
    """
    big = np.iinfo(np.int64).max
    served = np.asarray(served, dtype=bool)
    r = real_req[list(REQUEST_FIELDS)].to_numpy()[served]
    s = sim_req[list(REQUEST_FIELDS)].to_numpy()[served]
    agree = (r == s).all(axis=1)
    # each request's first step at which the two schedules treat it differently
    first_diff = np.where(r != s, np.minimum(np.where(r < 0, big, r), np.where(s < 0, big, s)), big).min(axis=1)
    n_real, n_sim = len(real_steps), len(sim_steps)
    n = min(n_real, n_sim)
    fields = list(STEP_FIELDS)
    counts = np.zeros(max(n_real, n_sim), dtype=bool)
    counts[:n] = (real_steps[fields].to_numpy()[:n] == sim_steps[fields].to_numpy()[:n]).all(axis=1)
    batch = np.full(len(counts), np.nan)
    equal = counts.copy()
    if "batch" in real_steps and "batch" in sim_steps:
        rb, sb = real_steps["batch"].tolist()[:n], sim_steps["batch"].tolist()[:n]
        if all(x is not None for x in rb) and all(x is not None for x in sb):
            same = np.array([a == b for a, b in zip(rb, sb)], dtype=bool)
            batch[:n] = same
            batch[n:] = 0.0
            equal[:n] &= same
    cls = np.full(len(equal), "", dtype=object)
    starts = []
    for a, b in _episodes(equal):
        if (first_diff < a).any():
            c = DOWNSTREAM
        elif a >= n:
            c = LENGTH
        else:
            c = classify_episode(a, policy, real_steps, sim_steps, arrival_s, served,
                                 real_visible=real_visible, sim_visible=sim_visible, input_tokens=input_tokens)
        cls[a:b] = c
        starts.append((a, c))
    steps = pd.DataFrame({"step": np.arange(len(equal)), "agree_counts": counts, "agree_batch": batch,
                          "agree": equal, "cls": cls})
    # a disagreeing request: the class of the last episode that started by its first differing step
    rcls = np.full(len(agree), "", dtype=object)
    for i in np.flatnonzero(~agree):
        named = [c for a, c in starts if a <= first_diff[i]]
        rcls[i] = named[-1] if named else SAME_SHAPE
    requests = pd.DataFrame({"request_index": np.flatnonzero(served), "agree": agree, "cls": rcls})
    return steps, requests


#: How the replayed-cost comparison sets each request's arrival in the model: "trace" (the window's
#: arrival, as the serving loop's schedule had it) or "submitted" (where the requests log has
#: ``submit_step``: the time that makes the model's first step able to schedule it the real one's,
#: :func:`submitted_arrivals` — the serving loop's clock read taken into the replay's configuration).
ARRIVALS = ("trace", "submitted")


def submitted_arrivals(arrival_s, submit_step, step_starts, *, eps_s: float = 1e-9) -> np.ndarray:
    """Arrival times that make the model's replay see each request first at the step the real
    engine did (``submit_step``, the requests log's: the index of the first step that could
    schedule it; -1 keeps the trace's arrival). The requests submitted before step ``s`` all arrive
    at the first of their trace arrivals, or just after step ``s − 1``'s start when that is later
    (the real loop read its clock after that step, so the model must not see them at it): the model,
    whose step ``s`` starts at the real step's start (or, after an idle engine, at the first
    arrival), then admits them at step ``s`` and not before. Arrival order is kept (ties in window
    order, as both engines break them)."""
    a = np.asarray(arrival_s, dtype=float)
    s = np.asarray(submit_step, dtype=np.int64)
    starts = np.asarray(step_starts, dtype=float)
    out = a.copy()
    for g in np.unique(s[s >= 0]):
        m = s == g
        t = float(a[m].min())
        if 1 <= g <= len(starts):
            t = max(t, float(starts[g - 1]) + eps_s)
        out[m] = t
    return out


def replay_run(run, requests: pd.DataFrame, steps: pd.DataFrame, windows: dict, fallback, *,
               kv_tokens: int = 500_000, slai_clock: str = "measured", arrivals: str = "trace") -> dict:
    """One real run (a row of the runs table) replayed with its own step times and compared
    (:func:`replayed_cost_comparison` does this for every run; ``steps``: :func:`run_steps`'s).
    Returns ``steps`` and ``requests`` (:func:`compare_schedules`), ``real_steps`` (with ``batch``
    where logged), ``sim_steps`` (:meth:`ReplayedStepTimes.log`), ``real_requests`` and
    ``sim_requests`` (:func:`request_steps`), ``real_visible``, ``sim_visible``, ``served``,
    ``arrival_s`` (the replay's) and ``result``."""

    rs = run_rows(steps, run).reset_index(drop=True)
    if not len(rs):
        raise ValueError(f"no steps logged for run {tuple(run[k] for k in RUN_KEYS)}")
    real = run_rows(requests, run).sort_values("request_index")
    replay = ReplayedStepTimes(rs, fallback)
    w = scale(windows[run["window_id"]], run["load_factor"])
    submit = real["submit_step"].to_numpy(dtype=np.int64) if "submit_step" in real else None
    if arrivals == "submitted":
        w = dataclasses.replace(w, arrival_s=submitted_arrivals(w.arrival_s, submit, rs["start_s"]))
    pol = None
    if run["policy"] == "slai_faithful" and slai_clock == "measured":
        pol = measured_clock_slai(slai_measured_step_s(rs), **REAL_COUNTERPARTS["slai_faithful"]["params"])
    result, refused = simulate_counterpart(w, run["policy"], replay, kv_tokens=kv_tokens,
                                           **run_limits(run), policy_obj=pol, on_engine=replay.attach)
    log = replay.log()
    batches = real_batches(rs)
    if batches is not None:
        rs = rs.assign(batch=batches)
    real_req = request_steps(real["admit_s"], real["first_token_s"], real["finish_s"], rs["start_s"], rs["end_s"])
    sim_req = request_steps(result.admit_s, result.first_token_s, result.finish_s,
                            log["start_ps"] / PS, log["end_ps"] / PS)
    served = ~refused
    if "refused" in real:
        served &= ~real["refused"].to_numpy(dtype=bool)
    sim_visible = None
    if submit is not None:
        sim_visible = np.searchsorted(log["start_ps"].to_numpy(), np.ceil(w.arrival_s * PS).astype(np.int64))
    st, rq = compare_schedules(rs, log, real_req, sim_req, policy=run["policy"], arrival_s=w.arrival_s,
                               served=served, real_visible=submit, sim_visible=sim_visible,
                               input_tokens=w.input_tokens)
    return {"steps": st, "requests": rq, "real_steps": rs, "sim_steps": log, "real_requests": real_req,
            "sim_requests": sim_req, "real_visible": submit, "sim_visible": sim_visible, "served": served,
            "arrival_s": w.arrival_s, "result": result}


def replayed_cost_comparison(runs: pd.DataFrame, requests: pd.DataFrame, steps: pd.DataFrame,
                             windows: dict, fallback, *, kv_tokens: int = 500_000,
                             slai_clock: str = "measured", arrivals: str = "trace"):
    """Every real run replayed in ``vllm_v1`` with its own recorded step times
    (:class:`ReplayedStepTimes`; ``fallback`` times steps past the real run's last) and compared
    with the real schedule (:func:`compare_schedules`), as the run ran: its ``max_model_len`` (the
    runs table's, where it has one) refuses the same requests on both sides. ``slai_clock``:
    "measured" runs ``slai_faithful`` with the step length the real scheduler measured at each step
    (:func:`measured_clock_slai`); "fixed" with the study's 1 ms. ``arrivals``: :data:`ARRIVALS`.

    Where the step log has ``scheduled`` (each step's batch), each step's exact set of requests and
    their tokens is compared as well as the counts; where the requests log has ``submit_step``, the
    race class is read from it (:func:`raced`).

    Returns (steps, requests, per_run): the step and request tables of every run (with the run's
    keys and ``source``), and per run the counts ``n_steps_real``, ``n_steps_sim``,
    ``steps_agree``, ``steps_agree_counts``, ``requests``, ``requests_agree`` and
    ``first_disagreement`` (step; -1: none).
    """
    if slai_clock not in ("measured", "fixed"):
        raise ValueError(f"slai_clock must be 'measured' or 'fixed', got {slai_clock!r}")
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {ARRIVALS}, got {arrivals!r}")
    if arrivals == "submitted" and "submit_step" not in requests:
        raise ValueError("arrivals='submitted' needs the requests log's submit_step")
    steps = run_steps(steps)
    step_frames, req_frames, per_run = [], [], []
    for _, run in runs.iterrows():
        if run["policy"] not in REAL_COUNTERPARTS:
            continue
        one = replay_run(run, requests, steps, windows, fallback, kv_tokens=kv_tokens, slai_clock=slai_clock,
                         arrivals=arrivals)
        st, rq, rs, log = one["steps"], one["requests"], one["real_steps"], one["sim_steps"]
        keys = {"source": run["source"], **{k: run[k] for k in RUN_KEYS}}
        step_frames.append(st.assign(**keys))
        req_frames.append(rq.assign(**keys))
        bad = np.flatnonzero(~st["agree"].to_numpy())
        per_run.append({**keys, "n_steps_real": len(rs), "n_steps_sim": len(log),
                        "steps_agree": int(st["agree"].sum()), "steps_agree_counts": int(st["agree_counts"].sum()),
                        "requests": len(rq), "requests_agree": int(rq["agree"].sum()),
                        "first_disagreement": int(bad[0]) if len(bad) else -1})
    return (pd.concat(step_frames, ignore_index=True), pd.concat(req_frames, ignore_index=True),
            pd.DataFrame(per_run))


def agreement_table(frame: pd.DataFrame, by=("policy",)) -> pd.DataFrame:
    """Share of ``agree`` rows of a step or request table, overall and ``by`` group, and each
    disagreement class's share of the rows (columns: the group, ``n``, ``agree``, one per class;
    for a step table whose batches were compared, also ``agree, counts only``: the share whose
    counts agree, whatever requests ran)."""
    by = list(by)
    groups = [("all", frame)] + ([(k if len(by) > 1 else k[0], g) for k, g in frame.groupby(by)] if by else [])
    rows = []
    for name, g in groups:
        row = {"group": name if isinstance(name, str) else " / ".join(map(str, name)), "n": len(g),
               "agree": float(g["agree"].mean())}
        if "agree_batch" in frame and frame["agree_batch"].notna().any():
            row["agree, counts only"] = float(g["agree_counts"].mean())
        for c in DISAGREEMENT_CLASSES:
            row[c] = float((g["cls"] == c).mean())
        rows.append(row)
    return pd.DataFrame(rows)


def class_counts(steps: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Each disagreement class (:data:`DISAGREEMENT_CLASSES`) counted three ways: the episodes it
    names (runs of consecutive disagreeing steps within a run), their steps, and the requests it
    names; from :func:`replayed_cost_comparison`'s step and request tables."""
    order = steps.sort_values(RUN_KEYS + ["step"])
    bad = ~order["agree"].to_numpy(dtype=bool)
    same_run = (order[RUN_KEYS].shift(1) == order[RUN_KEYS]).all(axis=1).to_numpy()
    prev_bad = np.r_[False, bad[:-1]] & same_run
    first = bad & ~prev_bad
    cls = order["cls"].to_numpy()
    rows = []
    for c in DISAGREEMENT_CLASSES:
        rows.append({"class": c, "episodes": int((first & (cls == c)).sum()), "steps": int((bad & (cls == c)).sum()),
                     "requests": int((requests["cls"] == c).sum())})
    return pd.DataFrame(rows).set_index("class")

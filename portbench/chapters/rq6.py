"""The RQ6 chapter's readings of the committed real-engine cases, beside the simulator's.

What the chapter reports, computed here so that the notebook only glues and draws: each case's
provenance line; the per-source ``slai_faithful − vllm_faithful`` ANWG differences on the real
engine, in the simulator (on the same windows and on all) and in the original study; the RQ2
reversal classifier on each; the refusals per policy; the conclusion sentence over every
configuration; the study's configuration simulated and measured (:func:`study_configuration`); each
case's simulated counterpart against it (:func:`own_configuration`); and the GPU run's readings. The
cases are read through :mod:`portbench.results` (:class:`Cases`).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd

from .. import present, results, stats, store
from ..book import pair_label, source_label
from ..realengine.study import CASE_POLICIES, CASE_REGION, CASE_SOURCES, case_deltas

#: The original study's reported GPU result (vLLM 0.27.1, Qwen2.5-0.5B, one A100; mean SLAI − vLLM
#: ANWG per source over 40 windows), typed from the study, for comparison only.
ORIGINAL = {"azure_llm_2024": -0.024, "burstgpt": -0.200, "bailian_qwen": -0.026}
ORIGINAL_ENGINE = "original: vLLM 0.27.1 on A100"
#: The campaign's base SLO multiplier, the one the real cases ran at.
BASE_SLO = 20.0


def original_result() -> pd.DataFrame:
    """The original study's GPU result as a table (``source``, ``delta``, ``engine``)."""
    return pd.DataFrame({"source": list(ORIGINAL), "delta": list(ORIGINAL.values()), "engine": ORIGINAL_ENGINE})


@dataclasses.dataclass(frozen=True)
class Cases:
    """The committed real-engine cases a chapter reads (by tag, the headline first), with or without
    the runs whose host probes drifted on every attempt (``exclude_host_flagged``)."""

    cases: dict
    exclude_host_flagged: bool = False

    @property
    def tags(self) -> list[str]:
        return list(self.cases)

    def __getitem__(self, tag: str) -> results.Case:
        return self.cases[tag]

    def runs(self, tag: str) -> pd.DataFrame:
        """A case's runs; without the host-flagged ones if ``exclude_host_flagged`` (repetitions of a
        window are averaged by the statistics downstream)."""
        runs = self.cases[tag].runs.copy()          # the caller's to change
        if self.exclude_host_flagged and "host_flagged" in runs:
            runs = runs[~runs["host_flagged"].astype(bool)]
        return runs


def open_cases(tags, *, exclude_host_flagged: bool = False, data_dir=None, **named) -> Cases:
    """The cases ``tags``; ``named``: parameters that name one of them (``equal_limits_run=tag``, or
    empty for none). ValueError naming a parameter whose case is not among ``tags``;
    FileNotFoundError naming the cases that have no runs, and the cases there are."""
    tags = list(tags)
    for name, tag in named.items():
        if tag and tag not in tags:
            raise ValueError(f"{name}: {tag!r} is not among real_engine_runs ({', '.join(tags)}); name one "
                             f"of them, or set {name} to empty")
    cases = {tag: results.Case(tag, data_dir) for tag in tags}
    missing = [c.path("runs").name for c in cases.values() if not c.has("runs")]
    if missing:
        raise FileNotFoundError(f"real_engine_runs: no {', '.join(missing)} in {results.realengine_dir(data_dir)}; "
                                f"there are {results.case_tags(data_dir)}")
    return Cases(cases, exclude_host_flagged)


def provenance_line(cases: Cases, tag: str) -> str:
    """One markdown bullet on case ``tag``: engine, host, model, windows, λ_ref search, date, guard."""
    meta = cases[tag].meta
    if meta is None:
        return f"- **{present.label(tag)}** (`{tag}`): no provenance file"
    env, case = meta.get("environment", {}), meta.get("case", {})
    shape = env.get("model_shape", {})
    model = (f"a random-weight {shape.get('n_layers')}-layer, {shape.get('hidden_size')}-wide Llama "
             f"({shape.get('dtype')})" if shape else "model not recorded")
    return (f"- **{present.label(tag)}** (`{tag}`): {env.get('engine', meta.get('backend', '?'))} {env.get('engine_version', '')} "
            f"on {env.get('device', '?')}, {model}; {case.get('n_per_source', '?')} windows per source "
            f"({', '.join(source_label(s) for s in case.get('sources', []))}) at {case.get('region', '?')}; "
            f"λ_ref from a {case.get('bisection_steps', '?')}-step bisection; run {env.get('date', '?')[:10]}; "
            + _guard_summary(cases, tag, case))


def _guard_summary(cases: Cases, tag: str, case: dict) -> str:
    runs = cases[tag].runs
    if "host_flagged" not in runs:
        return f"{len(runs)} runs, no host guard (timings carry whatever else ran on the machine)."
    flagged = int(runs["host_flagged"].sum())
    reps = runs.groupby(["window_id", "policy"])["repetition"].nunique()     # as run (a case may stop early)
    reps_text = str(reps.min()) if reps.min() == reps.max() else f"{reps.min()}–{reps.max()}"
    return (f"{len(runs)} runs ({reps_text} repetitions of each window and policy), "
            f"each between two host probes; {flagged} flagged (probes off by more than "
            f"{case.get('drift_tolerance', float('nan')):.0%} on every attempt)"
            + (", left out below." if cases.exclude_host_flagged and flagged else ", kept below (their own steps: "
               "see the fidelity chapter)." if flagged else "."))


def sim_cells(table: pd.DataFrame, window_ids=None) -> pd.DataFrame:
    """The campaign's cells of the case (its region, policies and the base SLO), on ``window_ids``."""
    keep = (table["region"] == CASE_REGION) & table["policy"].isin(CASE_POLICIES) & (table["slo_multiplier"] == BASE_SLO)
    if window_ids is not None:
        keep &= table["window_id"].isin(window_ids)
    return table[keep]


def deltas(cases: Cases, sim_table: pd.DataFrame, engine_model: str, *, n_resamples: int,
           seed: int) -> pd.DataFrame:
    """Per source, the mean SLAI − vLLM ANWG with its 95% interval: each case, the simulator on that
    case's windows, the simulator on all windows, and the original study (column ``engine``)."""
    frames = []
    for tag in cases.tags:
        runs = cases.runs(tag)
        frames.append(case_deltas(runs, tag, n_resamples=n_resamples, seed=seed))
        # the simulator's prediction for the very same windows
        frames.append(case_deltas(sim_cells(sim_table, runs["window_id"]),
                                  f"simulator ({engine_model}) on the windows of {present.label(tag)}", n_resamples=n_resamples,
                                  seed=seed))
    frames.append(case_deltas(sim_cells(sim_table), f"simulator ({engine_model}), all windows",
                              n_resamples=n_resamples, seed=seed))
    return pd.concat(frames + [original_result()], ignore_index=True)


def verdicts(cases: Cases, sim_table: pd.DataFrame, engine_model: str, **classifier) -> pd.DataFrame:
    """The RQ2 reversal classifier (:func:`portbench.stats.reversals`, with ``classifier``'s
    ``n_resamples``, ``seed``, ``margin``, ``confidence_level``) on the two case policies' ANWG at
    the case's region: each case with at least two sources, then the simulator (column ``engine``)."""
    out = []
    for tag in cases.tags:
        runs = cases.runs(tag)
        if "slo_multiplier" not in runs:
            runs = runs.assign(slo_multiplier=BASE_SLO)
        run_sources = sorted(set(runs["source"]))
        if len(run_sources) < 2:
            continue
        rev = stats.reversals(runs, "anwg", CASE_REGION, sources=run_sources, policies=CASE_POLICIES, **classifier)
        out.append(rev.assign(engine=tag))
    sim_rev = stats.reversals(sim_table, "anwg", CASE_REGION, policies=CASE_POLICIES, **classifier)
    out.append(sim_rev.assign(engine=f"simulator ({engine_model})"))
    return pd.concat(out, ignore_index=True)


def pick(g: pd.DataFrame, pair) -> pd.DataFrame:
    """The classifier's row for a source pair, in either order (Δ of the first source first)."""
    a, b = pair
    fwd = g[(g["source_x"] == a) & (g["source_y"] == b)]
    if len(fwd):
        return fwd.assign(first=a, second=b, d_first=fwd["delta_x"], d_second=fwd["delta_y"])
    rev_ = g[(g["source_x"] == b) & (g["source_y"] == a)]
    return rev_.assign(first=a, second=b, d_first=rev_["delta_y"], d_second=rev_["delta_x"])


def verdict_lines(verdict: pd.DataFrame, case_sources, control_sources) -> list[str]:
    """A markdown bullet per engine: the case's per-source differences and the classifier's verdicts."""
    policy_a, policy_b = CASE_POLICIES
    lines = []
    for engine, g in verdict.groupby("engine", sort=False):
        case, control = pick(g, case_sources), pick(g, control_sources)
        if case.empty:
            continue
        c = case.iloc[0]
        sentence = (f"**{present.label(engine)}**: {policy_a} − {policy_b} ANWG is {present.signed(c['d_first'], 3)} on "
                    f"{source_label(c['first'])} and {present.signed(c['d_second'], 3)} on "
                    f"{source_label(c['second'])}; the classifier calls the case ({pair_label(*case_sources)}) "
                    f"**{present.label(c['cls'])}**")
        if not control.empty:
            sentence += f", the control ({pair_label(*control_sources)}) **{present.label(control.iloc[0]['cls'])}**"
        lines.append("- " + sentence + ".")
    return lines


def classifier_summary(verdict: pd.DataFrame, first_real, case_sources, control_sources) -> dict:
    """The headline case's (``real_…``) and the simulator's (``sim_…``) verdicts on the case and the
    control, and the case's differences on its first and second source ("n/a" where absent)."""
    summary = {f"{who}_{what}_class": "n/a" for who in ("real", "sim") for what in ("case", "control")}
    summary.update({f"{who}_case_delta_{end}": "n/a" for who in ("real", "sim") for end in ("first", "second")})
    for engine, g in verdict.groupby("engine", sort=False):
        who = "sim" if engine.startswith("simulator") else ("real" if engine == first_real else None)
        if who is None:
            continue
        case, control = pick(g, case_sources), pick(g, control_sources)
        if len(case):
            summary[f"{who}_case_class"] = present.label(case.iloc[0]["cls"])
            summary[f"{who}_case_delta_first"] = present.signed(case.iloc[0]["d_first"], 3)
            summary[f"{who}_case_delta_second"] = present.signed(case.iloc[0]["d_second"], 3)
        if len(control):
            summary[f"{who}_control_class"] = present.label(control.iloc[0]["cls"])
    return summary


def run_keys(runs: pd.DataFrame) -> list[str]:
    """The columns that identify a run in ``runs`` (older cases have no ``repetition``)."""
    return [k for k in ("window_id", "policy", "repetition") if k in runs]


def per_policy(cases: Cases, tag: str, sources) -> pd.DataFrame:
    """Per source (in the order of ``sources``) and policy on case ``tag``: runs, max_model_len,
    mean refusals and requests per run, completion fraction, ANWG and the share not refused."""
    head = cases.runs(tag)
    requests = cases[tag].requests
    if requests is not None:
        sizes = requests.groupby(run_keys(head)).size().rename("n_requests").reset_index()
        head = head.merge(sizes, on=run_keys(head), how="left")
    for col in ("max_model_len", "n_refused", "n_requests"):
        if col not in head:
            head[col] = np.nan
    table = (head.groupby(["source", "policy"])
             .agg(runs=("anwg", "size"), max_model_len=("max_model_len", "first"),
                  refused=("n_refused", "mean"), requests=("n_requests", "mean"),
                  completion_fraction=("completion_fraction", "mean"), anwg=("anwg", "mean"))
             .reset_index())
    table["not_refused"] = 1 - table["refused"] / table["requests"]
    order = [s for s in dict.fromkeys(sources) if s in set(table["source"])]
    table["source"] = pd.Categorical(table["source"], categories=order, ordered=True)
    return table.sort_values(["source", "policy"])


@dataclasses.dataclass(frozen=True)
class Readings:
    """What the conclusion sentence reads: the cases, the headline case, the differences and the
    classifier's verdicts of every engine, its summary, and the sources in the chapter's order."""

    cases: Cases
    head_tag: str
    deltas: pd.DataFrame
    verdict: pd.DataFrame
    summary: dict
    order: list
    case_sources: tuple
    control_sources: tuple

    def per_source(self, pp: pd.DataFrame, column: str, policy: str, digits: int) -> str:
        return present.join([f"{present.num(pp.loc[(s, policy), column], digits)} on {source_label(s)}"
                             for s in self.order if (s, policy) in pp.index])

    def engine_setting(self, tag: str, key: str):
        return self.cases[tag].provenance.get("engine_kwargs", {}).get(key) if tag else None


def conclusion(r: Readings, per_policy_table: pd.DataFrame, *, equal_limits_run: str = "",
               study_config_run: str = "") -> str:
    """The chapter's conclusion over every configuration: the headline case's differences and
    verdicts, each policy's ANWG and refusals, the same-limits and study-configuration cases."""
    pp = per_policy_table.set_index(["source", "policy"])
    sentence = _head_sentence(r, pp) + _refusals(r, pp)
    equal_mml = r.engine_setting(equal_limits_run, "max_model_len")
    sentence += limits_reading(r, equal_limits_run, f"With the same admission limit for both, max_model_len "
                                                    f"{present.num(float(equal_mml), 0) if equal_mml else '?'}")
    study_mml = r.engine_setting(study_config_run, "max_model_len")
    study_inflight = r.engine_setting(study_config_run, "max_in_flight")
    if study_config_run:
        sentence += limits_reading(r, study_config_run,
                                   f"In the study's real-system configuration, max_model_len "
                                   f"{present.num(float(study_mml), 0) if study_mml else '?'} and whole-prompt "
                                   f"admission for both and at most {study_inflight or '?'} requests in flight "
                                   f"as its load generator had")
        longest = max(int((w.input_tokens + w.output_tokens).max()) for w in store.load_windows())
        sentence += (f" The study's own A100 verdict was measured in that configuration: both policies at the "
                     f"same limit, {present.num(float(study_mml), 0) if study_mml else '?'} tokens, which no request "
                     f"of the {len(store.load_windows())} windows exceeds (the longest has "
                     f"{present.num(longest, 0)}), so nothing was refused for its length.")
    return sentence + (" Every verdict here rests on a CPU host and a tiny random-weight model, not on the GPU and "
                       "model of the original study.")


def _head_sentence(r: Readings, pp: pd.DataFrame) -> str:
    policy_a, policy_b = CASE_POLICIES
    env = r.cases[r.head_tag].provenance.get("environment", {})
    shape = env.get("model_shape", {})
    device = str(env.get("device", ""))
    on = (f"a CPU host ({device.removeprefix('cpu (').removesuffix(')')})" if device.startswith("cpu (")
          else (device or "a CPU host"))
    host = (f"vLLM {env.get('engine_version', '')}'s CPU build on {on} serving a random-weight "
            f"{shape.get('n_layers', '?')}-layer, {shape.get('hidden_size', '?')}-wide Llama"
            if env else "vLLM's CPU build on a CPU host serving a tiny random-weight model")
    d = r.deltas
    deltas_text = present.join([f"{present.signed(d.loc[(d['engine'] == r.head_tag) & (d['source'] == s), 'delta'].iloc[0], 3)} "
                                f"on {source_label(s)}" for s in r.order
                                if ((d["engine"] == r.head_tag) & (d["source"] == s)).any()])
    return (f"On the real engine — the {present.label(r.head_tag)} runs, {host} — {policy_a} − {policy_b} mean ANWG at "
            f"{CASE_REGION} is {deltas_text}; the reversal classifier's verdict on the case "
            f"({pair_label(*r.case_sources)}) is {r.summary['real_case_class']}, on the control "
            f"({pair_label(*r.control_sources)}) {r.summary['real_control_class']}. Per policy, mean ANWG is "
            f"{r.per_source(pp, 'anwg', policy_a, 3)} for {policy_a} and {r.per_source(pp, 'anwg', policy_b, 3)} for "
            f"{policy_b}.")


def _refusals(r: Readings, pp: pd.DataFrame) -> str:
    policy_a, policy_b = CASE_POLICIES
    mml = pp["max_model_len"].groupby(level="policy").first()
    if not (mml.notna().all() and mml.nunique() > 1):
        return ""
    refusals = []
    for pol in (policy_b, policy_a):
        total = pp.xs(pol, level="policy")["refused"]
        what = ("refused none" if (total == 0).all() else
                f"refused on average, of {present.num(pp['requests'].median(), 0)} requests per run, "
                f"{r.per_source(pp, 'refused', pol, 2)}")
        refusals.append(f"{pol}, with max_model_len {present.num(mml[pol], 0)}, {what}")
    sentence = " The two policies ran with different admission limits: " + "; ".join(refusals) + "."
    worst = pp.xs(policy_b, level="policy")["refused"].idxmax()
    row = pp.loc[(worst, policy_b)]
    if row["refused"] > 0 and abs(row["anwg"] - row["not_refused"]) < 0.005:
        sentence += (f" On {source_label(worst)}, {policy_b}'s ANWG ({present.num(row['anwg'], 3)}) equals "
                     f"its share of requests not refused ({present.num(row['not_refused'], 3)}): every request "
                     f"it lost there was refused, not scheduled late, so this verdict does not separate "
                     f"scheduling from refusal.")
    return sentence


def limits_reading(r: Readings, tag: str, what: str) -> str:
    """One sentence on case ``tag`` (``what``: how its limits were set): its per-source difference,
    the classifier's verdict on the case and the control, what it refused, and its host against the
    headline case's."""
    if not tag:
        return ""
    policy_a, policy_b = CASE_POLICIES
    runs = r.cases.runs(tag)
    d = r.deltas[r.deltas["engine"] == tag].set_index("source")
    g = r.verdict[r.verdict["engine"] == tag]
    case, control = pick(g, r.case_sources), pick(g, r.control_sources)
    refused = runs.groupby("source")["n_refused"].mean()
    same_refusals = runs.groupby(["window_id", "repetition"])["n_refused"].nunique().eq(1).all()
    n_requests = r.cases[tag].requests.groupby(run_keys(runs)).size().median()
    refusals = ("nothing refused" if not refused.any() else
                ("both refusing the same requests: " if same_refusals else "refusing ")
                + present.join([f"{present.num(refused[s_], 1)} on {source_label(s_)}" for s_ in r.order
                                if s_ in refused.index])
                + f" per run of {present.num(n_requests, 0)}")
    device = r.cases[tag].provenance.get("environment", {}).get("device", "")
    head_device = r.cases[r.head_tag].provenance.get("environment", {}).get("device", "")
    host = ""
    if device and device != head_device:
        ratio = runs["probe_ref_s"].median() / r.cases.runs(r.head_tag)["probe_ref_s"].median()
        host = (f"; on another host, {device.removeprefix('cpu (').removesuffix(')')}, whose fixed probe "
                f"took {present.num(ratio, 2)}× the headline host's")
    return (f" {what} ({present.label(tag)}: {runs['window_id'].nunique()} windows, {len(runs)} runs, {refusals}{host}), "
            f"{policy_a} − {policy_b} is "
            + present.join([f"{present.signed(d.loc[s_, 'delta'], 3)} on {source_label(s_)}"
                            for s_ in r.order if s_ in d.index])
            + (f"; the classifier calls the case {present.label(case.iloc[0]['cls'])}" if len(case) else "")
            + (f" and the control {present.label(control.iloc[0]['cls'])}" if len(control) else "")
            + ".")


# --- the study's configuration ----------------------------------------------------------------

#: :func:`study_configuration`'s rows of the real engine: its reading (repetitions resampled as the
#: pairs the case runs back to back) and the same runs' unpaired reading beside it
REAL_PAIRED = "real engine (windows and repetitions resampled, runs paired)"
REAL_UNPAIRED = "real engine (the same, each policy's runs drawn apart)"


def study_configuration(cases: Cases, tag: str, sim_tables: dict, *, n_resamples: int, seed: int) -> dict:
    """Per source, the study-configuration case ``tag`` measured (windows and repetitions
    resampled; :data:`REAL_PAIRED`, and :data:`REAL_UNPAIRED` beside it), the simulator in the same
    configuration (the case's ``sim_config``), and each campaign table of ``sim_tables`` (engine
    model → table) on the same windows."""
    from ..realconfig import repetition_resampled_delta

    pred = cases[tag].sim_config
    if pred is None:
        raise FileNotFoundError(f"no {cases[tag].path('sim_config').name}: run `python benchmarks/predict_real_config.py "
                                f"--tag {tag}` to simulate the case in its configuration")
    runs = cases.runs(tag)
    rows = {
        REAL_PAIRED: repetition_resampled_delta(runs, n_resamples=n_resamples, seed=seed),
        REAL_UNPAIRED: repetition_resampled_delta(runs, n_resamples=n_resamples, seed=seed, paired=False),
        "simulator, same configuration (vllm_v1)": case_deltas(pred, "", n_resamples=n_resamples, seed=seed),
    }
    for engine_name, table in sim_tables.items():
        rows[f"simulator, campaign configuration ({engine_name})"] = case_deltas(
            sim_cells(table, set(runs["window_id"])), "", n_resamples=n_resamples, seed=seed)
    return rows


def primary_reading(runs: pd.DataFrame, repetitions: int, *, n_resamples: int, seed: int) -> pd.DataFrame:
    """The study-configuration case read at a fixed size: the first ``repetitions`` repetitions of
    every window (paired, windows and repetitions resampled), per source; a source with fewer is left
    out. The case's later repetitions were added per source until its interval settled (a sequential
    rule, its intervals uncorrected for the repeated looks); this reading does not depend on it."""
    from ..realconfig import repetition_resampled_delta

    first = runs[runs["repetition"] < repetitions]
    have = first.groupby("source")["repetition"].nunique()
    first = first[first["source"].isin(have[have >= repetitions].index)]
    return repetition_resampled_delta(first, n_resamples=n_resamples, seed=seed).set_index("source")


def host_steady_runs(case: results.Case, tolerance: float = 0.15) -> pd.DataFrame:
    """The runs of ``case`` whose own steps ran at a steady host speed: a run's step ratio (the
    median of its real step times over the profile's cost for the same batches,
    :func:`portbench.engine.stepcost.step_ratios`) within ``tolerance`` (the guard's drift
    tolerance) of the median over the repetitions of the same window and policy. The probes around a run do not see a host that
    slows down while it runs; its own steps do. The runs table gains ``step_ratio`` and ``speed_off``."""
    from ..engine.stepcost import step_ratios
    from ..fidelity.tables import profile_cost

    runs, steps = case.runs, case.steps
    cost = profile_cost((case.tuning or {}).get("from") or case.tag.removesuffix(results.CASE_SUFFIX),
                        case.data_dir)
    runs = runs.merge(step_ratios(steps, cost), on=["window_id", "policy", "repetition"], how="left")
    off = (runs["step_ratio"] / runs.groupby(["window_id", "policy"])["step_ratio"].transform("median") - 1).abs()
    return runs.assign(speed_off=off > tolerance)


def settled(r) -> str:
    """Whether a difference's interval (``ci_low``, ``ci_high``, ``half_width``) settles its sign."""
    if r["ci_low"] > 0 or r["ci_high"] < 0:
        return "sign settled"
    if r["half_width"] <= 0.005:
        return "no difference beyond ±0.005"
    return "not settled"


def interval_reading(table: pd.DataFrame, sources, verdict: bool = True) -> str:
    """Each of ``sources`` in ``table`` as "−0.005 on Bailian [−0.008, −0.003] (sign settled)",
    joined (:func:`settled` says the verdict; ``verdict=False`` leaves it out, for a prediction)."""
    return present.join([f"{present.signed(table.loc[s_, 'delta'], 3)} on {source_label(s_)} "
                         f"[{present.signed(table.loc[s_, 'ci_low'], 3)}, {present.signed(table.loc[s_, 'ci_high'], 3)}]"
                         + (f" ({settled(table.loc[s_])})" if verdict else "")
                         for s_ in sources if s_ in table.index])


def runs_to_settle(real_row: pd.DataFrame, runs: pd.DataFrame, target: float = 0.005) -> str:
    """For each source whose interval settles nothing (:func:`settled`), about how many more runs
    would bring its half-width to ``target``, if the spread stays as it is (a half-width shrinks as
    one over the square root of the runs, windows and repetitions grown alike)."""
    parts = []
    for src, r in real_row.iterrows():
        if settled(r) != "not settled":
            continue
        have = int((runs["source"] == src).sum())
        factor = (r["half_width"] / target) ** 2
        parts.append(f"{source_label(src)} about {present.num(np.ceil(have * (factor - 1)), 0)} more runs "
                     f"({present.num(factor, 1)}× its {have})")
    return present.join(parts, empty="none: every source is settled")


def signs(table: pd.DataFrame, sources) -> dict:
    """Each source's sign of ``delta`` as printed (three decimals)."""
    return {s_: np.sign(round(table.loc[s_, "delta"], 3)) for s_ in sources}


def short_finding(real_row: pd.DataFrame, pred_row: pd.DataFrame, camp_rows: dict, agree: dict,
                  steady_row: pd.DataFrame | None = None, rehost_row: pd.DataFrame | None = None) -> str:
    """The RQ6 finding in at most 150 words: the study-configuration case measured, the simulator
    in its configuration and in the campaign's, and the A100's result; with ``steady_row`` (the same
    measured on the host-steady runs, :func:`host_steady_runs`), each source whose verdict it changes;
    with ``rehost_row`` (the case rerun on a second host, :func:`rehost_clause`), its reading.
    ``agree``: per simulator row, how many of the measured signs it matches, counted over the sources
    whose measured sign is settled only (an unsettled sign is noise)."""
    policy_a, policy_b = CASE_POLICIES
    order_src = [s_ for s_ in ("azure_llm_2024", "burstgpt", "bailian_qwen") if s_ in real_row.index]

    def triple(table) -> str:
        return " / ".join(present.signed(table.loc[s_, "delta"], 3) for s_ in order_src)

    campaign_v1 = camp_rows["simulator, campaign configuration (vllm_v1)"]
    campaign_lssp = camp_rows["simulator, campaign configuration (lssp)"]
    verdict = {s_: settled(real_row.loc[s_]) for s_ in order_src}
    n_settled = sum(v == "sign settled" for v in verdict.values())
    if not n_settled:
        cause = ("; with no measured sign settled, these runs cannot tell whether through the "
                 f"configuration or the model (vllm_v1 in the campaign's configuration gives {triple(campaign_v1)})")
    elif agree["configured"] > agree["simulator, campaign configuration (vllm_v1)"]:
        cause = (" because of the configuration, not the model: vllm_v1 in the campaign's configuration gives "
                 f"{triple(campaign_v1)}")
    else:
        cause = (" not through the configuration alone: vllm_v1 in the campaign's configuration gives "
                 f"{triple(campaign_v1)}")
    real_text = interval_reading(real_row, order_src, verdict=False)
    reps = int(real_row["repetitions"].min())
    reps_max = int(real_row.get("repetitions_max", real_row["repetitions"]).max())
    reps_text = present.count(reps, "repetition") if reps == reps_max else f"{reps}–{reps_max} repetitions"
    short = (f"In the study's real-system configuration — vLLM's CPU build, a tiny random-weight model, "
             f"{int(real_row['n_windows'].min())} windows per source, {reps_text} — "
             f"{policy_a} − {policy_b} mean ANWG at {CASE_REGION} is {real_text} (95% paired-bootstrap CI): "
             + present.join([f"{source_label(s_)} {verdict[s_]}"
                             + (f" (±{present.num(real_row.loc[s_, 'half_width'], 4)})"
                                if verdict[s_] == "not settled" else "") for s_ in order_src]) + ". "
             + robust_clause(real_row, steady_row, order_src) + rehost_clause(rehost_row) +
             f"The simulator in the same configuration predicts {triple(pred_row)} "
             f"({agree['configured']} of the {n_settled} settled signs as measured). The lssp campaign's "
             f"{triple(campaign_lssp)} differs{cause}. The A100 measured "
             + " / ".join(present.signed(ORIGINAL[s_], 3) for s_ in order_src)
             + f" ({' / '.join(source_label(s_) for s_ in order_src)}).")
    n_words = len(short.split())
    assert n_words <= 150, f"the short RQ6 finding has {n_words} words (at most 150)"
    return short


def _verdict_groups(real_row: pd.DataFrame, rehost_row: pd.DataFrame | None) -> dict:
    """Sources by their reading of the A100's sign: "same sign", "opposite sign", "no difference
    beyond ±0.005" or "not settled" (:func:`settled`), each source as (name, row, where); a source
    the first case leaves unsettled takes the second host's reading when that settles it."""
    groups: dict[str, list] = {}
    for s_ in [s_ for s_ in ("burstgpt", "bailian_qwen", "azure_llm_2024") if s_ in real_row.index]:
        row, where = real_row.loc[s_], ""
        if settled(row) == "not settled" and rehost_row is not None and s_ in rehost_row.index \
                and settled(rehost_row.loc[s_]) != "not settled":
            row, where = rehost_row.loc[s_], " on a second host"
        state = settled(row)
        if state == "sign settled":
            state = "same sign" if np.sign(row["delta"]) == np.sign(ORIGINAL[s_]) else "opposite sign"
        groups.setdefault(state, []).append((source_label(s_), row, where))
    return groups


def verdict(real_row: pd.DataFrame, rehost_row: pd.DataFrame | None = None,
            primary_row: pd.DataFrame | None = None) -> str:
    """RQ6's answer in plain words, at most 80: per source, whether the A100's sign of
    ``slai_faithful − vllm_faithful`` appears on vLLM in the study's configuration, with intervals;
    with ``primary_row`` (the fixed-size reading, :func:`primary_reading`), the sources whose verdict
    it does not share."""
    words = {"same sign": "appears on", "opposite sign": "is reversed on",
             "no difference beyond ±0.005": "is absent (no difference beyond ±0.005) on",
             "not settled": "is not settled by the runs on"}
    parts = [words[k] + " " + present.join(
        [f"{name}{where} ({present.signed(row['delta'], 3)}, 95% CI {present.signed(row['ci_low'], 3)} to "
         f"{present.signed(row['ci_high'], 3)})" for name, row, where in v])
        for k, v in _verdict_groups(real_row, rehost_row).items()]
    text = ("On vLLM in the study's configuration (CPU build, tiny model), the A100's finding that "
            "slai_faithful scores below vllm_faithful " + "; it ".join(parts) + ".")
    if primary_row is not None:
        moved = primary_disagrees(primary_row, real_row)
        if moved:
            text += (f" A fixed-size reading ({int(primary_row['repetitions'].min())} repetitions) reads "
                     f"{present.join([name for name, *_ in moved])} otherwise.")
    n_words = len(text.split())
    assert n_words <= 80, f"the RQ6 verdict has {n_words} words (at most 80)"
    return text


def primary_disagrees(primary_row: pd.DataFrame, real_row: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(display name, fixed-size verdict, final verdict) of each source whose fixed-size reading gives
    another verdict (:func:`settled`) than the final one."""
    return [(source_label(s_), settled(primary_row.loc[s_]), settled(real_row.loc[s_])) for s_ in real_row.index
            if s_ in primary_row.index and settled(primary_row.loc[s_]) != settled(real_row.loc[s_])]


def verdict_brief(real_row: pd.DataFrame, rehost_row: pd.DataFrame | None = None) -> str:
    """:func:`verdict` without numbers: each reading with its sources."""
    return "; ".join(f"{k}: {present.join([name + where for name, _, where in v])}"
                     for k, v in _verdict_groups(real_row, rehost_row).items())


def robust_clause(real_row: pd.DataFrame, steady_row: pd.DataFrame | None, order_src) -> str:
    """A sentence naming each source whose verdict (:func:`settled`) differs on the host-steady runs,
    with that reading's interval; '' when none does (or there is no such reading)."""
    if steady_row is None:
        return ""
    moved = [s_ for s_ in order_src if s_ in steady_row.index
             and settled(steady_row.loc[s_]) != settled(real_row.loc[s_])]
    if not moved:
        return ""
    return ("Without the runs the host slowed down, " + present.join(
        [f"{source_label(s_)} is {settled(steady_row.loc[s_])} "
         f"([{present.signed(steady_row.loc[s_, 'ci_low'], 3)}, {present.signed(steady_row.loc[s_, 'ci_high'], 3)}])"
         for s_ in moved]) + ". ")


def rehost_clause(rehost_row: pd.DataFrame | None) -> str:
    """A sentence on the study-configuration case rerun on a second host, with λ_ref searched there
    (its paired reading per source, :func:`interval_reading`); '' without one."""
    if rehost_row is None or not len(rehost_row):
        return ""
    return f"On a second host, own λ_ref: {interval_reading(rehost_row, rehost_row.index)}. "


def own_configuration(cases: Cases, *, n_resamples: int, seed: int) -> pd.DataFrame:
    """Per case with simulated counterparts (its ``sim_requests``) and source: the real and the
    simulated SLAI − vLLM ANWG (95% CI over windows) and whether their signs agree."""
    from ..fidelity import anwg_from_counterpart

    out = []
    for tag in cases.tags:
        counterpart = cases[tag].sim_requests
        if counterpart is None:
            continue
        anwg = anwg_from_counterpart(counterpart)
        real_d = case_deltas(anwg.rename(columns={"anwg_real": "anwg"}), "real", n_resamples=n_resamples, seed=seed)
        sim_d = case_deltas(anwg.rename(columns={"anwg_sim": "anwg"}), "sim", n_resamples=n_resamples, seed=seed)
        both = real_d.merge(sim_d, on="source", suffixes=("_real", "_sim"))
        both["signs agree"] = np.sign(both["delta_real"].round(3)) == np.sign(both["delta_sim"].round(3))
        out.append(both.assign(case=tag))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


# --- the GPU run --------------------------------------------------------------------------------

#: The files of a GPU run the chapter reads (parts of :class:`portbench.results.Case`).
GPU_PARTS = ("tuning", "profile", "cost", "meta", "runs", "steps", "calibration")


def gpu_case(run: str, data_dir=None) -> results.Case:
    """The GPU run ``run`` (its set-up tag, e.g. ``h200_study``); FileNotFoundError naming its
    missing files."""
    case = results.setup_case(run, data_dir)
    absent = case.missing(*GPU_PARTS)
    if absent:
        raise FileNotFoundError(f"gpu_run={run!r}: no {', '.join(absent)} in {case.folder}; "
                                f"set gpu_run to empty to leave the GPU run out")
    return case


def gpu_tuning(case: results.Case) -> pd.DataFrame:
    """The tuning burst's configurations: CUDA graphs, set-up and replay time, throughput, chosen."""
    tuning = case.tuning
    rows = pd.DataFrame(tuning["tuning"])
    rows["CUDA graphs (prefill, decode)"] = rows["extra"].map(lambda e: str(json.loads(e).get("use_cuda_graph")))
    best = str(tuning["best_config"]["extra"].get("use_cuda_graph"))
    rows["chosen"] = ((rows["CUDA graphs (prefill, decode)"] == best.replace("(", "[").replace(")", "]"))
                      | (rows["CUDA graphs (prefill, decode)"] == best))
    return rows


def gpu_provenance(case: results.Case, n_configs: int) -> str:
    env = case.meta["environment"]
    return (f"**Provenance**: {env.get('gpu') or 'no GPU named'}, {env['engine']} {env['engine_version']}, "
            f"{env['date'][:10]}. **What the tuning chose** (a {n_configs}-configuration tuning burst, "
            f"{case.tuning['tuning'][0].get('n_steps', '?')} steps each; the configuration whose replay, "
            f"set-up included, took the least wall time):")


@dataclasses.dataclass(frozen=True)
class GpuBudget:
    """What the GPU case needs against what a lease gives: runs made, a step's and a run's time, the
    device-minutes the planned case needs."""

    runs: pd.DataFrame
    steps: pd.DataFrame
    per_run_s: float
    per_search: float
    need_s: float


def gpu_budget(case: results.Case, *, windows_per_source: int, repetitions: int) -> GpuBudget:
    """The device time the GPU case needs at ``windows_per_source`` windows and ``repetitions``, from
    its runs (a run's wall time and its probes) and its λ_ref searches (replays per window)."""
    runs, cal = case.runs, case.calibration
    steps = case.steps[case.steps["kept"].astype(bool)]
    per_run_s = float(runs["wall_s"].mean())
    probe_s = float(runs[["probe_before_s", "probe_after_s"]].mean().sum())
    n_sources = len(case.meta["case"]["sources"])
    need_runs = n_sources * windows_per_source * len(CASE_POLICIES) * repetitions
    searches = n_sources * windows_per_source
    per_search = float(cal.groupby("window_id").size().mean()) if len(cal) else 4.0
    need_s = need_runs * (per_run_s + probe_s) + searches * per_search * per_run_s
    return GpuBudget(runs, steps, per_run_s, per_search, need_s)


def gpu_verdict(case: results.Case, b: GpuBudget, *, windows_per_source: int, repetitions: int,
                budget_s: float) -> str:
    """The GPU run in plain words: what was made, what it can say, and why so few runs."""
    runs, steps = b.runs, b.steps
    both = runs.groupby("window_id")["policy"].nunique().eq(2).sum()
    lambdas = case.meta["lambda_ref_real"]
    pinned = [w for w, e in lambdas.items() if e.get("pinned")]
    return (
        f"On the {case.meta['environment'].get('gpu') or 'GPU'}, {present.count(len(runs), 'run')} of the case "
        f"{'was' if len(runs) == 1 else 'were'} made "
        f"({present.count(int(runs['window_id'].nunique()), 'window')}, "
        f"{present.join(sorted(set(runs['policy'])))}); {present.count(int(both), 'window')} ran under both "
        f"policies, so no SLAI − vLLM difference on this GPU can be estimated, and nothing here confirms or "
        f"contradicts the A100's "
        + " / ".join(present.signed(ORIGINAL[s_], 3) for s_ in CASE_SOURCES)
        + f" ({' / '.join(source_label(s_) for s_ in CASE_SOURCES)}). "
        + (f"The λ_ref search of {present.join([present.window_label(w) for w in pinned])} ended pinned at its low bound (the knee lies below "
           f"λ = {present.num(min(lambdas[w]['lambda'] for w in pinned), 2)}), so that run "
           f"is above HIGH_PRESSURE, not at it. " if pinned else "")
        + f"Why so few: this engine takes a median {present.num(steps['duration_s'].median() * 1e3, 0)} ms a "
        f"step on the real window (a median {present.num(steps['decode_seqs'].median(), 0)} decodes over "
        f"{present.num(steps['context_tokens'].median() / 1e3, 0)}k "
        f"context tokens; its paged attention grows with the context, see the profile), so one window replays in "
        f"about {present.num(b.per_run_s, 0)} s; the case at {windows_per_source} windows per source, "
        f"{present.count(repetitions, 'repetition')} and a λ_ref "
        f"search of {present.num(b.per_search, 0)} replays a window (the shortened search made here) needs at least "
        f"{present.num(b.need_s / 60, 0)} "
        f"device-minutes, against the {present.num(budget_s / 60, 0)} a lease gives.")


def gpu_cost(case: results.Case) -> str:
    """The step cost refitted on the GPU profile, and its error on the profile and on the case's steps."""
    cost = case.cost
    return (
        f"The step cost refitted on this profile (relative least squares): "
        f"{present.num(cost['cost']['fixed_s'] * 1e3, 1)} ms + {present.num(cost['cost']['per_prefill_token_s'] * 1e6, 2)} µs "
        f"per prefill token + {present.num(cost['cost']['per_decode_seq_s'] * 1e6, 1)} µs per decoding sequence + "
        f"{present.num(cost['cost']['per_context_token_s'] * 1e9, 0)} ns per context token, "
        f"{present.pct(cost['fit_median_rel_error'], 1)} median error on the profile's {cost['profile_rows']} steps and "
        f"{present.pct(cost['case_steps']['median_abs_rel_error'], 1)} on the case run's "
        f"{present.num(cost['case_steps']['n'], 0)} steps (out of sample; contexts up to "
        f"{present.num(cost['case_steps']['max_context_tokens'], 0)} tokens, the profile's up to "
        f"{present.num(cost['case_steps']['max_profile_context_tokens'], 0)}), whose total it puts at "
        f"{present.pct(cost['case_steps']['sum_predicted_over_measured'], 0)} of the measured.")

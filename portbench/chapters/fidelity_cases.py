"""The fidelity chapter's later sections: the equal-limits case and its re-run with the port's two
rules fixed (each replayed with its own step times, its classes of disagreement and its per-request
errors), the model against the real engine's own repeatability, the head-of-line ablation and the
headline numbers under both engine models — each a :class:`~portbench.chapters.fidelity.Section`
read from the stored results (:mod:`.tables`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import present
from ..fidelity import latency_error_table, latency_errors, tables
from . import fidelity_figures as figures
from .fidelity import Chapter, Section, _source, agreement_shown, latency_groups, percent_table
from ..fidelity.schedules import DOWNSTREAM, ID_TIE, LAST_PROMPT_TOKEN, LENGTH, OTHER, RACE, SAME_SHAPE, SLAI_CLOCK

#: The disagreement classes by the short key of their glued names.
CLASS_KEYS = {RACE: "race", SLAI_CLOCK: "slai_clock", LENGTH: "length", LAST_PROMPT_TOKEN: "last_prompt_token",
              ID_TIE: "id_tie", SAME_SHAPE: "same_shape", DOWNSTREAM: "downstream", OTHER: "unexplained"}
#: The three rules of vllm_faithful for a prompt above its budget, as the reader reads them.
VARIANTS = {"vllm_faithful[block]": "vllm_faithful, blocks the queue (study's rule)",
            "vllm_faithful[reject]": "vllm_faithful, refuses over-long prompts",
            "vllm_faithful[chunk]": "vllm_faithful, admits them alone"}


def _case_runs(ch: Chapter, tag: str) -> pd.DataFrame:
    return ch.case(tag).runs.copy()


def slai_minus_vllm(case_runs: pd.DataFrame) -> str:
    """The real engine's ``slai_faithful`` − ``vllm_faithful`` mean ANWG per source, as text."""
    m = case_runs.groupby(["source", "policy"])["anwg"].mean().unstack()
    d = m["slai_faithful"] - m["vllm_faithful"]
    return present.join([f"{present.signed(v)} on {_source(src)}" for src, v in d.items()])


def missing_case(prefix: str) -> dict:
    """The glued names of :func:`replay_case` for a case that is not there: the prose reads "nan", 0, "n/a"."""
    numbers = {}
    for name in ("replay_step_agreement", "replay_step_agreement_counts", "replay_request_agreement",
                 "replay_step_agreement_submitted", "replay_request_agreement_submitted",
                 "replay_step_agreement_submitted_vllm_faithful", "replay_request_agreement_submitted_vllm_faithful",
                 *(f"{m}_{q}_rel_error" for m in ("e2e", "ttft", "tbt") for q in ("median", "p90")),
                 "e2e_median_rel_error_robust_fit", "e2e_median_rel_error_pooled",
                 "cv_step_error_linear_small", "cv_step_error_rich_small"):
        numbers[f"{prefix}_{name}"] = float("nan")
    for name in ("n_runs", "max_model_len", *(f"{k}_{what}{x}" for k in CLASS_KEYS.values()
                                              for what in ("episodes", "steps", "requests") for x in ("", "_submitted"))):
        numbers[f"{prefix}_{name}"] = 0
    for name in ("refused_same", "refused_text", "classes_text", "classes_text_submitted", "e2e_verdict",
                 "slai_minus_vllm"):
        numbers[f"{prefix}_{name}"] = "n/a"
    return numbers


def replay_case(ch: Chapter, tag: str, prefix: str) -> Section:
    """A case that logged each step's batch, replayed with the trace's arrivals and at the real
    submission steps: glued ``<prefix>_*``, the agreement and the classes shown."""
    runs = _case_runs(ch, tag)
    refused = runs.groupby(["source", "policy"])["n_refused"].mean().unstack()
    numbers = {f"{prefix}_n_runs": int(len(runs)), f"{prefix}_max_model_len": int(runs["max_model_len"].max()),
               f"{prefix}_refused_same": "the same requests" if (refused.nunique(axis=1) == 1).all()
               else "different requests",
               f"{prefix}_refused_text": present.join([f"{present.num(v, 1)} on {_source(src)}"
                                                       for src, v in refused.iloc[:, 0].items()])}
    shown_tables, classes = {}, {}
    for arrivals in ("trace", "submitted"):
        replay = tables.replay_agreement(tag, ch.real_engine_tag, arrivals=arrivals, data_dir=ch.data_dir)
        suffix = "" if arrivals == "trace" else "_submitted"
        sa, ra = replay["steps"], replay["requests"]
        numbers[f"{prefix}_replay_step_agreement{suffix}"] = float(sa.loc[0, "agree"])
        numbers[f"{prefix}_replay_step_agreement_counts{suffix}"] = float(sa.loc[0, "agree, counts only"])
        numbers[f"{prefix}_replay_request_agreement{suffix}"] = float(ra.loc[0, "agree"])
        for what, table in (("step", sa), ("request", ra)):
            for _, row in table.iloc[1:].iterrows():
                numbers[f"{prefix}_replay_{what}_agreement{suffix}_{row['group']}"] = float(row["agree"])
        counts = replay["classes"]
        classes[arrivals] = counts
        for c, row in counts.iterrows():
            for what in ("episodes", "steps", "requests"):
                numbers[f"{prefix}_{CLASS_KEYS[c]}_{what}{suffix}"] = int(row[what])
        named = [f"{present.count(int(r['episodes']), 'episode')} of “{c}” "
                 f"({present.count(int(r['requests']), 'request')} named)"
                 for c, r in counts.iterrows() if r["episodes"] or r["requests"]]
        numbers[f"{prefix}_classes_text{suffix}"] = present.join(named) if named else "none"
        shown_tables[arrivals] = pd.concat({"steps": sa.set_index("group"), "requests": ra.set_index("group")})
    shown = agreement_shown(shown_tables, ["arrivals in the replay", "compared", "policy"])
    classes_shown = pd.concat(classes, axis=1)
    classes_shown.columns = [f"{'trace' if a == 'trace' else 'submitted'} arrivals, {m}"
                             for a, m in classes_shown.columns]
    numbers[f"{prefix}_slai_minus_vllm"] = slai_minus_vllm(runs)
    return Section(numbers=numbers, shown=[
        present.table(shown.rename(index={"all": "all policies", "trace": "the trace's",
                                          "submitted": "at the real submission step"}), digits=2),
        present.table(classes_shown, digits=0)])


# --- the equal-limits case ------------------------------------------------------------------------
def equal_replay(ch: Chapter) -> Section:
    if not ch.has_case(ch.equal_tag):
        return Section(numbers=missing_case("fid_equal"))
    return replay_case(ch, ch.equal_tag, "fid_equal")


def equal_latency(ch: Chapter) -> Section:

    if not ch.has_case(ch.equal_tag):
        return Section()
    e_latency = latency_errors(tables.counterpart(ch.equal_tag, data_dir=ch.data_dir))
    e_overall = latency_error_table(e_latency).iloc[0]
    numbers = {}
    for m, key in (("end-to-end", "e2e"), ("TTFT", "ttft"), ("TBT", "tbt")):
        numbers[f"fid_equal_{key}_median_rel_error"] = float(e_overall[f"{m} median"])
        numbers[f"fid_equal_{key}_p90_rel_error"] = float(e_overall[f"{m} p90"])
    for src, row in latency_error_table(e_latency, "source").iterrows():
        numbers[f"fid_equal_e2e_median_rel_error_{src}"] = float(row["end-to-end median"])
    e_pairs = latency_error_table(e_latency.assign(
        group=[f"{_source(a)}, {b}" for a, b in zip(e_latency["source"], e_latency["policy"])]), "group")
    e_choices = tables.cost_choices(ch.equal_tag, data_dir=ch.data_dir)
    numbers["fid_equal_e2e_median_rel_error_robust_fit"] = float(e_choices.iloc[0]["end-to-end median"])
    numbers["fid_equal_e2e_median_rel_error_pooled"] = float(e_choices.iloc[1]["end-to-end median"])
    numbers["fid_equal_e2e_verdict"] = "meets" if float(e_overall["end-to-end median"]) <= 0.10 else "misses"
    errors = tables.step_error_columns(tables.step_errors(ch.equal_tag, ("linear", "rich"), data_dir=ch.data_dir)["errors"])
    small = [i for i in errors.index if i.startswith("small")][0]
    for kind in ("linear", "rich"):
        numbers[f"fid_equal_cv_step_error_{kind}_small"] = float(errors.loc[small, (kind, "median")])
    return Section(numbers=numbers, shown=[
        percent_table(pd.concat([latency_groups(e_latency), e_pairs]).rename_axis("runs")), percent_table(e_choices)])


# --- the port's two rules fixed, and the engine's own repeatability --------------------------------
def fixed_replay(ch: Chapter) -> Section:
    """The port-fixed case: the chapter's headline figures (``fid_replay_*``, ``fid_e2e_*``) come
    from it, this host's guarded runs with the port as it is now and every step's batch logged."""

    if not ch.has_case(ch.fixed_tag):
        numbers = missing_case("fid_fixed")
        for name in ("replay_step_agreement", "replay_request_agreement",
                     *(f"{m}_{q}_rel_error" for m in ("e2e", "ttft", "tbt") for q in ("median", "p90"))):
            numbers[f"fid_{name}"] = float("nan")
        numbers["fid_e2e_verdict"] = "n/a"
        return Section(numbers=numbers)
    section = replay_case(ch, ch.fixed_tag, "fid_fixed")
    f_overall = latency_error_table(fixed_latency(ch)).iloc[0]
    for m, key in (("end-to-end", "e2e"), ("TTFT", "ttft"), ("TBT", "tbt")):
        for q in ("median", "p90"):
            section.numbers[f"fid_fixed_{key}_{q}_rel_error"] = float(f_overall[f"{m} {q}"])
            section.numbers[f"fid_{key}_{q}_rel_error"] = float(f_overall[f"{m} {q}"])
    submitted = tables.replay_agreement(ch.fixed_tag, ch.real_engine_tag, arrivals="submitted", data_dir=ch.data_dir)
    section.numbers["fid_replay_step_agreement"] = float(submitted["steps"].loc[0, "agree"])
    section.numbers["fid_replay_request_agreement"] = float(submitted["requests"].loc[0, "agree"])
    section.numbers["fid_e2e_verdict"] = "meets" if float(f_overall["end-to-end median"]) <= 0.10 else "misses"
    return section


def fixed_latency(ch: Chapter) -> pd.DataFrame:

    return latency_errors(tables.counterpart(ch.fixed_tag, data_dir=ch.data_dir))


def worst_group(ch: Chapter) -> pd.Series:
    """The source × policy group whose model error is largest against the engine's own noise."""
    noise = tables.noise(ch.fixed_tag, **ch.boot, data_dir=ch.data_dir)
    groups = noise[(noise["group"] != "all") & (noise["measure"] == "end-to-end") & (noise["stat"] == "median")]
    return groups.loc[groups["ratio"].idxmax()]


def repeatability_noise(ch: Chapter) -> Section:

    if not ch.has_case(ch.fixed_tag):
        return Section(numbers={f"fid_{name}": float("nan") for name in (
            "noise_e2e_median_rel_error", "sim_over_noise_e2e_median", "worst_group_sim_over_noise")})
    noise = tables.noise(ch.fixed_tag, **ch.boot, data_dir=ch.data_dir)
    keys = {"end-to-end": "e2e", "TTFT": "ttft", "TBT": "tbt"}
    overall = noise[noise["group"] == "all"].set_index(["measure", "stat"])
    numbers = {}
    for m, key in keys.items():
        for st in ("median", "p90"):
            row = overall.loc[(m, st)]
            numbers[f"fid_noise_{key}_{st}_rel_error"] = float(row["noise"])
            numbers[f"fid_sim_over_noise_{key}_{st}"] = float(row["ratio"])
            numbers[f"fid_sim_over_noise_{key}_{st}_lo"] = float(row["ratio_lo"])
            numbers[f"fid_sim_over_noise_{key}_{st}_hi"] = float(row["ratio_hi"])
    groups = noise[(noise["group"] != "all") & (noise["measure"] == "end-to-end") & (noise["stat"] == "median")]
    worst = worst_group(ch)
    numbers.update({"fid_worst_group_sim_over_noise": float(worst["ratio"]),
                    "fid_worst_group": worst["group"].replace(" / ", " × "),
                    "fid_worst_group_lo": float(worst["ratio_lo"]), "fid_worst_group_hi": float(worst["ratio_hi"]),
                    "fid_worst_group_sim": float(worst["sim"]), "fid_worst_group_noise": float(worst["noise"])})
    # the same table once each request's simulated latency is stretched by the host's measured speed
    # over its life: what is left when the host's timing is known
    timed = tables.lifetime_speed_noise(ch.fixed_tag, **ch.boot, data_dir=ch.data_dir)
    t_groups = timed[(timed["group"] != "all") & (timed["measure"] == "end-to-end") & (timed["stat"] == "median")]
    t_all = timed[(timed["group"] == "all") & (timed["measure"] == "end-to-end") & (timed["stat"] == "median")].iloc[0]
    t_worst = t_groups.set_index("group").loc[worst["group"]]
    numbers.update({"fid_lifetime_sim_e2e_median": float(t_all["sim"]),
                    "fid_lifetime_sim_over_noise_e2e_median": float(t_all["ratio"]),
                    "fid_lifetime_worst_group_ratio": float(t_worst["ratio"]),
                    "fid_lifetime_worst_group_sim": float(t_worst["sim"]),
                    "fid_lifetime_max_group_ratio": float(t_groups["ratio"].max()),
                    "fid_lifetime_groups_within_goal": f"{int((t_groups['ratio'] <= 1.1).sum())} of {len(t_groups)}"})
    within, above = groups[groups["ratio"] <= 1.1], groups[groups["ratio_lo"] > 1.0]
    numbers["fid_groups_within_goal"] = f"{len(within)} of {len(groups)}"
    numbers["fid_groups_above_noise"] = present.join([g.replace(" / ", " × ") for g in above["group"]], empty="none")
    table = noise.assign(group=noise["group"].str.replace(" / ", " × "))
    return Section(numbers=numbers, figures={"fid_noise_ratio": figures.noise_ratio(noise, keys)}, shown=[
        present.table(table[["group", "measure", "stat", "sim", "noise", "ratio", "ratio_lo", "ratio_hi",
                             "requests", "windows"]], digits=3)])


def run_offsets(ch: Chapter) -> Section:
    from .. import repeatability

    if not ch.has_case(ch.fixed_tag):
        return Section()
    paired = repeatability.paired_errors(tables.counterpart(ch.fixed_tag, data_dir=ch.data_dir))
    offsets, adjusted = repeatability.run_offsets(paired)
    speed = tables.run_speed(ch.fixed_tag, data_dir=ch.data_dir)
    both = offsets.merge(speed, on=["window_id", "policy", "repetition"], how="inner")
    corr = float(np.corrcoef(np.log1p(both["sim_offset"]), -np.log(both["speed_factor"]))[0, 1]) \
        if len(both) > 2 else float("nan")
    numbers = {"fid_run_offset_min": float(offsets["sim_offset"].min()),
               "fid_run_offset_max": float(offsets["sim_offset"].max()), "fid_run_offset_speed_corr": corr,
               "fid_e2e_offset_removed_sim": float(adjusted["sim_error_offset_removed"].median()),
               "fid_e2e_offset_removed_noise": float(adjusted["noise_error_offset_removed"].median())}
    # where the worst group's excess sits: the longer and shorter half of its requests, and how far
    # apart its runs' offsets are (the model's against the other repetition's)
    w_src, w_pol = worst_group(ch)["group"].split(" / ")
    e = paired[(paired["measure"] == "end-to-end") & (paired["source"] == w_src) & (paired["policy"] == w_pol)]
    longer = e["real"] > e["real"].median()
    for half, mask in (("longer", longer), ("shorter", ~longer)):
        numbers[f"fid_worst_{half}_half_sim"] = float(e.loc[mask, "sim_error"].median())
        numbers[f"fid_worst_{half}_half_noise"] = float(e.loc[mask, "noise_error"].median())
    w_off = offsets[(offsets["source"] == w_src) & (offsets["policy"] == w_pol)]
    numbers["fid_worst_offset_sd_sim"] = float(w_off["sim_offset"].std())
    numbers["fid_worst_offset_sd_noise"] = float(w_off["noise_offset"].std())
    return Section(numbers=numbers)


def admission_order(ch: Chapter) -> Section:
    if not ch.has_case(ch.fixed_tag):
        return Section(numbers={f"fid_{name}": float("nan") for name in (
            "free_running_order_agreement", "noise_order_agreement", "steps_with_choice_share")})
    order = tables.admission_order(ch.fixed_tag, data_dir=ch.data_dir)
    numbers = {"fid_free_running_order_agreement": float(order["sim"].mean()),
               "fid_noise_order_agreement": float(order["noise"].mean())}
    for pol, row in order.groupby("policy")[["sim", "noise"]].mean().iterrows():
        numbers[f"fid_free_running_order_agreement_{pol}"] = float(row["sim"])
        numbers[f"fid_noise_order_agreement_{pol}"] = float(row["noise"])
    choice = tables.replay_agreement(ch.fixed_tag, ch.real_engine_tag, arrivals="submitted",
                                     data_dir=ch.data_dir)["choice"]
    ch_ = choice.set_index("group")
    numbers.update({"fid_steps_with_choice_share": float(ch_.loc["all", "choice_share"]),
                    "fid_choice_step_agreement": float(ch_.loc["all", "agree_choice"]),
                    "fid_choice_steps": int(ch_.loc["all", "choice_steps"])})
    for pol in ("slai_faithful", "vllm_faithful"):
        if pol in ch_.index:
            numbers[f"fid_steps_with_choice_share_{pol}"] = float(ch_.loc[pol, "choice_share"])
    numbers.update(hol_numbers(ch, ch.fixed_tag, "fid_hol"))
    like_fixed = tables.like_for_like(ch.fixed_tag, **ch.boot, data_dir=ch.data_dir)
    return Section(numbers=numbers, shown=[
        present.table(choice.rename(columns={"choice_share": "share with a choice", "agree_all": "agree, all steps",
                                             "agree_choice": "agree, choice steps"}), digits=3),
        present.table(like_fixed, digits=3)])


HOL_NAMES = ("fired_share", "fired_steps", "fired_windows", "agree_fired", "blocked_steps", "blocked_windows",
             "agree_blocked")


def hol_numbers(ch: Chapter, tag: str, prefix: str) -> dict:
    """Where ``vllm_faithful``'s head-of-line rule fired in case ``tag`` (and blocked a prompt that
    would have fit), and the replay's agreement on those steps, as ``<prefix>_<name>``."""
    hol = tables.replay_agreement(tag, ch.real_engine_tag, arrivals="submitted", data_dir=ch.data_dir).get("hol")
    if hol is None:
        return {f"{prefix}_{name}": float("nan") for name in HOL_NAMES}
    row = hol.iloc[0]
    return {f"{prefix}_{name}": (int(row[name]) if name.endswith(("_steps", "_windows")) else float(row[name]))
            for name in HOL_NAMES}


CHOICE_NAMES = ("n_runs", "n_windows", "choice_share", "choice_share_slai_faithful", "choice_share_vllm_faithful",
                "choice_steps", "choice_step_agreement", "request_agreement", "free_running_order_agreement",
                "noise_order_agreement", "sim_e2e_median", "noise_e2e_median", "sim_over_noise_e2e_median",
                "sim_over_noise_lo", "sim_over_noise_hi", *(f"hol_{n}" for n in HOL_NAMES))


def choice_case(ch: Chapter) -> Section:
    """The case with choices in it (``choice_tag``: the equal case with 8 seats): how often the engine
    had a choice and the head-of-line rule fired, the replay's agreement on those steps, the
    free-running admission order and the per-request error, each beside two real runs."""
    tag = ch.choice_tag
    if not ch.has_case(tag):
        return Section(numbers={f"fid_choicecase_{n}": float("nan") for n in CHOICE_NAMES})
    runs = _case_runs(ch, tag)
    replay = tables.replay_agreement(tag, ch.real_engine_tag, arrivals="submitted", data_dir=ch.data_dir)
    choice = replay["choice"].set_index("group")
    order = tables.admission_order(tag, data_dir=ch.data_dir)
    noise = tables.noise(tag, **ch.boot, data_dir=ch.data_dir)
    overall = noise[(noise["group"] == "all") & (noise["measure"] == "end-to-end")
                    & (noise["stat"] == "median")].iloc[0]
    numbers = {"n_runs": len(runs), "n_windows": runs["window_id"].nunique(),
               "choice_share": float(choice.loc["all", "choice_share"]),
               "choice_steps": int(choice.loc["all", "choice_steps"]),
               "choice_step_agreement": float(choice.loc["all", "agree_choice"]),
               "request_agreement": float(replay["requests"].loc[0, "agree"]),
               "free_running_order_agreement": float(order["sim"].mean()),
               "noise_order_agreement": float(order["noise"].mean()),
               "sim_e2e_median": float(overall["sim"]), "noise_e2e_median": float(overall["noise"]),
               "sim_over_noise_e2e_median": float(overall["ratio"]),
               "sim_over_noise_lo": float(overall["ratio_lo"]), "sim_over_noise_hi": float(overall["ratio_hi"])}
    for pol in ("slai_faithful", "vllm_faithful"):
        numbers[f"choice_share_{pol}"] = float(choice.loc[pol, "choice_share"]) if pol in choice.index else np.nan
    numbers = {f"fid_choicecase_{k}": v for k, v in numbers.items()}
    numbers.update(hol_numbers(ch, tag, "fid_choicecase_hol"))
    per_policy = pd.DataFrame({
        "steps with a choice": choice["choice_share"], "replay agrees, choice steps": choice["agree_choice"],
        "free-running order": order.groupby("policy")["sim"].mean(),
        "order, real vs real": order.groupby("policy")["noise"].mean()})
    return Section(numbers=numbers, shown=[present.table(per_policy, digits=3)])


def native_equivalence(ch: Chapter) -> Section:
    """``vllm_v1`` against vLLM's own scheduler stepped in virtual time, run by run (the committed
    ``native_vs_model.csv`` of ``benchmarks/native_vs_model.py --save``): per configuration and
    policy, the runs identical to the request (every admission, first token and finish the same
    picosecond) and the classes of the first differing step of the rest."""
    from .. import results
    from ..engine.vllm_native import CLASSES
    from ..policies import canonical

    path = results.native_check_path(ch.data_dir)
    if not path.exists():
        return Section(numbers={"fid_native_identical_runs_share": float("nan"), "fid_native_runs": 0,
                                "fid_native_identical_runs_share_all": float("nan"), "fid_native_runs_all": 0,
                                "fid_native_not_counted": "n/a", "fid_slai_native_identical_share": float("nan"),
                                "fid_slai_native_runs": 0,
                                "fid_native_classes": "not run", "fid_native_no_form": "n/a",
                                "fid_native_lacking": "n/a"})
    runs = pd.read_csv(path, dtype={"class": "string", "detail": "string"})
    runs["policy"] = runs["policy"].map(canonical)          # a stored row of a renamed policy
    own = runs[~runs["policy"].isin(_NO_VLLM_FORM)]
    by = runs.groupby(["config", "policy"], sort=False)
    table = pd.DataFrame({"runs": by.size(), "identical": by["identical"].sum(),
                          "share identical": by["identical"].mean()})
    classes = runs.loc[~runs["identical"], "class"].fillna("stamps_only").value_counts()
    for cls in classes.index[:4]:
        table[cls] = runs.assign(c=runs["class"].fillna("stamps_only") == cls).groupby(
            ["config", "policy"], sort=False)["c"].mean()
    numbers = {"fid_native_identical_runs_share": float(own["identical"].mean()), "fid_native_runs": len(own),
               "fid_native_identical_runs_share_all": float(runs["identical"].mean()),
               "fid_slai_native_identical_share": float(runs.loc[runs["policy"] == "slai_faithful", "identical"].mean()),
               "fid_slai_native_runs": int((runs["policy"] == "slai_faithful").sum()),
               "fid_native_runs_all": len(runs),
               "fid_native_not_counted": present.join([f"{p} ({why})" for p, why in _NO_VLLM_FORM.items()
                                                       if p in set(runs["policy"])], empty="none"),
               "fid_native_windows": runs["window_id"].nunique(),
               "fid_native_configs": present.join(list(dict.fromkeys(runs["config"]))),
               "fid_native_policies": present.join(list(dict.fromkeys(runs["policy"]))),
               "fid_native_classes": present.join(
                   [f"{cls.replace('_', ' ')} in {present.count(int(n), 'run')} ({present.pct(n / len(runs), 1)})"
                    for cls, n in classes.items()], empty="none")}
    for (config, policy), row in table.iterrows():
        numbers[f"fid_native_identical_share_{config}_{policy}"] = float(row["share identical"])
    numbers.update(_native_coverage(runs))
    legend = pd.DataFrame({"class": classes.index, "runs": classes.to_numpy(),
                           "what it is": [CLASSES.get(c, "logs agree; stamps differ") for c in classes.index]})
    return Section(numbers=numbers, shown=[present.table(table, digits=3), present.table(legend)])


#: Simulated policies whose rule vLLM v1 does not have: the native check runs them on vLLM's nearest
#: scheduling, so its identical share counts only the others (the policies whose vLLM form is vLLM's own).
_NO_VLLM_FORM = {"vllm_v0_priority": "a waiting request's eviction of lower priorities is vLLM v0's rule"}

#: Policies checked, besides the shared configurations, in one of their own (their engine settings
#: on vLLM).
_OWN_NATIVE_CONFIG = {"slai_faithful": "slai"}


def _native_coverage(runs: pd.DataFrame) -> dict:
    """Which registered policies the native check leaves out, and why: those with no vLLM form that
    ``vllm_native`` runs (:func:`~portbench.engine.vllm_native.native_policies`), and those it runs
    that the stored check lacks in some configuration (every shared one, and its own where it has
    one: :data:`_OWN_NATIVE_CONFIG`)."""
    from ..engine.vllm_native import native_policies
    from ..policies import available

    runnable = native_policies()
    shared = [c for c in dict.fromkeys(runs["config"]) if c not in _OWN_NATIVE_CONFIG.values()]
    have = set(zip(runs["config"], runs["policy"]))
    lacking = []
    for p in runnable:
        wanted = shared + ([_OWN_NATIVE_CONFIG[p]] if p in _OWN_NATIVE_CONFIG else [])
        missing = [c for c in wanted if (c, p) not in have]
        if missing:
            lacking.append(f"{p} ({present.join(missing)})")
    return {"fid_native_no_form": present.join([p for p in available() if p not in runnable]),
            "fid_native_lacking": present.join(lacking, empty="none")}


# --- 3. the head-of-line ablation, 4. the headline numbers ----------------------------------------
def hol_ablation(ch: Chapter) -> Section:
    result = tables.hol(ch.base_path, **ch.boot, data_dir=ch.data_dir)
    ablation, hol = result["ablation"], result["reversals"]
    means = ablation.pivot_table(index="policy", columns="source", values="anwg")
    numbers = {}
    for variant, g in hol.groupby("variant"):
        key = variant.split("[")[1].rstrip("]")
        numbers[f"fid_hol_supported_{key}"] = int((g["cls"] == "SUPPORTED_PRACTICAL_REVERSAL").sum())
        numbers[f"fid_hol_vllm_azure_{key}"] = float(means.loc[variant, "azure_llm_2024"])
    supported = {v.split("[")[1].rstrip("]"): int((g["cls"] == "SUPPORTED_PRACTICAL_REVERSAL").sum())
                 for v, g in hol.groupby("variant")}
    numbers["fid_hol_went"] = present.went_from(supported.get("block", 0),
                                                {"over-long prompts refused": supported.get("reject", 0),
                                                 "admitted alone": supported.get("chunk", 0)})
    block, alone = supported.get("block", 0), supported.get("chunk", 0)
    numbers["fid_hol_sentence"] = (
        "The study's supported slai_faithful–vllm_faithful reversals rest on a head-of-line rule in its "
        f"vllm_faithful that vLLM does not have: without it they go {numbers['fid_hol_went']}."
        if block > alone else
        f"At this build's loads ({ch.engine_model}), the head-of-line rule of the study's vllm_faithful "
        f"decides no supported reversal: they go {numbers['fid_hol_went']} without it.")
    means_shown = means.rename(index=VARIANTS, columns=lambda c: f"{_source(c)}, mean ANWG")
    means_shown.index.name = "policy"
    return Section(numbers=numbers, shown=[
        present.table(means_shown, digits=3),
        present.table(hol[["variant", "source_x", "source_y", "delta_x", "delta_y", "cls"]]
                      .replace({"variant": VARIANTS}).rename(columns={"variant": "policy against slai_faithful"}),
                      digits=3)])


def headline_label(key: str) -> str:
    """A readable name for a key of fidelity.headline_numbers."""
    if key.startswith("reversals_") and key.removeprefix("reversals_").upper() in present.LABELS:
        return "RQ2 tests: " + present.label(key.removeprefix("reversals_").upper())
    return {"tau_min": "RQ1 cross-source τ_b, lowest", "tau_max": "RQ1 cross-source τ_b, highest",
            "tau_azure_bailian_min": "RQ1 τ_b, Azure–Bailian, lowest",
            "tau_azure_bailian_max": "RQ1 τ_b, Azure–Bailian, highest",
            "tau_with_burstgpt_min": "RQ1 τ_b, pairs with BurstGPT, lowest",
            "tau_with_burstgpt_max": "RQ1 τ_b, pairs with BurstGPT, highest",
            "reversals_supported_slai_vllm": "RQ2 supported reversals of slai_faithful–vllm_faithful",
            "cross_metric_median_tau": "RQ3 cross-metric median τ_b",
            "cross_metric_top1_agreement": "RQ3 cross-metric top-1 agreement",
            "slo_median_tau": "RQ4 SLO variants, median τ_b", "slo_top1_changes": "RQ4 SLO variants, top-1 changes",
            "slo_conditions": "RQ4 SLO variants, conditions",
            "sample_top1_unreliable_at_10": "RQ5 conditions with P(top-1) < 0.9 at 10 windows",
            "sample_conditions": "RQ5 conditions"}.get(key, key)


def headline(ch: Chapter) -> Section:
    rows = {ch.engine_model: tables.headline(ch.base_path, **ch.boot, data_dir=ch.data_dir)}
    if ch.calibrated_path.exists():
        rows[ch.calibrated_engine_model] = tables.headline(ch.calibrated_path, **ch.boot, data_dir=ch.data_dir)
    headline_ = pd.DataFrame(rows)
    numbers = {f"fid_{engine}_{key}": float(value) for engine, col in headline_.items()
               for key, value in col.items() if pd.notna(value)}

    def count(key: str, engine: str) -> str:
        return (str(int(headline_.loc[key, engine])) if engine in headline_ and pd.notna(headline_.loc[key, engine])
                else "n/a")

    for name, key in (("supported", "reversals_supported_practical_reversal"),
                      ("slai_vllm", "reversals_supported_slai_vllm")):
        numbers[f"fid_base_{name}"] = count(key, ch.engine_model)
        numbers[f"fid_calibrated_{name}"] = count(key, ch.calibrated_engine_model)
    counts = [k for k in headline_.index if k.startswith(("reversals_", "slo_top1", "slo_conditions", "sample_"))]
    shown = pd.DataFrame({"headline number": [headline_label(k) for k in headline_.index]})
    for engine in headline_.columns:
        shown[f"engine model {engine}"] = [present.num(v, 0 if k in counts else 3) for k, v in headline_[engine].items()]
    return Section(numbers=numbers, shown=[present.table(shown, labels=False)])

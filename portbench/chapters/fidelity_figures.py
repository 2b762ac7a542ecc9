"""The fidelity chapter's four figures, each drawn from the tables of its section: the refitted
step cost against the step profile, the calibrated model against the real runs, the per-request
latency error by source, and the model's error against the real engine's own repeatability. Each
function returns the Matplotlib figure (placed by :func:`portbench.present.figure`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def step_fit(profile: pd.DataFrame, pred):
    """Measured against modelled step time per clean profile step, coloured by decoding sequences."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.4, 4))
    points = ax.scatter(profile["step_s"] * 1e3, pred * 1e3, s=8, c=np.log1p(profile["decode_seqs"]), cmap="viridis")
    lim = [0, float(max(profile["step_s"].max(), pred.max()) * 1e3 * 1.05)]
    ax.plot(lim, lim, "k:", lw=1)
    ax.set_xlabel("measured step time (ms)"); ax.set_ylabel("cost model's step time (ms)")
    bar = fig.colorbar(points, ax=ax)
    ticks = [t for t in (0, 1, 4, 16, 64, 128) if t <= profile["decode_seqs"].max()]
    bar.set_ticks(np.log1p(ticks), labels=[str(t) for t in ticks])
    bar.set_label("decoding sequences in the step")
    fig.tight_layout()
    return fig


def sim_vs_real(run_err: pd.DataFrame, calibrated_engine_model: str, slow_step_ratio: float):
    """Left: real against simulated ANWG per run, by policy and host guard; right: the error against
    the run's step ratio."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for (policy, host), g in run_err.groupby(["policy", "host"]):
        axes[0].scatter(g["anwg_real"], g["anwg_sim"], s=18, marker="o" if host == "accepted" else "x",
                        label=f"{policy} (host guard: {host})")
    axes[0].plot([0, 1], [0, 1], "k:", lw=1)
    axes[0].set_xlabel("ANWG, real engine"); axes[0].set_ylabel(f"ANWG, {calibrated_engine_model} model")
    axes[0].legend(fontsize=7)
    if run_err["step_ratio"].notna().any():
        for policy, g in run_err.groupby("policy"):
            axes[1].scatter(g["step_ratio"], g["anwg_sim"] - g["anwg_real"], s=18, label=policy)
        axes[1].axvline(slow_step_ratio, color="grey", ls=":", lw=1)
        axes[1].axhline(0, color="k", lw=0.6)
        axes[1].set_xscale("log")
        axes[1].set_xlabel("real step ÷ cost model (median over the run's steps)")
        axes[1].set_ylabel("ANWG, model − real"); axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def e2e_error(latency: pd.DataFrame):
    """The cumulative share of each source's requests by relative end-to-end latency error."""
    import matplotlib.pyplot as plt

    from ..book import source_label

    fig, ax = plt.subplots(figsize=(6, 3.6))
    e2e = latency[latency["measure"] == "end-to-end"]
    for src, g in e2e.groupby("source"):
        x = np.sort(g["rel_error"].to_numpy()) * 100
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=f"{source_label(src)} ({len(x):,} requests)")
    ax.axvline(10, color="grey", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("relative error of end-to-end latency, model against real (%)")
    ax.set_ylabel("share of requests")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def noise_ratio(noise: pd.DataFrame, measures: dict):
    """Per group, the model's median error ÷ the real repetitions' difference, with its interval."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    shown = noise[noise["stat"] == "median"]
    names = list(dict.fromkeys(shown["group"]))
    for k, (m, marker) in enumerate(zip(measures, "osD")):
        d = shown[shown["measure"] == m].set_index("group").reindex(names)
        y = np.arange(len(names)) + (k - 1) * 0.22
        ax.errorbar(d["ratio"], y, xerr=[d["ratio"] - d["ratio_lo"], d["ratio_hi"] - d["ratio"]], fmt=marker,
                    capsize=2, label=f"{m}, median")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvline(1.1, color="k", lw=0.6, ls=":")
    ax.set_yticks(range(len(names)), [n.replace("_llm_2024", "").replace(" / ", " × ") for n in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("model's error ÷ the real engine's own run-to-run difference (95% CI by window)", fontsize=8)
    ax.legend(fontsize=7.5, loc="lower right")
    fig.tight_layout()
    return fig

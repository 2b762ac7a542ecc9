"""Recompute the committed campaign tables from an empty cache and compare them, column by column.

The project's anchor is that the ``lssp`` tables stay bit-identical through every change to a result
module; this script is the check to run before committing one. It copies the frozen windows into a
scratch data folder, runs each campaign there from an empty cache (the same commands as
``portbench campaign``), and compares every table and λ_ref file with the committed one: it prints,
per table, the number of cells that differ in each column (NaN equals NaN; ``cell_key``, a cache
key that hashes the source code, is not compared), and for the cells that moved the policies and
regions they belong to. A committed row of a policy since renamed is compared under its registered
name (:data:`portbench.policies.ALIASES`). Exit status 1 when an ``lssp`` table differs.

    python benchmarks/recompute_tables.py                 # all eight tables (~6 min on 2 idle cores)
    python benchmarks/recompute_tables.py --engines lssp  # the anchor only
    python benchmarks/recompute_tables.py --keep DIR      # also keep the recomputed tables in DIR
    python benchmarks/recompute_tables.py --report FILE.csv   # per (table, policy, region): what moved
    python benchmarks/recompute_tables.py --rq8           # also RQ8's sub-window tables (+ ~4 min)

``--rq8`` recomputes RQ8's tables too (``portbench rq8-campaign``: the primary panel on 50-, 100- and
200-request sub-windows, per engine) and compares them the same way (keys: window, sub-window,
region, policy).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from portbench import results, store
from portbench.campaign import CampaignConfig, run_campaign
from portbench.commands import RQ7_PREDICTION_ERRORS
from portbench.policies import EXTENDED_PANEL, canonical
from portbench.workload import PREDICTION_RELATIVE_ERROR

KEYS = ["window_id", "region", "policy", "slo_multiplier"]
#: An RQ8 row's keys (a sub-window of a frozen window).
RQ8_KEYS = ["window_id", "parent_window_id", "sub_index", "region", "policy", "slo_multiplier"]
#: Not a result: each cell's cache key, a hash that includes the source code (it moves with any edit).
NOT_COMPARED = ("cell_key",)


def configs(engines):
    """The committed tables' configurations: the base table (three SLO multipliers) and RQ7's
    prediction-error sweep (base SLO only), per engine model."""
    for engine in engines:
        yield CampaignConfig(engine_model=engine, policies=EXTENDED_PANEL)
        for err in RQ7_PREDICTION_ERRORS:
            yield CampaignConfig(engine_model=engine, policies=EXTENDED_PANEL, slo_multipliers=(20.0,),
                                 prediction_error=err)


def compare(new: pd.DataFrame, old: pd.DataFrame, key_columns=KEYS) -> tuple[int, dict, pd.DataFrame, pd.DataFrame]:
    """(cells compared, differing cells per column, the keys of the rows that differ, the keys of
    the rows only the recomputed table has). A row only the recomputed table has is an addition (a
    policy added to the panel), not a change: the anchor is that every committed cell stays."""
    keys = [k for k in key_columns if k in old.columns]
    old = old.assign(policy=old["policy"].map(canonical))     # a renamed policy under its new name
    merged = old.merge(new, on=keys, how="outer", suffixes=("_old", "_new"), indicator=True)
    lost = merged[merged["_merge"] == "left_only"]
    added = merged.loc[merged["_merge"] == "right_only", keys]
    both = merged[merged["_merge"] == "both"]
    per_column, moved = {}, np.zeros(len(both), dtype=bool)
    if len(lost):
        per_column["(committed row missing from the recomputed table)"] = len(lost)
    for col in old.columns:
        if col in keys or col in NOT_COMPARED or col + "_new" not in both:
            continue
        a, b = both[col + "_old"].to_numpy(), both[col + "_new"].to_numpy()
        if a.dtype.kind in "fc" and b.dtype.kind in "fc":
            same = (a == b) | (np.isnan(a) & np.isnan(b))
        else:
            same = a == b
        if (~same).any():
            per_column[col] = int((~same).sum())
            moved |= ~same
    return len(both), per_column, both.loc[moved, keys], added


def moved_report(table: str, new: pd.DataFrame, old: pd.DataFrame, key_columns=KEYS) -> pd.DataFrame:
    """Per (policy, region): cells compared, cells whose λ_ref moved, cells whose ANWG moved, and the
    mean and largest |ΔANWG| (new − old) — what a recompute changed, for the methods chapter."""
    keys = [k for k in key_columns if k in old.columns]
    old = old.assign(policy=old["policy"].map(canonical))
    both = old.merge(new, on=keys, suffixes=("_old", "_new"))
    delta = both["anwg_new"] - both["anwg_old"]
    frame = pd.DataFrame({"table": table, "policy": both["policy"], "region": both["region"],
                          "lambda_moved": both["lambda_ref_new"] != both["lambda_ref_old"],
                          "anwg_moved": ~((both["anwg_new"] == both["anwg_old"])
                                          | (both["anwg_new"].isna() & both["anwg_old"].isna())),
                          "abs_delta_anwg": delta.abs(), "delta_anwg": delta})
    return (frame.groupby(["table", "policy", "region"], sort=False)
            .agg(n_cells=("anwg_moved", "size"), n_lambda_moved=("lambda_moved", "sum"),
                 n_anwg_moved=("anwg_moved", "sum"), mean_delta_anwg=("delta_anwg", "mean"),
                 mean_abs_delta_anwg=("abs_delta_anwg", "mean"), max_abs_delta_anwg=("abs_delta_anwg", "max"))
            .reset_index())


def print_comparison(name: str, n: int, per_column: dict, moved: pd.DataFrame, added: pd.DataFrame,
                     seconds: float, extra: str = "") -> None:
    print(f"{name}: {n} cells in {seconds:.1f} s{extra}; "
          + ("every cell identical" if not per_column else
             f"{len(moved)} rows differ: " + ", ".join(f"{c} {k}" for c, k in per_column.items())))
    if len(added):
        print(f"    {len(added)} rows added (only in the recomputed table), policies: "
              + ", ".join(sorted(set(added["policy"]))))
    if len(moved):
        print("    by policy: " + ", ".join(f"{p} {k}" for p, k in moved["policy"].value_counts().items()))
        print("    by region: " + ", ".join(f"{r} {k}" for r, k in moved["region"].value_counts().items()))


def recompute_rq8(engines, data: Path, keep: Path | None, workers) -> tuple[bool, list]:
    """RQ8's tables recomputed in ``data`` and compared with the committed ones: (an lssp table
    moved, the moved reports)."""
    from portbench.open_questions import RQ8_WINDOW_SIZES, SubWindowConfig, run_subwindow_campaign

    anchor_moved, reports = False, []
    for engine in engines:
        for size in RQ8_WINDOW_SIZES:
            t0 = time.perf_counter()
            new_table, new_path = run_subwindow_campaign(SubWindowConfig(window_size=size, engine_model=engine),
                                                         data_dir=data, workers=workers, progress=False)
            old_table = results.read_subwindow_table(size, engine)
            n, per_column, moved, added = compare(new_table, old_table, RQ8_KEYS)
            reports.append(moved_report(new_path.stem, new_table, old_table, RQ8_KEYS))
            print_comparison(f"RQ8 {engine} n{size}", n, per_column, moved, added, time.perf_counter() - t0)
            anchor_moved |= engine == "lssp" and bool(per_column)
            if keep:
                keep.mkdir(parents=True, exist_ok=True)
                for f in (new_path, results.stamp_path(new_path)):
                    shutil.copy2(f, keep / f.name)
    return anchor_moved, reports


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", nargs="+", default=["lssp", "vllm_v1"])
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="copy the recomputed tables here")
    ap.add_argument("--report", type=Path, default=None,
                    help="write what moved, per (table, policy, region), to this CSV")
    ap.add_argument("--rq8", action="store_true", help="also recompute and compare RQ8's sub-window tables")
    args = ap.parse_args()
    anchor_moved = False
    reports = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        shutil.copytree(store.windows_dir(), data / "windows")
        for config in configs(args.engines):
            t0 = time.perf_counter()
            run_campaign(config, data_dir=data, workers=args.workers, progress=False)
            new_path = results.campaign_path(config.engine_model, data, config.prediction_error)
            old_path = results.campaign_path(config.engine_model, None, config.prediction_error)
            new_table, old_table = pd.read_parquet(new_path), pd.read_parquet(old_path)
            n, per_column, moved, added = compare(new_table, old_table)
            reports.append(moved_report(new_path.stem, new_table, old_table))
            lam_new = results.lambda_ref_path(config.engine_model, data, config.prediction_error)
            lam_old = results.lambda_ref_path(config.engine_model, None, config.prediction_error)
            lam_same = lam_new.read_bytes() == lam_old.read_bytes()
            err = "" if config.prediction_error == PREDICTION_RELATIVE_ERROR else f" prederr {config.prediction_error:g}"
            print_comparison(f"{config.engine_model}{err}", n, per_column, moved, added, time.perf_counter() - t0,
                             f"; λ_ref file {'identical' if lam_same else 'DIFFERS'}")
            if config.engine_model == "lssp" and (per_column or not lam_same):
                anchor_moved = True
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                for f in (new_path, lam_new, results.stamp_path(new_path)):
                    shutil.copy2(f, args.keep / f.name)
        if args.rq8:
            moved_rq8, rq8_reports = recompute_rq8(args.engines, data, args.keep, args.workers)
            anchor_moved |= moved_rq8
            reports += rq8_reports
    if args.report:
        pd.concat(reports).to_csv(args.report, index=False, float_format="%.6g")
        print(f"what moved: {args.report}")
    if anchor_moved:
        print("the lssp anchor MOVED: do not commit this change to a result module")
    return 1 if anchor_moved else 0


if __name__ == "__main__":
    sys.exit(main())

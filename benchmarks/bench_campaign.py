"""Benchmark: the whole campaign (calibration of every window + all cells) from an empty cache.

Prints wall time, CPU time, cells/s, simulated requests/s, peak memory, and the CPU per cell against
the original study's (~33 CPU-core-hours for 18,720 cells). Usage:

    python benchmarks/bench_campaign.py [--workers N] [--limit-windows K] [--policies ...]
"""

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

from portbench import store
from portbench.campaign import CampaignConfig, calibrate, run_campaign
from portbench.policies import STUDY_POLICIES
from portbench.regions import BISECTION_STEPS

ORIGINAL_CORE_SECONDS_PER_CELL = 33 * 3600 / 18720


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--limit-windows", type=int, default=None, help="windows per source")
    ap.add_argument("--policies", nargs="+", default=list(STUDY_POLICIES))
    ap.add_argument("--executor", default="local")
    ap.add_argument("--slo-multipliers", nargs="+", type=float, default=[20.0],
                    help="default: the base SLO only, i.e. the study's 9,360 cells")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shutil.copytree(store.windows_dir(), tmp / "windows")
        manifest = store.list_windows(tmp)
        if args.limit_windows:
            manifest = manifest.groupby("source").head(args.limit_windows)
        config = CampaignConfig(policies=tuple(args.policies), window_ids=tuple(manifest["window_id"]),
                                slo_multipliers=tuple(args.slo_multipliers))
        cpu0 = time.process_time()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        summary = run_campaign(config, data_dir=tmp, executor=args.executor, workers=args.workers,
                               progress=False)
        wall = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (time.process_time() - cpu0) + (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        peak_child = ru1.ru_maxrss / 1024

    n_windows = len(manifest)
    n_cells = summary.n_cells
    # The calibration's runs, counted again outside the timed part: a bisection probe that repeats
    # an earlier probe's run (the same visible steps under lssp) is not simulated twice.
    windows = store.load_windows(window_ids=tuple(manifest["window_id"]))
    n_cal = sum(calibrate(w, config).n_simulations for w in windows)
    n_probes = n_windows * (BISECTION_STEPS + 2)
    n_sims = n_cells + n_cal
    requests = n_sims * sum(len(w) for w in windows) / n_windows
    print(f"windows                  {n_windows}")
    print(f"cells                    {n_cells}  (+ {n_cal} calibration runs for {n_probes} bisection probes)")
    print(f"wall time                {wall:.1f} s")
    print(f"CPU time (all processes) {cpu:.1f} s")
    print(f"cells/s (wall)           {n_cells / wall:.1f}")
    print(f"simulated requests/s     {requests / wall:,.0f} (wall), {requests / cpu:,.0f} per CPU-second")
    print(f"peak RSS                 main {peak_self:.0f} MiB, largest worker {peak_child:.0f} MiB")
    per_cell_cpu = cpu / n_cells
    print(f"CPU per cell             {per_cell_cpu * 1000:.1f} ms (original study: "
          f"{ORIGINAL_CORE_SECONDS_PER_CELL:.2f} s) -> {ORIGINAL_CORE_SECONDS_PER_CELL / per_cell_cpu:.0f}x less")


if __name__ == "__main__":
    main()

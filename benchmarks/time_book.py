"""Benchmark: how long `make book` takes from the committed tables, chapter by chapter.

Does what `portbench book` does once its environment is set up: checks that every campaign table the
book reads is current (a stale one is named; `make book` would recompute it, this benchmark does not),
then builds the book — every notebook executed with papermill (one per core at a time, unless
``--jobs``), then the HTML — into a scratch copy of the book's pages, so the repository's ``book/`` is
left alone. Prints each chapter's wall time (longest first), the HTML build's, the notebooks' sum and
the total, with the machine's load average before and after (this is a shared 2-core machine: read
the figures beside the load). Usage:

    python benchmarks/time_book.py [--jobs N] [--book-dir DIR] [--notebooks NAME ...] [--tiny]

``--jobs 1`` executes the notebooks one after another, as `make book` did before the parallel build.
"""

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path


def stale_tables(engine: str = "lssp") -> list[str]:
    """The campaign tables `portbench book` would recompute before building (see portbench.commands)."""
    from portbench.campaign import CampaignConfig, results_are_current, results_path
    from portbench.commands import RQ7_PREDICTION_ERRORS
    from portbench.open_questions import RQ8_WINDOW_SIZES, SubWindowConfig, subwindow_results_current
    from portbench.policies import EXTENDED_PANEL

    configs = [CampaignConfig(engine_model=engine, policies=EXTENDED_PANEL)] + [
        CampaignConfig(engine_model=engine, policies=EXTENDED_PANEL, slo_multipliers=(20.0,), prediction_error=err)
        for err in RQ7_PREDICTION_ERRORS]
    stale = [results_path(c.engine_model, prediction_error=c.prediction_error).name
             for c in configs if not results_are_current(c)]
    stale += [f"rq8 sub-windows of {size}" for size in RQ8_WINDOW_SIZES
              if not subwindow_results_current(SubWindowConfig(window_size=size, engine_model=engine))]
    from portbench import rq9
    stale += [results_path(c.table_name).name for c in rq9.configs().values() if not results_are_current(c)]
    return stale


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=None, help="notebooks executed at a time (default: one per core)")
    ap.add_argument("--book-dir", help="build here (default: a scratch folder, removed afterwards)")
    ap.add_argument("--notebooks", nargs="+", help="only these chapters (file stems)")
    ap.add_argument("--tiny", action="store_true", help="the tests' small parameters (few bootstrap resamples)")
    args = ap.parse_args()

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    from portbench import book

    stale = stale_tables()
    t_checks = time.perf_counter() - t_start
    if stale:
        print(f"note: not current, `make book` would recompute them first: {', '.join(stale)}")
    scratch = None if args.book_dir else Path(tempfile.mkdtemp(prefix="portbench-time-book-"))
    book_dir = Path(args.book_dir) if args.book_dir else scratch / "book"
    if scratch is not None and (book.EXECUTED_DIR).exists():
        # the last build's executed notebooks, as `make book` finds them: they say which chapters ran
        # longest, and those start first
        shutil.copytree(book.EXECUTED_DIR, book_dir / "executed")
    timings = {}
    try:
        t0 = time.perf_counter()
        book.build_book(book.TINY_PARAMETERS if args.tiny else None, notebooks=args.notebooks, progress=False,
                        book_dir=book_dir, jobs=args.jobs, timings=timings)
        t_build = time.perf_counter() - t0
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    total = time.perf_counter() - t_start
    load_after = os.getloadavg()

    html = timings.pop("html")
    jobs = args.jobs or os.cpu_count()
    print(f"\nmake book from the committed tables ({len(timings)} notebooks, {min(jobs, len(timings))} at a time, "
          f"{os.cpu_count()} cores; CPU: user + system seconds, the kernels' included)")
    print(f"{'chapter':<26}{'wall s':>9}{'CPU s':>9}")
    for name, t in sorted(timings.items(), key=lambda kv: -kv[1]["wall"]):
        print(f"{name:<26}{t['wall']:>9.1f}{t['cpu']:>9.1f}")
    print(f"{'(sum of the chapters)':<26}{sum(t['wall'] for t in timings.values()):>9.1f}"
          f"{sum(t['cpu'] for t in timings.values()):>9.1f}")
    print(f"{'notebooks, wall':<26}{t_build - html['wall']:>9.1f}")
    print(f"{'HTML (Sphinx)':<26}{html['wall']:>9.1f}{html['cpu']:>9.1f}")
    print(f"{'table checks, imports':<26}{t_checks:>9.1f}")
    print(f"{'total':<26}{total:>9.1f}")
    print(f"load average (1, 5, 15 min): before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")


if __name__ == "__main__":
    main()

"""Instructions executed by a fixed simulation workload, this tree against a git revision.

Wall time on a shared 2-core machine drifts by ±15% and, for minutes at a time, by 2–6×, which hides
a change of a few per cent. The instructions a process executes do not drift: this script runs the
same workload under valgrind's callgrind for the working tree and for ``--base`` (checked out in a
temporary git worktree), subtracts what the same process executes without the workload (imports,
loading the compiled loops), and prints both counts and their ratio. A ratio is not a wall-time
ratio (cache misses and the interpreter's branches weigh differently), but it moves with the work
done, and it is the same on every run.

    python benchmarks/bench_instructions.py --base HEAD                    # 12 windows' 936 cells
    python benchmarks/bench_instructions.py --base HEAD --policies slai_faithful fifo
    python benchmarks/bench_instructions.py --base HEAD --calibration      # 12 windows' λ_ref
    python benchmarks/bench_instructions.py --base HEAD --engine-model vllm_v1 --policies slai_faithful

Needs ``valgrind`` on the PATH. A run takes a few minutes (callgrind runs Python ~50× slower); the
two trees run side by side, one per core.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# One process, one workload on every 10th window: its λ_ref calibration, or its cells at the
# committed λ_ref (``none``: the start-up alone).
WORKLOAD = r"""
import sys
import pandas as pd
from portbench import store, sim
from portbench.campaign import CampaignConfig, calibrate
from portbench.engine import engine_model
from portbench.policies import make_policy
from portbench.regions import REGIONS
from portbench.workload import scale
mode, engine, lambda_csv, policies = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
windows = store.load_windows()[::10]
model = engine_model(engine)
if mode == "calibration":
    for w in windows:
        calibrate(w, CampaignConfig(engine_model=engine))
elif mode == "cells":
    lam = pd.read_csv(lambda_csv).set_index("window_id")["lambda_ref"]
    for w in windows:
        for f in REGIONS.values():
            scaled = scale(w, f * float(lam[w.window_id]))
            for p in policies:
                sim.simulate(scaled, make_policy(p), model)
"""


def instructions(tree: Path, mode: str, engine: str, policies: list[str], script: Path,
                 out: Path) -> subprocess.Popen:
    from portbench import results

    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, str(script),
           mode, engine, str(results.lambda_ref_path(engine, ROOT / "data")), *policies]
    return subprocess.Popen(cmd, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def refs(proc: subprocess.Popen) -> int:
    _, err = proc.communicate()
    m = re.search(r"I\s+refs:\s+([\d,]+)", err)
    if proc.returncode or not m:
        raise SystemExit(f"valgrind failed (exit {proc.returncode}):\n{err[-2000:]}")
    return int(m.group(1).replace(",", ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision to compare with (e.g. HEAD)")
    ap.add_argument("--policies", nargs="+", default=None,
                    help="policies whose cells to run (default: the study's 13)")
    ap.add_argument("--calibration", action="store_true", help="the λ_ref calibration alone")
    ap.add_argument("--engine-model", default="lssp", choices=["lssp", "vllm_v1"],
                    help="the engine model of the workload (its committed λ_ref for the cells)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: this benchmark counts instructions with callgrind")
    from portbench.policies import STUDY_POLICIES
    policies = args.policies or list(STUDY_POLICIES)
    mode = "calibration" if args.calibration else "cells"

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        script = tmp / "workload.py"
        script.write_text(WORKLOAD)
        base = tmp / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(base), args.base], cwd=ROOT,
                       check=True, capture_output=True)
        # each tree reads its own checkout's windows (the same files); the cells of both run at this
        # tree's committed λ_ref
        try:
            counts = {}
            for label, m in (("overhead", "none"), ("workload", mode)):
                procs = {tree: instructions(path, m, args.engine_model, policies, script,
                                            tmp / f"cg.{tree}.{m}")
                         for tree, path in (("this tree", ROOT), (args.base, base))}
                for tree, proc in procs.items():
                    counts[tree, label] = refs(proc)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)

    what = ("their λ_ref calibration" if mode == "calibration" else
            f"their cells of {len(policies)} policies at the committed λ_ref")
    print(f"workload: 12 windows (every 10th), {what}, {args.engine_model} engine; instructions net "
          f"of start-up")
    net = {}
    for tree in (args.base, "this tree"):
        net[tree] = counts[tree, "workload"] - counts[tree, "overhead"]
        print(f"{tree:>12}: {net[tree] / 1e9:8.3f} G instructions "
              f"(start-up {counts[tree, 'overhead'] / 1e9:.3f} G)")
    print(f"ratio this tree / {args.base}: {net['this tree'] / net[args.base]:.3f}")


if __name__ == "__main__":
    main()

"""A key policy of your own on three engine models: ``lssp``, ``vllm_v1`` and vLLM's own scheduler
stepped in virtual time (``vllm_native``), beside a panel of policies that run on all three.

The "Add your own scheduler" chapter reads what this writes (:func:`portbench.results.custom_engines_path`)
and shows where the engines rank the policies alike. Each cell is a campaign cell
(:func:`portbench.campaign.run_window`: the window compressed to a region's load, the base SLO, the
study's prediction error), at each engine model's own λ_ref (``data/results/lambda_ref_<engine>.csv``;
``vllm_native`` takes ``vllm_v1``'s: the two run FIFO identically in all 720 campaign runs of the
equivalence check, so their knees are the same). The policy file is loaded by path, as
``portbench campaign --policy-module`` does; each row records the file's sha256, so the chapter can
tell results of another version of the policy.

Runs in the vLLM environment (``vllm_native`` needs vLLM; about two minutes on two cores)::

    .venv-vllm/bin/python benchmarks/custom_policy_engines.py            # the chapter's policy, --save
    .venv-vllm/bin/python benchmarks/custom_policy_engines.py --policy-module my_policy.py \\
        --policy my_policy --out /tmp/mine.csv
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from portbench import results, store  # noqa: E402
from portbench.campaign import CampaignConfig, run_window  # noqa: E402
from portbench.commands import import_policy_modules  # noqa: E402

#: The chapter's policy file and name.
EXAMPLE = ROOT / "portbench" / "examples" / "shortest_predicted_remaining_first.py"
EXAMPLE_POLICY = "shortest_predicted_remaining_first"
#: Policies that run on every engine model, vLLM's scheduler included (vLLM's own forms or keys).
PANEL = ("fifo", "edf", "sjf_aging", "lof", "hrrn", "shortest_prefill_first")
ENGINES = ("lssp", "vllm_v1", "vllm_native")
REGIONS = ("KNEE", "OVERLOAD", "HIGH_PRESSURE")
SLO = 20.0


def lambda_refs(engine: str) -> pd.Series:
    source = "vllm_v1" if engine == "vllm_native" else engine
    return results.read_lambda_table(source).set_index("window_id")["lambda_ref"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy-module", default=str(EXAMPLE), help="the policy's file")
    ap.add_argument("--policy", default=EXAMPLE_POLICY, help="its registered name")
    ap.add_argument("--panel", nargs="+", default=list(PANEL))
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    ap.add_argument("--regions", nargs="+", default=list(REGIONS))
    ap.add_argument("--windows-per-source", type=int, default=4)
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--save", action="store_true", help="write where the chapter reads it")
    group.add_argument("--out", help="write this CSV")
    args = ap.parse_args(argv)

    path = Path(args.policy_module)
    import_policy_modules([path])
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    policies = tuple(dict.fromkeys([*args.panel, args.policy]))
    windows = [w for s in store.SOURCES_OF_THE_STUDY
               for w in store.load_windows(source=s)[:args.windows_per_source]]
    frames = []
    for engine in args.engines:
        config = CampaignConfig(engine_model=engine, policies=policies, regions=tuple(args.regions),
                                slo_multipliers=(SLO,))          # refuses a policy the engine cannot run
        lam = lambda_refs(engine)
        t = time.perf_counter()
        for w in windows:
            frames.append(run_window(w, config, SLO, fingerprint="", lambda_ref=float(lam[w.window_id])))
        n = len(windows) * len(args.regions) * len(policies)
        print(f"{engine}: {n} cells in {time.perf_counter() - t:.1f} s", flush=True)
    table = pd.concat(frames, ignore_index=True).drop(columns=["cell_key"])
    table["policy_file"] = path.name
    table["policy_sha256"] = digest
    out = results.custom_engines_path() if args.save else Path(args.out) if args.out else None
    if out is None:
        print(table.groupby(["engine_model", "policy"])["anwg"].mean().unstack("engine_model").round(4))
        return 0
    tmp = out.with_suffix(".tmp")
    table.to_csv(tmp, index=False)
    tmp.replace(out)
    print(f"{len(table)} rows -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

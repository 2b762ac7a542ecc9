"""The simulator's prediction for a real case, in the configuration the case ran (no engine is run):

    python benchmarks/predict_real_config.py                      # the study-configuration case
    python benchmarks/predict_real_config.py --tag vllm_cpu_study --config study

For every (window, policy) of the case ``<tag>_case``: the window at the case's load (its real
λ_ref × the region's factor), the ``vllm_v1`` engine model with the step cost cross-validated by
window on the case's own steps (a cost per policy), and the configuration's limits and client cap
(:data:`portbench.realconfig.STUDY_CONFIG`: 32,768-token budget and ``max_model_len``, 256
sequences, at most 32 requests in flight, chunked prefill off). Writes the case's ``sim_config`` beside it
(:class:`portbench.results.Case`; one row per window and policy: the load, the cap's fixed-point
iterations, refusals and every metric) and prints the predicted and real ``slai_faithful`` − ``vllm_faithful`` ANWG per source.
"""

import argparse
import time

import pandas as pd

from portbench import fidelity, realconfig, results
from portbench.realengine.study import case_deltas

CONFIGS = {"study": realconfig.STUDY_CONFIG}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", default="vllm_cpu_study", help="the real-engine case (without _case)")
    ap.add_argument("--config", default="study", choices=sorted(CONFIGS))
    ap.add_argument("--folds", type=int, default=4)
    args = ap.parse_args()
    t0 = time.perf_counter()
    case = fidelity.load_case(args.tag)
    config = CONFIGS[args.config]
    pred = realconfig.predict_runs(case["runs"], case["steps"], case["windows"], k=args.folds, **config)
    pred = pred.assign(config=args.config, budget=config["budget"], seqs=config["seqs"],
                       max_model_len=config["max_model_len"], max_in_flight=config["max_in_flight"],
                       enable_chunked_prefill=config["enable_chunked_prefill"],
                       cost=f"rich, per policy, cross-validated over {args.folds} folds of windows")
    stored = results.case_of(args.tag)
    stored.write(sim_config=pred)
    path = stored.path("sim_config")
    both = pd.concat([case_deltas(pred, "simulator, same configuration"),
                      case_deltas(case["runs"], "real engine")], ignore_index=True)
    print(both.to_string(index=False))
    print(f"cap fixed point: {pred['iterations'].median():.0f} iterations median, {pred['iterations'].max()} max")
    print(f"wrote {path} ({len(pred)} rows) in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

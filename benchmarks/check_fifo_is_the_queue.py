"""FCFS under an engine model is "propose the waiting queue as it stands": the registered ``fifo``
against a policy that proposes ``view.waiting`` unchanged, on all 720 (window, region) runs at the
committed λ_ref and the base SLO. Prints how many runs differ (request by request).

    python benchmarks/check_fifo_is_the_queue.py                    # vllm_v1 (about a minute)
    python benchmarks/check_fifo_is_the_queue.py --engine-model lssp

Before the engine took over the admission walk, 240 of the 720 vllm_v1 runs differed (a policy
helper filtered the queue by the study's whole-prompt rule before vLLM's head-of-line rule saw it).
"""

import argparse

import numpy as np

from portbench import results, store
from portbench.engine import engine_model
from portbench.policies import make_policy
from portbench.regions import REGIONS, region_factor
from portbench.sim import Decision, Policy, simulate
from portbench.workload import scale, with_slo


class ProposesTheQueue(Policy):
    name = "proposes_the_queue"
    admission_only = True

    def schedule(self, view):
        return Decision(admit=list(view.waiting))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-model", default="vllm_v1")
    args = ap.parse_args()
    model = engine_model(args.engine_model)
    table = results.read_lambda_table(args.engine_model)
    if table is None:
        raise SystemExit(f"no {results.lambda_ref_path(args.engine_model).name}: run `portbench campaign "
                         f"--engine-model {args.engine_model}` first")
    lam = table.set_index("window_id")["lambda_ref"]
    differ = 0
    for window in store.load_windows():
        w = with_slo(window, 20.0)
        for region in REGIONS:
            x = scale(w, lam[w.window_id] * region_factor(region))
            a, b = simulate(x, make_policy("fifo"), model), simulate(x, ProposesTheQueue(), model)
            differ += not all(np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True)
                              for f in ("admit_s", "first_token_s", "finish_s"))
    print(f"{args.engine_model}: fifo differs from proposing the queue as it stands in {differ} of "
          f"{len(lam) * len(REGIONS)} (window, region) runs")


if __name__ == "__main__":
    main()

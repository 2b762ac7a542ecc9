"""Simulated requests per second for a ~20,000-request trace under the vLLM-v1-like engine model.

The anchor: Vidur 0.0.26 (vLLM-v0 scheduler, Llama-3-8B profile, the 19,366-request Azure 2023
conversation trace) simulated ~280 requests/s on this 2-core machine (measured earlier; see the
project's toolchain notes). Here the trace is 100 of the frozen windows (20,000 requests) laid end to
end in trace time, compressed by ``--scale``, served FCFS (vLLM's default) by the ``vllm_v1`` engine
model; the same run walked step by step must give identical results.

    python benchmarks/bench_vs_vidur.py [--scale 0.5] [--windows 100] [--no-reference]
    python benchmarks/bench_vs_vidur.py --table [--repeats 3]     # every registered policy, side by side
    python benchmarks/bench_vs_vidur.py --engine-share --policies slai_faithful las
    python benchmarks/bench_vs_vidur.py --calls --policies slai_faithful fastserve_mlfq

``--table`` times every registered policy (or ``--policies``) in one process, ``--repeats`` times
each, interleaved with FCFS, and prints the median, the spread (min–max) and the ratio to FCFS
measured in the same rounds — on a shared machine the ratio is the figure to trust.

``--engine-share`` splits a policy's run into the policy's part and the engine's: the run's decisions
are recorded, then replayed by a policy that only returns them (the same steps, admissions and
timers, so the engine does the same work); the replay's time is the engine's share, and what a
policy with free decisions could reach at most on this trace.

``--calls`` counts where a policy is asked: its calls, the engine's steps, and the calls made just
after the engine refused an admission the policy proposed, with how many of those propose the same
request first again and hold the same requests as the call before (a decision repeated as is).
"""

import argparse
import collections
import dataclasses
import itertools
import time

import numpy as np

from portbench import sim, store
from portbench.engine import VllmV1Model
from portbench.policies import make_policy
from portbench.workload import make_window, scale

VIDUR_REQUESTS_PER_S = 280.0


def recorded(admissions, record: list):
    """``admissions``, lazily, each noted in ``record`` as the engine takes it."""
    for i in admissions:
        record.append(i)
        yield i


def long_trace(n_windows: int, source: str | None = None):
    """Windows in manifest order (the study's, or ``source``'s), each starting one mean gap after the
    previous one's last arrival; a prefix-hashed source's windows keep their block hashes."""
    windows = store.load_windows(source=source)[:n_windows]
    arrival, inp, out, pred, t0 = [], [], [], [], 0.0
    for w in windows:
        gap = w.duration_s / max(1, len(w) - 1)
        arrival.append(w.arrival_s + t0)
        t0 = float(arrival[-1][-1]) + gap
        inp.append(w.input_tokens), out.append(w.output_tokens), pred.append(w.predicted_output_tokens)
    hashed = windows[0].block_hashes is not None
    return make_window(f"{n_windows}_windows", "mixed", np.concatenate(arrival), np.concatenate(inp),
                       np.concatenate(out), np.concatenate(pred),
                       meta={"block_tokens": windows[0].meta["block_tokens"]} if hashed else None,
                       block_hashes=[h for w in windows for h in w.block_hashes] if hashed else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=100)
    ap.add_argument("--scale", type=float, default=0.5, help="arrival compression of the trace")
    ap.add_argument("--policy", default="fifo")
    ap.add_argument("--no-reference", action="store_true", help="skip the step-by-step check")
    ap.add_argument("--table", action="store_true", help="every policy side by side (no reference)")
    ap.add_argument("--policies", nargs="+", help="with --table: these policies (default: all)")
    ap.add_argument("--repeats", type=int, default=3, help="with --table: rounds per policy")
    ap.add_argument("--engine-share", action="store_true",
                    help="time each policy's run against a replay of its decisions (the engine alone)")
    ap.add_argument("--prefix-caching", action="store_true",
                    help="vLLM's prefix cache on (enable_prefix_caching) in the engine model")
    ap.add_argument("--source", help="the windows of this source (default: the study's)")
    ap.add_argument("--calls", action="store_true",
                    help="count each policy's calls, and those that repeat a refused decision")
    args = ap.parse_args()
    if args.table:
        return table(args)
    if args.engine_share:
        return engine_share(args)
    if args.calls:
        return call_counts(args)

    trace = scale(long_trace(args.windows, args.source), args.scale)
    model = VllmV1Model(enable_prefix_caching=args.prefix_caching)
    # The engine's compiled loops are loaded (or compiled, on a first run) once per process: that
    # start-up is timed apart from the simulation, as Vidur's figure is its simulation loop alone.
    t = time.perf_counter()
    sim.simulate(scale(long_trace(1, args.source), args.scale), make_policy(args.policy), model)
    startup = time.perf_counter() - t
    t = time.perf_counter()
    fast = sim.simulate(trace, make_policy(args.policy), model)
    wall = time.perf_counter() - t
    n = len(trace)
    rate = n / wall
    print(f"trace                    {n} requests over {trace.duration_s:.0f} s (scale {args.scale})")
    print(f"engine model             vllm_v1 (prefix cache {'on' if args.prefix_caching else 'off'}), "
          f"policy {args.policy}, {fast.n_steps} engine steps, "
          f"{int(fast.completed.sum())} completed, {fast.n_preemptions} preemptions")
    print(f"engine start-up          {startup:.2f} s (compiled loops loaded once per process, not counted)")
    print(f"simulation wall time     {wall:.2f} s")
    print(f"simulated requests/s     {rate:,.0f}  ({rate / VIDUR_REQUESTS_PER_S:.0f}x Vidur's ~280/s; "
          f"goal 100x = 28,000/s)")
    if not args.no_reference:
        t = time.perf_counter()
        slow = sim.simulate(trace, make_policy(args.policy), model, event_skipping=False)
        ref_wall = time.perf_counter() - t
        same = all(np.array_equal(getattr(fast, f), getattr(slow, f), equal_nan=True)
                   for f in ("admit_s", "first_token_s", "finish_s")) and fast.n_steps == slow.n_steps
        print(f"step-by-step reference   {ref_wall:.2f} s ({n / ref_wall:,.0f} requests/s); "
              f"identical request by request: {same}")


def table(args):
    from portbench.policies import available

    trace = scale(long_trace(args.windows, args.source), args.scale)
    model = VllmV1Model(enable_prefix_caching=args.prefix_caching)
    names = args.policies or available()
    for name in set(names) | {"fifo"}:             # compiled loops and imports, once
        sim.simulate(scale(long_trace(1, args.source), args.scale), make_policy(name), model)

    def timed(name):
        t = time.perf_counter()
        sim.simulate(trace, make_policy(name), model)
        return time.perf_counter() - t

    n = len(trace)
    print(f"{n} requests (scale {args.scale}), vllm_v1, {args.repeats} rounds; each round times FCFS "
          "and then the policy")
    print(f"{'policy':32s} {'median s':>9s} {'spread s':>13s} {'req/s':>9s} {'x FCFS speed':>13s}")
    for name in names:
        walls, ratios = [], []
        for _ in range(args.repeats):
            base = timed("fifo")
            wall = timed(name)
            walls.append(wall)
            ratios.append(base / wall)
        w = float(np.median(walls))
        print(f"{name:32s} {w:9.2f} {min(walls):6.2f}–{max(walls):<6.2f} {n / w:9,.0f} "
              f"{float(np.median(ratios)):13.2f}")


class _Recorder(sim.Policy):
    """Runs ``policy`` and records each decision as the engine took it (the admissions it consumed)."""

    def __init__(self, policy):
        self.policy, self.name, self.log = policy, policy.name, []
        self.admission_only = policy.admission_only      # asked at the same steps as the policy
        self.event_driven = policy.event_driven

    def reset(self, view):
        self.policy.reset(view)

    def schedule(self, view):
        d = self.policy.schedule(view)
        taken = []
        self.log.append((view.step, dataclasses.replace(d, admit=taken, preempt=list(d.preempt))))
        return dataclasses.replace(self.log[-1][1], admit=recorded(d.admit, taken))


class _Replay(sim.Policy):
    """Returns the recorded decisions, in order (checks that it is asked at the same steps)."""

    name = "replay"
    event_driven = True             # the recorded decisions carry the policy's own timers

    def __init__(self, log, admission_only: bool):
        self.log, self.admission_only = log, admission_only

    def reset(self, view):
        self.k = 0

    def schedule(self, view):
        step, decision = self.log[self.k]
        self.k += 1
        if step != view.step:
            raise RuntimeError(f"the replay drifted: asked at step {view.step}, recorded {step}")
        return decision


def engine_share(args):
    trace = scale(long_trace(args.windows, args.source), args.scale)
    model = VllmV1Model(enable_prefix_caching=args.prefix_caching)
    names = args.policies or ["fifo"]
    n = len(trace)
    print(f"{n} requests (scale {args.scale}), vllm_v1; per policy, {args.repeats} rounds of: the "
          "policy's run, then the replay of its decisions (the engine's share)")
    print(f"{'policy':24s} {'calls':>7s} {'run s':>6s} {'engine s':>9s} {'policy us/call':>15s} "
          f"{'engine us/call':>15s} {'engine-only req/s':>18s}")
    for name in names:
        rec = _Recorder(make_policy(name))
        sim.simulate(scale(long_trace(1, args.source), args.scale), make_policy(name), model)
        first = sim.simulate(trace, rec, model)
        runs, replays = [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            sim.simulate(trace, make_policy(name), model)
            runs.append(time.perf_counter() - t)
            t = time.perf_counter()
            again = sim.simulate(trace, _Replay(rec.log, rec.admission_only), model)
            replays.append(time.perf_counter() - t)
        if not np.array_equal(first.finish_s, again.finish_s, equal_nan=True):
            raise RuntimeError(f"{name}: the replay did not reproduce the run")
        calls = len(rec.log)
        run, eng = float(np.median(runs)), float(np.median(replays))
        print(f"{name:24s} {calls:7d} {run:6.2f} {eng:9.2f} {(run - eng) / calls * 1e6:15.0f} "
              f"{eng / calls * 1e6:15.0f} {n / eng:18,.0f}")


class _CallCounter(sim.Policy):
    """Runs ``policy`` and counts its calls, and those after a refused admission (see ``--calls``)."""

    def __init__(self, policy):
        self.policy, self.name = policy, policy.name
        self.admission_only, self.event_driven = policy.admission_only, policy.event_driven
        self.counts = collections.Counter()

    def reset(self, view):
        self.policy.reset(view)
        self.last = None                    # (first proposal, holds) of the last call

    def schedule(self, view):
        d = self.policy.schedule(view)
        admit = iter(d.admit)               # peek at the first proposal without consuming the rest
        first = next(admit, None)
        c = self.counts
        c["calls"] += 1
        if view.refused:
            c["after a refusal"] += 1
            c[f"after a refusal ({view.refused[0][1]})"] += 1
            same_first = self.last is not None and first is not None and first == self.last[0]
            same_hold = self.last is not None and d.hold == self.last[1]
            c["  proposing the same request first"] += same_first
            c["  holding the same requests"] += same_hold
            c["  both"] += same_first and same_hold
        self.last = (first, d.hold)
        admit = admit if first is None else itertools.chain([first], admit)
        return dataclasses.replace(d, admit=admit)


def call_counts(args):
    trace = scale(long_trace(args.windows, args.source), args.scale)
    model = VllmV1Model(enable_prefix_caching=args.prefix_caching)
    for name in args.policies or ["fifo"]:
        counter = _CallCounter(make_policy(name))
        result = sim.simulate(trace, counter, model)
        print(f"{name}: {result.n_steps:,} engine steps, {result.n_preemptions:,} preemptions")
        for what, k in counter.counts.items():
            print(f"  {what:40s} {k:9,d}")


if __name__ == "__main__":
    main()

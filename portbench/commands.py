"""Sub-commands of the simulator and campaign (registered on the main ``portbench`` parser)."""

from __future__ import annotations

import argparse



def _whole_int(text: str, least: int = 0) -> int:
    """An argparse type: a whole number of at least ``least``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def _positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    return _whole_int(text, 1)


def _campaign(args) -> int:
    from . import store
    from .campaign import CampaignConfig, results_are_current, results_path, run_campaign
    from .policies import EXTENDED_PANEL, STUDY_POLICIES
    from .regions import REGIONS
    from .workload import PREDICTION_RELATIVE_ERROR

    window_ids = args.windows
    if args.source:
        ids = store.list_windows(args.data_dir, args.source)["window_id"].tolist()
        window_ids = [w for w in (window_ids or ids) if w in set(ids)]
    if args.limit_windows:
        # with no window or source named, the study's windows (as without --limit-windows)
        manifest = store.list_windows(args.data_dir, every_source=bool(window_ids))
        manifest = manifest[manifest["window_id"].isin(window_ids)] if window_ids else manifest
        window_ids = (manifest.groupby("source", sort=True).head(args.limit_windows)["window_id"].tolist())
    if args.policy_module:
        import_policy_modules(args.policy_module)
    panel = {"study": STUDY_POLICIES, "extended": EXTENDED_PANEL}[args.panel]
    errors = args.prediction_error or [PREDICTION_RELATIVE_ERROR]
    if args.output and len(errors) > 1:
        raise ValueError("--output takes one table: give one --prediction-error with it")
    configs = [CampaignConfig(
        engine_model=args.engine_model,
        policies=tuple(args.policies or panel),
        regions=tuple(args.regions or REGIONS),
        slo_multipliers=tuple(args.slo_multipliers or CampaignConfig.slo_multipliers),
        window_ids=tuple(window_ids) if window_ids else None,
        prediction_error=err, knee=args.knee) for err in errors]   # every value is checked before any runs
    for config in configs:
        path = results_path(config.table_name, args.data_dir, config.prediction_error)
        if not args.force and not args.output and results_are_current(config, args.data_dir):
            print(f"{path} is up to date with this code, these windows and this configuration: "
                  f"nothing to do (--force recomputes)")
            continue
        summary = run_campaign(config, data_dir=args.data_dir, executor=args.executor,
                               workers=args.workers, address=args.address, progress=not args.quiet,
                               output=args.output)
        print(summary.line())
    return 0


def _rq8_campaign(args) -> int:
    from .open_questions import RQ8_WINDOW_SIZES, SubWindowConfig, run_subwindow_campaign, subwindow_results_current
    from .regions import REGIONS

    configs = [SubWindowConfig(window_size=size, engine_model=args.engine_model,
                               regions=tuple(args.regions or REGIONS),
                               window_ids=tuple(args.windows) if args.windows else None)
               for size in (args.window_sizes or RQ8_WINDOW_SIZES)]      # every size checked first
    for config in configs:
        if not args.force and subwindow_results_current(config, args.data_dir):
            print(f"RQ8 results for {config.window_size}-request windows are up to date: nothing to do "
                  "(--force recomputes)")
            continue
        run_subwindow_campaign(config, data_dir=args.data_dir, workers=args.workers,
                               progress=not args.quiet)
    return 0


def _rq9_campaign(args) -> int:
    from . import rq9
    from .campaign import results_are_current, run_campaign

    unknown = sorted(set(args.configurations or ()) - set(rq9.TAGS))
    if unknown:
        raise SystemExit(f"unknown RQ9 configuration(s) {', '.join(unknown)}; known: {', '.join(rq9.TAGS)}")
    for source in args.source or rq9.SOURCES:
        ids = rq9.source_window_ids(args.windows, args.data_dir, source=source)
        for name, config in rq9.configs(ids, args.data_dir, source=source).items():
            if name not in (args.configurations or rq9.TAGS):
                continue
            if not args.force and results_are_current(config, args.data_dir):
                print(f"RQ9 results ({source}, {name}) are up to date: nothing to do (--force recomputes)")
                continue
            print(run_campaign(config, data_dir=args.data_dir, executor=args.executor, workers=args.workers,
                               address=args.address, progress=not args.quiet).line())
        if not args.windows and (not args.configurations or "off" in args.configurations):
            print(f"RQ9 hit rates ({source}) -> {rq9.hit_rate_path(source, args.data_dir)}")
            rq9.hit_rate_table(source, args.data_dir, force=args.force)
    return 0


#: The prediction-error levels of RQ7's sweep besides the study's 0.2.
RQ7_PREDICTION_ERRORS = (0.0, 0.5, 1.0)
#: The engine models every headline is stated under: the study's rules and vLLM v1's.
HEADLINE_ENGINES = ("lssp", "vllm_v1")


def attainable_knee_config(engine: str):
    """The book's campaign at the attainable knee: the study's 13 policies, the base SLO."""
    from .campaign import CampaignConfig
    from .policies import STUDY_POLICIES

    return CampaignConfig(engine_model=engine, policies=STUDY_POLICIES, slo_multipliers=(20.0,),
                          knee="attainable")


def import_policy_modules(paths) -> list[str]:
    """Import policy files given on the command line, so that their @register runs (worker processes
    started by fork inherit them; on a Dask cluster the module must be importable on the workers).
    Returns the names of the policies they registered. A file already imported is not imported
    again (its @register would clash with itself)."""
    import importlib.util
    import sys
    from pathlib import Path

    from .policies import _REGISTRY, available

    available()                                   # the package's own first, so that only the file's are new
    before = set(_REGISTRY)
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"--policy-module {path}: no such file")
        name = f"portbench_user_policy_{path.stem}"
        if name in sys.modules and Path(sys.modules[name].__file__).resolve() == path.resolve():
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sorted(set(_REGISTRY) - before)


def _calibrate(args) -> int:
    import pandas as pd
    from tqdm.auto import tqdm

    from . import store
    from .engine import engine_model
    from .regions import find_lambda_ref

    windows = store.load_windows(args.data_dir, args.source, args.windows)
    model = engine_model(args.engine_model)
    rows = []
    for w in tqdm(windows, desc="λ_ref", unit="window", disable=args.quiet):
        cal = find_lambda_ref(w, model=model)
        paper = w.meta.get("paper_lambda_ref", float("nan"))
        rows.append({"window_id": w.window_id, "lambda_ref": cal.lambda_ref, "pinned": cal.pinned or "",
                     "paper_lambda_ref": paper, "relative_difference": abs(cal.lambda_ref / paper - 1)})
    frame = pd.DataFrame(rows)
    with pd.option_context("display.max_rows", None, "display.width", 200):
        print(frame.to_string(index=False))
    print(f"\nmax relative difference to the study's λ_ref: {frame['relative_difference'].max():.3g}")
    return 0


def _policies(args) -> int:
    import sys

    from .policies import PRIMARY_PANEL, ROBUSTNESS_PANEL, RQ7_POLICIES, available, make_policy
    from .rq9 import CACHE_AWARE
    for name in available():
        doc = sys.modules[type(make_policy(name)).__module__].__doc__ or ""
        summary = doc.strip().splitlines()[0] if doc.strip() else ""
        panel = ("primary" if name in PRIMARY_PANEL else "robustness" if name in ROBUSTNESS_PANEL
                 else "rq7" if name in RQ7_POLICIES else "rq9" if name in CACHE_AWARE else "extra")
        print(f"{name:32s} {panel:10s} {summary}")
    return 0


def _book(args) -> int:
    import sys
    import time
    from pathlib import Path

    from . import book
    from .campaign import CampaignConfig, results_are_current, run_campaign
    from .policies import EXTENDED_PANEL

    # Every parameter is checked against the notebooks' parameters cells before anything runs.
    try:
        params = book.parse_assignments(args.param)
        if args.engine_model and params.get("engine_model", args.engine_model) != args.engine_model:
            raise book.ParameterError(f"--engine-model {args.engine_model} and -p engine_model="
                                      f"{params['engine_model']} disagree")
        params.setdefault("engine_model", args.engine_model or "lssp")
        if args.tiny:
            params = {**book.TINY_PARAMETERS, **params}
        if args.n_resamples:
            params["n_resamples"] = str(args.n_resamples)
        plan = book.plan_parameters(params, args.notebooks)
    except (book.ParameterError, FileNotFoundError) as exc:
        print(f"portbench book: {exc}", file=sys.stderr)
        return 2
    engine = plan[next(iter(plan))]["engine_model"]
    if not args.skip_campaign:
        # the book's campaigns: the extended panel (the study's 13 and RQ7's 11) under the three SLOs,
        # and RQ7's prediction-error sweep at the base SLO; the other engine model's base table (the
        # chapters state each headline under both); the study's panel at the attainable knee, both models
        configs = [CampaignConfig(engine_model=engine, policies=EXTENDED_PANEL)] + [
            CampaignConfig(engine_model=engine, policies=EXTENDED_PANEL, slo_multipliers=(20.0,),
                           prediction_error=err) for err in RQ7_PREDICTION_ERRORS]
        configs += [CampaignConfig(engine_model=e, policies=EXTENDED_PANEL) for e in HEADLINE_ENGINES if e != engine]
        configs += [attainable_knee_config(e) for e in HEADLINE_ENGINES]
        for config in configs:
            if results_are_current(config, args.data_dir):
                print(f"campaign results ({config.table_name}, prediction error {config.prediction_error:g}) "
                      "are up to date: reusing them")
            else:
                print("running the campaign (cached windows are reused) ...")
                print(run_campaign(config, data_dir=args.data_dir, progress=not args.quiet).line())
        # RQ8: the study's primary panel on the frozen windows and on sub-windows cut from them
        from .open_questions import RQ8_WINDOW_SIZES, SubWindowConfig, run_subwindow_campaign, \
            subwindow_results_current
        for size in RQ8_WINDOW_SIZES:
            config = SubWindowConfig(window_size=size, engine_model=engine)
            if not subwindow_results_current(config, args.data_dir):
                run_subwindow_campaign(config, data_dir=args.data_dir, progress=not args.quiet)
        # RQ9: the prefix-hashed source with vLLM's prefix cache off and on (vllm_v1 whatever the engine)
        from . import rq9
        if "rq9_prefix_cache" in (args.notebooks or book.available_notebooks()):
            for name, config in rq9.configs(data_dir=args.data_dir).items():
                if results_are_current(config, args.data_dir):
                    print(f"RQ9 results ({name}) are up to date: reusing them")
                else:
                    print(f"running RQ9's campaign ({name}; cached windows are reused) ...")
                    print(run_campaign(config, data_dir=args.data_dir, progress=not args.quiet).line())
    t0 = time.perf_counter()
    index = book.build_book(params, notebooks=args.notebooks, strict=args.strict,
                            progress=not args.quiet,
                            book_dir=Path(args.book_dir) if args.book_dir else book.BOOK_DIR,
                            jobs=args.jobs)
    print(f"\nThe book is at {index} (notebooks and HTML in {time.perf_counter() - t0:.1f} s)")
    return 0


def _realengine_case(args) -> int:
    from .realengine.study import CaseConfig, run_case
    runs = run_case(CaseConfig(args.backend, n_per_source=args.windows_per_source,
                               bisection_steps=args.bisection_steps, speed_ratio=args.speed_ratio,
                               tag=args.tag, data_dir=args.data_dir),
                    time_budget_s=args.budget_s, progress=not args.quiet)
    print(f"{len(runs)} runs -> data/results/realengine/{args.tag or args.backend + '_case'}_*")
    return 0


def _realengine_replay(args) -> int:
    """Named policies (a user's own key policy included) replayed on vLLM for a few windows, guarded
    and resumable like the RQ6 case, at the committed case's real-engine λ_ref."""
    import json

    import numpy as np

    from . import results, store
    from .engine.vllm_native import VLLM_SETUP, VLLM_VERSION, vllm_available
    from .realengine import ModelShape
    from .realengine.study import CaseConfig, reusable_lambda_refs, run_case
    from .realengine.vllm_settings import policy_spec

    import_policy_modules(args.policy_module or [])
    if not vllm_available():
        raise SystemExit(f"portbench realengine replay runs vLLM {VLLM_VERSION} (CPU build), which this Python "
                         f"cannot import: set it up with `{VLLM_SETUP}` and run .venv-vllm/bin/portbench")
    for p in args.policies:                       # an unknown or inexpressible policy: say so now
        try:
            policy_spec(p)
        except (KeyError, ValueError) as e:
            raise SystemExit(f"portbench realengine replay: {e.args[0] if e.args else e}") from None
    windows = [w for s in args.sources for w in store.load_windows(args.data_dir, s)[:args.windows_per_source]]
    source = results.Case(args.lambda_refs_from, args.data_dir)
    settings = (source.meta or {}).get("case", {})
    search = {"bracket_factor": settings.get("bracket_factor", 8.0),     # the λ_ref search of the case reused
              "bisection_steps": settings.get("bisection_steps", 3)}
    shared = {} if args.lambda_refs_from == "none" else reusable_lambda_refs(
        source, [w.window_id for w in windows], backend="vllm", engine_kwargs={"shape": repr(ModelShape())},
        lambda_policy="fifo", **search)
    tag = args.tag or "vllm_replay_" + "_".join(args.policies) + "_case"
    runs = run_case(CaseConfig("vllm", policies=tuple(args.policies), windows=tuple(windows), region=args.region,
                               repetitions=args.repetitions, lambda_refs=shared, tag=tag, data_dir=args.data_dir,
                               speed_ratio=settings.get("speed_ratio", 1.0), **search,
                               reference_probes=args.reference_probes, probe_warmup=args.probe_warmup,
                               probe_repeats=args.probe_repeats,
                               engine_kwargs={"shape": ModelShape()}),
                    time_budget_s=args.budget_s, progress=not args.quiet)
    table = runs.groupby(["window_id", "policy"])["anwg"].mean().unstack("policy")[list(args.policies)]
    print(table.round(4).to_string())
    best = table.idxmax(axis=1)
    print("best by mean ANWG per window: " + json.dumps(best.value_counts().to_dict()))
    print(f"{len(runs)} runs ({int(np.sum(runs['host_flagged']))} host-flagged) -> "
          f"{results.Case(tag, args.data_dir).folder}/{tag}_*")
    return 0


def _realengine_gpu(args) -> int:
    from .realengine import gpu
    return gpu.run(args)


def register(sub) -> None:
    """Add the simulator's sub-commands to the ``portbench`` parser."""
    p = sub.add_parser(
        "campaign", help="simulate every (window, region, policy) cell -> data/results/",
        description="Calibrate each window's λ_ref (FIFO's 0.5%% SLO-violation knee), then simulate every "
                    "(window, operating region, policy) cell and write one tidy row per cell to "
                    "data/results/campaign_<engine>.parquet (and the λ_ref comparison to "
                    "lambda_ref_<engine>.csv). Finished windows are cached in data/results/cache/, so a "
                    "rerun reuses them and a killed run resumes.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--engine-model", default="lssp", help="engine model")
    p.add_argument("--policies", nargs="+", help="policy ids (default: the --panel)")
    p.add_argument("--panel", choices=["study", "extended"], default="extended",
                   help="extended: the study's 13 policies and today's 11 engine schedulers (RQ7), as "
                        "the book's tables hold; study: the 13 only")
    p.add_argument("--prediction-error", nargs="+", type=float, metavar="E",
                   help="relative error of the output-length predictions, one campaign per value "
                        "(default 0.2, the study's; others go to campaign_<engine>_prederr<E>.parquet)")
    p.add_argument("--policy-module", nargs="+", metavar="FILE",
                   help="Python files defining policies with @register (your own scheduler)")
    p.add_argument("--knee", choices=["study", "attainable"], default="study",
                   help="λ_ref at the study's knee, or at the attainable knee (requests no scheduler can "
                        "meet at a load left out of its miss count; table campaign_<engine>_attainable_knee)")
    p.add_argument("--regions", nargs="+", help="operating regions (default: all six)")
    p.add_argument("--slo-multipliers", nargs="+", type=float, help="SLO multipliers (default: 10 20 40; 20 is the study's base)")
    p.add_argument("--windows", nargs="+", help="window ids (default: the study's three sources' windows)")
    p.add_argument("--source", help="only the windows of this source (any source in the store)")
    p.add_argument("--limit-windows", type=int, help="at most this many windows per source (quick runs)")
    p.add_argument("--executor", choices=["local", "dask"], default="local",
                   help="local processes, or a Dask cluster")
    p.add_argument("--address", help="Dask scheduler address (default: start a LocalCluster)")
    p.add_argument("--workers", type=int, help="worker processes (default: all cores)")
    p.add_argument("--output", help="write the table here instead of data/results/")
    p.add_argument("--force", action="store_true",
                   help="recompute even if the results table is up to date (the cache is still used)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_campaign)

    p = sub.add_parser(
        "rq8-campaign", help="RQ8: the primary panel on sub-windows, with per-phase SLOs and ANWG weightings",
        description="Cut each frozen window into consecutive sub-windows of each --window-sizes (200: the "
                    "windows themselves), calibrate every sub-window's own λ_ref, and simulate the study's "
                    "primary panel in every region at the base SLO, with the study's 11 metrics plus "
                    "TTFT/TPOT attainment and ANWG under other weightings. Writes "
                    "data/results/rq8_<engine>_n<size>.parquet; finished windows are cached, so a rerun "
                    "reuses them and a killed run resumes. Windows longer than 200 requests need the raw "
                    "traces: `portbench windows add --window-size N`, then `portbench campaign`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--window-sizes", nargs="+", type=int, metavar="N",
                   help="requests per sub-window, dividing 200 (default: 50 100 200)")
    p.add_argument("--engine-model", default="lssp", help="engine model")
    p.add_argument("--regions", nargs="+", help="operating regions (default: all six)")
    p.add_argument("--windows", nargs="+", help="frozen window ids to cut (default: the study's)")
    p.add_argument("--workers", type=int, help="worker processes (default: all cores)")
    p.add_argument("--force", action="store_true", help="rewrite the tables even if up to date")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_rq8_campaign)

    p = sub.add_parser(
        "rq9-campaign", help="RQ9: the prefix-hashed sources with vLLM's prefix cache off, on, warm, tiered",
        description="Run the vllm_v1 engine model on the prefix-hashed sources' windows "
                    "(mooncake_conversation, mooncake_synthetic) with its prefix cache off; on, cold, at "
                    "three KV capacities (the first source); on and warm; warm with a 4M-token offload "
                    "tier; each at its own knee and (the primary reading) at the cache-off knee; with the "
                    "study's 13 policies, vllm_v0_priority and the cache-aware lpm, dfs_weight and "
                    "cache_aware_sjf, in every region at SLO x20 and x1, with TTFT attainment. Writes "
                    "data/results/campaign_vllm_v1_rq9_*.parquet, their λ_ref tables and each source's "
                    "hit-rate table; finished windows are cached, so a rerun reuses them and a killed "
                    "run resumes.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--configurations", nargs="+", metavar="NAME",
                   help="configurations (default: all; see portbench.rq9): off, on_<kv> and "
                        "on_<kv>_same_load (cold, first source only), warm_131072[_same_load], "
                        "tier_4194304[_same_load]")
    p.add_argument("--source", nargs="+", choices=["mooncake_conversation", "mooncake_synthetic"],
                   help="prefix-hashed sources (default: both)")
    p.add_argument("--windows", type=int, metavar="N", help="only the source's first N windows")
    p.add_argument("--executor", choices=["local", "dask"], default="local")
    p.add_argument("--address", help="Dask scheduler address (with --executor dask)")
    p.add_argument("--workers", type=int, help="worker processes (default: all cores)")
    p.add_argument("--force", action="store_true", help="rewrite the tables even if up to date")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_rq9_campaign)

    p = sub.add_parser("calibrate", help="find each window's λ_ref and compare with the study's",
                       description="Bisection on FIFO's SLO-violation knee, per window, printed beside "
                                   "the study's own λ_ref.")
    p.add_argument("--engine-model", default="lssp")
    p.add_argument("--source", help="only this source")
    p.add_argument("--windows", nargs="+", help="window ids")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_calibrate)

    p = sub.add_parser(
        "book", help="campaign (if needed) -> every notebook with papermill -> the HTML book",
        description="Run the campaign unless its results are up to date, execute every notebook in "
                    "notebooks/ with papermill into book/executed/, and build the Jupyter Book into "
                    "book/_build/html/. -p NAME=VALUE sets a notebook parameter (repeatable); it goes "
                    "to every selected notebook whose parameters cell declares NAME, read as the type "
                    "of that default (lists comma-separated). Unknown names and bad values are refused "
                    "before anything runs.",
        epilog="example: portbench book --skip-campaign --notebooks rq2_reversals -p margin=0.2 "
               "-p panel=primary")
    p.add_argument("-p", "--param", action="append", metavar="NAME=VALUE", default=[],
                   help="a notebook parameter, e.g. -p margin=0.2 -p confidence_level=0.9")
    p.add_argument("--engine-model", default=None, help="engine model (the same as -p engine_model=...; "
                                                        "default lssp)")
    p.add_argument("--tiny", action="store_true", help="few bootstrap resamples (CI)")
    p.add_argument("--n-resamples", type=int, help="bootstrap resamples for every notebook")
    p.add_argument("--notebooks", nargs="+", help="only these notebooks (file stems)")
    p.add_argument("--skip-campaign", action="store_true", help="use the results table as it is")
    p.add_argument("--strict", action="store_true", help="Sphinx warnings are errors")
    p.add_argument("--book-dir", help="build in this folder (a copy of book/'s pages) instead of book/")
    p.add_argument("--jobs", type=_positive_int, default=None,
                   help="notebooks executed at once (default: one per core; 1: one after another)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_book)

    p = sub.add_parser("realengine", help="replay the study's RQ6 case on a real serving engine",
                       description="The RQ6 case (slai_faithful vs vllm_faithful at HIGH_PRESSURE, Azure vs "
                                   "BurstGPT, Bailian as control) replayed in real time on a real engine.")
    rsub = p.add_subparsers(dest="realengine_command", required=True, metavar="ACTION")
    q = rsub.add_parser("case", help="real-engine λ_ref, then the case and the control, on this machine",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    q.add_argument("--backend", choices=["transformers", "vllm"], required=True,
                   help="vllm needs the vLLM environment (.venv-vllm)")
    q.add_argument("--windows-per-source", type=int, default=10)
    q.add_argument("--bisection-steps", type=int, default=5)
    q.add_argument("--speed-ratio", type=float, default=1.0,
                   help="bracket the λ_ref search around the simulator's λ_ref times this")
    q.add_argument("--budget-s", type=float, default=None, help="stop starting windows after this long")
    q.add_argument("--tag", help="file prefix (default: <backend>_case)")
    q.add_argument("--quiet", action="store_true")
    q.set_defaults(func=_realengine_case)
    from .realengine import PROBE_REPEATS, PROBE_WARMUP
    from .realengine.study import CASE_REGION, CASE_SOURCES, CaseConfig
    from .regions import REGIONS
    q = rsub.add_parser(
        "replay", help="replay named policies (your own key policy too) on vLLM for a few windows",
        description="Replay each policy on vLLM (CPU build; run with .venv-vllm/bin/portbench) at the "
                    "committed RQ6 case's real-engine λ_ref for each window, guarded by host probes and "
                    "resumable like the case; prints mean ANWG per window and policy. Any registered key "
                    "policy runs through the key adapter (vLLM's FCFS queue in the policy's key order); "
                    "results go to data/results/realengine/<tag>_*.",
        epilog="example: .venv-vllm/bin/portbench realengine replay --policies fifo sjf_aging "
               "--windows-per-source 1 --repetitions 1",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    q.add_argument("--policies", nargs="+", required=True, help="policy ids")
    q.add_argument("--policy-module", nargs="+", metavar="FILE",
                   help="Python files defining policies with @register")
    q.add_argument("--sources", nargs="+", choices=CASE_SOURCES, default=list(CASE_SOURCES))
    q.add_argument("--windows-per-source", type=_positive_int, default=1)
    q.add_argument("--repetitions", type=_positive_int, default=1)
    q.add_argument("--region", choices=list(REGIONS), default=CASE_REGION)
    q.add_argument("--lambda-refs-from", default="vllm_cpu_guarded_case",
                   help="reuse this case's real-engine λ_ref ('none': search each window, ~6 replays each)")
    q.add_argument("--budget-s", type=float, default=None, help="stop starting runs after this long")
    q.add_argument("--reference-probes", type=_positive_int, default=CaseConfig.reference_probes,
                   help="host probes that make each policy's reference before its first run")
    q.add_argument("--probe-warmup", type=_whole_int, default=PROBE_WARMUP, help="untimed replays of each host probe")
    q.add_argument("--probe-repeats", type=_positive_int, default=PROBE_REPEATS,
                   help="timed replays of each host probe (fewer: a quicker, coarser guard)")
    q.add_argument("--tag", help="file prefix (end it in _case); vllm_replay_<policies>_case when not given")
    q.add_argument("--data-dir", default=None, help="the data folder; the repository's when not given")
    q.add_argument("--quiet", action="store_true")
    q.set_defaults(func=_realengine_replay)
    from .realengine import gpu
    q = rsub.add_parser("gpu", help="the prepared GPU run: tune the engine, profile its steps, run the case",
                        parents=[gpu.build_parser(add_help=False)], description=gpu.__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter, conflict_handler="resolve")
    q.set_defaults(func=_realengine_gpu)

    p = sub.add_parser("policies", help="list the registered scheduling policies")
    p.set_defaults(func=_policies)

"""The campaign: every (window, region, policy) cell simulated, one tidy row per cell.

Work is split by window: one task calibrates a window's λ_ref (FIFO knee) and then runs all its
cells. Each finished task is written to a shard in the cache folder, atomically, under a content
hash of (window rows, engine config, policies, SLO multiplier, code fingerprint), so a campaign that
is killed resumes where it stopped and a rerun reuses everything. Tasks run in-process, on local
processes, or on a Dask cluster; a cell's result does not depend on where it ran
(:func:`run_sharded`, which RQ8's sub-window campaign shares). Every file is named, read and
written by :mod:`portbench.results`.

``CampaignConfig.prediction_error`` re-synthesises the windows' output-length predictions at another
relative error (:func:`portbench.workload.with_prediction_error`; deadlines are kept). The study's
0.2 keeps every key, path and table of the study's setting as it was; another level gets its own
cache folder, shard keys and results file (``campaign_<engine>_prederr<e>.parquet``).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from . import results, store
from .stored import source_fingerprint
from .engine import engine_model, simulate
from .metrics import METRICS, cell_metrics, phase_attainment
from .policies import STUDY_POLICIES, make_policy
from .regions import KNEES, REGIONS, find_lambda_ref
from .results import campaign_cache_dir as cache_dir, campaign_path as results_path, results_dir  # noqa: F401
from .workload import (BASE_SLO_MULTIPLIER, PREDICTION_RELATIVE_ERROR, Window, check_prediction_error,
                       scale, with_prediction_error, with_slo)

#: Modules whose source decides a cell's numbers; their hash is part of every cache key.
#: (``realengine/vllm_settings.py``: a policy's vLLM scheduling decides ``vllm_v1``'s preemption victims)
_RESULT_MODULES = ("engine", "workload.py", "metrics.py", "regions.py", "policies", "realengine/__init__.py",
                   "realengine/vllm_settings.py")

IDENTITY_COLUMNS = ["source", "window_id", "region", "region_factor", "lambda_ref", "load_factor",
                    "policy", "slo_multiplier", "prediction_error", "engine_model"]
DIAGNOSTIC_COLUMNS = ["n_completed", "n_dropped", "n_unfinished", "n_preemptions", "n_steps"]
RESULT_COLUMNS = IDENTITY_COLUMNS + list(METRICS) + DIAGNOSTIC_COLUMNS + ["cell_key"]
#: A campaign with the prefix cache on adds, per cell, the tokens its admissions looked up in the
#: cache and those the cache served (their ratio is the cell's hit rate).
PREFIX_COLUMNS = ["prefix_queried_tokens", "prefix_hit_tokens"]
#: ... and, with an offload tier, the hit tokens loaded from it.
TIER_COLUMNS = ["prefix_tier_hit_tokens"]
#: A campaign with ``phase_metrics`` adds RQ8's per-phase attainments (:func:`metrics.phase_attainment`).
PHASE_COLUMNS = ["attainment_ttft", "attainment_tpot", "attainment_ttft_tpot"]


@dataclasses.dataclass(frozen=True)
class CampaignConfig:
    """What to simulate. ``window_ids=None`` means every window of the study's three sources
    (``store.SOURCES_OF_THE_STUDY``): a source added to the store later joins a campaign only when its
    window ids are named, so adding one neither grows nor invalidates the study's tables.

    ``prediction_error``: relative error of the output-length predictions the cells' policies see
    (the study's 0.2 = the frozen predictions). λ_ref is always calibrated on the frozen window: the
    study's FIFO reads no prediction and deadlines do not change with the error level, so its knee
    (and so every region's load) is the same at every level, and only the policies' information
    differs between two levels. (With a prediction-reading ``calibration_policy`` the regions stay
    those of the study's predictions, on purpose.)

    ``engine_options``: ``(setting, value)`` pairs that change the engine model's defaults (e.g.
    ``(("enable_prefix_caching", True), ("max_kv_tokens", 65536))``); such a campaign needs a
    ``tag``, which names its table, λ_ref table and cache folder (``campaign_<engine>_<tag>``), so
    that it never overwrites the default configuration's. λ_ref is calibrated under the changed
    model (each configuration at its own knee, as the study calibrates each engine).

    ``knee``: which knee λ_ref is (:data:`portbench.regions.KNEES`): the study's, or the attainable
    knee, where requests that no scheduler can meet at a load are left out of its miss count. A
    campaign at the attainable knee is tagged ``attainable_knee`` unless it has a tag of its own.

    ``lambda_ref_from``: the table name (:attr:`table_name`) of another campaign whose λ_ref each
    window takes instead of being calibrated (its λ_ref file must be on disk): two configurations
    then run at the same absolute loads (RQ9's cache on at the cache-off knee). Needs a ``tag``.

    ``phase_metrics``: each cell also carries RQ8's TTFT, TPOT and joint attainments
    (:data:`PHASE_COLUMNS`). An engine model with ``warm_start`` gets its windows with their history
    (``store.load_windows(..., history=True)``).
    """

    engine_model: str = "lssp"
    policies: tuple = STUDY_POLICIES
    regions: tuple = tuple(REGIONS)
    slo_multipliers: tuple = (10.0, BASE_SLO_MULTIPLIER, 40.0)   # the base SLO and its sensitivity
    window_ids: tuple | None = None
    calibration_policy: str = "fifo"
    prediction_error: float = PREDICTION_RELATIVE_ERROR
    engine_options: tuple = ()
    tag: str = ""
    knee: str = "study"
    lambda_ref_from: str = ""
    phase_metrics: bool = False

    def __post_init__(self):
        if self.lambda_ref_from and not self.tag:
            raise ValueError("a campaign that borrows λ_ref (lambda_ref_from) needs a tag (it names the table)")
        if self.knee not in KNEES:
            raise ValueError(f"unknown knee {self.knee!r}; knees: {', '.join(KNEES)}")
        if self.knee != "study" and not self.tag:
            object.__setattr__(self, "tag", f"{self.knee}_knee")
        for p in self.policies:
            make_policy(p)
        object.__setattr__(self, "engine_options", tuple((str(k), v) for k, v in self.engine_options))
        if self.engine_options and not self.tag:
            raise ValueError("a campaign with engine_options needs a tag (it names the campaign's table)")
        if self.tag and not self.tag.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"campaign tag {self.tag!r}: use letters, digits, '_' and '-' only")
        if self.engine_model == "vllm_native":
            # vLLM's own scheduler runs only the policies vLLM itself expresses: say so before any run
            from .engine.vllm_native import native_form

            for p in (*self.policies, self.calibration_policy):
                native_form(p)
        self.model()                    # an unknown engine model or setting fails here, named
        object.__setattr__(self, "prediction_error", check_prediction_error(self.prediction_error))
        for r in self.regions:
            if r not in REGIONS:
                raise KeyError(f"unknown region {r!r}; regions: {', '.join(REGIONS)}")
        for m in self.slo_multipliers:
            if not float(m) > 0:
                raise ValueError(f"SLO multiplier must be positive, got {m!r}")
        if not self.policies or not self.regions or not self.slo_multipliers:
            raise ValueError("a campaign needs at least one policy, region and SLO multiplier")

    def model(self):
        """The engine model the campaign runs: its defaults, ``engine_options`` applied."""
        model = engine_model(self.engine_model)
        if not self.engine_options:
            return model
        fields = {f.name for f in dataclasses.fields(model)}
        unknown = [k for k, _ in self.engine_options if k not in fields]
        if unknown:
            raise KeyError(f"engine model {self.engine_model!r} has no setting {unknown[0]!r}; its "
                           f"settings: {', '.join(sorted(fields))}")
        return dataclasses.replace(model, **dict(self.engine_options))

    @property
    def table_name(self) -> str:
        """What names the campaign's files: the engine model, and its tag if any."""
        return f"{self.engine_model}_{self.tag}" if self.tag else self.engine_model


#: Engine-model files that decide only their own model's results (``vllm_native`` steps vLLM's
#: scheduler): an edit there leaves every other engine model's tables current.
_OWN_MODEL_FILES = {"engine/vllm_native.py": "vllm_native"}


def code_fingerprint(engine_model: str | None = None) -> str:
    """sha256 over the source of the modules that decide ``engine_model``'s results (every engine
    model's shared code, and a file of :data:`_OWN_MODEL_FILES` only for its own model)."""
    return source_fingerprint(_RESULT_MODULES, leave_out={f for f, own in _OWN_MODEL_FILES.items()
                                                          if own != engine_model})


def shard_key(window: Window, config: CampaignConfig, slo_multiplier: float, fingerprint: str) -> str:
    model = config.model()
    payload = {
        "window_sha256": store.rows_sha256(window.arrival_s, window.input_tokens, window.output_tokens,
                                           window.predicted_output_tokens),
        "engine": [config.engine_model, dataclasses.asdict(model)],
        "calibration_policy": config.calibration_policy,
        "slo_multiplier": float(slo_multiplier),
        "code": fingerprint,
    }
    if config.prediction_error != PREDICTION_RELATIVE_ERROR:    # the study's keys stay as they were
        payload["prediction_error"] = config.prediction_error
    if config.knee != "study":
        payload["knee"] = config.knee
    if config.lambda_ref_from:
        payload["lambda_ref_from"] = config.lambda_ref_from
    if config.phase_metrics:
        payload["phase_metrics"] = True
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def cell_key(shard: str, region: str, policy: str) -> str:
    return hashlib.sha256(f"{shard}|{region}|{policy}".encode()).hexdigest()[:24]


def run_window(window: Window, config: CampaignConfig, slo_multiplier: float, fingerprint: str,
               cells: list[tuple[str, str]] | None = None, lambda_ref: float | None = None) -> pd.DataFrame:
    """Simulate one window's (region, policy) cells under one SLO multiplier; one row per cell.

    λ_ref is found under the base SLO when not given (the study keeps the primary load factors for
    its SLO variants); the cells then run with deadlines for ``slo_multiplier`` and predictions at
    ``config.prediction_error`` (deadlines kept: they are the requests' SLOs).
    """
    model = config.model()
    key = shard_key(window, config, slo_multiplier, fingerprint)
    caching = getattr(model, "enable_prefix_caching", False)
    tiered = caching and getattr(model, "offload_kv_tokens", 0) > 0
    lam = lambda_ref if lambda_ref is not None else calibrate(window, config).lambda_ref
    variant = window if slo_multiplier == window.slo_multiplier else with_slo(window, slo_multiplier)
    variant = with_prediction_error(variant, config.prediction_error)
    if cells is None:
        cells = [(r, p) for r in config.regions for p in config.policies]
    rows = []
    scaled = {}
    for region, policy in cells:
        factor = REGIONS[region]
        if region not in scaled:
            scaled[region] = scale(variant, factor * lam)
        result = simulate(scaled[region], make_policy(policy), model)
        extra = phase_attainment(result, scaled[region]) if config.phase_metrics else {}
        if caching:
            extra.update(prefix_queried_tokens=result.prefix_queried_tokens,
                         prefix_hit_tokens=result.prefix_hit_tokens)
        if tiered:
            extra["prefix_tier_hit_tokens"] = result.prefix_tier_hit_tokens
        n_done = int(result.completed.sum())
        n_never = int(np.isnan(result.admit_s).sum())
        rows.append({
            "source": window.source, "window_id": window.window_id, "region": region,
            "region_factor": factor, "lambda_ref": lam, "load_factor": factor * lam,
            "policy": policy, "slo_multiplier": float(slo_multiplier),
            "prediction_error": config.prediction_error, "engine_model": config.engine_model,
            **cell_metrics(result),
            "n_completed": n_done, "n_dropped": n_never, "n_unfinished": len(window) - n_done - n_never,
            "n_preemptions": result.n_preemptions, "n_steps": result.n_steps,
            "cell_key": cell_key(key, region, policy), **extra,
        })
    return pd.DataFrame(rows, columns=RESULT_COLUMNS + extra_columns(config))


def extra_columns(config: CampaignConfig) -> list[str]:
    """The columns a cell of ``config`` has past :data:`RESULT_COLUMNS`."""
    model = config.model()
    caching = getattr(model, "enable_prefix_caching", False)
    return ((PREFIX_COLUMNS if caching else [])
            + (TIER_COLUMNS if caching and getattr(model, "offload_kv_tokens", 0) > 0 else [])
            + (PHASE_COLUMNS if config.phase_metrics else []))


def calibrate(window: Window, config: CampaignConfig):
    """The window's λ_ref under the campaign's engine model and calibration policy."""
    return find_lambda_ref(window, policy=config.calibration_policy, model=config.model(), knee=config.knee)


# ---------------------------------------------------------------------------------------------
# Orchestration

@dataclasses.dataclass
class CampaignSummary:
    n_cells: int
    n_cells_computed: int
    n_cells_reused: int
    n_windows: int
    wall_s: float
    path: Path
    table: pd.DataFrame

    def line(self) -> str:
        rate = self.n_cells_computed / self.wall_s if self.wall_s > 0 else float("nan")
        return (f"{self.n_cells} cells over {self.n_windows} windows: {self.n_cells_computed} simulated, "
                f"{self.n_cells_reused} reused from the cache, in {self.wall_s:.1f} s "
                f"({rate:.0f} cells/s) -> {self.path}")


def _task(window, config, fingerprint, jobs, lambda_ref=None):
    """One window: calibrate once (unless ``lambda_ref`` is given), then each (shard, SLO multiplier,
    cells) job; returns ``[(shard, frame)]``. Picklable for pools/Dask."""
    lam = lambda_ref if lambda_ref is not None else calibrate(window, config).lambda_ref
    return [(stem, run_window(window, config, slo, fingerprint, cells, lam)) for stem, slo, cells in jobs]


def run_campaign(config: CampaignConfig | None = None, *, data_dir: Path | None = None,
                 executor: str = "local", workers: int | None = None, address: str | None = None,
                 progress: bool = True, output: Path | None = None) -> CampaignSummary:
    """Run (or resume) a campaign and write its table to ``data/results/campaign_<engine>.parquet``
    (:func:`portbench.results.campaign_path`: another prediction-error level gets its own file), its
    stamp and its λ_ref table beside it.

    ``executor``: ``"local"`` (processes; ``workers=1`` runs in this process) or ``"dask"``
    (``address`` of a scheduler, or a ``LocalCluster`` with ``workers`` processes when omitted).
    """
    config = config or CampaignConfig()
    t0 = time.perf_counter()
    windows = store.load_windows(data_dir, window_ids=config.window_ids,
                                 history=getattr(config.model(), "warm_start", False))
    fingerprint = code_fingerprint(config.engine_model)
    cache = results.ShardCache(cache_dir(config.table_name, data_dir, config.prediction_error),
                               RESULT_COLUMNS, merge_on=("region", "policy"))
    wanted = [(r, p) for r in config.regions for p in config.policies]
    borrowed = borrowed_lambda_refs(config, windows, data_dir)
    todo: dict[str, tuple] = {}           # window_id -> (window, config, fingerprint, [(stem, slo, cells)], λ_ref)
    for w in windows:
        for slo in config.slo_multipliers:
            stem = results.shard_stem(w.window_id, slo)
            shard = cache.read(stem, shard_key(w, config, slo, fingerprint))
            have = set() if shard is None else set(zip(shard["region"], shard["policy"]))
            missing = [c for c in wanted if c not in have]
            if missing:
                todo.setdefault(w.window_id, (w, config, fingerprint, [], borrowed.get(w.window_id)))[3].append(
                    (stem, slo, missing))
    n_reused = sum(len(f) for f in cache.frames.values())
    n_new_cells = sum(len(cells) for _, _, _, jobs, _ in todo.values() for _, _, cells in jobs)
    run_sharded(_task, list(todo.values()), cache, executor=executor, workers=workers, address=address,
                progress=progress, total=n_new_cells, unit="cell", desc=f"campaign [{config.table_name}]")

    table = assemble(cache.frames.values(), config)
    path = Path(output) if output else results_path(config.table_name, data_dir, config.prediction_error)
    stamp = campaign_stamp(config, {w.window_id: w.meta.get("sha256", "") for w in windows}, fingerprint)
    results.write_table(path, table, stamp)
    write_lambda_table(table, windows, results.lambda_ref_path(config.table_name, data_dir,
                                                               config.prediction_error, beside=path))
    return CampaignSummary(len(table), n_new_cells, n_reused, len(windows),
                           time.perf_counter() - t0, path, table)


def borrowed_lambda_refs(config: CampaignConfig, windows, data_dir: Path | None = None) -> dict:
    """window_id → λ_ref from the campaign ``config.lambda_ref_from`` names ({} when it names none);
    a clear error when that campaign's λ_ref file or one of the windows is missing."""
    if not config.lambda_ref_from:
        return {}
    path = results.lambda_ref_path(config.lambda_ref_from, data_dir)
    if not path.exists():
        raise FileNotFoundError(f"campaign {config.table_name} takes λ_ref from {config.lambda_ref_from}, "
                                f"whose λ_ref file {path} is not on disk: run that campaign first")
    lam = pd.read_csv(path).set_index("window_id")["lambda_ref"]
    missing = sorted({w.window_id for w in windows} - set(lam.index))
    if missing:
        raise KeyError(f"{path.name} has no λ_ref for {len(missing)} windows of {config.table_name} "
                       f"(first: {missing[0]})")
    return {w.window_id: float(lam[w.window_id]) for w in windows}


def run_sharded(task, arguments: list[tuple], cache: results.ShardCache, *, executor: str = "local",
                workers: int | None = None, address: str | None = None, progress: bool = True,
                total: int | None = None, unit: str = "task", desc: str = "", count=len) -> None:
    """Run ``task(*args)`` for each of ``arguments`` and store each shard it returns (a list of
    ``(stem, frame)``) in ``cache`` as soon as its task finishes, so that a killed run loses only the
    tasks in flight and a rerun resumes. The progress bar counts ``count(frame)`` per shard stored,
    out of ``total``. ``executor``: see :func:`run_campaign`; the results do not depend on it."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, unit=unit, desc=desc, disable=not progress or not arguments, smoothing=0.05)
    try:
        for shards in _execute(task, arguments, executor, workers, address):
            for stem, frame in shards:
                cache.write(stem, frame)
                bar.update(count(frame))
    finally:
        bar.close()


def campaign_stamp(config: CampaignConfig, window_sha256: dict, fingerprint: str) -> dict:
    """What a results table was computed from: config, window checksums, code fingerprint."""
    stamp = {"engine_model": config.engine_model, "policies": list(config.policies),
             "regions": list(config.regions), "slo_multipliers": [float(m) for m in config.slo_multipliers],
             "calibration_policy": config.calibration_policy, "code_fingerprint": fingerprint,
             "windows": dict(window_sha256)}
    if config.prediction_error != PREDICTION_RELATIVE_ERROR:    # the study's stamps stay as they were
        stamp["prediction_error"] = config.prediction_error
    if config.tag:
        stamp["tag"] = config.tag
        stamp["engine_options"] = [[k, v] for k, v in config.engine_options]
    if config.knee != "study":
        stamp["knee"] = config.knee
    if config.lambda_ref_from:
        stamp["lambda_ref_from"] = config.lambda_ref_from
    return stamp


def results_are_current(config: CampaignConfig, data_dir: Path | None = None) -> bool:
    """True when the results table on disk was made by this code from these windows and config."""
    path = results_path(config.table_name, data_dir, config.prediction_error)
    saved = results.read_stamp(path) if path.exists() else None
    if saved is None:
        return False
    manifest = store.list_windows(data_dir, every_source=config.window_ids is not None)
    if config.window_ids is not None:
        manifest = manifest[manifest["window_id"].isin(config.window_ids)]
    return saved == campaign_stamp(config, zip(manifest["window_id"], manifest["sha256"]),
                                   code_fingerprint(config.engine_model))


def _execute(task, arguments, executor, workers, address):
    """Yield ``task(*args)`` for each of ``arguments`` as the tasks finish, in completion order (in
    this process when there is one worker or one task)."""
    if not arguments:
        return
    if executor == "local":
        workers = workers or os.cpu_count() or 1
        if workers == 1 or len(arguments) == 1:
            for args in arguments:
                yield task(*args)
            return
        with cf.ProcessPoolExecutor(max_workers=workers) as pool:
            for fut in cf.as_completed([pool.submit(task, *args) for args in arguments]):
                yield fut.result()
    elif executor == "dask":
        from distributed import Client, LocalCluster, as_completed
        cluster = None
        if address is None:
            cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                                   processes=True, dashboard_address=None)
        client = Client(address or cluster)
        try:
            for fut in as_completed([client.submit(task, *args, pure=False) for args in arguments]):
                yield fut.result()
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
    else:
        raise ValueError(f"unknown executor {executor!r}: use 'local' or 'dask'")


def assemble(frames, config: CampaignConfig) -> pd.DataFrame:
    """One table of the requested cells in a fixed order (source, window, SLO, region, policy)."""
    table = pd.concat(list(frames), ignore_index=True) if frames else pd.DataFrame(columns=RESULT_COLUMNS)
    table = table[table["region"].isin(config.regions) & table["policy"].isin(config.policies)]
    region_rank = {r: k for k, r in enumerate(REGIONS)}
    policy_rank = {p: k for k, p in enumerate(config.policies)}
    table = table.assign(_r=table["region"].map(region_rank), _p=table["policy"].map(policy_rank))
    table = table.sort_values(["source", "window_id", "slo_multiplier", "_r", "_p"], kind="stable")
    columns = RESULT_COLUMNS + [c for c in PREFIX_COLUMNS + TIER_COLUMNS + PHASE_COLUMNS if c in table.columns]
    return table.drop(columns=["_r", "_p"]).reset_index(drop=True)[columns]


def write_lambda_table(table: pd.DataFrame, windows, path: Path) -> pd.DataFrame:
    """window_id, source, lambda_ref, paper_lambda_ref, relative difference."""
    lam = table.groupby("window_id", sort=False)["lambda_ref"].first()
    rows = []
    for w in windows:
        if w.window_id not in lam.index:
            continue
        paper = w.meta.get("paper_lambda_ref", np.nan)
        ours = float(lam[w.window_id])
        rows.append({"window_id": w.window_id, "source": w.source, "lambda_ref": ours,
                     "paper_lambda_ref": paper, "relative_difference": abs(ours / paper - 1)
                     if paper == paper else np.nan})
    frame = pd.DataFrame(rows)
    results.write_lambda_table(path, frame)
    return frame


def load_results(engine: str = "lssp", data_dir: Path | None = None,
                 prediction_error: float = PREDICTION_RELATIVE_ERROR) -> pd.DataFrame:
    """The campaign table written by :func:`run_campaign` (run ``portbench campaign`` first)."""
    return results.read_campaign(engine, data_dir, prediction_error)


def diff_tables(old: pd.DataFrame, new: pd.DataFrame, *, ignore=("cell_key",)) -> list[str]:
    """Column-by-column differences between two campaign tables (cells matched on their identity);
    ``[]`` when every value is identical (NaN equal to NaN). ``cell_key`` hashes the code, so it is
    ignored by default."""
    ids = ["window_id", "region", "policy", "slo_multiplier"]
    problems = []
    if len(old) != len(new):
        problems.append(f"{len(old)} cells before, {len(new)} now")
    a = old.set_index(ids).sort_index()
    b = new.set_index(ids).sort_index()
    if not a.index.equals(b.index):
        problems.append(f"cells differ: {len(a.index.difference(b.index))} gone, "
                        f"{len(b.index.difference(a.index))} new")
        both = a.index.intersection(b.index)
        a, b = a.loc[both], b.loc[both]
    for col in a.columns:
        if col in ignore:
            continue
        if col not in b.columns:
            problems.append(f"column {col} is gone")
            continue
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype.kind == "f" or y.dtype.kind == "f":
            same = (x == y) | (pd.isna(x) & pd.isna(y))
        else:
            same = x == y
        if not same.all():
            first = a.index[~same][0]
            problems.append(f"{col}: {int((~same).sum())} cells differ, first {first}: "
                            f"{x[~same][0]!r} -> {y[~same][0]!r}")
    for col in set(b.columns) - set(a.columns) - set(ignore):
        problems.append(f"new column {col}")
    return problems

"""Every file under ``data/results/``: its name, how it is read and how it is written.

- **Campaign tables**: ``campaign_<engine>.parquet`` (``campaign_<engine>_prederr<e>.parquet`` at
  another prediction-error level), each with its stamp beside it (``.json``: the configuration,
  window checksums and code fingerprint it was computed from) and its λ_ref table
  ``lambda_ref_<engine>[_prederr<e>].csv``.
- **RQ8 tables**: ``rq8_<engine>_n<size>.parquet``, with their stamps.
- **Shard caches** of both campaigns, ``cache/<engine>[_prederr<e>]/`` and
  ``cache/rq8_<engine>_n<size>/``: one Parquet file per finished piece of work (:class:`ShardCache`).
- **The book's stored computations**, ``fidelity/``, ``reference/`` and their ``cache/`` twins
  (:func:`stored_dir`, :func:`stored_part_path`; kept current by :mod:`portbench.stored`).
- **Real-engine cases**, ``realengine/<tag>_*`` (:class:`Case`): a case's runs, requests, steps,
  attempts and λ_ref search, its provenance (``<tag>.json``), its simulated counterparts, and the
  files of the engine set-up it ran on (step profile, tuning, refitted step cost).

Nothing else in the package builds a path under ``data/results/``. Every write is atomic: a
temporary file in the same folder, then one rename (:func:`portbench.store.atomic_write`), so a
stopped process never leaves a half-written file.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from . import store
from .workload import PREDICTION_RELATIVE_ERROR, check_prediction_error


# --- folders ----------------------------------------------------------------------------------

def results_dir(data_dir: Path | None = None) -> Path:
    """``data/results/`` (of ``data_dir``, else of :func:`portbench.store.default_data_dir`)."""
    return Path(data_dir or store.default_data_dir()) / "results"


def realengine_dir(data_dir: Path | None = None) -> Path:
    """``data/results/realengine/``: the real-engine cases."""
    return results_dir(data_dir) / "realengine"


# --- the campaign tables ----------------------------------------------------------------------

def prediction_suffix(prediction_error: float) -> str:
    """'' for the study's prediction error, '_prederr<e>' for another level."""
    e = check_prediction_error(prediction_error)
    return "" if e == PREDICTION_RELATIVE_ERROR else f"_prederr{e:g}"


def campaign_path(engine: str, data_dir: Path | None = None,
                  prediction_error: float = PREDICTION_RELATIVE_ERROR) -> Path:
    """``campaign_<engine>.parquet``; ``campaign_<engine>_prederr<e>.parquet`` at another error level."""
    return results_dir(data_dir) / f"campaign_{engine}{prediction_suffix(prediction_error)}.parquet"


def lambda_ref_path(engine: str, data_dir: Path | None = None,
                    prediction_error: float = PREDICTION_RELATIVE_ERROR, *, beside: Path | None = None) -> Path:
    """``lambda_ref_<engine>[_prederr<e>].csv``, in ``data/results/`` or in the folder of the
    campaign table ``beside`` (a campaign written elsewhere keeps its λ_ref table with it)."""
    folder = Path(beside).parent if beside is not None else results_dir(data_dir)
    return folder / f"lambda_ref_{engine}{prediction_suffix(prediction_error)}.csv"


def campaign_cache_dir(engine: str, data_dir: Path | None = None,
                       prediction_error: float = PREDICTION_RELATIVE_ERROR) -> Path:
    """The campaign's shards of one engine (one folder per prediction-error level, so that no
    level's clean-up of stale shards touches another's)."""
    return results_dir(data_dir) / "cache" / f"{engine}{prediction_suffix(prediction_error)}"


def subwindow_path(engine: str, window_size: int, data_dir: Path | None = None) -> Path:
    """RQ8's table of one window size, ``rq8_<engine>_n<size>.parquet``."""
    return results_dir(data_dir) / f"rq8_{engine}_n{int(window_size)}.parquet"


def subwindow_cache_dir(engine: str, window_size: int, data_dir: Path | None = None) -> Path:
    """RQ8's shards of one engine and window size."""
    return results_dir(data_dir) / "cache" / f"rq8_{engine}_n{int(window_size)}"


def native_check_path(data_dir: Path | None = None) -> Path:
    """``vllm_v1`` against vLLM's own scheduler (the ``vllm_native`` engine model), one row per run:
    ``native_vs_model.csv`` (``benchmarks/native_vs_model.py --save``)."""
    return results_dir(data_dir) / "native_vs_model.csv"


def native_prefix_check_path(data_dir: Path | None = None) -> Path:
    """The same check with the prefix cache on, on the prefix-hashed source (RQ9):
    ``native_vs_model_prefix.csv``."""
    return results_dir(data_dir) / "native_vs_model_prefix.csv"


def native_prefix_warm_check_path(data_dir: Path | None = None) -> Path:
    """The prefix-cache check with the cache warmed by each window's history first, on the
    prefix-hashed sources at RQ9's three KV capacities: ``native_vs_model_prefix_warm.csv``
    (rewritten after every run, so that a stopped check resumes where it was)."""
    return results_dir(data_dir) / "native_vs_model_prefix_warm.csv"


def rq9_real_check_path(data_dir: Path | None = None) -> Path:
    """RQ9's real-engine check: vLLM's prefix cache off and on beside the ``vllm_v1`` model, one row
    per (cache, measure): ``rq9_vllm_cpu_summary.csv`` (``benchmarks/rq9_vllm_cpu.py``; its runs are
    the cases ``realengine/vllm_cpu_rq9_cache_{off,on}_case``)."""
    return results_dir(data_dir) / "rq9_vllm_cpu_summary.csv"


def custom_engines_path(data_dir: Path | None = None) -> Path:
    """The "Add your own scheduler" chapter's policy and a panel on three engine models, one row per
    (engine model, window, region, policy): ``custom_policy_engines.csv``
    (``benchmarks/custom_policy_engines.py``)."""
    return results_dir(data_dir) / "custom_policy_engines.csv"


def stored_dir(folder: str, data_dir: Path | None = None, *, committed: bool = True) -> Path:
    """The stored results of one book computation family (``fidelity``, ``reference``):
    ``<folder>/`` for the book's own parameters (committed), ``cache/<folder>/`` for any other
    (:mod:`portbench.stored`)."""
    return results_dir(data_dir) / (folder if committed else f"cache/{folder}")


def stored_part_path(folder: Path, name: str, part: str) -> Path:
    """One table (``part``) of stored result ``name`` in ``folder``: ``<name>.<part>.parquet``."""
    return Path(folder) / f"{name}.{part}.parquet"


def stored_parts(folder: Path, name: str = "*") -> list[Path]:
    """The files of stored result ``name`` (every stored result's, by default) in ``folder``."""
    return sorted(Path(folder).glob(f"{name}.*.parquet"))


def stamp_path(table_path: Path) -> Path:
    """A table's stamp, beside it: what it was computed from."""
    return Path(table_path).with_suffix(".json")


def read_stamp(table_path: Path) -> dict | None:
    """The stamp of the table at ``table_path``; None when there is none or it is unreadable."""
    try:
        return json.loads(stamp_path(table_path).read_text())
    except (OSError, ValueError):
        return None


def write_table(path: Path, table: pd.DataFrame, stamp: dict) -> None:
    """A campaign (or RQ8) table, then its stamp."""
    store.atomic_write(path, lambda p: table.to_parquet(p, index=False))
    store.atomic_write(stamp_path(path),
                       lambda p: p.write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n"))


def read_campaign(engine: str = "lssp", data_dir: Path | None = None,
                  prediction_error: float = PREDICTION_RELATIVE_ERROR) -> pd.DataFrame:
    """A campaign table (run ``portbench campaign`` first)."""
    path = campaign_path(engine, data_dir, prediction_error)
    if not path.exists():
        raise FileNotFoundError(f"no campaign results at {path}: run `portbench campaign` first")
    return pd.read_parquet(path)


def read_subwindow_table(window_size: int, engine: str = "lssp", data_dir: Path | None = None) -> pd.DataFrame:
    """RQ8's table of one window size (``portbench rq8-campaign`` writes it)."""
    path = subwindow_path(engine, window_size, data_dir)
    if not path.exists():
        raise FileNotFoundError(f"no RQ8 results at {path}: run `portbench rq8-campaign "
                                f"--window-sizes {window_size}` first")
    return pd.read_parquet(path)


def write_lambda_table(path: Path, frame: pd.DataFrame) -> None:
    """A λ_ref table (every digit of a float kept)."""
    store.atomic_write(path, lambda p: frame.to_csv(p, index=False, float_format="%.17g"))


def read_lambda_table(engine: str, data_dir: Path | None = None,
                      prediction_error: float = PREDICTION_RELATIVE_ERROR) -> pd.DataFrame | None:
    """The campaign's λ_ref table of ``engine`` (``window_id, source, lambda_ref, paper_lambda_ref,
    relative_difference``); None when the campaign has not written it."""
    path = lambda_ref_path(engine, data_dir, prediction_error)
    return pd.read_csv(path) if path.exists() else None


class TableFile(NamedTuple):
    """A campaign or λ_ref table on disk: its path, its name less the kind's prefix (``lssp``,
    ``vllm_v1_prederr0.5``), its engine model and its prediction error (None: the study's)."""
    path: Path
    name: str
    engine: str
    prediction_error: float | None


def _tables(prefix: str, suffix: str, data_dir) -> list[TableFile]:
    out = []
    for path in sorted(results_dir(data_dir).glob(f"{prefix}*{suffix}")):
        name = path.name.removeprefix(prefix).removesuffix(suffix)
        engine, _, err = name.partition("_prederr")
        out.append(TableFile(path, name, engine, float(err) if err else None))
    return out


def campaign_tables(data_dir: Path | None = None) -> list[TableFile]:
    """The campaign tables on disk, by file name."""
    return _tables("campaign_", ".parquet", data_dir)


def lambda_tables(data_dir: Path | None = None) -> list[TableFile]:
    """The λ_ref tables on disk, by file name."""
    return _tables("lambda_ref_", ".csv", data_dir)


# --- the shard caches -------------------------------------------------------------------------

def shard_stem(window_id: str, slo_multiplier: float | None = None) -> str:
    """The shard name of a window's work (under one SLO multiplier, for the main campaign)."""
    return window_id if slo_multiplier is None else f"{window_id}-slo{slo_multiplier:g}"


class ShardCache:
    """One campaign's cache folder: a Parquet file per shard, ``<stem>-<key[:16]>.parquet``, where
    ``key`` is a content hash of everything that decides the shard's rows. :meth:`read` takes a
    shard whose key still holds (a missing, damaged or older-layout file is ignored and recomputed);
    :meth:`write` stores one atomically, adds it to the rows already there (``merge_on``: the
    columns that identify a row within a shard; none: it replaces them) and removes the stem's
    stale files (older code or configuration). :attr:`frames` holds every shard read or written."""

    def __init__(self, folder: Path, columns, merge_on: tuple = ()):
        self.folder = Path(folder)
        self.columns = list(columns)
        self.merge_on = list(merge_on)
        self.frames: dict[str, pd.DataFrame] = {}
        self._keys: dict[str, str] = {}

    def path(self, stem: str, key: str) -> Path:
        return self.folder / f"{stem}-{key[:16]}.parquet"

    def read(self, stem: str, key: str) -> pd.DataFrame | None:
        """The shard ``stem`` under ``key``, or None; the key is kept for :meth:`write`."""
        self._keys[stem] = key
        path = self.path(stem, key)
        if not path.exists():
            return None
        try:
            frame = pd.read_parquet(path)
        except Exception:            # a foreign or damaged file: recompute rather than trust it
            return None
        if not set(self.columns) <= set(frame.columns):      # an older layout
            return None
        self.frames[stem] = frame
        return frame

    def write(self, stem: str, frame: pd.DataFrame) -> pd.DataFrame:
        """Store ``frame`` as shard ``stem`` (under the key :meth:`read` was given); returns what the
        shard now holds."""
        old = self.frames.get(stem) if self.merge_on else None
        merged = frame if old is None else pd.concat([old, frame], ignore_index=True)
        if self.merge_on:
            merged = merged.drop_duplicates(self.merge_on, keep="last")
        path = self.path(stem, self._keys[stem])
        store.atomic_write(path, lambda p: merged.to_parquet(p, index=False))
        for stale in self.folder.glob(f"{stem}-*.parquet"):       # older code or config
            if stale != path:
                stale.unlink(missing_ok=True)
        self.frames[stem] = merged
        return merged


# --- the real-engine cases --------------------------------------------------------------------

#: What a real-engine case's tag is followed by in each of its files' names (``<tag>_runs.parquet``,
#: ``<tag>.json``), and what the file holds.
CASE_FILES = {
    "runs": ("_runs.parquet", "case runs: one row per (window, policy, repetition), real-engine and "
                              "simulator λ_ref, the 11 metrics, host probes where guarded"),
    "requests": ("_requests.parquet", "per request: arrival, deadline, tokens, admission, first-token and "
                                      "finish times"),
    "calibration": ("_calibration.parquet", "the real-engine λ_ref bisection probes (λ, FIFO violation rate)"),
    "attempts": ("_attempts.parquet", "every attempt of every guarded run, re-runs included"),
    "steps": ("_steps.parquet", "every engine step of every attempt (duration, queue lengths, prefill "
                                "tokens, decoding sequences, context tokens)"),
    "meta": (".json", "provenance: engine and versions, model shape, hardware, date, case settings"),
    "sim_requests": ("_sim_requests.parquet", "each real run's simulated counterpart, per request"),
    "sim_config": ("_sim_config.parquet", "the simulator in the case's own configuration, per window "
                                          "and policy"),
}
#: Likewise for the engine set-up a case ran on, named by its setup tag (the case's tag without
#: :data:`CASE_SUFFIX`: ``vllm_cpu_guarded_cost.json`` beside ``vllm_cpu_guarded_case_runs.parquet``).
SETUP_FILES = {
    "profile": ("_step_profile.parquet", "engine step time against prefill tokens, decoding sequences and "
                                         "context tokens"),
    "fit_by_range": ("_fit_by_range.parquet", "the refitted step-cost model's error by prefill/decode range"),
    "cost": ("_cost.json", "the step-cost model refitted to the step profile"),
    "tuning": ("_tuning.json", "engine settings, probe settings and each window's real-engine λ_ref"),
    "console": ("_console.txt", "the run's console output"),
}
#: What a committed case's tag ends with (its set-up's tag does not).
CASE_SUFFIX = "_case"


def setup_tag(tag: str) -> str:
    """The tag of a case's engine set-up: ``vllm_cpu_equal_case`` and ``vllm_cpu_equal`` both give
    ``vllm_cpu_equal``."""
    return tag.removesuffix(CASE_SUFFIX)


def case_of(tag: str, data_dir: Path | None = None) -> "Case":
    """The case of a set-up or case tag (``vllm_cpu_equal`` or ``vllm_cpu_equal_case``)."""
    return setup_case(setup_tag(tag), data_dir)


def setup_case(tag: str, data_dir: Path | None = None) -> "Case":
    """The case a script runs on set-up ``tag``, taken as it is (``<tag>_step_profile.parquet``
    beside the case's ``<tag>_case...`` files)."""
    return Case(tag + CASE_SUFFIX, data_dir)


def realengine_files(data_dir: Path | None = None) -> list[Path]:
    """Every file of ``data/results/realengine/``, by name."""
    folder = realengine_dir(data_dir)
    return [p for p in sorted(folder.glob("*")) if p.is_file()] if folder.exists() else []


def realengine_contents(name: str) -> str:
    """What the real-engine file ``name`` holds, in words (:data:`CASE_FILES`, :data:`SETUP_FILES`)."""
    ends = [(CASE_SUFFIX + end, what) for end, what in CASE_FILES.values()] + list(SETUP_FILES.values())
    for end, what in sorted(ends, key=lambda e: -len(e[0])):        # the longest ending that fits
        if name.endswith(end):
            return what
    return "provenance" if name.endswith(".json") else "real-engine results"


def case_tags(data_dir: Path | None = None) -> list[str]:
    """The tags of the cases on disk (those with a runs file), sorted."""
    end = CASE_FILES["runs"][0]
    return sorted(p.name.removesuffix(end) for p in realengine_dir(data_dir).glob(f"*{end}"))


def _read(path: Path):
    if not path.exists():
        return None
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    return json.loads(path.read_text()) if path.suffix == ".json" else path.read_text()


def _write(path: Path, value) -> None:
    if isinstance(value, pd.DataFrame):
        store.atomic_write(path, lambda p: value.to_parquet(p, index=False))
    elif isinstance(value, str):
        store.atomic_write(path, lambda p: p.write_text(value))
    else:
        store.atomic_write(path, lambda p: p.write_text(json.dumps(value, indent=1, default=str)))


#: Policy names as real-engine cases recorded them, read under today's names: vLLM v1's priority
#: scheduling was recorded as ``vllm_priority`` before that name was split into v0's rule
#: (``vllm_v0_priority``, a simulated policy) and what vLLM v1 ships (``vllm_v1_priority``). The
#: stored files stay as recorded.
RECORDED_LABELS = {"vllm_priority": "vllm_v1_priority"}


def recorded_labels(frame: pd.DataFrame) -> pd.DataFrame:
    """A real-engine case's table with its policy names read under today's (:data:`RECORDED_LABELS`)."""
    if "policy" in frame.columns:
        frame["policy"] = frame["policy"].replace(RECORDED_LABELS)
    return frame


def _part(name: str, doc: str):
    def read(self):
        value = _read(self.path(name))
        return recorded_labels(value) if isinstance(value, pd.DataFrame) else value
    read.__doc__ = doc
    return functools.cached_property(read)


@dataclasses.dataclass(frozen=True)
class Case:
    """A real-engine case by its tag, the prefix of its files in ``data/results/realengine/``
    (:data:`CASE_FILES`, :data:`SETUP_FILES`). Each part is read from disk the first time it is
    used and is None when its file is absent (``meta`` too; :attr:`provenance` is ``{}`` then).
    :meth:`write` stores parts, each atomically (a case in progress writes its five tables, then its
    provenance: :func:`portbench.realengine.study.run_case`)."""

    tag: str
    data_dir: Path | None = None

    runs = _part("runs", "One row per (window, policy, repetition) run.")
    requests = _part("requests", "One row per request of every kept run.")
    steps = _part("steps", "Every engine step of every attempt.")
    attempts = _part("attempts", "Every attempt of every guarded run.")
    calibration = _part("calibration", "The real-engine λ_ref search's probes.")
    meta = _part("meta", "The provenance file (``<tag>.json``) as a dict.")
    sim_requests = _part("sim_requests", "Each run's simulated counterpart, per request.")
    sim_config = _part("sim_config", "The simulator in the case's own configuration.")
    profile = _part("profile", "The set-up's step profile.")
    fit_by_range = _part("fit_by_range", "The refitted step cost's error by range.")
    cost = _part("cost", "The step cost refitted to the profile (a dict; ``cost``: its terms).")
    tuning = _part("tuning", "The set-up's engine settings and speed ratio.")

    @property
    def folder(self) -> Path:
        return realengine_dir(self.data_dir)

    @property
    def setup(self) -> str:
        """The tag of the engine set-up's files (:func:`setup_tag`)."""
        return setup_tag(self.tag)

    @property
    def provenance(self) -> dict:
        """:attr:`meta`, ``{}`` when the case has no provenance file."""
        return self.meta or {}

    def path(self, part: str) -> Path:
        """The file of ``part`` (a key of :data:`CASE_FILES` or :data:`SETUP_FILES`)."""
        if part in CASE_FILES:
            return self.folder / f"{self.tag}{CASE_FILES[part][0]}"
        if part in SETUP_FILES:
            return self.folder / f"{self.setup}{SETUP_FILES[part][0]}"
        raise KeyError(f"no case file {part!r}; parts: {', '.join([*CASE_FILES, *SETUP_FILES])}")

    def has(self, *parts: str) -> bool:
        """Whether every one of ``parts`` is on disk."""
        return all(self.path(p).exists() for p in parts)

    def missing(self, *parts: str) -> list[str]:
        """The file names of those of ``parts`` that are not on disk."""
        return [self.path(p).name for p in parts if not self.path(p).exists()]

    def write(self, **parts) -> None:
        """Store each given part (a frame as Parquet, a dict as JSON, a str as text), in the order
        given, each atomically."""
        for name, value in parts.items():
            _write(self.path(name), value)
            self.__dict__.pop(name, None)           # the next read sees the new file


def load_case(tag: str, data_dir: Path | None = None) -> Case:
    """The case ``tag`` (its files' prefix, e.g. ``vllm_cpu_guarded_case``); FileNotFoundError,
    naming the cases there are, when it has no runs file."""
    case = Case(tag, data_dir)
    if not case.has("runs"):
        raise FileNotFoundError(f"no {case.path('runs').name} in {case.folder}; cases there: "
                                f"{', '.join(case_tags(data_dir)) or 'none'}")
    return case


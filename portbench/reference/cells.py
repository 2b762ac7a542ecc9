"""The original study's published cells beside ours: the four files, the study's names for metrics
and classes, how two values match (:func:`match`), the :class:`Cells` collection, how a cell reads
in the book, the count of cells by file and match, and the comparison's heavy statistics stored
under ``data/results/reference/`` (:func:`stored_statistics`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from .. import present, stats
from ..metrics import METRICS

#: The four published files (stems), in the order of the study's research questions.
FILES = ("rq1_rq2_portability", "rq3_reversals", "rq4_sample_complexity", "rq5_temporal_robustness")

#: The study's metric names → ours.
METRIC_NAMES = {"arrival_normalized_weighted_goodput": "anwg", "completion_fraction": "completion_fraction",
                "weighted_completion_fraction": "weighted_completion",
                "slo_violation_rate": "slo_violation_rate", "weighted_goodput": "weighted_goodput",
                "mean_latency": "mean_latency_s", "p95_latency": "p95_latency_s",
                "mean_ttft": "mean_ttft_s", "p95_ttft": "p95_ttft_s",
                "request_throughput": "request_throughput", "token_throughput": "token_throughput"}
#: The study's reversal class names → ours.
CLASS_NAMES = {"UNDEFINED_UNESTIMABLE": "UNDEFINED", "STABLE_NO_SIGN_CHANGE": "STABLE",
               "MICROSCOPIC_SIGN_CHANGE": "MICROSCOPIC",
               "UNSUPPORTED_SIGN_CHANGE_WIDE_CI": "UNSUPPORTED_WIDE_CI",
               "SUPPORTED_PRACTICAL_REVERSAL": "SUPPORTED_PRACTICAL_REVERSAL"}
assert set(METRIC_NAMES.values()) == set(METRICS)
assert set(CLASS_NAMES.values()) == set(stats.REVERSAL_CLASSES)

EXACT, ROUNDING, DIFFERS, NOT_COMPUTED = "exact match", "within rounding", "differs", "not computed"
CATEGORIES = (EXACT, ROUNDING, DIFFERS, NOT_COMPUTED)
#: Package modules whose source decides the stored statistics (:func:`stored_statistics`).
RESULT_CODE = ("stats", "metrics.py", "workload.py", "reference", "stored.py")
#: Two doubles within this relative difference agree "within rounding" (summation order, a few ulps).
RELATIVE_TOLERANCE = 1e-12
#: Short reasons for cells that differ or are not computed; each is explained in the chapter's prose.
WHY = {"bootstrap": "bootstrap draws", "subsample": "subsample draws",
       "bh family": "bootstrap p-value; BH family",
       "zero ties": "UNDEFINED rule (Δ = 0, zero loser)", "float ties": "study's float means break ties",
       "spearman ci": "not in portbench (ρ interval)", "top-3 recovery": "not in portbench (top-3 recovery)",
       "concentrated": "not in portbench (concentrated vs spread)",
       "family": "not in portbench (policy families)"}


def stored_statistics(name: str, table: pd.DataFrame, compute, *, data_dir=None, **params) -> pd.DataFrame:
    """``compute()`` (a statistics table of the campaign ``table``), stored as ``data/results/reference/
    <name>.<engine model>.table.parquet`` and reused while the table's content, ``params`` and the
    code of :data:`RESULT_CODE` are the same (:func:`portbench.stored.stored`)."""
    from ..stored import source_fingerprint, stored

    engine = "+".join(sorted(set(table["engine_model"]))) if "engine_model" in table else "table"
    return stored("reference", f"{name}.{engine}", lambda: {"table": compute()}, code=source_fingerprint(RESULT_CODE),
                  params=params, frames=[table], data_dir=data_dir)["table"]


def load_published(reference_dir) -> dict:
    """The four published files, by stem (:data:`FILES`)."""
    out = {}
    for name in FILES:
        with open(Path(reference_dir) / f"{name}.json") as f:
            out[name] = json.load(f)
    return out


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def match(pub, ours) -> str:
    """How a published value and ours agree: one of :data:`CATEGORIES` (``ours`` None: not computed)."""
    ours = _plain(ours)
    if ours is None:
        return NOT_COMPUTED
    if isinstance(pub, (bool, str)) or isinstance(ours, (bool, str)):
        return EXACT if pub == ours else DIFFERS
    p, o = float(pub), float(ours)
    if p == o or (math.isnan(p) and math.isnan(o)):
        return EXACT
    if math.isclose(o, p, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-15):
        return ROUNDING
    return DIFFERS


class Cells:
    """The published cells beside ours, in the order they were added."""

    def __init__(self):
        self.rows: list[dict] = []

    def add(self, file, section, item, field, pub, ours, why=""):
        """One published cell beside ours. ``why`` (a key of :data:`WHY`, or a text) names the expected
        reason should the two differ; a difference without one is "unexplained"."""
        m = match(pub, ours)
        self.rows.append({"file": file, "section": section, "item": item, "field": field, "published": pub,
                          "ours": _plain(ours), "match": m,
                          "why": "" if m in (EXACT, ROUNDING) else WHY.get(why, why or "unexplained")})

    def frame(self, file: str | None = None) -> pd.DataFrame:
        """Every cell (or one file's) as a table: file, section, item, field, published, ours, match, why."""
        return pd.DataFrame([c for c in self.rows if file is None or c["file"] == file])


# --- how cells read -------------------------------------------------------------------------------

def short(source: str) -> str:
    """A source id's first word (``azure_llm_2024`` → ``azure``)."""
    return source.split("_")[0]


def readable(text: str) -> str:
    """A published or portbench class name (or a field or item that contains one) as the book names it."""
    for study_name in sorted(CLASS_NAMES, key=len, reverse=True):
        if study_name in text:
            return text.replace(study_name, present.label(CLASS_NAMES[study_name]))
    for ours in sorted(stats.REVERSAL_CLASSES, key=len, reverse=True):
        if ours in text:
            return text.replace(ours, present.label(ours))
    return text


def fmt(value) -> str:
    """A cell's value: numbers to six significant digits (the match column says whether they agree to
    the last bit), true minus signs, readable class names."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return present.minus_signs(f"{value:.6g}")
    if isinstance(value, int):
        return present.num(value, 0)
    return readable(str(value))


def file_view(cells: Cells, file: str) -> tuple[str, pd.DataFrame]:
    """A file's cells as the chapter shows them: a line counting them by match (markdown) and the
    cells, one per row, formatted (:func:`fmt`)."""
    frame = cells.frame(file).drop(columns="file")
    for column in ("published", "ours", "item", "field"):
        frame[column] = frame[column].map(fmt)
    counts = frame["match"].value_counts().reindex(CATEGORIES, fill_value=0)
    line = (f"`{file}.json`: {present.count(len(frame), 'published cell')} — "
            + present.join(f"{n:,} {c}" for c, n in counts.items()) + ".")
    return line, frame


def max_abs_diff(frame: pd.DataFrame) -> float:
    """The largest |ours − published| of a frame of numeric cells."""
    return float((frame["ours"].astype(float) - frame["published"].astype(float)).abs().max())


def agreeing(frame: pd.DataFrame) -> int:
    """Cells that match exactly or within rounding."""
    return int(frame["match"].isin([EXACT, ROUNDING]).sum())


def top_k(column: pd.Series, k: int) -> set:
    """The k best policies of a column of means, ties to the alphabetically first id (the study's rule)."""
    order = sorted(column.dropna().items(), key=lambda kv: (-kv[1], kv[0]))
    return {p for p, _ in order[:k]}


def spearman(a: pd.Series, b: pd.Series):
    """Spearman ρ and its p-value between two columns of means (portbench has no ρ of its own)."""
    from scipy import stats as sps

    keep = a.notna() & b.notna()
    res = sps.spearmanr(a[keep].to_numpy(), b[keep].to_numpy())
    return float(res.statistic), float(res.pvalue)


def topk_overlap(row, mx, my, k: int, n_policies: int) -> float:
    """Our top-k overlap of two conditions (top-1 from the test's own row, as the study defines it)."""
    return (float(not row["top1_changed"]) if k == 1
            else len(top_k(mx, k) & top_k(my, k)) / min(k, n_policies))


# --- all files together ---------------------------------------------------------------------------

def summary(cells: Cells) -> tuple[dict, pd.DataFrame]:
    """Cells per file and match (a row for all files, a column for the total), and the glued totals
    (``cmp_n_*``, ``cmp_differs_*``)."""
    everything = cells.frame()
    table = (everything.groupby("file")["match"].value_counts().unstack("match")
             .reindex(index=list(FILES), columns=list(CATEGORIES)).fillna(0).astype(int))
    table.loc["all files"] = table.sum()
    table["cells"] = table.sum(axis=1)
    numbers = {"cmp_n_cells": int(len(everything))}
    for cat in CATEGORIES:
        numbers[f"cmp_n_{cat.replace(' ', '_')}"] = int((everything["match"] == cat).sum())
    numbers["cmp_n_agree"] = agreeing(everything)
    numbers["cmp_n_computed"] = int((everything["match"] != NOT_COMPUTED).sum())
    numbers["cmp_n_unexplained"] = int((everything["why"] == "unexplained").sum())
    differs = everything[everything["match"] == DIFFERS]
    for key in ("bootstrap", "subsample", "bh family", "float ties", "zero ties"):
        numbers[f"cmp_differs_{key.replace(' ', '_')}"] = int((differs["why"] == WHY[key]).sum())
    return numbers, table


def gaps(cells: Cells) -> pd.DataFrame:
    """The cells that are not identical but numeric on both sides, with |ours − published| (``gap``)
    and the reason (``within rounding`` or the cell's ``why``)."""
    everything = cells.frame()
    num = everything[everything["match"].isin([ROUNDING, DIFFERS])].copy()
    is_real = (num["published"].map(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
               & num["ours"].map(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)))
    num = num[is_real]
    num["gap"] = (num["ours"].astype(float) - num["published"].astype(float)).abs()
    num["reason"] = np.where(num["match"] == ROUNDING, "within rounding", num["why"])
    return num

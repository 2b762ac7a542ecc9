"""The book's chapters' code: what every chapter starts from (here), and each long chapter's readings.

A chapter notebook reads, calls this package and shows; what it computes lives here, one module per
chapter that needs one (:mod:`.fidelity` and :mod:`.fidelity_cases` with :mod:`.fidelity_figures`,
the fidelity chapter; :mod:`.rq6`, the real-engine chapter; :mod:`.rq9`, the prefix-cache chapter). They read the analysis layer's results
(:mod:`portbench.fidelity`, :mod:`portbench.stats`, :mod:`portbench.results`) and format them with
:mod:`portbench.present`.

Every chapter that reads the campaign begins the same way: check the metric it ranks by and any
region it names, resolve its panel of policies, make its output folder, read the campaign table of
its engine model (or the table at ``results_path``), and list the table's operating regions and
sources. :func:`open_chapter` does all of it in one call and returns a :class:`Chapter`::

    chapter = open_chapter(engine_model, results_path, output_dir, metric=metric, panel=panel)
    table, policies = chapter.table, chapter.policies

A bad value fails here, before anything is computed, with a message that names the values allowed
(:func:`check_metric`, :func:`check_region`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..book import resolve_panel
from ..campaign import load_results
from .headlines import HEADLINE_ENGINES, headline_table
from ..metrics import METRICS
from ..regions import REGIONS
from ..workload import PREDICTION_RELATIVE_ERROR


@dataclasses.dataclass(frozen=True, eq=False)
class Chapter:
    """The data a chapter computes from.

    ``table``: the campaign table (one row per cell); ``policies``: the panel's policy ids, in the
    panel's order (empty when the chapter takes no panel); ``regions``: the operating regions the
    table holds, by increasing load; ``sources``: the table's sources, sorted.
    """

    table: pd.DataFrame
    policies: tuple
    regions: list
    sources: list


def campaign_table(engine_model: str, results_path: str | Path = "") -> pd.DataFrame:
    """The table at ``results_path``, or the campaign table of ``engine_model`` when it is empty."""
    return pd.read_parquet(results_path) if results_path else load_results(engine_model)


def check_metric(metric: str) -> None:
    """A ``ValueError`` naming the metrics unless ``metric`` is one of them."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; metrics: {', '.join(METRICS)}")


def check_region(region: str) -> None:
    """A ``ValueError`` naming the operating regions unless ``region`` is one of them."""
    if region not in REGIONS:
        raise ValueError(f"unknown region {region!r}; regions: {', '.join(REGIONS)}")


def open_chapter(engine_model: str, results_path: str | Path = "", output_dir: str | Path | None = None,
                 *, metric: str | None = None, panel=None, named_regions: Sequence[str] = (),
                 required_policies: Sequence[str] = (), frozen_predictions: bool = False) -> Chapter:
    """Check a chapter's parameters, read its table and say what the table holds.

    ``metric`` (when given) must be one of :data:`portbench.metrics.METRICS` and each of
    ``named_regions`` one of :data:`portbench.regions.REGIONS`; ``panel`` (when given) is resolved by
    :func:`portbench.book.resolve_panel`. ``output_dir`` (when given) is created. The table must hold
    every one of ``required_policies`` (a ``ValueError`` says which campaign to run);
    ``frozen_predictions`` keeps only the cells simulated with the study's frozen length predictions
    (:data:`portbench.workload.PREDICTION_RELATIVE_ERROR`) when the table records the prediction
    error.
    """
    if metric is not None:
        check_metric(metric)
    for region in named_regions:
        check_region(region)
    policies = resolve_panel(panel) if panel is not None else ()
    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
    table = campaign_table(engine_model, results_path)
    missing = sorted(set(required_policies) - set(table["policy"]))
    if missing:
        raise ValueError(f"the {engine_model} results table lacks {missing}: run "
                         f"`portbench campaign --engine-model {engine_model}` (the extended panel)")
    if frozen_predictions and "prediction_error" in table:
        table = table[np.isclose(table["prediction_error"], PREDICTION_RELATIVE_ERROR)]
    regions = [r for r in REGIONS if r in set(table["region"])]
    sources = sorted(set(table["source"]))
    return Chapter(table, policies, regions, sources)


def engine_tables(engine_model: str, table: pd.DataFrame, *, knee: str = "study") -> dict:
    """Engine model → campaign table for each of :data:`~.headlines.HEADLINE_ENGINES`: at the study's
    knee, the chapter's own ``table`` for its engine model and the committed table for the others; at
    the attainable knee, the committed tables. None where a table is not on disk."""
    return {e: table if knee == "study" and e == engine_model else headline_table(e, knee=knee)
            for e in HEADLINE_ENGINES}

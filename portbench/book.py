"""Execute the study's notebooks with papermill and build the Jupyter Book.

Notebooks live in ``notebooks/`` as jupytext py:percent files with a ``parameters`` cell; executed
copies go to ``book/executed/`` (what the book renders) and figures to ``book/figures/``.

An executed copy is dressed for reading before the book renders it: every code cell is folded
(``hide-input``: a toggle shows it), the notebook's own defaults cell and papermill's injected cell
are removed, and in their place a small table lists the *parameters of this build* — every value the
notebook ran with, its default when it was changed, and what it means (the comment on its line in the
parameters cell).

Parameters are checked before anything runs: a name no selected notebook declares, a value of another
type than the notebook's default (``int``, ``float``, ``str``, ``bool`` or a list of them), or a value
outside what the parameter accepts (:data:`CHECKS`) is a :class:`ParameterError`.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = REPO / "notebooks"
BOOK_DIR = REPO / "book"
EXECUTED_DIR = BOOK_DIR / "executed"
FIGURES_DIR = BOOK_DIR / "figures"

#: Notebooks in book order (file stem).
NOTEBOOKS = ("workload", "rq1_cross_source", "rq2_reversals", "rq3_cross_metric", "rq4_regions_slo",
             "rq5_sample_complexity", "rq6_real_engine", "fidelity", "rq7_engine_schedulers", "rq8_open_questions",
             "rq9_prefix_cache", "comparison",
             "add_your_scheduler")

#: Parameters every notebook accepts, with the book's defaults.
COMMON_PARAMETERS = {"results_path": "", "engine_model": "lssp", "n_resamples": 2000, "seed": 0,
                     "output_dir": "book/figures"}      # relative to the repository (notebooks run there)
#: Small values for CI: few resamples (the campaign table is the same).
TINY_PARAMETERS = {"n_resamples": 50}

#: Cell tags that already decide how a cell shows; such cells are left as they are.
_DISPLAY_TAGS = {"remove-cell", "remove-input", "hide-cell", "hide-input"}


class ParameterError(ValueError):
    """A notebook parameter that is unknown, of the wrong type or out of range."""


def available_notebooks() -> list[str]:
    return [n for n in NOTEBOOKS if (NOTEBOOKS_DIR / f"{n}.py").exists()]


# ---------------------------------------------------------------------------------------------
# Notebook parameters: declared defaults, checks, command-line values

@dataclasses.dataclass(frozen=True)
class Parameter:
    """One assignment of a notebook's ``parameters`` cell."""

    name: str
    default: object
    meaning: str = ""      # the comment on the assignment's line


def notebook_parameters(name: str) -> dict[str, Parameter]:
    """The parameters a notebook declares, in order, with their defaults (literals only)."""
    src = NOTEBOOKS_DIR / f"{name}.py"
    if not src.exists():
        raise FileNotFoundError(f"no notebook {src}; notebooks: {', '.join(available_notebooks())}")
    return _parameters_of(src)


def _parameters_of(src: Path) -> dict[str, Parameter]:
    import jupytext

    nb = jupytext.read(src)
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            lines = cell.source.splitlines()
            out = {}
            for node in ast.parse(cell.source).body:
                if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Name)):
                    continue
                try:
                    default = ast.literal_eval(node.value)
                except ValueError:
                    raise ValueError(f"{src}: the default of {node.targets[0].id} is not a literal") from None
                tail = lines[node.end_lineno - 1][node.end_col_offset:].strip()
                meaning = tail[1:].strip() if tail.startswith("#") else ""
                out[node.targets[0].id] = Parameter(node.targets[0].id, default, meaning)
            return out
    raise ValueError(f"{src} has no cell tagged 'parameters'")


def _declared_parameters(src: Path) -> set[str]:
    """Names assigned in the notebook's ``parameters`` cell."""
    return set(_parameters_of(src))


def _type_name(default) -> str:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a number"
    if isinstance(default, str):
        return "a string"
    if isinstance(default, (list, tuple)):
        inner = f" of {_type_name(default[0]).removeprefix('an ').removeprefix('a ')}s" if default else ""
        return f"a list{inner} (comma-separated)"
    return type(default).__name__


def coerce(value, default, *, what: str = "value"):
    """``value`` (a command-line string, or a Python value) as the type of ``default``.

    Raises :class:`ParameterError` naming ``what`` when it cannot be read as that type.
    """
    def fail():
        raise ParameterError(f"{what} must be {_type_name(default)} (its default is {default!r}), "
                             f"got {value!r}")

    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.strip().lower() in ("true", "yes", "1")
        fail()
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip().replace("_", ""))
            except ValueError:
                fail()
        fail()
    if isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                fail()
        fail()
    if isinstance(default, str):
        if isinstance(value, str):
            return value
        fail()
    if isinstance(default, (list, tuple)):
        items = value
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    items = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    fail()
            else:
                items = [v.strip() for v in text.split(",") if v.strip()]
        if not isinstance(items, (list, tuple)):
            fail()
        if default:
            try:
                items = [coerce(v, default[0], what=what) for v in items]
            except ParameterError:
                fail()
        return list(items)
    return value


def _in_range(lo, hi):
    return lambda v: None if lo < v < hi else f"must lie strictly between {lo} and {hi}"


def _check_metric(v):
    from .metrics import METRICS
    return None if v in METRICS else f"unknown metric {v!r}; metrics: {', '.join(METRICS)}"


def _check_engine(v):
    from .engine import ENGINE_MODELS
    return None if v in ENGINE_MODELS else f"unknown engine model {v!r}; known: {', '.join(ENGINE_MODELS)}"


def _check_region(v):
    from .regions import REGIONS
    return None if v in REGIONS else f"unknown region {v!r}; regions: {', '.join(REGIONS)}"


def _check_panel(v):
    try:
        resolve_panel(v)
    except ValueError as exc:
        return str(exc)
    return None


def _check_source_pair(v):
    from . import store
    if len(v) != 2 or v[0] == v[1]:
        return f"must name two different sources, got {v!r}"
    known = sorted(set(store.list_windows(every_source=True)["source"]))   # a named source may be any
    unknown = [s for s in v if s not in known]
    return f"unknown source(s) {unknown}; sources: {', '.join(known)}" if unknown else None


def _check_each(check):
    def run(values):
        for v in values:
            try:
                check(v)
            except ValueError as exc:
                return str(exc)
        return None if values else "must name at least one value"
    return run


def _check_window_size(v):
    from .open_questions import check_window_size
    return check_window_size(v)


def _check_slo_kind(v):
    from .open_questions import check_slo_kind
    return check_slo_kind(v)


def _check_weighting(v):
    from .open_questions import check_weighting
    return check_weighting(v)


#: Checks of a parameter's value beyond its type, by parameter name (a message, or None when fine).
CHECKS = {
    "metric": _check_metric,
    "engine_model": _check_engine,
    "calibrated_engine_model": _check_engine,
    "posthoc_region": _check_region,
    "focus_region": _check_region,
    "panel": _check_panel,
    "case_sources": _check_source_pair,
    "control_sources": _check_source_pair,
    "confidence_level": _in_range(0.0, 1.0),
    "fdr_q": _in_range(0.0, 1.0),
    "recovery_threshold": _in_range(0.0, 1.0),
    "margin": lambda v: None if v >= 0 else "must be ≥ 0",
    "n_resamples": lambda v: None if v >= 1 else "must be ≥ 1",
    "n_draws": lambda v: None if v >= 1 else "must be ≥ 1",
    "sizes": lambda v: None if v and min(v) >= 1 else "must be positive window counts",
    "window_sizes": _check_each(_check_window_size),
    "slo_kinds": _check_each(_check_slo_kind),
    "weightings": _check_each(_check_weighting),
    "tie_rtol": lambda v: None if 0 <= v < 1 else "must lie in [0, 1)",
}


def check_parameters(name: str, parameters: dict) -> dict:
    """``parameters`` for notebook ``name``, each read as the type of its default and checked.

    Raises :class:`ParameterError` for a name the notebook does not declare or a bad value.
    """
    declared = notebook_parameters(name)
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise ParameterError(f"notebook {name}: unknown parameter(s) {unknown}; it takes "
                             f"{sorted(declared)}")
    out = {}
    for key, value in parameters.items():
        what = f"notebook {name}: parameter {key}"
        value = coerce(value, declared[key].default, what=what)
        check = CHECKS.get(key)
        problem = check(value) if check else None
        if problem:
            raise ParameterError(f"{what}: {problem}")
        out[key] = value
    return out


def parse_assignments(items) -> dict[str, str]:
    """``["NAME=VALUE", ...]`` (the command line's ``-p``) as a dict of strings."""
    out = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip().isidentifier():
            raise ParameterError(f"-p wants NAME=VALUE, got {item!r}")
        out[name.strip()] = value
    return out


def plan_parameters(parameters: dict | None, notebooks=None) -> dict[str, dict]:
    """Per notebook, the parameters it will get: each one goes to every selected notebook that
    declares it. Checks everything first: an unknown notebook, a name that no selected notebook
    declares, or a bad value raises :class:`ParameterError` before anything runs."""
    names = list(notebooks or available_notebooks())
    unknown_nb = [n for n in names if n not in available_notebooks()]
    if unknown_nb:
        raise ParameterError(f"unknown notebook(s) {unknown_nb}; notebooks: {', '.join(available_notebooks())}")
    parameters = dict(parameters or {})
    declared = {n: notebook_parameters(n) for n in names}
    orphans = sorted(k for k in parameters if not any(k in d for d in declared.values()))
    if orphans:
        takes = "; ".join(f"{n}: {', '.join(sorted(set(d) - set(COMMON_PARAMETERS))) or '—'}"
                          for n, d in declared.items())
        raise ParameterError(f"unknown parameter(s) {orphans} for notebook(s) {', '.join(names)}. "
                             f"Every notebook takes {', '.join(COMMON_PARAMETERS)}; besides, {takes}")
    return {n: check_parameters(n, {k: v for k, v in parameters.items() if k in declared[n]})
            for n in names}


# ---------------------------------------------------------------------------------------------
# Helpers the notebooks use for labels and panels

#: Readable names of the study's sources (any other source is named by its id).
SOURCE_LABELS = {"azure_llm_2024": "Azure", "bailian_qwen": "Bailian", "burstgpt": "BurstGPT",
                 "mooncake_conversation": "Mooncake conversation", "mooncake_synthetic": "Mooncake synthetic"}


def source_label(source: str) -> str:
    return SOURCE_LABELS.get(source, source)


def pair_label(a: str, b: str) -> str:
    return f"{source_label(a)}–{source_label(b)}"


def resolve_panel(spec) -> tuple:
    """The policies of a panel: ``"primary"`` (the study's 11), ``"study"`` (its 13), or policy ids
    (a list or a comma-separated string; at least three, to rank)."""
    from .policies import PRIMARY_PANEL, STUDY_POLICIES, available
    if isinstance(spec, str) and spec.strip() in ("primary", "study"):
        return PRIMARY_PANEL if spec.strip() == "primary" else STUDY_POLICIES
    ids = [p.strip() for p in spec.split(",")] if isinstance(spec, str) else list(spec)
    ids = [p for p in ids if p]
    unknown = [p for p in ids if p not in available()]
    if unknown:
        raise ValueError(f"unknown policy id(s) {unknown}; a panel is 'primary', 'study' or policy "
                         f"ids among {', '.join(available())}")
    if len(set(ids)) < 3:
        raise ValueError(f"a panel needs at least three different policies, got {ids}")
    return tuple(dict.fromkeys(ids))


def engine_description(name: str) -> str:
    """First sentence of the engine model's docstring."""
    from . import engine
    return engine.describe(name)


# ---------------------------------------------------------------------------------------------
# Executing and dressing a notebook

def _ipc_kernel_manager():
    """A kernel manager that talks to the notebook's kernel over local IPC sockets (in a temporary
    folder) rather than TCP on localhost, so the kernel does not warn, once per notebook, that its
    TCP traffic is unencrypted: nothing here leaves the machine."""
    import os
    import tempfile

    from jupyter_client.manager import AsyncKernelManager

    class IpcKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            kwargs.setdefault("transport", "ipc")
            kwargs.setdefault("ip", os.path.join(tempfile.mkdtemp(prefix="portbench-kernel-"), "kernel"))
            super().__init__(**kwargs)

    return IpcKernelManager


def execute_notebook(name: str, parameters: dict | None = None, out_dir: Path = EXECUTED_DIR) -> Path:
    """Run one notebook with papermill; the executed copy replaces the old one only on success."""
    import jupytext
    import nbformat
    import papermill

    src = NOTEBOOKS_DIR / f"{name}.py"
    if not src.exists():
        raise FileNotFoundError(f"no notebook {src}; notebooks: {', '.join(available_notebooks())}")
    params = check_parameters(name, {**COMMON_PARAMETERS, **(parameters or {})})
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (REPO / params["output_dir"]).mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{name}.tmp.ipynb"
    try:
        papermill.execute_notebook(jupytext.read(src), str(tmp), parameters=params, kernel_name="python3",
                                   cwd=str(REPO), progress_bar=False, kernel_manager_class=_ipc_kernel_manager())
        nb = nbformat.read(tmp, as_version=4)
        dress_for_reading(nb, notebook_parameters(name), params, name)
        nbformat.write(nb, tmp)
        tmp.replace(out_dir / f"{name}.ipynb")
    finally:
        tmp.unlink(missing_ok=True)
    return out_dir / f"{name}.ipynb"


def _md_value(value) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(_md_value(v) for v in value) or "(none)"
    text = "(empty)" if value == "" else str(value)
    return "`" + text.replace("`", "'") + "`"


def _differs(value, default) -> bool:
    if isinstance(default, (list, tuple)) and isinstance(value, (list, tuple)):
        return list(value) != list(default)
    return value != default


#: Parameters that do not change a chapter's content (left out of "changed from the defaults").
_PLACEMENT_ONLY = {"output_dir"}


def parameters_markdown(name: str, declared: dict[str, Parameter], values: dict) -> str:
    """The "parameters of this build" box: every declared parameter with the value it ran with,
    the notebook's default beside any value that differs from it, and the parameter's meaning."""
    rows, changed = [], []
    for key, p in declared.items():
        value = values.get(key, p.default)
        shown = _md_value(value)
        if _differs(value, p.default):
            shown += f" (notebook default {_md_value(p.default)})"
            if key not in _PLACEMENT_ONLY:
                changed.append(key)
        rows.append(f"| `{key}` | {shown} | {p.meaning.replace('|', '/')} |")
    title = "Parameters of this build"
    if changed:
        title += " — changed from the notebook's defaults: " + ", ".join(changed)
    return "\n".join([
        f":::{{admonition}} {title}",
        ":class: dropdown toggle-shown pb-parameters",
        "",
        "| parameter | value | meaning |",
        "|---|---|---|",
        *rows,
        "",
        f"Rebuild this chapter with other values: `portbench book --skip-campaign --notebooks {name} "
        f"-p NAME=VALUE` (see {{doc}}`/reproduce`).",
        ":::",
    ])


def download_line(name: str) -> str:
    """The line under a chapter's parameters box that offers its executed notebook for download."""
    return (f"**Download this chapter's notebook:** {{download}}`{name}.ipynb <{name}.ipynb>` (executed, "
            f"with every output; its source is `notebooks/{name}.py`). The campaign tables and real-engine "
            f"files behind the figures: {{doc}}`/data`.")


def dress_for_reading(nb, declared: dict[str, Parameter], values: dict, name: str) -> None:
    """Fold code, drop the two parameters cells, and show one table of this build's parameters,
    followed by a line that offers the executed notebook for download (:func:`download_line`)."""
    import nbformat

    cells = []
    for cell in nb.cells:
        tags = list(cell.get("metadata", {}).get("tags", []))
        if "parameters" in tags or "injected-parameters" in tags:
            if "injected-parameters" in tags:
                box = nbformat.v4.new_markdown_cell(parameters_markdown(name, declared, values))
                box.metadata["tags"] = ["build-parameters"]
                cells.append(box)
                line = nbformat.v4.new_markdown_cell(download_line(name))
                line.metadata["tags"] = ["download-notebook"]
                cells.append(line)
            cell.metadata["tags"] = tags + ["remove-cell"]
        elif cell.cell_type == "code" and not _DISPLAY_TAGS & set(tags):
            cell.metadata["tags"] = tags + ["hide-input"]
        cells.append(cell)
    nb.cells = cells
    nb.metadata["portbench"] = {"notebook": name, "parameters": {k: values.get(k, p.default)
                                                                  for k, p in declared.items()}}


def executed_parameters(path: Path) -> dict:
    """The parameters an executed notebook ran with (empty for one not executed by this module)."""
    import nbformat
    return dict(nbformat.read(path, as_version=4).metadata.get("portbench", {}).get("parameters", {}))


# ---------------------------------------------------------------------------------------------
# Data downloads: the files the book reads, offered on its "Data downloads" page (book/data.md)

#: Folder (under the book's folder; generated, not committed) that holds the copies the site offers.
DOWNLOADS = "downloads"

#: Columns of the campaign tables that identify a condition (the means CSV averages over windows).
CONDITION_COLUMNS = ("source", "region", "slo_multiplier", "prediction_error", "policy")


def human_size(n_bytes: int) -> str:
    """``1.9 MB``, ``36 kB``, ``298 bytes`` (decimal units)."""
    if n_bytes < 1000:
        return f"{n_bytes} bytes"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if n_bytes < scale * 1000 or unit == "GB":
            value = n_bytes / scale
            return f"{value:.0f} {unit}" if value >= 100 else f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def condition_means_table(table):
    """Per condition (source, region, SLO multiplier, prediction error where present, policy): the
    mean of every metric over windows (repetitions averaged first, undefined values left out, as in
    :func:`portbench.stats.condition_means`) and the number of windows."""
    from .metrics import METRICS

    missing = [c for c in ("window_id", "source", "region", "policy", *METRICS) if c not in table]
    if missing:
        raise ValueError(f"not a campaign table: no column(s) {missing}")
    keys = [c for c in CONDITION_COLUMNS if c in table]
    per_window = table.groupby(keys + ["window_id"], sort=True)[list(METRICS)].mean()
    grouped = per_window.groupby(level=keys, sort=True)
    out = grouped.mean()
    out.insert(0, "n_windows", grouped.size())
    return out.reset_index()


def _realengine_contents(name: str) -> str:
    """What a real-engine file holds, said where its name is (:mod:`portbench.results`)."""
    from .results import realengine_contents

    return realengine_contents(name)


def prepare_downloads(book_dir: Path = BOOK_DIR, data_dir: Path | None = None) -> list[dict]:
    """Copy the campaign tables and the real-engine files into ``book_dir/downloads/``, write a CSV
    of per-condition means beside each campaign table, and write ``downloads/files.md``: the table
    of links (with size and content) that the book's "Data downloads" page includes. Sphinx copies
    every linked file into the built site, so the links work offline. Returns one row per file."""
    from . import results

    book_dir = Path(book_dir)
    out = book_dir / DOWNLOADS
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rows = []

    def add(src: Path, group: str, what: str, dest_name: str | None = None) -> None:
        dest = out / (dest_name or src.name)
        if src != dest:
            shutil.copyfile(src, dest)
        rows.append({"group": group, "file": dest.name, "bytes": dest.stat().st_size, "contents": what})

    import pandas as pd

    for table in results.campaign_tables(data_dir):
        error = (f"{table.prediction_error:.0%} prediction error" if table.prediction_error is not None
                 else "the study's 20% prediction error")
        add(table.path, "campaign", f"every cell of engine model `{table.engine}`, {error}")
        means = condition_means_table(pd.read_parquet(table.path))
        means_path = out / f"condition_means_{table.name}.csv"
        means.to_csv(means_path, index=False, float_format="%.6g")
        add(means_path, "campaign", f"per-condition means of `{table.path.name}` ({len(means):,} conditions)")
    for table in results.lambda_tables(data_dir):
        add(table.path, "campaign", f"per window: λ_ref of engine model `{table.name}` beside the study's")
    for path in results.realengine_files(data_dir):
        add(path, "real engine", _realengine_contents(path.name))
    if not rows:
        raise FileNotFoundError(f"no campaign tables in {results.results_dir(data_dir)}: run `portbench "
                                f"campaign` first")
    lines = []
    for group, title in (("campaign", "Campaign tables"), ("real engine", "Real-engine runs (vLLM, CPU build)")):
        mine = [r for r in rows if r["group"] == group]
        if not mine:
            continue
        lines += [f"## {title}", "", "| file | size | what it holds |", "|---|---|---|"]
        lines += [f"| {{download}}`{r['file']} <{DOWNLOADS}/{r['file']}>` | {human_size(r['bytes'])} | "
                  f"{r['contents'].replace('|', '/')} |" for r in mine]
        lines.append("")
    (out / "files.md").write_text("\n".join(lines))
    return rows


# ---------------------------------------------------------------------------------------------
# The HTML book

def build_html(strict: bool = False, book_dir: Path = BOOK_DIR, quiet: bool = False) -> Path:
    """``jupyter-book build``; with ``strict`` every Sphinx warning is an error."""
    book_dir = Path(book_dir)
    missing = [f"executed/{n}.ipynb" for n in available_notebooks()
               if not (book_dir / "executed" / f"{n}.ipynb").exists()]
    if missing:
        raise FileNotFoundError(f"{book_dir}: notebooks not executed yet: {missing} (run `portbench book`)")
    exe = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(exe if exe.exists() else "jupyter-book"), "build", str(book_dir), "--config",
           str(REPO / "_config.yml"), "--toc", str(book_dir / "_toc.yml"),
           "--path-output", str(book_dir)]
    if strict:
        cmd += ["-W", "-n", "--keep-going"]
    if quiet:
        cmd += ["-q"]
    prepare_downloads(book_dir)
    # Pages paste numbers from other pages' notebooks, which Sphinx does not track: read them all.
    shutil.rmtree(book_dir / "_build" / ".doctrees", ignore_errors=True)
    # Figures are rewritten by every run: stale copies would make Sphinx warn that it overwrites them.
    shutil.rmtree(book_dir / "_build" / "html" / "_images", ignore_errors=True)
    subprocess.run(cmd, check=True, cwd=REPO)
    return book_dir / "_build" / "html" / "index.html"


def mixed_engine_models(book_dir: Path = BOOK_DIR) -> dict[str, list[str]]:
    """Engine models of the executed notebooks, when they are not all the same (else empty)."""
    by_engine: dict[str, list[str]] = {}
    for n in available_notebooks():
        path = Path(book_dir) / "executed" / f"{n}.ipynb"
        if path.exists():
            engine = executed_parameters(path).get("engine_model", "?")
            by_engine.setdefault(engine, []).append(n)
    return by_engine if len(by_engine) > 1 else {}


def _last_seconds(path: Path) -> float:
    """How long the executed notebook at ``path`` took to run last time (papermill's record in its
    metadata; 0 when there is none)."""
    import json

    try:
        with open(path) as f:
            return float(json.load(f)["metadata"]["papermill"]["duration"] or 0.0)
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (a notebook's kernel)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _one_blas_thread() -> None:
    """In a worker process, before it starts any kernel: the kernels it starts use one BLAS thread
    (unless the environment says otherwise)."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def _execute_timed(name: str, parameters: dict, out_dir: Path) -> dict:
    """:func:`execute_notebook`, timed: its wall and CPU seconds (the kernel's included). In a worker
    process a failure comes back as a ``RuntimeError`` naming the notebook (papermill's own errors
    do not cross processes)."""
    t0, c0 = time.perf_counter(), _cpu_seconds()
    try:
        execute_notebook(name, parameters, out_dir=out_dir)
    except ParameterError:
        raise
    except Exception as exc:
        raise RuntimeError(f"notebooks/{name}.py: {type(exc).__name__}: {exc}") from None
    return {"wall": time.perf_counter() - t0, "cpu": _cpu_seconds() - c0}


def execute_notebooks(names, plan: dict, *, out_dir: Path, jobs: int | None = None, progress: bool = True,
                      timings: dict | None = None) -> None:
    """Execute the notebooks ``names``, each with its parameters ``plan[name]``, into ``out_dir``,
    ``jobs`` at a time in worker processes (default: one per core; 1: one after another, here), the
    longest of the last build first so that the workers finish together. A failure stops the
    notebooks not yet started and is raised when the running ones have ended. ``timings`` (a dict)
    receives each notebook's ``{"wall": seconds, "cpu": seconds}``."""
    import concurrent.futures as cf
    import multiprocessing

    names = list(names)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(names)))
    timings = {} if timings is None else timings
    done = 0

    def report(name: str, seconds: dict) -> None:
        nonlocal done
        done += 1
        timings[name] = seconds
        if progress:
            print(f"[{done}/{len(names)}] notebooks/{name}.py done in {seconds['wall']:.1f} s", flush=True)

    if jobs == 1:
        for name in names:
            if progress:
                print(f"      executing notebooks/{name}.py ...", flush=True)
            t0, c0 = time.perf_counter(), _cpu_seconds()
            execute_notebook(name, plan[name], out_dir=out_dir)
            report(name, {"wall": time.perf_counter() - t0, "cpu": _cpu_seconds() - c0})
        return
    order = sorted(names, key=lambda n: -_last_seconds(Path(out_dir) / f"{n}.ipynb"))
    if progress:
        print(f"executing {len(names)} notebooks, {jobs} at a time ...", flush=True)
    # The notebooks already run one per core: a kernel's BLAS threads would only contend with the
    # other kernels (they spin), so each kernel gets one (its results are the same).
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                initializer=_one_blas_thread) as pool:
        futures = {pool.submit(_execute_timed, name, plan[name], Path(out_dir)): name for name in order}
        try:
            for future in cf.as_completed(futures):
                report(futures[future], future.result())
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def build_book(parameters: dict | None = None, notebooks=None, strict: bool = False,
               progress: bool = True, book_dir: Path = BOOK_DIR, jobs: int | None = None,
               timings: dict | None = None) -> Path:
    """Execute the notebooks, then build the HTML; returns the path of the book's index page.

    Each parameter goes to every notebook that declares it; all are checked before anything runs.
    ``book_dir`` other than ``book/`` gets a copy of the book's pages first (tests build there).
    The notebooks run ``jobs`` at a time (:func:`execute_notebooks`; default one per core);
    ``timings`` (a dict) receives each notebook's wall and CPU seconds and the HTML build's (``"html"``).
    """
    book_dir = Path(book_dir)
    names = list(notebooks or available_notebooks())
    plan = plan_parameters({"output_dir": os.path.relpath(book_dir / "figures", REPO), **(parameters or {})},
                           names)
    if book_dir.resolve() != BOOK_DIR.resolve():
        shutil.copytree(BOOK_DIR, book_dir, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("_build", "executed", "figures", DOWNLOADS))
    timings = {} if timings is None else timings
    execute_notebooks(names, plan, out_dir=book_dir / "executed", jobs=jobs, progress=progress, timings=timings)
    mixed = mixed_engine_models(book_dir)
    if mixed:
        print("note: the book's chapters were executed with different engine models: "
              + "; ".join(f"{e}: {', '.join(ns)}" for e, ns in mixed.items()), file=sys.stderr)
    t0, c0 = time.perf_counter(), _cpu_seconds()
    index = build_html(strict, book_dir=book_dir, quiet=not progress)
    timings["html"] = {"wall": time.perf_counter() - t0, "cpu": _cpu_seconds() - c0}
    return index

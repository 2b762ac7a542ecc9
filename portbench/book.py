"""Execute the study's notebooks with papermill and build the Jupyter Book.

Notebooks live in ``notebooks/`` as jupytext py:percent files with a ``parameters`` cell; executed
copies go to ``book/executed/`` (what the book renders) and figures to ``book/figures/``.
"""

from __future__ import annotations

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
             "rq5_sample_complexity")

#: Parameters every notebook accepts, with the book's defaults.
COMMON_PARAMETERS = {"results_path": "", "engine_model": "lssp", "n_resamples": 2000, "seed": 0,
                     "output_dir": str(FIGURES_DIR)}
#: Small values for CI: few resamples (the campaign table is the same).
TINY_PARAMETERS = {"n_resamples": 50}


def available_notebooks() -> list[str]:
    return [n for n in NOTEBOOKS if (NOTEBOOKS_DIR / f"{n}.py").exists()]


def execute_notebook(name: str, parameters: dict | None = None, out_dir: Path = EXECUTED_DIR) -> Path:
    """Run one notebook with papermill; the executed copy replaces the old one only on success."""
    import jupytext
    import papermill

    src = NOTEBOOKS_DIR / f"{name}.py"
    if not src.exists():
        raise FileNotFoundError(f"no notebook {src}; notebooks: {', '.join(available_notebooks())}")
    params = {**COMMON_PARAMETERS, **(parameters or {})}
    unknown = set(params) - set(COMMON_PARAMETERS) - _declared_parameters(src)
    if unknown:
        raise ValueError(f"notebook {name}: unknown parameter(s) {sorted(unknown)}; it takes "
                         f"{sorted(set(COMMON_PARAMETERS) | _declared_parameters(src))}")
    out_dir.mkdir(parents=True, exist_ok=True)
    Path(params["output_dir"]).mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{name}.ipynb.tmp"
    try:
        papermill.execute_notebook(jupytext.read(src), str(tmp), parameters=params, kernel_name="python3",
                                   cwd=str(REPO), progress_bar=False)
        tmp.replace(out_dir / f"{name}.ipynb")
    finally:
        tmp.unlink(missing_ok=True)
    return out_dir / f"{name}.ipynb"


def _declared_parameters(src: Path) -> set[str]:
    """Names assigned in the notebook's ``parameters`` cell."""
    import ast

    import jupytext

    nb = jupytext.read(src)
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            tree = ast.parse(cell.source)
            return {t.id for node in tree.body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
    raise ValueError(f"{src} has no cell tagged 'parameters'")


def build_html(strict: bool = False) -> Path:
    """``jupyter-book build book``; with ``strict`` every Sphinx warning is an error."""
    exe = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(exe if exe.exists() else "jupyter-book"), "build", str(BOOK_DIR), "--config",
           str(REPO / "_config.yml"), "--toc", str(BOOK_DIR / "_toc.yml")]
    if strict:
        cmd += ["-W", "-n", "--keep-going"]
    shutil.rmtree(BOOK_DIR / "_build" / ".doctrees", ignore_errors=True)
    subprocess.run(cmd, check=True, cwd=REPO)
    return BOOK_DIR / "_build" / "html" / "index.html"


def build_book(parameters: dict | None = None, notebooks=None, strict: bool = False,
               progress: bool = True) -> Path:
    """Execute the notebooks, then build the HTML; returns the path of the book's index page."""
    names = list(notebooks or available_notebooks())
    for k, name in enumerate(names, 1):
        t0 = time.perf_counter()
        if progress:
            print(f"[{k}/{len(names)}] executing notebooks/{name}.py ...", flush=True)
        execute_notebook(name, parameters)
        if progress:
            print(f"      done in {time.perf_counter() - t0:.1f} s", flush=True)
    return build_html(strict)

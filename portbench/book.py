"""Execute the study's notebooks with papermill and build the Jupyter Book.

Notebooks live in ``notebooks/`` as jupytext py:percent files with a ``parameters`` cell; executed
copies go to ``book/executed/`` (what the book renders) and figures to ``book/figures/``.
"""

from __future__ import annotations

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
             "rq5_sample_complexity", "rq6_real_engine", "fidelity", "comparison")

#: Parameters every notebook accepts, with the book's defaults.
COMMON_PARAMETERS = {"results_path": "", "engine_model": "lssp", "n_resamples": 2000, "seed": 0,
                     "output_dir": "book/figures"}      # relative to the repository (notebooks run there)
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
    accepted = set(COMMON_PARAMETERS) | _declared_parameters(src)
    unknown = set(params) - accepted
    if unknown:
        raise ValueError(f"notebook {name}: unknown parameter(s) {sorted(unknown)}; it takes {sorted(accepted)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (REPO / params["output_dir"]).mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{name}.tmp.ipynb"
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
    shutil.rmtree(book_dir / "_build" / ".doctrees", ignore_errors=True)
    subprocess.run(cmd, check=True, cwd=REPO)
    return book_dir / "_build" / "html" / "index.html"


def build_book(parameters: dict | None = None, notebooks=None, strict: bool = False,
               progress: bool = True, book_dir: Path = BOOK_DIR) -> Path:
    """Execute the notebooks, then build the HTML; returns the path of the book's index page.

    ``book_dir`` other than ``book/`` gets a copy of the book's pages first (tests build there).
    """
    book_dir = Path(book_dir)
    if book_dir.resolve() != BOOK_DIR.resolve():
        shutil.copytree(BOOK_DIR, book_dir, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("_build", "executed", "figures"))
    parameters = {"output_dir": os.path.relpath(book_dir / "figures", REPO), **(parameters or {})}
    names = list(notebooks or available_notebooks())
    for k, name in enumerate(names, 1):
        t0 = time.perf_counter()
        if progress:
            print(f"[{k}/{len(names)}] executing notebooks/{name}.py ...", flush=True)
        execute_notebook(name, parameters, out_dir=book_dir / "executed")
        if progress:
            print(f"      done in {time.perf_counter() - t0:.1f} s", flush=True)
    return build_html(strict, book_dir=book_dir, quiet=not progress)

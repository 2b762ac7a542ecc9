"""How the book shows numbers, names, tables and figures: one place, used by every notebook.

A chapter computes its results and hands them to these helpers instead of printing Python values, so
that every page reads the same way:

- **Numbers** — :func:`num` rounds to the digits given (what the number supports), writes a true minus
  sign (U+2212) and groups thousands; :func:`signed` always shows the sign (``+0.012``, ``−0.024``);
  :func:`pct` writes a share as a percentage and :func:`sci` a tiny or huge one as ``3.2 × 10⁻⁵``. Glue the *string* these return and paste it with
  ``{glue:text}`key:s```: a format spec in the role (``:+.3f``) would write a hyphen-minus.
- **Words** — :func:`count` (``1 test``, ``0 tests``, ``2 policies``), :func:`join` (``a``, ``a and
  b``, ``a, b and c``; ``none`` when empty) and :func:`went_from` (``from 2 to 0 and 0`` becomes
  ``from 2 to none in either``) keep glued sentences English for zero, one and many.
- **Names** — :func:`label` turns an identifier into what a reader reads: a reversal class
  (``SUPPORTED_PRACTICAL_REVERSAL`` → "supported practical reversal"), a metric (``anwg`` → "ANWG"),
  a source (``burstgpt`` → "BurstGPT") or a table column (``tau_b`` → "τ_b"). Policy ids, region
  names (``HIGH_PRESSURE``) and engine-model ids stay as they are: they are the names the command
  line takes.
- **Tables** — :func:`table` shows a DataFrame without a 0…n index (a meaningful index becomes
  columns), with readable column names and labels, floats rounded per column and true minus signs.
- **Figures** — :func:`figure` saves a Matplotlib figure to the chapter's output folder and glues it
  under a key without showing it in the cell; a ``{glue:figure}`` markdown cell then places it with a
  number, a caption and alt text (figures glue within a page only; the introduction includes saved
  PNGs with ``{figure}``).

A new chapter imports this module (``from portbench import present``) and uses the same helpers; add a
label to :data:`LABELS` rather than writing one in a notebook.
"""

from __future__ import annotations

import math
from pathlib import Path

MINUS = "\u2212"

#: Readable names of identifiers that reach prose and tables (classes, metrics, sources, columns).
LABELS = {
    # reversal classes (portbench.stats)
    "UNDEFINED": "undefined",
    "STABLE": "stable",
    "MICROSCOPIC": "microscopic",
    "UNSUPPORTED_WIDE_CI": "unsupported (wide CI)",
    "SUPPORTED_PRACTICAL_REVERSAL": "supported practical reversal",
    # metrics (portbench.metrics.METRICS)
    "anwg": "ANWG",
    "completion_fraction": "completion fraction",
    "weighted_completion": "weighted completion",
    "slo_violation_rate": "SLO-violation rate",
    "weighted_goodput": "weighted goodput",
    "mean_latency_s": "mean latency (s)",
    "p95_latency_s": "p95 latency (s)",
    "mean_ttft_s": "mean TTFT (s)",
    "p95_ttft_s": "p95 TTFT (s)",
    "request_throughput": "request throughput",
    "token_throughput": "token throughput",
    # table columns
    "tau_b": "τ_b",
    "ci_low": "CI low",
    "ci_high": "CI high",
    "bca_low": "BCa low",
    "bca_high": "BCa high",
    "pvalue": "p",
    "delta": "Δ",
    "delta_x": "Δ (first source)",
    "delta_y": "Δ (second source)",
    "margin_x": "margin (first source)",
    "margin_y": "margin (second source)",
    "source_x": "first source",
    "source_y": "second source",
    "source_a": "source A",
    "source_b": "source B",
    "policy_a": "policy A",
    "policy_b": "policy B",
    "cls": "class",
    "bh": "survives BH",
    "top1_a": "top-1 (base)",
    "top1_b": "top-1 (variant)",
    "top1_changed": "top-1 changed",
    "median_tau": "median τ_b",
    "share_negative": "share negative",
    "top1_agreement": "top-1 agreement",
    "lambda_ref": "λ_ref",
    "paper_lambda_ref": "study's λ_ref",
    "relative_difference": "relative difference",
    "tau_vs_knee": "τ_b vs KNEE",
    "p_top1": "P(top-1)",
    "p_full": "P(full ranking)",
    # real-engine cases and set-ups (data/results/realengine/<tag>_case...), by what they ran
    "vllm_cpu_case": "vLLM-CPU, first case (no host guard)",
    "vllm_cpu_guarded_case": "vLLM-CPU, each policy's own limits",
    "vllm_cpu_equal_case": "vLLM-CPU, equal limits",
    "vllm_cpu_equal_fixed_case": "vLLM-CPU, equal limits, port fixed",
    "vllm_cpu_study_case": "vLLM-CPU, study configuration",
    "vllm_cpu_study_azure_h2_case": "vLLM-CPU, study configuration, second host",
    "vllm_cpu_choice_case": "vLLM-CPU, loaded for choices",
    "vllm_cpu_custom_case": "vLLM-CPU, your own scheduler",
    "vllm_cpu_rq7_case": "vLLM-CPU, RQ7 schedulers",
    "h200_study_case": "H200, study configuration",
}
# a case's set-up (its tuning, profile and cost) by the case's name
LABELS.update({k.removesuffix("_case"): v for k, v in list(LABELS.items()) if k.endswith("_case")})


def _source_labels() -> dict:
    from .book import SOURCE_LABELS
    return SOURCE_LABELS


def window_label(window_id: str) -> str:
    """A frozen window's id as a reader reads it: ``azure_llm_2024_pilot_v2_w10`` → "Azure window w10"
    (the source's display name and the window's number; a sub-window keeps its block, "… w10, block 2")."""
    import re

    m = re.fullmatch(r"(.+?)_(?:pilot_v2|stage0)_(w\d+)(?:_n\d+_(\d+))?", str(window_id))
    if not m:
        return str(window_id)
    block = f", block {int(m.group(3)) + 1}" if m.group(3) is not None else ""
    return f"{label(m.group(1))} window {m.group(2)}{block}"


def label(identifier) -> str:
    """What a reader reads for ``identifier`` (see :data:`LABELS`; sources as in the book); anything
    unknown is returned as its text."""
    text = str(identifier)
    sources = _source_labels()
    if text in sources:
        return sources[text]
    return LABELS.get(text, text)


# ---------------------------------------------------------------------------------------------
# Numbers

def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def num(x, digits: int = 2, *, sign: bool = False, missing: str = "n/a") -> str:
    """``x`` rounded to ``digits`` decimals, thousands grouped, with a true minus sign; ``+`` in front
    of a positive value with ``sign``. A value that rounds to zero is written without a sign. NaN or
    None gives ``missing``."""
    if digits < 0:
        raise ValueError(f"digits must be >= 0, got {digits}")
    if not _finite(x):
        return missing
    x = float(x)
    text = f"{abs(x):,.{digits}f}"
    if float(text.replace(",", "")) == 0:
        return text
    if x < 0:
        return MINUS + text
    return ("+" + text) if sign else text


def signed(x, digits: int = 3, *, missing: str = "n/a") -> str:
    """``x`` with its sign always written: ``+0.012``, ``−0.024`` (``0.000`` for zero)."""
    return num(x, digits, sign=True, missing=missing)


_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def sci(x, digits: int = 1, *, missing: str = "n/a") -> str:
    """A small or large number in scientific notation as printed prose writes it: ``3.2 × 10⁻⁵``
    (plain :func:`num` between 0.001 and 10,000)."""
    if not _finite(x):
        return missing
    x = float(x)
    if x == 0 or 1e-3 <= abs(x) < 1e4:
        return num(x, max(digits, 3) if abs(x) < 1 else digits)
    mantissa, exponent = f"{x:.{digits}e}".split("e")
    return f"{num(float(mantissa), digits)} × 10{str(int(exponent)).translate(_SUPERSCRIPT)}"


def pct(share, digits: int = 0, *, missing: str = "n/a") -> str:
    """A share (0.25) as a percentage (``25%``), true minus sign."""
    return missing if not _finite(share) else num(100 * float(share), digits) + "%"


def minus_signs(text: str) -> str:
    """``text`` with every hyphen-minus that stands before a digit as a true minus sign (for numbers
    already formatted elsewhere, e.g. by a library)."""
    out = []
    for k, ch in enumerate(text):
        if (ch == "-" and k + 1 < len(text) and (text[k + 1].isdigit() or text[k + 1] == ".")
                and (k == 0 or not (text[k - 1].isalnum() or text[k - 1] in "_."))):
            out.append(MINUS)
        else:
            out.append(ch)
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Words

def count(n: int, singular: str, plural: str | None = None) -> str:
    """``1 test``, ``0 tests``, ``1,234 tests`` (``plural`` defaults to ``singular + "s"``)."""
    n = int(n)
    return f"{n:,} {singular if n == 1 else (plural or singular + 's')}"


def join(items, conjunction: str = "and", empty: str = "none") -> str:
    """``a``; ``a and b``; ``a, b and c``; ``empty`` for no items."""
    items = [str(i) for i in items]
    if not items:
        return empty
    if len(items) == 1:
        return items[0]
    return f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


def went_from(before, afters: dict, noun: str = "") -> str:
    """A change of one count to several alternatives, as English: ``went_from(2, {"refused": 0,
    "chunked": 0})`` → ``"from 2 to 0 in either case"``; ``{"refused": 0, "chunked": 1}`` → ``"from 2
    to 0 (refused) and 1 (chunked)"``."""
    values = list(afters.values())
    head = f"from {before:,}" + (f" {noun}" if noun else "")
    if values and all(v == values[0] for v in values):
        which = "in either case" if len(values) == 2 else "in every case"
        return f"{head} to {values[0]:,} {which}" if len(values) > 1 else f"{head} to {values[0]:,}"
    return f"{head} to " + join(f"{v:,} ({k})" for k, v in afters.items())


# ---------------------------------------------------------------------------------------------
# Tables

def table(frame, digits=3, *, index: bool | None = None, labels: bool = True):
    """``frame`` for display: a meaningful index becomes columns (a 0…n index is dropped; ``index``
    forces either), floats are rounded (``digits``: one number, or a dict by column with a default
    under ``None``), minus signs are true ones, booleans read yes/no, and identifiers and column names
    are given readable labels (``labels``). Returns a Styler that hides the row index."""
    import numpy as np
    import pandas as pd

    if isinstance(frame, pd.Series):
        frame = frame.to_frame()
    frame = frame.copy()
    if isinstance(frame.columns, pd.MultiIndex):
        frame.columns = [" ".join(str(c) for c in col if str(c)) for col in frame.columns]
    unnamed = all(n is None for n in frame.index.names)
    keep_index = index if index is not None else not (
        unnamed and frame.index.nlevels == 1 and pd.api.types.is_integer_dtype(frame.index))
    if keep_index:
        names = [n if n is not None else ("" if frame.index.nlevels == 1 else f"level {k}")
                 for k, n in enumerate(frame.index.names)]
        frame.index = frame.index.set_names(names)
        frame = frame.reset_index()
    else:
        frame = frame.reset_index(drop=True)

    def digits_of(col):
        if isinstance(digits, dict):
            return digits.get(col, digits.get(None, 3))
        return digits

    def cell(value, col):
        if isinstance(value, (bool, np.bool_)):
            return "yes" if value else "no"
        if isinstance(value, (int, np.integer)):
            return num(value, 0)
        if isinstance(value, (float, np.floating)):
            if not math.isfinite(value):
                return "n/a"
            return num(value, digits_of(col))
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        return label(value) if labels else str(value)

    shown = pd.DataFrame({col: [cell(v, col) for v in frame[col]] for col in frame.columns},
                         index=range(len(frame)))
    if labels:
        shown.columns = [label(c) for c in shown.columns]
    return shown.style.hide(axis="index")


# ---------------------------------------------------------------------------------------------
# Figures

def figure(key: str, fig, output_dir=None, filename: str | None = None, dpi: int = 120):
    """Glue ``fig`` under ``key`` (placed by a ``{glue:figure}`` cell with number, caption and alt
    text), save it as ``output_dir/filename`` (default ``<key>.png``) when ``output_dir`` is given,
    and close it so the code cell shows nothing (it returns nothing, so nothing is displayed)."""
    import matplotlib.pyplot as plt
    from myst_nb import glue

    path = None
    if output_dir is not None:
        path = Path(output_dir) / (filename or f"{key}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    glue(key, fig, display=False)
    plt.close(fig)

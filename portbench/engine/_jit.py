"""Where numba keeps the engine's compiled loops: a cache directory named by the engine's sources.

numba's on-disk cache (``cache=True``) checks only the source file of the function it compiled, not
the functions it calls there: after an edit of :mod:`~portbench.engine.blockpool` or
:mod:`~portbench.engine.reqtable`, the cached loops of :mod:`~portbench.engine.vllm_v1` would go on
running the old code. The engine's compiled modules import this one first; it points numba's cache at
``__pycache__/numba-<digest of every engine source file>`` beside them, so any edit of the engine
compiles afresh (once). A ``NUMBA_CACHE_DIR`` set by the user is left alone; where that directory
cannot be written, numba falls back to its default places.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numba

_HERE = Path(__file__).resolve().parent


def sources_digest() -> str:
    """A digest of every ``.py`` file of the engine package (names and contents)."""
    h = hashlib.sha256()
    for f in sorted(_HERE.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


if not os.environ.get("NUMBA_CACHE_DIR"):
    numba.config.CACHE_DIR = str(_HERE / "__pycache__" / f"numba-{sources_digest()}")

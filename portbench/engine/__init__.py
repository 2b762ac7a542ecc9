"""The engine models and the policy interface: one engine loop contract, one module per engine model.

- :mod:`~portbench.engine.api`: what a policy is (:class:`Policy`, :class:`EngineView`,
  :class:`Decision`), what a run returns (:class:`RunResult`), the contract checks, and what an engine
  model is (:class:`EngineModel`);
- :mod:`~portbench.engine.queue`: the engine-owned waiting order behind a key policy (:class:`KeyPolicy`);
- :mod:`~portbench.engine.lssp`: the study's engine model (fixed 1 ms steps, free prefill);
- :mod:`~portbench.engine.vllm_v1`: a vLLM-v1-like model (token budget, chunked prefill, paged KV,
  head-of-line admission, recompute preemption) timed by a step-cost model;
- :mod:`~portbench.engine.vllm_native`: vLLM's own scheduler and KV-cache manager, stepped in
  virtual time (needs ``.venv-vllm``);
- :mod:`~portbench.engine.blockpool`, :mod:`~portbench.engine.prefix`: vLLM's block pool with its
  prefix cache, a warm start and an offload tier; which blocks two requests share;
- :mod:`~portbench.engine.reqtable`: the column names of ``vllm_v1``'s per-request table;
  :mod:`~portbench.engine._jit`: numba's cache location;
- :mod:`~portbench.engine.stepcost`: every step-cost model, its fit and its cross-validation.

:data:`ENGINE_MODELS` names them; a new engine model is one module beside these and one line there.
Importing this package loads no numba: ``vllm_v1`` is imported when it is first asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from .api import (NEVER, NOTHING, Decision, EngineModel, EngineView, Policy, PolicyContractError,  # noqa: F401
                  RunResult)
from .lssp import LsspModel, visible_steps  # noqa: F401
from .queue import KeyPolicy  # noqa: F401
from .stepcost import StepCost  # noqa: F401


class _Registry(Mapping):
    """Engine models by name, each imported when first asked for: ``vllm_v1`` compiles its step loops
    with numba, which a process that builds a vLLM engine must not load (see ``tests/test_policy_contract``),
    and the policy interface lives in this package."""

    def __init__(self, where: dict[str, str]):
        self._where = where

    def __getitem__(self, name: str):
        module, cls = self._where[name].split(":")
        return getattr(importlib.import_module(module, __name__), cls)

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


#: Engine models by name (``module:class``): what a campaign config, a notebook parameter and a
#: results table say. A new engine model is one module beside these and one line here.
ENGINE_MODELS = _Registry({
    "lssp": ".lssp:LsspModel",
    "vllm_v1": ".vllm_v1:VllmV1Model",
    "vllm_native": ".vllm_native:VllmNativeModel",
})


def __getattr__(name: str):
    if name == "VllmV1Model":            # loaded on first use, like the registry's entry
        return ENGINE_MODELS["vllm_v1"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def engine_model(name: str):
    """The engine model named ``name``, with its default settings."""
    try:
        return ENGINE_MODELS[name]()
    except KeyError:
        raise KeyError(f"unknown engine model {name!r}; known: {', '.join(ENGINE_MODELS)}") from None


def describe(name: str) -> str:
    """The first sentence of engine model ``name``'s docstring."""
    doc = (ENGINE_MODELS[name].__doc__ or "").strip().replace("\n", " ")
    return " ".join(doc.split(". ")[0].split()).rstrip(".") if doc else name


def simulate(window: Window, policy: Policy, model=None, *, event_skipping: bool = True,
             priority=None) -> RunResult:
    """Replay ``window`` (already scaled) under ``policy`` on ``model`` (default: the study's).

    To check a policy's promises on one run, :func:`portbench.testing.verified_run` replays it both
    ways (the fast engine and the step-by-step loop) and names the first difference.
    """
    model = model or LsspModel()
    engine = model.make_engine(window, policy, priority)
    engine.run(event_skipping=event_skipping)
    return engine.result(window)

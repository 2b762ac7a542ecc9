"""Replay a window on transformers' continuous-batching engine (pinned: transformers 5.17.0).

The engine (``transformers.generation.continuous_batching``) runs a background thread that, each
step, asks a *scheduler* for the next batch (decodes and prompt chunks within a token budget), runs
one forward pass over it with a paged KV cache, samples one token per finished prompt, and delivers
finished requests. We plug the study's policies in as scheduler subclasses registered in the
engine's ``SCHEDULER_MAPPING`` under ``portbench_<policy>``; they see per-request keys from the
window (deadline, estimated service, arrival rank) through a mapping from the engine's request id to
the request's index in the window, bound by :func:`replay` before the first submission.

What each policy maps to, and what the engine's scheduler API cannot express:
:data:`POLICY_MAPPING`.

Times: the replay's t = 0 is taken just before the first submission, with ``time.perf_counter``
(the engine stamps its timestamps with the same clock). Per request, admit = the first time it left
the waiting queue, first token = the time its first token was appended (after that step's forward),
finish = the time its last token was appended. ``duration_s`` is the span of :mod:`portbench.metrics`.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import warnings
import time
from typing import ClassVar

import numpy as np

from ..metrics import run_span_s
from ..policies._common import estimate
from ..policies.slai_faithful import SLAI
from ..workload import Window
from . import (PROBE_REPEATS, PROBE_WARMUP, ModelShape, environment, probe_window, random_prompt,
               refuse_oracles, steady_probe, to_run_result)


#: How each policy maps onto the engine's scheduler API (the module docstring points here).
POLICY_MAPPING = """What each policy maps to (the engine's scheduler API decides, per step, which active and waiting
requests enter the batch and in what order, within the token budget ``max_batch_tokens`` and the
block cache; it cannot hold a request *out of* the cache, and it evicts by its own rule):

- ``fifo``: the engine's own FIFO scheduler unchanged (decodes first, then in-flight prompt chunks,
  then waiting requests in arrival order; prompts are chunked to the budget; a waiting request that
  does not get blocks is skipped, not blocking the queue; new prompts stop when fewer than 15% of the
  blocks are free).
- ``edf`` / ``estimated_service_time_first``: FIFO with the waiting queue ordered by deadline /
  by ``(0.5*prompt + predicted output, deadline, index)`` (stable, ties in arrival order). Active
  requests keep the engine's order.
- ``vllm_faithful``: vLLM v0 FCFS as closely as this engine allows: decodes first; waiting requests
  in arrival order (so a preempted request goes back to the front, as in vLLM), each admitted only
  with its **whole** prompt in the budget left after the decodes and with blocks for prompt + 1
  (after a 1% watermark); admission **closes** at the first that does not fit. Differences: batches
  mix prefills and decodes (vLLM v0 runs prompt-only steps); the budget is ``max_batch_tokens``
  (the study's 2560), the cap on sequences ``max_requests_per_batch``; on block exhaustion the
  engine evicts the newest starved request and recomputes it (vLLM: newest running, recompute), and
  then admits no new prompt until some request finishes. A prompt longer than ``max_batch_tokens``
  is an error (vLLM rejects it too).
- ``slai_faithful``: critical decodes first (a decoder is critical once ``now >= lst``, its last
  service time + TBT − Θ·step, Θ = 5 below 96% KV use, else 10, as in the study), then in-flight
  prompt chunks, then admissions shortest prompt first (chunked to the leftover budget), then
  non-critical decodes from what is left, earliest ``lst`` first; decoders not served wait (are
  held) for that step. Expressible exactly except: the budget is the engine's ``max_batch_tokens``
  (set 512 to match the study), SLAI's decode limit (128) is the engine's per-batch request cap; the
  prompt-only block watermark is the engine's safety margin (1% here: below it no new prompt enters
  a batch that already has something, and that also stops later non-critical decodes that step); a
  waiting request that gets no blocks is skipped rather than closing admission; prefill is real, not
  a shadow. Clock: wall time, ``SlaiRule.step_s`` stays the study's 1 ms constant.
"""

try:  # the engine is an optional extra (pip install -e .[transformers])
    import torch
    import transformers
    from transformers import ContinuousBatchingConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.generation.continuous_batching import scheduler as _cb_scheduler
    from transformers.generation.continuous_batching.requests import RequestStatus
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError("portbench.realengine.transformers_backend needs torch and transformers 5.17.0: "
                      "pip install -e '.[transformers]'") from _e

ENGINE = "transformers-cb"
PINNED_VERSION = "5.17.0"
FIFOScheduler = _cb_scheduler.FIFOScheduler
SCHEDULER_MAPPING = _cb_scheduler.SCHEDULER_MAPPING
if transformers.__version__ != PINNED_VERSION:   # the scheduler API changes between releases
    warnings.warn(f"portbench's transformers backend is written for transformers {PINNED_VERSION}, "
                  f"found {transformers.__version__}", RuntimeWarning, stacklevel=2)

DEFAULT_MAX_BATCH_TOKENS = 512
DEFAULT_BLOCK_SIZE = 32
DEFAULT_NUM_BLOCKS = 1024
SWITCH_INTERVAL_S = 0.0005


class ReplayError(RuntimeError):
    """A replay that cannot run as asked, or whose outcome is not what the window requires."""


# ------------------------------------------------------------------------------------- schedulers


class PortbenchScheduler(FIFOScheduler):
    """FIFO plus bookkeeping: window keys, every state a request id had, and a per-step log.

    ``bind`` (called by :func:`replay` before the first submission) gives the mapping from engine
    request ids to window indices and the per-request keys. Bookkeeping never changes the schedule.
    """

    policy: ClassVar[str] = "fifo"
    default_safety_margin: ClassVar[float | None] = None     # None: the FIFO scheduler's 15%

    def __init__(self, cache, safety_margin, max_requests_per_batch):
        self.index_of: dict[str, int] = {}
        self.keys: list = []
        self.params: dict = {}
        self.whole_prompts = False          # chunked prefill off (set by bind)
        if safety_margin is None:
            safety_margin = self.default_safety_margin
        super().__init__(cache, safety_margin, max_requests_per_batch)

    # -- bookkeeping
    def reset(self) -> None:
        super().reset()
        self.states: dict[str, list] = {}   # request id -> every RequestState it had (soft resets add one)
        self.n_evictions = 0
        # (t, prefill_tokens, decode_seqs, context_tokens, n_requests, steady, schedule_s, running, waiting)
        self.step_log: list[tuple] = []
        self._pending_after_last: set[str] = set()

    def bind(self, index_of: dict[str, int], keys: list, params: dict | None = None, *,
             whole_prompts: bool = False) -> None:
        self.index_of = dict(index_of)
        self.keys = list(keys)
        self.params = dict(params or {})
        self.whole_prompts = bool(whole_prompts)

    def key(self, request_id: str):
        i = self.index_of.get(request_id)
        return (math.inf,) if i is None else self.keys[i]

    def index(self, request_id: str) -> int:
        return self.index_of.get(request_id, 1 << 62)

    def add_waiting_request(self, state) -> None:
        seen = self.states.setdefault(state.request_id, [])
        if seen:
            self.n_evictions += 1           # the engine re-queues an evicted (soft-reset) request
        if not seen or seen[-1] is not state:
            seen.append(state)
        super().add_waiting_request(state)

    def schedule_batch(self, token_budget: int, cache_budget: int):
        t = time.perf_counter()
        decoding = {rid for rid, s in self.active_requests.items() if s.status == RequestStatus.DECODING}
        # The previous step's duration is t minus its start only if the engine came straight back,
        # i.e. some request still pending after the previous schedule is pending now.
        pending_now = self.active_requests.keys() | self.waiting_requests.keys()
        steady = bool(self._pending_after_last & pending_now)
        n_run, n_wait = len(self.active_requests), len(self.waiting_requests)
        ts = time.perf_counter()
        out = self._schedule(token_budget, cache_budget)
        schedule_s = time.perf_counter() - ts          # the policy's own scheduling time
        batch = out[0]
        if batch:
            prefill = sum(fs.query_length for fs in batch if fs.state.request_id not in decoding)
            n_dec = sum(1 for fs in batch if fs.state.request_id in decoding)
            context = sum(fs.state.current_len() for fs in batch)
            self.step_log.append((t, prefill, n_dec, context, len(batch), steady, schedule_s, n_run, n_wait))
        self._pending_after_last = set(self.active_requests) | set(self.waiting_requests)
        return out

    def _schedule(self, token_budget: int, cache_budget: int):
        return FIFOScheduler.schedule_batch(self, token_budget, cache_budget)

    def _finish_schedule(self, candidates, token_budget, cache_budget):
        """The engine's own candidate walk and queue clean-up (as FIFOScheduler does after ordering)."""
        removed: set[str] = set()
        scheduled, one_failed, fast_path, n_q, kv_read = self._process_candidates(
            candidates, token_budget, cache_budget, removed)
        self._cleanup_waiting_queue(removed)
        if not scheduled and one_failed:
            return None, fast_path, 0, 0
        return scheduled, fast_path, n_q, kv_read



class KeyedScheduler(PortbenchScheduler):
    """FIFO with the waiting queue ordered by the bound per-request key (stable)."""

    def _get_waiting_candidates(self):
        return sorted(super()._get_waiting_candidates(), key=lambda s: self.key(s.request_id))


class FifoScheduler(PortbenchScheduler):
    policy = "fifo"


class EdfScheduler(KeyedScheduler):
    policy = "edf"


class EstimatedServiceTimeFirstScheduler(KeyedScheduler):
    policy = "estimated_service_time_first"


class VllmFaithfulScheduler(PortbenchScheduler):
    """FCFS (arrival order), whole prompts only, admission closes at the first misfit."""

    policy = "vllm_faithful"
    default_safety_margin = 0.0         # the watermark is applied below, in the admission walk

    def _schedule(self, token_budget, cache_budget):
        bs = self.cache.block_size
        watermark = self.params.get("watermark", 0.01)
        decoding, prefilling = [], []
        for s in self.active_requests.values():
            (decoding if s.status == RequestStatus.DECODING else prefilling).append(s)
        decoding.sort(key=lambda s: self.index(s.request_id))
        budget = token_budget - len(decoding) - sum(len(s.remaining_prefill_tokens) for s in prefilling)
        # blocks left once every decoder has its next slot, minus the watermark
        free = self.cache.get_num_free_blocks() - math.ceil(watermark * self.cache.num_blocks)
        free -= sum(1 for s in decoding if s.allocated_blocks * bs - s.current_len() < 1)
        seqs = len(decoding) + len(prefilling)
        admit = []
        if not self.block_new_requests:
            for s in sorted(self._get_waiting_candidates(), key=lambda s: self.index(s.request_id)):
                n = len(s.remaining_prefill_tokens)
                blocks = (n + 1) // bs + 1          # what the engine allocates for a whole prompt
                if n > budget or blocks > free or seqs + 1 > self.max_requests_per_batch:
                    break
                admit.append(s)
                budget -= n
                free -= blocks
                seqs += 1
        return self._finish_schedule(decoding + prefilling + admit, token_budget, cache_budget)


class SlaiFaithfulScheduler(PortbenchScheduler):
    """Critical decodes, prompt chunks, shortest-prompt-first admission, then non-critical decodes."""

    policy = "slai_faithful"
    default_safety_margin = 0.01        # SLAI's prompt-only block watermark

    def reset(self) -> None:
        super().reset()
        self.lst: dict[str, float] = {}     # last-schedule time of each decoder (perf_counter clock)

    def _schedule(self, token_budget, cache_budget):
        rule = dataclasses.replace(SLAI, **self.params)
        now = time.perf_counter()
        used = 1.0 - self.cache.get_num_free_blocks() / self.cache.num_blocks
        fresh = rule.last_schedule_time(now, used)
        lst = self.lst
        for rid in [r for r in lst if r not in self.active_requests]:
            del lst[rid]
        decoding, prefilling = [], []
        for s in self.active_requests.values():
            (decoding if s.status == RequestStatus.DECODING else prefilling).append(s)
        for s in decoding:
            lst.setdefault(s.request_id, fresh)
        decoding.sort(key=lambda s: (lst[s.request_id], self.index(s.request_id)))
        critical, non_critical = rule.split(decoding, lambda s: lst[s.request_id], now)
        waiting = []
        if not self.block_new_requests:
            waiting = sorted(self._get_waiting_candidates(),
                             key=lambda s: (len(s.remaining_prefill_tokens), self.index(s.request_id)))
        if self.whole_prompts:
            # chunked prefill off (vLLM v1 without it): a waiting request enters only with its whole
            # prompt in the budget left after the critical decodes and prompt chunks, and admission
            # closes at the first that does not fit
            left = token_budget - len(critical) - sum(len(s.remaining_prefill_tokens) for s in prefilling)
            fits = []
            for s in waiting:
                n = len(s.remaining_prefill_tokens)
                if n > left:
                    break
                fits.append(s)
                left -= n
            waiting = fits
        out = self._finish_schedule(critical + prefilling + waiting + non_critical, token_budget, cache_budget)
        if waiting and not out[0] and (decoding or prefilling):
            # The engine stops its walk at a waiting request that meets a full cache, before our
            # non-critical decodes, and then cannot evict anything (it only evicts starved *active*
            # requests): retry without admissions, so decoders proceed or get evicted as under FIFO.
            out = self._finish_schedule(critical + prefilling + non_critical, token_budget, cache_budget)
        served = {s.request_id for s in decoding}
        for fs in out[0] or ():
            if fs.state.request_id in served:
                lst[fs.state.request_id] = fresh
        return out


#: The policies that can run with ``enable_chunked_prefill=False`` (whole-prompt admission).
WHOLE_PROMPT_POLICIES = ("vllm_faithful", "slai_faithful")

#: policy name -> scheduler class (registered in the engine as ``portbench_<policy>``)
POLICIES: dict[str, type[PortbenchScheduler]] = {
    cls.policy: cls for cls in (FifoScheduler, EdfScheduler, EstimatedServiceTimeFirstScheduler,
                                VllmFaithfulScheduler, SlaiFaithfulScheduler)
}
for _name, _cls in POLICIES.items():
    SCHEDULER_MAPPING[f"portbench_{_name}"] = _cls


def result_from_engine(window: Window, policy: str, ids, outputs, states, step_log, t0: float,
                       n_steps: int, n_preemptions: int):
    """The engine's records as a RunResult, with :mod:`portbench.metrics`' definitions: admission
    and first token are the earliest over every attempt of a request (an evicted request is
    re-queued as a new state), finish its last token, span the start of the last step."""
    n = len(window)
    admit = np.full(n, np.nan)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    bad = []
    for i, rid in enumerate(ids):
        out = outputs[rid]
        got = len(out.generated_tokens)
        if out.error is not None or out.status != RequestStatus.FINISHED or got != int(window.output_tokens[i]):
            bad.append(f"request {i}: {got}/{int(window.output_tokens[i])} tokens, status "
                       f"{RequestStatus(out.status).name}, error {out.error!r}")
            continue
        seen = states.get(rid, [])
        starts = [s.lifespan[0] for s in seen if s.lifespan[0] > 0]
        stamps = [s._timestamps[0] for s in seen if s._timestamps]
        admit[i] = (min(starts) if starts else out.lifespan[0]) - t0
        first[i] = (min(stamps) if stamps else out.timestamps[0]) - t0
        finish[i] = out.timestamps[-1] - t0
    if bad:
        raise ReplayError(f"window {window.window_id}, policy {policy}: wrong outputs: " + "; ".join(bad[:10]))
    return to_run_result(window, policy, ENGINE, admit_s=admit, first_token_s=first, finish_s=finish,
                         duration_s=run_span_s([entry[0] - t0 for entry in step_log]), n_steps=n_steps,
                         n_preemptions=n_preemptions)


def scheduler_type(policy: str) -> str:
    """The engine's ``scheduler_type`` for a study policy; KeyError naming the supported ones."""
    refuse_oracles(policy)
    if policy not in POLICIES:
        raise KeyError(f"policy {policy!r} is not supported on the transformers engine; "
                       f"supported: {', '.join(POLICIES)}")
    return f"portbench_{policy}"


def request_keys(window: Window, policy: str) -> list:
    """The per-request ordering key each policy uses (indexed by position in the window)."""
    n = len(window)
    if policy == "edf":
        return [(float(window.deadline_s[i]), i) for i in range(n)]
    if policy == "estimated_service_time_first":
        return [(estimate(int(window.input_tokens[i]), int(window.predicted_output_tokens[i])),
                 float(window.deadline_s[i]), i) for i in range(n)]
    return [(float(window.arrival_s[i]), i) for i in range(n)]


# ----------------------------------------------------------------------------------------- engine


def engine_version() -> str:
    return transformers.__version__


def use_attention(model, attn_implementation: str | None) -> str:
    """Switch ``model`` to ``attn_implementation`` (None: leave it); returns the one it has now. The
    engine runs a name without ``paged|`` on its paged counterpart, where it has one."""
    if attn_implementation is not None and model.config._attn_implementation != attn_implementation:
        model.set_attn_implementation(attn_implementation)
    return str(model.config._attn_implementation)


def build_model(shape: ModelShape = ModelShape(), device: str = "cpu", seed: int = 0):
    """A random-init Llama of ``shape`` on ``device`` (no hub access)."""
    torch.manual_seed(seed)
    config = LlamaConfig(**shape.llama_config())
    dtype = getattr(torch, shape.dtype)
    model = LlamaForCausalLM(config).to(device=torch.device(device), dtype=dtype)
    return model.eval()


def _check_fits(window: Window, policy: str, shape: ModelShape, *, block_size: int, num_blocks: int,
                max_batch_tokens: int) -> None:
    """Refuse, naming the requests, anything the engine could never finish (instead of hanging)."""
    if shape.vocab_size <= 3:
        raise ReplayError(f"vocab_size={shape.vocab_size} leaves no non-special token ids")
    problems = []
    for i, (p, o) in enumerate(zip(window.input_tokens.tolist(), window.output_tokens.tolist())):
        who = f"request {i} (prompt {p}, output {o} tokens)"
        need = -(-(p + o) // block_size) + 1        # the engine may over-allocate one block
        if p + o > shape.max_position_embeddings:
            problems.append(f"{who} needs {p + o} positions; the model has "
                            f"max_position_embeddings={shape.max_position_embeddings}")
        elif need > num_blocks:
            problems.append(f"{who} needs up to {need} KV blocks of {block_size} tokens; the cache has "
                            f"num_blocks={num_blocks}")
        elif policy == "vllm_faithful" and p + 1 > max_batch_tokens:
            problems.append(f"{who}: vllm_faithful admits whole prompts only and the budget is "
                            f"max_batch_tokens={max_batch_tokens}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ReplayError(f"window {window.window_id}: {len(problems)} request(s) cannot run: "
                          + "; ".join(problems[:5]) + more)


def _engine_config(policy, *, max_batch_tokens, block_size, num_blocks, seed, extra):
    kw = dict(scheduler_type=scheduler_type(policy), max_batch_tokens=int(max_batch_tokens),
              block_size=int(block_size), num_blocks=int(num_blocks), allow_block_sharing=False,
              seed=int(seed))
    kw.update(extra or {})
    return ContinuousBatchingConfig(**kw)


def replay(window: Window, policy: str, *, shape: ModelShape = ModelShape(), device: str = "cpu",
           max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, block_size: int = DEFAULT_BLOCK_SIZE,
           num_blocks: int = DEFAULT_NUM_BLOCKS, seed: int = 0, extra: dict | None = None,
           policy_params: dict | None = None, timeout_s: float | None = None, model=None,
           max_in_flight: int | None = None, enable_chunked_prefill: bool = True,
           attn_implementation: str | None = None):
    """Replay ``window`` (already time-scaled) on the engine in real time under ``policy``.

    extra: more ``ContinuousBatchingConfig`` fields (e.g. ``use_cuda_graph``, ``default_compile_level``,
        ``max_requests_per_batch``, ``safety_margin``), overriding the ones set here.
    policy_params: the policy's own constants (vllm_faithful: ``watermark``; slai_faithful: ``tbt_s``,
        ``theta_low``, ``theta_high``, ``kv_threshold``, ``step_s``: fields of ``SlaiRule``).
    timeout_s: give up (ReplayError) if no result comes for this long after the last submission
        (default 300 s).
    model: a model from :func:`build_model` to reuse (it must have ``shape``'s config).
    max_in_flight: hold a due request back while this many submitted requests are unfinished (the
        study's real-system client: 32 worker threads, each blocking on one request); its deadline
        still counts from its trace arrival. None: no cap.
    enable_chunked_prefill: False admits a waiting request only with its whole prompt in the step's
        budget, closing admission at the first that does not fit (vLLM v1 without chunked prefill;
        ``vllm_faithful`` always does so; supported for ``slai_faithful`` too).
    attn_implementation: the model's attention implementation for this replay and after it
        (:data:`portbench.realengine.gpu.ATTENTION`; None: the model's own, run on its paged path).

    Returns ``(RunResult, info)``; info has the engine version, device, shape, wall time, the
    engine's set-up time before the first submission (``setup_s``: cache, CUDA-graph warm-up),
    generated tokens per second, evictions, submission lag (over requests not held by the cap),
    each request's submission time (``submit_s``), the first token each request generated
    (``first_tokens``, in window order), the per-step log (a DataFrame) and ``environment``.
    """
    import pandas as pd

    stype = scheduler_type(policy)
    if max_in_flight is not None and int(max_in_flight) < 1:
        raise ValueError(f"max_in_flight must be >= 1 (got {max_in_flight})")
    if not enable_chunked_prefill and policy not in WHOLE_PROMPT_POLICIES:
        raise ReplayError(f"enable_chunked_prefill=False is supported for {', '.join(WHOLE_PROMPT_POLICIES)}, "
                          f"not {policy!r}")
    _check_fits(window, policy, shape, block_size=block_size, num_blocks=num_blocks,
                max_batch_tokens=max_batch_tokens)
    n = len(window)
    rng = np.random.default_rng(seed)
    prompts = [random_prompt(int(p), shape.vocab_size, rng) for p in window.input_tokens]
    if model is None:
        model = build_model(shape, device, seed)
    attention = use_attention(model, attn_implementation)
    gen_config = GenerationConfig(eos_token_id=-1, do_sample=False,
                                  max_new_tokens=int(window.output_tokens.max()))
    cb_config = _engine_config(policy, max_batch_tokens=max_batch_tokens, block_size=block_size,
                               num_blocks=num_blocks, seed=seed, extra=extra)
    ids = [f"req_{i}" for i in range(n)]
    keys = request_keys(window, policy)
    arrival = window.arrival_s.astype(float)
    if timeout_s is None:
        timeout_s = 300.0

    t_setup = time.perf_counter()
    with model.continuous_batching_context_manager(generation_config=gen_config,
                                                   continuous_batching_config=cb_config) as manager:
        deadline = time.monotonic() + 30.0
        while manager.batch_processor is None:
            if time.monotonic() > deadline:
                raise ReplayError("the engine's batch processor did not start")
            time.sleep(0.001)
        sched = manager.batch_processor.scheduler
        if not isinstance(sched, POLICIES[policy]):
            raise ReplayError(f"engine built {type(sched).__name__}, expected {stype}")
        sched.bind(dict(zip(ids, range(n))), keys, policy_params, whole_prompts=not enable_chunked_prefill)
        # The submit loop needs the GIL to wake on time; the default 5 ms switch interval showed as up
        # to 5 ms of submission lag. A shorter one while replaying (restored after) keeps it ~1 ms.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
        try:
            t0, submit, held, outputs, n_steps = _submit_and_collect(manager, prompts, ids, arrival, window,
                                                                     timeout_s, max_in_flight)
        finally:
            sys.setswitchinterval(switch)
        wall = time.perf_counter() - t0
        states = {rid: list(v) for rid, v in sched.states.items()}
        step_log = list(sched.step_log)
        n_evictions = sched.n_evictions

    result = result_from_engine(window, policy, ids, outputs, states, step_log, t0, n_steps, n_evictions)
    first_tokens = [int(outputs[rid].generated_tokens[0]) if len(outputs[rid].generated_tokens) else -1
                    for rid in ids]

    steps = pd.DataFrame(step_log, columns=["t_s", "prefill_tokens", "decode_seqs", "context_tokens",
                                            "n_requests", "steady", "schedule_s", "running", "waiting"])
    if len(steps):
        steps["t_s"] -= t0
        nxt = steps["t_s"].shift(-1) - steps["t_s"]
        # a step's duration is known when the engine came straight back for the next one
        steps["step_s"] = nxt.where(steps["steady"].shift(-1, fill_value=False).astype(bool))
        steps = steps.drop(columns="steady")
    generated = int(window.output_tokens.sum())
    lag = (submit - arrival)[~held] if (~held).any() else np.zeros(1)
    info = {
        "engine": ENGINE, "engine_version": engine_version(), "torch_version": torch.__version__,
        "device": str(device), "scheduler_type": stype, "shape": dataclasses.asdict(shape),
        "engine_config": {"max_batch_tokens": max_batch_tokens, "block_size": block_size,
                          "max_model_len": shape.max_position_embeddings,
                          "num_blocks": num_blocks, "max_in_flight": max_in_flight,
                          "enable_chunked_prefill": bool(enable_chunked_prefill),
                          "attn_implementation": attention, **(extra or {})},
        "policy_params": dict(policy_params or {}), "torch_threads": torch.get_num_threads(),
        "wall_s": wall, "setup_s": float(t0 - t_setup), "generated_tokens": generated, "generated_tokens_per_s": generated / wall,
        "n_steps": int(n_steps), "n_evictions": int(n_evictions),
        "submit_lag_max_s": float(lag.max()), "submit_lag_mean_s": float(lag.mean()),
        "submit_s": submit, "n_held_by_cap": int(held.sum()), "first_tokens": first_tokens,
        "steps": steps,
        "environment": environment(ENGINE, engine_version(), shape, str(device)),
    }
    return result, info


def probe(policy: str = "fifo", *, warmup: int = PROBE_WARMUP, repeats: int = PROBE_REPEATS,
          **engine_kwargs) -> dict:
    """The host probe: :func:`portbench.realengine.probe_window` (8 requests of 64 prompt and 32
    output tokens, all at t = 0) replayed under ``policy`` with the case's engine settings (pass
    ``model=`` to reuse a built model), ``warmup`` untimed and ``repeats`` timed times. Returns
    ``wall_s``, ``mean_step_s`` and ``n_steps``."""
    return steady_probe(lambda: replay(probe_window(), policy, **engine_kwargs)[1], warmup, repeats)


def _submit_and_collect(manager, prompts, ids, arrival, window, timeout_s, max_in_flight=None):
    """Submit request i at t0 + arrival[i] (real time), or, when ``max_in_flight`` requests are
    unfinished, as soon as one finishes; collect every result. Returns ``(t0, submit_s, held,
    outputs, n_steps)``: ``submit_s[i]`` the time request i was added (s from t0), ``held[i]`` True
    when it was due while the cap was full."""
    n = len(ids)
    cap = n if max_in_flight is None else int(max_in_flight)
    submit = np.full(n, np.nan)
    held = np.zeros(n, dtype=bool)
    outputs: dict[str, object] = {}
    t0 = time.perf_counter()
    t_last = time.monotonic()
    i = 0
    while len(outputs) < n:
        if i < n and i - len(outputs) < cap:
            wait = t0 + arrival[i] - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            submit[i] = time.perf_counter() - t0
            rid = manager.add_request(prompts[i], request_id=ids[i], max_new_tokens=int(window.output_tokens[i]),
                                      record_timestamps=True)
            if rid is None:
                raise ReplayError(f"the engine refused request {i} "
                                  f"({manager.background_thread_status.fatal_error!r})")
            i += 1
            t_last = time.monotonic()
            continue
        if i < n and time.perf_counter() - t0 >= arrival[i]:
            held[i] = True                      # due, but the cap is full
        out = manager.get_result(timeout=0.5 if i >= n else 0.05)
        if out is None:
            fatal = manager.background_thread_status.fatal_error
            if fatal is not None or not manager.is_running():
                raise ReplayError(f"the engine stopped with {len(outputs)}/{n} results: {fatal!r}")
            if time.monotonic() - t_last > timeout_s:
                raise ReplayError(f"no result for {timeout_s:.0f} s with {len(outputs)}/{n} done")
            continue
        t_last = time.monotonic()
        outputs[out.request_id] = out
    return t0, submit, held, outputs, manager.current_batch


# ---------------------------------------------------------------------------------- step profile


def step_profile(shape: ModelShape = ModelShape(), device: str = "cpu", *,
                 prefill_tokens=(0, 32, 128, 512), decode_seqs=(0, 1, 8, 32), context_tokens=(64, 512),
                 reps: int = 3, warmup: int = 2, block_size: int = DEFAULT_BLOCK_SIZE, seed: int = 0,
                 extra: dict | None = None, model=None, attn_implementation: str | None = None):
    """Time the engine's steps over a grid of batch compositions; returns a pandas DataFrame.

    For each (decoding sequences ``d``, context ``c``), ``d`` requests with ``c``-token prompts are
    prefilled (untimed) until all decode; then for each prefill size ``p`` the engine runs
    ``warmup`` untimed and ``reps`` timed steps, each with the ``d`` decodes plus (``p > 0``) one fresh
    ``p``-token prompt that finishes at its first token (so the decoders' context grows by one a
    step). The engine's step is driven synchronously through its own batch processor (prepare the
    batch, forward + sampling, update), without the background thread; the engine's FIFO builds the
    batches. Columns: the grid point, ``rep``, the batch as the engine built it
    (``batch_prefill_tokens``, ``batch_decode_seqs``, ``batch_context_tokens`` = KV tokens before the
    step summed over the batch, ``batch_requests``), ``forward_s`` (forward and sampling),
    ``step_s`` (the whole iteration), ``gap_s`` (from the end of the previous iteration to the start
    of this one, less the time spent adding the step's prompt: the loop's own time) and
    ``schedule_s`` (the scheduler's time). Uses the engine's private step methods (pinned 5.17.0).
    The grid is the caller's: for the case's ranges pass prefill up to 2,560 tokens, up to 128
    decoding sequences and contexts whose total (``decode_seqs × context_tokens``) reaches ~300k
    tokens (the KV cache is sized to fit). ``attn_implementation``: as :func:`replay`'s.
    """
    import pandas as pd

    prefill_tokens = sorted({int(p) for p in prefill_tokens})
    decode_seqs = sorted({int(d) for d in decode_seqs})
    points = [(d, c) for d in decode_seqs for c in sorted({int(c) for c in context_tokens})]
    points = [(d, c) for d, c in points if d > 0] + ([(0, 0)] if 0 in {d for d, _ in points} else [])
    if not prefill_tokens or not points or (points == [(0, 0)] and prefill_tokens == [0]):
        raise ValueError("empty grid")
    max_p, max_d, max_c = max(prefill_tokens), max(d for d, _ in points), max(context_tokens)
    max_batch_tokens = max(max_p + max_d, 64)
    # decoders live through their own prefill (chunked) and every timed and warm-up step
    max_new = -(-max_d * max_c // max_batch_tokens) + len(prefill_tokens) * (reps + warmup) + 8
    if max_c + max_new > shape.max_position_embeddings:
        raise ValueError(f"context {max_c} + {max_new} exceeds max_position_embeddings="
                         f"{shape.max_position_embeddings}")
    num_blocks = max_d * (-(-(max_c + max_new) // block_size) + 2) + (max_p + 1) // block_size + 4
    if model is None:
        model = build_model(shape, device, seed)
    attention = use_attention(model, attn_implementation)
    rng = np.random.default_rng(seed)
    gen_config = GenerationConfig(eos_token_id=-1, do_sample=False, max_new_tokens=max_new)
    cb_config = _engine_config("fifo", max_batch_tokens=max_batch_tokens, block_size=block_size,
                               num_blocks=num_blocks, seed=seed, extra={"safety_margin": 0.0, **(extra or {})})
    manager = model.init_continuous_batching(generation_config=gen_config, continuous_batching_config=cb_config)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    rows = []
    counter = 0
    try:
        bp = manager._create_batch_processor()
        manager.batch_processor = bp
        sched = bp.scheduler
        queue = manager.output_router.output_queue

        last_end = [None]
        submitted = [0.0]

        def step():
            t = time.perf_counter()
            gap = t - last_end[0] - submitted[0] if last_end[0] is not None else math.nan
            submitted[0] = 0.0
            if not bp.prepare_next_batch():
                return None
            log = sched.step_log[-1]
            sync()
            tf = time.perf_counter()
            bp._generation_step(model)
            sync()
            tf = time.perf_counter() - tf
            bp.update_batch()
            sync()
            last_end[0] = time.perf_counter()
            return log, tf, last_end[0] - t, gap

        def add(n_tokens, new_tokens):
            nonlocal counter
            prompt = random_prompt(n_tokens, shape.vocab_size, rng)
            t = time.perf_counter()
            manager.add_request(prompt, request_id=f"prof_{counter}", max_new_tokens=new_tokens)
            submitted[0] += time.perf_counter() - t
            counter += 1

        def clear():
            for rid in list(sched.active_requests) + list(sched.waiting_requests):
                sched.finish_request(rid)
                sched.waiting_requests.pop(rid, None)
            sched.waiting_requests_order.clear()
            while not queue.empty():
                queue.get_nowait()

        for d, c in points:
            last_end[0] = None
            for _ in range(d):
                add(c, max_new)
            for _ in range(10 * d * (c // max_batch_tokens + 2) + 10):
                if len(sched.active_requests) >= d and not sched.waiting_requests and all(
                        s.status == RequestStatus.DECODING for s in sched.active_requests.values()):
                    break
                step()
            else:
                raise RuntimeError(f"profile point d={d}, c={c}: the decoders never all decode")
            for p in prefill_tokens:
                if p == 0 and d == 0:
                    continue
                for r in range(-warmup, reps):
                    if p:
                        add(p, 1)
                    res = step()
                    if res is None:
                        raise RuntimeError(f"profile point p={p}, d={d}, c={c}: empty step")
                    (_, b_pre, b_dec, b_ctx, b_n, _, sched_s, _, _), fwd, total, gap = res
                    if r >= 0:
                        rows.append({"prefill_tokens": p, "decode_seqs": d, "context_tokens": c, "rep": r,
                                     "batch_prefill_tokens": b_pre, "batch_decode_seqs": b_dec,
                                     "batch_context_tokens": b_ctx, "batch_requests": b_n,
                                     "forward_s": fwd, "step_s": total, "gap_s": gap,
                                     "schedule_s": sched_s})
            clear()
    finally:
        manager.batch_processor = None
        manager.destroy()
        if manager._original_attn_impl is not None:     # undo the switch to paged attention
            model.set_attn_implementation(manager._original_attn_impl)
    df = pd.DataFrame(rows)
    df.attrs.update({"engine": ENGINE, "engine_version": engine_version(), "device": str(device),
                     "shape": dataclasses.asdict(shape), "block_size": block_size, "num_blocks": num_blocks,
                     "max_batch_tokens": max_batch_tokens, "torch_threads": torch.get_num_threads(),
                     "attn_implementation": attention})
    return df

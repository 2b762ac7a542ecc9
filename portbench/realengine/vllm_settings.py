"""How each policy runs on vLLM: its engine settings, its request priorities, and the cases' limits.

What a replay asks of the engine before anything runs, with no vLLM import: per policy a
:class:`PolicySpec` in :data:`POLICIES` (scheduling policy, token budget, sequence cap, chunked
prefill, scheduler subclass, how a request's priority is computed), :func:`engine_config`, which
turns it and a case's overrides into the :class:`EngineConfig` an engine is built from, which
requests a replay refuses (:data:`REFUSAL_RULE`), and the RQ6 case's two configurations
(:data:`EQUAL_ADMISSION`, :data:`STUDY_ENGINE`). :mod:`portbench.realengine.vllm_backend` builds
the engines and replays the windows.

Policies and how each runs: the comment above :data:`POLICIES`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import ModelShape, refuse_oracles
from ..policies._common import estimate
from ..workload import Window

#: Which requests a replay refuses, and why (vLLM 0.32.0's source, ``site-packages/vllm/``):
#:
#: - ``config/scheduler.py`` lines 314–326 (``SchedulerConfig.verify_max_model_len``): with chunked
#:   prefill off, ``max_num_batched_tokens < max_model_len`` is a configuration error, so
#:   ``vllm_faithful`` (2,560-token budget, no chunking) runs with ``max_model_len = 2560``;
#: - ``v1/engine/input_processor.py`` lines 557–602 (``_validate_prompt_len``, called at line 619):
#:   a prompt longer than ``max_model_len`` is refused (``VLLMValidationError``), and so is one of
#:   exactly ``max_model_len`` tokens (no room for one output token);
#: - ``v1/core/sched/utils.py`` lines 98–119 (``check_stop``, called from ``scheduler.py`` line
#:   2506): a request stops ``FINISHED_LENGTH_CAPPED`` once ``num_tokens >= max_model_len``, i.e. a
#:   request with prompt + output > ``max_model_len`` would be served a *shortened* output.
#:
#: A replay must produce exactly the trace's output lengths, so
#: :func:`~portbench.realengine.vllm_backend.replay` refuses up front every request with ``prompt +
#: output > max_model_len`` (the first case included): never submitted, counted as not completed,
#: listed in ``info["rejected"]``. The simulated counterpart of the sim-vs-real comparison applies
#: the same rule (:func:`portbench.fidelity.real_refused`).
REFUSAL_RULE = "prompt + output > max_model_len"


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """Engine-level settings of a policy on vLLM, and how a request's priority is computed."""

    scheduling_policy: str                     # "fcfs" or "priority"
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    scheduler_cls: str | None = None
    priority: str | None = None                # key into _PRIORITY, None = 0 for all
    description: str = ""


def _prio_deadline(w: Window) -> np.ndarray:
    return np.rint(w.deadline_s * 1e6)


def _est(w: Window) -> np.ndarray:
    return estimate(w.input_tokens.astype(np.float64), w.predicted_output_tokens)


def _prio_laxity(w: Window) -> np.ndarray:
    return np.rint((w.deadline_s - _est(w)) * 1e6)


def _prio_prompt(w: Window) -> np.ndarray:
    return w.input_tokens


_PRIORITY = {"deadline": _prio_deadline, "laxity": _prio_laxity, "prompt": _prio_prompt}

# Policies (engine-level settings in :data:`POLICIES`; priorities are vLLM's ``priority`` scheduling,
# lower = earlier, static per request, ties by arrival then id):
#
# ========================== =================================================================
# ``fifo``                   vLLM FCFS (``scheduling_policy="fcfs"``), chunked prefill
# ``vllm_faithful``          vLLM FCFS, 2,560-token budget, **chunked prefill off**, 256 seqs.
#                            vLLM v1 then requires ``max_model_len <= max_num_batched_tokens``, so
#                            ``max_model_len = 2560`` and a request with prompt + output > 2560 is
#                            **rejected** (never submitted, counted as not completed, listed in
#                            ``info["rejected"]``) — where the study's v0.1.0 model instead let such a
#                            prompt block the queue head forever. (See :data:`REFUSAL_RULE`.)
# ``edf``                    priority = the request's rank in ``edf``'s key (the deadline, ties by
#                            arrival; :func:`key_priorities`): exactly the simulator's order, where a
#                            deadline in microseconds would tie requests closer than that
# ``estimated_service_time_first`` priority = the rank in its key (est = prompt/2 + predicted output,
#                            then the deadline): exactly the simulator's order, ties on est included
#                            (an integer 2·est would break them by arrival)
# ``least_laxity_first``     priority = (deadline − est) in µs, the study's unit quirk kept (est in
#                            1 ms steps subtracted from seconds); ``now`` is common to all, so the
#                            static order equals the dynamic one
# ``slai_faithful``          :class:`~portbench.realengine.vllm_slai_scheduler.SlaiScheduler`
#                            (``scheduler_cls``), priority scheduling, 512-token budget, chunked
#                            prefill, 128 seqs; priority = the prompt's length (the port sets it
#                            itself; an engine model reads it to preempt as vLLM does, the longest
#                            prompt first)
# ``vllm_v1_priority``       vLLM v1's own priority scheduling, priority = deadline (µs; the same
#                            order as ``edf``'s rank but for deadlines within a microsecond), ``edf``'s
#                            engine settings: the simulator's ``edf`` (an alias of it by this name)
# ``vllm_v0_priority``       the same priorities; the simulator's policy also lets a waiting request
#                            evict lower priorities (vLLM v0's rule), which vLLM v1 does not have: an
#                            engine model reads the priorities only to choose growth-preemption
#                            victims as vLLM v1 does, the lowest priority first
# any other key policy       :class:`~portbench.realengine.vllm_key_scheduler.KeyPolicyScheduler`
# (``sjf_aging``, ``hrrn``,  (``scheduler_cls``): vLLM's FCFS queue put in the policy's own key order
# a user's own ...)          before every step (:func:`policy_spec` builds its spec); one with
#                            ``evict = True``: vLLM's priority scheduling, priority = the request's
#                            rank in the key's order (:func:`key_priorities`)
# ========================== =================================================================
#
# The table's entries are vLLM's own scheduling (FCFS, or priority with a priority computed per
# request) or a port of a policy that is not a key (``slai_faithful``); every other registered
# :class:`~portbench.engine.queue.KeyPolicy`, a user's own included, runs through the one adapter
# with no further code.
POLICIES: dict[str, PolicySpec] = {
    "fifo": PolicySpec("fcfs", description="vLLM FCFS, chunked prefill"),
    "vllm_faithful": PolicySpec("fcfs", max_num_batched_tokens=2560, max_num_seqs=256,
                                enable_chunked_prefill=False,
                                description="vLLM FCFS, 2560-token budget, whole-prompt admission "
                                            "(chunked prefill off; longer requests rejected)"),
    "edf": PolicySpec("priority", priority="key",
                      description="priority = the rank in edf's key (the SLO deadline; ties by arrival)"),
    "estimated_service_time_first": PolicySpec(
        "priority", priority="key", description="priority = the rank in the policy's key (0.5*prompt + "
                                                "predicted output, then deadline)"),
    "least_laxity_first": PolicySpec(
        "priority", priority="laxity", description="priority = deadline - (0.5*prompt + predicted "
                                                   "output), the study's unit quirk"),
    "slai_faithful": PolicySpec("priority", max_num_batched_tokens=512, max_num_seqs=128,
                                scheduler_cls="portbench.realengine.vllm_slai_scheduler.SlaiScheduler",
                                priority="prompt",
                                description="SLAI scheduler subclass: critical decodes first, "
                                            "shortest-prompt-first admission, decode holds"),
    "vllm_v1_priority": PolicySpec("priority", priority="deadline",
                                   description="vLLM v1 priority scheduling, priority = SLO deadline "
                                               "in microseconds (edf's order)"),
    "vllm_v0_priority": PolicySpec("priority", priority="deadline",
                                   description="vLLM v1 priority scheduling on the deadline; the "
                                               "simulated policy's waiting-triggered eviction (vLLM "
                                               "v0's) has no vLLM v1 form"),
}


#: The same admission limit for both policies of the RQ6 case (``rq6_vllm_cpu.py --config equal``):
#: ``max_model_len`` 2,560 for every policy. ``vllm_faithful`` is defined by a 2,560-token budget with
#: whole-prompt admission (chunked prefill off), and vLLM v1 then allows at most ``max_model_len =
#: 2560`` (:data:`REFUSAL_RULE`); raising its budget or turning chunking on would change the policy
#: under test, so ``slai_faithful`` (512-token budget, chunked) is the one brought down to 2,560.
#: Both policies then refuse the same requests (prompt + output > 2,560), and a difference between
#: them is scheduling on the same accepted requests.
EQUAL_ADMISSION = {"max_model_len": 2560}

#: A case with choices in it (``rq6_vllm_cpu.py --config choice``): the equal-admission case's
#: settings and load (its λ_ref, at HIGH_PRESSURE), with the engine's sequence cap lowered from 256
#: to 8 for both policies. At the equal case's own settings the engine ran everything it could see at
#: about nine steps in ten (at most 8 requests running at about 70% of ``vllm_faithful``'s steps), so
#: a replay that agrees there says little about the rules. With 8 seats, requests queue in the
#: engine, where the policy orders them; ``vllm_faithful``'s whole-prompt admission (no chunked
#: prefill, a 2,560-token budget) then stops at a prompt that does not fit the budget left, ahead of
#: others that would (vLLM's head-of-line rule).
CHOICE_ENGINE = {**EQUAL_ADMISSION, "max_num_seqs": 8}

#: The study's real-system configuration, as far as it carries to a tiny model on a CPU
#: (``rq6_vllm_cpu.py --config study``). From the study's repository
#: (SoroushVahidi/llm-serving-scheduler-robustness-benchmark):
#:
#: - ``configs/real_vllm/rq6_validation_manifest_v1_20260903.json`` (``scheduler_mapping``): both
#:   policies run with ``--no-enable-chunked-prefill --no-enable-prefix-caching``, "engine flags held
#:   identical ... so the comparison isolates the policy"; ``vllm_faithful`` = FCFS with no scheduler
#:   class, ``slai_faithful`` = ``--scheduling-policy priority`` + the SLAI ``--scheduler-cls``;
#:   ``vllm==0.27.1``, ``Qwen/Qwen2.5-0.5B-Instruct``, one NVIDIA A100-SXM4-80GB per run.
#: - ``scripts/real_vllm/run_rq6_validation.sbatch`` and ``run_rq6_validation.py``:
#:   ``--max-model-len 32768`` and ``--gpu-memory-utilization 0.65`` for both policies;
#:   ``--max-num-batched-tokens`` and ``--max-num-seqs`` are not passed (vLLM's defaults).
#: - vLLM's defaults for those (read in vLLM 0.32.0's ``engine/arg_utils.py``,
#:   ``get_batch_defaults`` and ``_set_default_max_num_seqs_and_batched_tokens_args``; 0.27.1 not
#:   checked): ``vllm serve`` on an A100 gets 2,048 tokens and 256 sequences, and without chunked
#:   prefill the budget is raised to ``max(max_model_len, 2048)`` = 32,768. So both policies ran with
#:   a 32,768-token budget, 256 sequences and the same 32,768 admission limit (no trace request of
#:   the case exceeds it: nothing refused). KV: 0.65 of 80 GB less a 0.5B model's weights holds
#:   millions of tokens, never a limit here; ``kv_cache_gib`` 1.5 holds ~786k tokens of the tiny
#:   model (:data:`STUDY_KV_CACHE_GIB`).
#: - ``src/robustbench/real_llm/slai_plugin/slai_vllm_scheduler.py``: the SLAI plugin's budget is
#:   the engine's ``max_num_scheduled_tokens`` (32,768 there, not the simulator's 512), decode limit
#:   128; its clock is the step index × 1 ms (here: the real clock, see
#:   :mod:`~portbench.realengine.vllm_slai_scheduler`; not carried over).
#: - ``src/robustbench/real_llm/rq6_calibration.py`` (``replay_window_once``): requests go out from a
#:   pool of 32 client threads, each blocking on a non-streaming HTTP call, so at most 32 are in
#:   flight and a due request waits for a free worker (its deadline still counts from its trace
#:   arrival): ``max_in_flight`` 32 here. A request the server refuses counts as not completed. The
#:   λ_ref search replays ``vllm_faithful`` (``REFERENCE_POLICY``), not FIFO.
STUDY_ENGINE = {"max_model_len": 32768, "max_num_batched_tokens": 32768, "max_num_seqs": 256,
                "enable_chunked_prefill": False, "max_in_flight": 32}
STUDY_KV_CACHE_GIB = 1.5
STUDY_LAMBDA_POLICY = "vllm_faithful"


#: The request arrays of a window that a key reads (the view's fixed data, :class:`~portbench.engine.queue.FixedData`).
FIELDS = ("arrival_s", "deadline_s", "input_tokens", "predicted_output_tokens")


def key_priorities(window: Window, policy) -> list[int]:
    """vLLM priorities (lower served first) for a key policy on the requests' fixed data (``edf``,
    ``estimated_service_time_first``, one with ``evict = True``): each request's rank in the key's
    order over the window's fixed data, ties by arrival then index (as the simulator ranks it)."""
    import types

    from ..engine.queue import rank_by

    view = types.SimpleNamespace(**{f: np.asarray(getattr(window, f)) for f in FIELDS},
                                 priority=np.ones(len(window)), n_requests=len(window), model=None)
    return rank_by(view, policy.fixed_key(view)).tolist()


#: The scheduler class that runs any key policy (:mod:`~portbench.realengine.vllm_key_scheduler`).
KEY_SCHEDULER = "portbench.realengine.vllm_key_scheduler.KeyPolicyScheduler"


def policy_spec(policy: str) -> PolicySpec:
    """The settings of ``policy`` on vLLM: its entry in :data:`POLICIES`, else, for a registered key
    policy (:class:`~portbench.engine.queue.KeyPolicy`, a user's own included), the key adapter
    (:data:`KEY_SCHEDULER`) or, with ``evict = True``, vLLM's priority scheduling on the key's rank.
    An oracle policy, an unknown one and one that is not a key (it needs its own port) are refused."""
    refuse_oracles(policy)
    if policy in POLICIES:
        return POLICIES[policy]
    from ..engine.queue import KeyPolicy
    from ..policies import available, make_policy

    try:
        rule = make_policy(policy)
    except KeyError:
        raise KeyError(f"policy {policy!r} is not registered (a policy of your own: import its module, "
                       f"or pass it with --policy-module); runnable on vLLM: {', '.join(vllm_policies(available()))}"
                       ) from None
    if not isinstance(rule, KeyPolicy):
        raise KeyError(f"policy {policy!r} is not a key policy (an order of the waiting queue), so it needs "
                       f"a scheduler port of its own, as slai_faithful has; runnable on vLLM: "
                       f"{', '.join(vllm_policies(available()))}")
    if rule.evict:
        return PolicySpec("priority", priority="key",
                          description=f"vLLM priority scheduling, priority = the rank in {policy}'s key "
                                      "(evict = True: no eviction by a waiting request in vLLM v1)")
    return PolicySpec("fcfs", scheduler_cls=KEY_SCHEDULER,
                      description=f"key adapter: vLLM's FCFS queue put in {policy}'s key order before "
                                  "every step")


def vllm_policies(names=None) -> list[str]:
    """The policies of ``names`` (default: the table's) that run on vLLM."""
    if names is None:
        return list(POLICIES)
    from ..engine.queue import KeyPolicy
    from ..policies import make_policy

    def runnable(p: str) -> bool:
        rule = make_policy(p)
        return isinstance(rule, KeyPolicy) and not getattr(type(rule), "needs_true_lengths", False)

    return [p for p in names if p in POLICIES or runnable(p)]


def priorities(window: Window, policy) -> list[int]:
    """vLLM priority of each request under ``policy`` (lower is served earlier): a name, or a policy
    instance (a key policy's rank then comes from the instance, with its own parameters)."""
    name = policy if isinstance(policy, str) else policy.name
    spec = policy_spec(name)
    if spec.priority is None:
        return [0] * len(window)
    if spec.priority == "key":
        from ..engine.queue import KeyPolicy
        from ..policies import make_policy
        return key_priorities(window, policy if isinstance(policy, KeyPolicy) else make_policy(name))
    return [int(p) for p in _PRIORITY[spec.priority](window)]


def scheduling_priorities(window: Window, policy) -> np.ndarray | None:
    """The int64 vLLM priorities of ``window``'s requests when ``policy`` (a name or an instance)
    runs on vLLM's ``priority`` scheduling (:func:`priorities`); None when it runs on FCFS or has no
    vLLM form (an oracle, a policy that is not a key and has no port, one that is not registered).
    What an engine model needs to choose preemption victims as vLLM would for the policy."""
    try:
        spec = policy_spec(policy if isinstance(policy, str) else policy.name)
    except (KeyError, ValueError):
        return None
    if spec.scheduling_policy != "priority":
        return None
    return np.asarray(priorities(window, policy), dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    shape: ModelShape
    scheduling_policy: str
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool
    max_model_len: int
    scheduler_cls: str | None
    kv_cache_gib: float
    seed: int
    enforce_eager: bool
    enable_prefix_caching: bool = False


def engine_config(policy: str, *, shape: ModelShape = ModelShape(), max_num_batched_tokens=None,
                  max_num_seqs=None, kv_cache_gib: float = 1.0, seed: int = 0,
                  enforce_eager: bool = True, max_model_len: int | None = None,
                  enable_chunked_prefill: bool | None = None,
                  enable_prefix_caching: bool = False) -> EngineConfig:
    """The engine ``policy`` runs on. ``max_num_batched_tokens``, ``max_num_seqs`` and
    ``enable_chunked_prefill`` default to the policy's (:data:`POLICIES`); ``max_model_len`` defaults
    to the model's context (32,768) with chunked prefill and to the token budget without it (vLLM v1
    requires ``max_model_len <= max_num_batched_tokens`` then). An explicit ``max_model_len`` (the
    same admission limit for every policy of a case) must respect that rule: a ``ValueError`` says
    so here rather than from inside vLLM. ``enable_prefix_caching``: vLLM's automatic prefix caching
    (off unless asked: the study's real engine ran without it)."""
    spec = policy_spec(policy)
    budget = int(max_num_batched_tokens or spec.max_num_batched_tokens)
    chunked = spec.enable_chunked_prefill if enable_chunked_prefill is None else bool(enable_chunked_prefill)
    if max_model_len is None:
        max_len = shape.max_position_embeddings if chunked else min(budget, shape.max_position_embeddings)
    else:
        max_len = int(max_model_len)
        if max_len > shape.max_position_embeddings:
            raise ValueError(f"max_model_len {max_len} > the model's context "
                             f"({shape.max_position_embeddings})")
        if not chunked and max_len > budget:
            raise ValueError(f"{policy}: max_model_len {max_len} > max_num_batched_tokens {budget} "
                             "without chunked prefill (vLLM v1 refuses this configuration): raise the "
                             "budget or enable chunked prefill")
    return EngineConfig(shape, spec.scheduling_policy, budget,
                        int(max_num_seqs or spec.max_num_seqs), chunked,
                        max_len, spec.scheduler_cls, float(kv_cache_gib), int(seed),
                        bool(enforce_eager), bool(enable_prefix_caching))

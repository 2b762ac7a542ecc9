"""The scheduling policies, one module each, registered by their study id.

A new policy is one module in this package that defines a :class:`portbench.engine.Policy` subclass
decorated with :func:`register`; it is found automatically.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..engine.api import Policy

_REGISTRY: dict[str, type[Policy]] = {}

#: The study's primary panel (55 pairs) and its robustness-only additions.
PRIMARY_PANEL = (
    "fifo", "edf", "least_laxity_first", "estimated_service_time_first", "weighted_fair_share",
    "kv_constrained_online", "admission_control", "vllm_faithful", "vllm_chunked_prefill_faithful",
    "sarathi_faithful", "slai_faithful",
)
ROBUSTNESS_PANEL = ("vllm_style_token_budget", "scorpio_style_slo_guard")
STUDY_POLICIES = PRIMARY_PANEL + ROBUSTNESS_PANEL
#: RQ7: today's engine schedulers (not in the study); ``srpt_oracle`` is a clairvoyant bound.
RQ7_POLICIES = ("vllm_v0_priority", "sjf_aging", "short_request_first", "fastserve_mlfq", "las",
                "srpt_oracle", "hrrn", "lof", "shortest_prefill_first", "random",
                "guaranteed_no_evict")
EXTENDED_PANEL = STUDY_POLICIES + RQ7_POLICIES

#: Other names that resolve to a registered policy (:func:`canonical`). ``vllm_v1_priority``: vLLM v1's
#: ``--scheduling-policy priority`` with priority = deadline, which is ``edf``'s order on vLLM's rules
#: (the ``vllm_v1`` engine model; vLLM's own scheduler agrees run for run). ``vllm_priority``: the name
#: that tables made before the v0/v1 split give ``vllm_v0_priority``.
ALIASES = {"vllm_v1_priority": "edf", "vllm_priority": "vllm_v0_priority"}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"policy name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def available() -> list[str]:
    """Registered policy names, study panel first."""
    _load_all()
    rest = sorted(set(_REGISTRY) - set(STUDY_POLICIES))
    return [p for p in STUDY_POLICIES if p in _REGISTRY] + rest


def canonical(name: str) -> str:
    """The registered name behind ``name`` (itself unless it is one of :data:`ALIASES`)."""
    return ALIASES.get(name, name)


def make_policy(name: str, **params) -> Policy:
    """A fresh instance of the policy registered as ``name`` (or named by one of :data:`ALIASES`)."""
    name = canonical(name)
    if name not in _REGISTRY:           # its module may not be imported yet
        _load_all()
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known policies: {', '.join(available())}") from None
    return cls(**params)

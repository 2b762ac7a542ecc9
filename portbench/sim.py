"""The policy author's import path, kept stable: the policy interface and :func:`simulate`.

Everything here lives in :mod:`portbench.engine` (the interface in :mod:`portbench.engine.api`, the
study's engine model in :mod:`portbench.engine.lssp`); ``from portbench.sim import Decision, Policy``
keeps working for schedulers written against it.
"""

from .engine import simulate  # noqa: F401
from .engine.api import (NEVER, NOTHING, Decision, EngineModel, EngineView, Policy,  # noqa: F401
                         PolicyContractError, RunResult, check_decision)
from .engine.lssp import LsspModel, visible_steps  # noqa: F401

"""Sub-commands of the simulator, campaign and analysis (registered on the main parser)."""

from __future__ import annotations


def register(sub) -> None:
    """Add the simulator's sub-commands to the ``portbench`` parser."""

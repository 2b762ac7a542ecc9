from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The repository's own data folder (never ../shared)."""
    return REPO / "data"

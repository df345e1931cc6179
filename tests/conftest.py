"""Fixtures: a throwaway bridge per test, and the rule for tests that need a real component."""
from pathlib import Path

import pytest

from harness import IN_CI, Bridge


@pytest.fixture
def bridge(tmp_path: Path) -> Bridge:
    b = Bridge.create(tmp_path)
    yield b
    b.kill_leftovers()


def require_component(path: Path, what: str) -> Path:
    """A real component the test needs: missing fails under CI=true, and skips with one line elsewhere."""
    if path.exists():
        return path
    message = f"{what} is not installed at {path}; tests/install_e2e.sh installs it"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)

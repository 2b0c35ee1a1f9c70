"""Shared fixtures for the end-to-end tests: where the espgate binary is."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def espgate():
    """Path to the release binary (built by `make test` before pytest runs)."""
    path = pathlib.Path(os.environ.get("ESPGATE", ROOT / "target" / "release" / "espgate"))
    if not path.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "espgate"], cwd=ROOT, check=True)
    return str(path)

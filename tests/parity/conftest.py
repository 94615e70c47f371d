"""Session fixtures of the parity tier: checkpoints made once, oracle models loaded once.

Everything expensive is cached for the whole session and keyed by what makes it different
(config name, variant, dtype), so a test asks for `checkpoint("qwen3_gqa2_tied")` or
`hf_model("qwen3_gqa2_tied", torch.bfloat16)` and pays for it only the first time.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_fixtures  # noqa: E402

# The CI machines have 2 cores; more threads only add contention with the CLI subprocesses.
torch.set_num_threads(2)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

# Checkpoint variants: overrides applied on top of DENSE_CONFIGS[name]. "gen" uses a 10x larger
# init so that greedy trajectories of the tiny random models move instead of repeating one token.
VARIANTS: dict[str, dict] = {
    "base": {},
    "gen": {"initializer_range": 0.2},
}

# Worst relative error per (config, dtype), filled by test_dense_parity, printed at the end.
WORST_ERRORS_KEY = pytest.StashKey[dict]()


def oracle_versions() -> str:
    return f"oracle: torch {torch.__version__}, transformers {transformers.__version__}"


def pytest_configure(config: pytest.Config) -> None:
    config.stash[WORST_ERRORS_KEY] = {}


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        binary = str(hf_fixtures.extract_binary())
    except FileNotFoundError as e:
        binary = f"missing ({e})"
    return [oracle_versions(), f"specwire-extract: {binary}"]


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    worst: dict = config.stash.get(WORST_ERRORS_KEY, {})
    terminalreporter.write_sep("-", "dense parity: worst relative error per config and dtype")
    terminalreporter.write_line(oracle_versions())
    if not worst:
        terminalreporter.write_line("(no parity test ran)")
        return
    terminalreporter.write_line(f"{'config':<20} {'dtype':<9} {'worst':>9} {'tol':>7}  where")
    for (name, dtype), (err, tol, where) in sorted(worst.items()):
        flag = "" if err <= tol else "  FAIL"
        terminalreporter.write_line(f"{name:<20} {dtype:<9} {err:>9.2e} {tol:>7.0e}  {where}{flag}")


@pytest.fixture(scope="session", autouse=True)
def _record_oracle_versions(record_testsuite_property) -> None:
    record_testsuite_property("oracle_torch", torch.__version__)
    record_testsuite_property("oracle_transformers", transformers.__version__)


@pytest.fixture(scope="session")
def worst_errors(pytestconfig: pytest.Config) -> dict:
    return pytestconfig.stash[WORST_ERRORS_KEY]


def _required_binary(name: str) -> Path:
    """services/*/<name> from $SPECWIRE_BUILD_DIR (default <repo>/build); the test fails saying
    how to build it when it is not there."""
    service = "extractor" if name == "specwire-extract" else "scorer"
    try:
        return hf_fixtures.built_binary(f"services/{service}/{name}")
    except FileNotFoundError as e:
        pytest.fail(f"{e}; build it with `cmake --build <dir> --target {name}`", pytrace=False)


@pytest.fixture(scope="session")
def extract_bin() -> Path:
    return _required_binary("specwire-extract")


@pytest.fixture(scope="session")
def replay_bin() -> Path:
    return _required_binary("specwire-replay")


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """checkpoint(name, variant="base", seed=0) -> directory, generated once per session."""
    root = tmp_path_factory.mktemp("checkpoints")
    made: dict[tuple[str, str, int], Path] = {}

    def get(name: str, variant: str = "base", seed: int = 0) -> Path:
        key = (name, variant, seed)
        if key not in made:
            out = root / f"{variant}-seed{seed}"
            out.mkdir(exist_ok=True)
            made[key] = hf_fixtures.make_checkpoint(name, out, seed=seed,
                                                    overrides=VARIANTS[variant])
        return made[key]

    return get


@pytest.fixture(scope="session")
def hf_model(checkpoint) -> Callable[..., transformers.PreTrainedModel]:
    """hf_model(name, dtype, variant="base") -> the transformers oracle, loaded once per session."""
    loaded: dict[tuple[str, torch.dtype, str], transformers.PreTrainedModel] = {}

    def get(name: str, dtype: torch.dtype, variant: str = "base") -> transformers.PreTrainedModel:
        key = (name, dtype, variant)
        if key not in loaded:
            loaded[key] = hf_fixtures.load_hf_model(checkpoint(name, variant), dtype)
        return loaded[key]

    return get

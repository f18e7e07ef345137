"""Every code block of the docs and README runs, or is checked, in CI.

The rules and markers are in ``tests/docs/_doc_blocks.py``. In short: ```` ```python ````
and ```` ```bash ```` blocks run in a sandbox that mirrors the repository root;
``<!-- docs-test: slow|gpu|cluster|skip REASON -->`` before a fence moves a block out of
the default run, where it is then compiled (Python) or has its commands' configs composed
and validated (shell); YAML config fragments are validated; JSON and TOML are parsed.
Test ids are ``file:line`` of the opening fence.

    python -m pytest tests/docs/test_docs_examples.py            # the default run
    python -m pytest tests/docs/test_docs_examples.py -m slow    # the slow examples too
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.docs._doc_blocks import (
    RUN_LANGS,
    Block,
    DocsMarkerError,
    Zygote,
    check_block,
    collect,
    continued_by,
    needs_check,
    run_block,
)

try:
    BLOCKS = collect()
    COLLECT_ERROR: DocsMarkerError | None = None
except DocsMarkerError as err:
    BLOCKS, COLLECT_ERROR = [], err


def _run_params() -> list[Any]:
    params: list[Any] = []
    for block in BLOCKS:
        if block.lang not in RUN_LANGS:
            continue
        marks = [pytest.mark.slow] if "slow" in block.modes else []
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


def test_markers_are_valid() -> None:
    assert COLLECT_ERROR is None, str(COLLECT_ERROR)
    assert BLOCKS, "no code blocks found under docs/"


@pytest.mark.parametrize("block", _run_params())
def test_block_runs(block: Block, tmp_path: Path, zygote: Zygote) -> None:
    if "skip" in block.modes:
        pytest.skip(f"docs-test: skip: {block.skip_reason}")
    if "cluster" in block.modes:
        pytest.skip("docs-test: cluster: needs several GPUs or nodes, SLURM or a full data set")
    if "gpu" in block.modes and not torch.cuda.is_available():
        pytest.skip("docs-test: gpu: CUDA is not available")
    after = continued_by(block, BLOCKS)
    if after is not None and after.modes == block.modes:
        pytest.skip(f"runs as the first part of {after.id}, which continues it")
    run_block(block, BLOCKS, tmp_path, zygote)


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS if needs_check(b)])
def test_block_checks(block: Block, tmp_path: Path, zygote: Zygote) -> None:
    check_block(block, BLOCKS, tmp_path, zygote)

"""The extract_cluster engine: argmax prototype of each sample, gathered in index order;
2 processes give what 1 gives; a model without swav_head is a ConfigError."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.integration._runs import run_config
from vissl.engines import get_engine
from vissl.engines.extract_cluster import (
    ExtractClusterEngine,
    load_cluster_assignments,
)
from vissl.errors import ConfigError
from vissl.utils.hydra_config import hydra_compose_and_validate

QUICK = "test/integration_test/quick_swav"
# One 12 px view per sample, and two sets of prototypes; 21 samples (odd: with 2
# processes the sampler pads rank 1's share with a repeat).
ONE_VIEW = [
    "config.DATA.TRAIN.TRANSFORMS=[{name: Resize, size: 12}, {name: ToTensor}]",
    "config.DATA.TRAIN.COLLATE_FUNCTION=default_collate",
    "config.DATA.TRAIN.DATA_LIMIT=21",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
    "config.DATA.TRAIN.DROP_LAST=False",
    "config.MODEL.HEAD.PARAMS=[[swav_head, {dims: [128, 64, 16], num_clusters: [8, 5]}]]",
]

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_proc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cluster") / "one"
    result = run_config(
        QUICK, "engine_name=extract_cluster", *ONE_VIEW, f"config.CHECKPOINT.DIR={out}"
    )
    assert result["TRAIN"].shape == (21, 2)
    return out


def test_engine_is_registered() -> None:
    assert isinstance(get_engine("extract_cluster"), ExtractClusterEngine)


def test_assignments_are_the_argmax_of_the_prototype_scores(one_proc: Path) -> None:
    got = load_cluster_assignments(str(one_proc), "train")
    assert got["cluster_inds"].tolist() == list(range(21))
    assert got["cluster_assignments"].shape == (21, 2)
    # Independently: the same (seeded) model on each sample, argmax per prototype set.
    from vissl.data import build_dataset
    from vissl.engines.train import set_seeds
    from vissl.models import build_model

    _, cfg = hydra_compose_and_validate([f"config={QUICK}", *ONE_VIEW])
    set_seeds(cfg, 0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER).eval()
    dataset = build_dataset(cfg, "TRAIN")
    images = torch.stack([dataset[i]["data"][0] for i in range(21)])
    with torch.no_grad():
        _, s0, s1 = model(images)[0]
    assert np.array_equal(s0.argmax(1).numpy(), got["cluster_assignments"][:, 0])
    assert np.array_equal(s1.argmax(1).numpy(), got["cluster_assignments"][:, 1])
    protos = model.heads[0].prototypes0.weight.detach().numpy()
    np.testing.assert_allclose(np.load(one_proc / "prototypes0.npy"), protos, rtol=1e-6)


def test_two_processes_equal_one(one_proc: Path, tmp_path) -> None:
    run_config(
        QUICK,
        "engine_name=extract_cluster",
        *ONE_VIEW,
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    a = load_cluster_assignments(str(one_proc), "train")
    b = load_cluster_assignments(str(tmp_path), "train")
    for kind in a:
        assert np.array_equal(a[kind], b[kind]), kind


def test_multi_crop_input_and_missing_head_are_config_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="one view per sample"):
        run_config(QUICK, "engine_name=extract_cluster", f"config.CHECKPOINT.DIR={tmp_path}")
    with pytest.raises(ConfigError, match="swav_head"):
        run_config(
            QUICK,
            "engine_name=extract_cluster",
            *ONE_VIEW,
            "config.MODEL.HEAD.PARAMS=[[mlp, {dims: [128, 16]}]]",
            f"config.CHECKPOINT.DIR={tmp_path / 'b'}",
        )

"""The extract_features engine writes VISSL's .npy files; the loader reads them back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.integration._runs import run_config
from vissl.engines.extract_features import ExtractedFeaturesLoader
from vissl.utils.checkpoint import load_checkpoint

SUP = "test/cpu_test/tiny_supervised"


@pytest.mark.integration
@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_extract_heads_and_trunk_features(tmp_path, nproc):
    train_dir = tmp_path / "train"
    run_config(
        SUP,
        "config.OPTIMIZER.num_epochs=1",
        "config.TEST_MODEL=False",
        f"config.CHECKPOINT.DIR={train_dir}",
    )
    (final,) = train_dir.glob("model_final*.torch")
    common = [
        "engine_name=extract_features",
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={final}",
        "config.DATA.TRAIN.DATA_LIMIT=40",
        "config.DATA.TEST.DATA_LIMIT=30",
        "config.EXTRACT_FEATURES.CHUNK_THRESHOLD=16",
        f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc}",
        "config.MULTI_PROCESSING_METHOD=fork",
    ]
    run_config(SUP, *common, f"config.CHECKPOINT.DIR={tmp_path / 'heads'}")
    test = ExtractedFeaturesLoader.load_features(str(tmp_path / "heads"), "heads", "test")
    assert test["features"].shape == (30, 10)
    assert np.array_equal(test["inds"], np.arange(30))
    train = ExtractedFeaturesLoader.load_features(str(tmp_path / "heads"), "heads", "train")
    assert train["features"].shape == (40, 10)
    assert len(list((tmp_path / "heads").glob("rank0_chunk*_test_heads_features.npy"))) >= 1

    run_config(
        SUP,
        *common,
        "config.MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=True",
        "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=True",
        f"config.CHECKPOINT.DIR={tmp_path / 'trunk'}",
    )
    trunk = ExtractedFeaturesLoader.load_features(str(tmp_path / "trunk"), "trunk", "test")
    assert trunk["features"].shape == (30, 512)
    # The head applied to the extracted trunk features gives the extracted head outputs.
    heads = load_checkpoint(str(final))["classy_state_dict"]["base_model"]["model"]["heads"]
    weight, bias = heads["0.clf.0.weight"], heads["0.clf.0.bias"]
    logits = torch.from_numpy(trunk["features"]) @ weight.T + bias
    assert torch.allclose(logits, torch.from_numpy(test["features"]), atol=1e-4)

"""The extract_label_predictions engine writes VISSL's per-rank prediction files; the loader
reads them back in index order; 2 processes give what 1 gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.integration._runs import run_config
from vissl.engines import get_engine
from vissl.engines.extract_features import ExtractedFeaturesLoader
from vissl.engines.extract_label_predictions import (
    PREDICTION_FILES,
    ExtractedLabelPredictionsLoader,
    ExtractLabelPredictionsEngine,
    default_label_predictions,
    unique_layer_names,
)
from vissl.errors import ConfigError

SUP = "test/cpu_test/tiny_supervised"
NARROW = [
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",  # trunk output: 128 features
    "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,10]}]]",
]
# Odd sizes: with 2 processes the sampler pads rank 1's share with a repeat.
DATA = ["config.DATA.TRAIN.DATA_LIMIT=61", "config.DATA.TEST.DATA_LIMIT=45"]
ENGINE = ["engine_name=extract_label_predictions", *NARROW, *DATA]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny supervised classifier (1 epoch): its final checkpoint."""
    out = tmp_path_factory.mktemp("elp") / "train"
    run_config(
        SUP,
        *NARROW,
        "config.OPTIMIZER.num_epochs=1",
        "config.TEST_MODEL=False",
        "config.DATA.TRAIN.DATA_LIMIT=128",
        f"config.CHECKPOINT.DIR={out}",
    )
    (final,) = out.glob("model_final*.torch")
    return final


@pytest.fixture(scope="module")
def one_proc(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("elp") / "one"
    values = run_config(
        SUP,
        *ENGINE,
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={trained}",
        f"config.CHECKPOINT.DIR={out}",
    )
    return {"dir": out, "values": values}


def test_engine_is_registered_under_vissls_name() -> None:
    assert isinstance(get_engine("extract_label_predictions"), ExtractLabelPredictionsEngine)


@pytest.mark.integration
def test_one_process_writes_vissl_files(
    one_proc: dict[str, Any], trained: Path, tmp_path: Path
) -> None:
    folder: Path = one_proc["dir"]
    for split in ("train", "test"):
        for kind in PREDICTION_FILES:
            assert (folder / f"rank0_{split}_heads_{kind}.npy").exists(), (split, kind)
    assert ExtractedLabelPredictionsLoader.layers(str(folder), "test") == ["heads"]

    test = ExtractedLabelPredictionsLoader.load_predictions(str(folder), "test")
    assert test["predictions"].shape == (45, 5)  # max(topk_values) = 5, best first
    assert test["conf_scores"].shape == (45, 10)
    assert test["targets"].shape == (45, 1)
    assert np.array_equal(test["inds"], np.arange(45))
    assert test["images"].tolist() == [""] * 45  # digits live in memory
    np.testing.assert_allclose(test["conf_scores"].sum(axis=1), 1.0, rtol=1e-5)
    order = np.argsort(-test["conf_scores"], axis=1, kind="stable")[:, :5]
    assert np.array_equal(test["predictions"], order)
    assert np.array_equal(
        test["predictions"][:, 0], test["conf_scores"].argmax(axis=1)
    )  # top-1 = arg-max

    # The meter's value (returned for one process) is that of the saved predictions.
    for split, n in (("train", 61), ("test", 45)):
        pred = ExtractedLabelPredictionsLoader.load_predictions(str(folder), split)
        assert len(pred["inds"]) == n
        hits = pred["predictions"] == pred["targets"]
        value = one_proc["values"][split.upper()]
        assert value["top_1"][0] == pytest.approx(100.0 * hits[:, 0].mean(), abs=1e-3)
        assert value["top_5"][0] == pytest.approx(100.0 * hits.any(axis=1).mean(), abs=1e-3)

    # The checkpoint's weights were used: a randomly initialised model scores otherwise.
    run_config(
        SUP,
        *ENGINE,
        "config.DATA.TRAIN.DATA_SOURCES=[]",
        f"config.CHECKPOINT.DIR={tmp_path / 'random'}",
    )
    rand = ExtractedLabelPredictionsLoader.load_predictions(str(tmp_path / "random"), "test")
    assert not np.allclose(rand["conf_scores"], test["conf_scores"], atol=1e-3)

    # Independently: the extract_features engine's head outputs (the logits) of the same
    # checkpoint give the same scores and classes.
    run_config(
        SUP,
        "engine_name=extract_features",
        *NARROW,
        *DATA,
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={trained}",
        f"config.CHECKPOINT.DIR={tmp_path / 'features'}",
    )
    feats = ExtractedFeaturesLoader.load_features(str(tmp_path / "features"), "heads", "test")
    assert np.array_equal(feats["inds"], test["inds"])
    assert np.array_equal(feats["targets"].reshape(-1, 1), test["targets"])
    logits = torch.from_numpy(feats["features"])
    np.testing.assert_allclose(logits.softmax(dim=1).numpy(), test["conf_scores"], atol=1e-6)
    assert np.array_equal(logits.topk(5, dim=1).indices.numpy(), test["predictions"])


@pytest.mark.integration
def test_two_processes_equal_one(one_proc: dict[str, Any], trained: Path, tmp_path: Path) -> None:
    run_config(
        SUP,
        *ENGINE,
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={trained}",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        "config.MULTI_PROCESSING_METHOD=fork",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    one: Path = one_proc["dir"]
    for split, n in (("train", 61), ("test", 45)):
        # Each rank wrote its share once, without the sampler's padding repeat.
        shares = [np.load(tmp_path / f"rank{r}_{split}_heads_inds.npy") for r in (0, 1)]
        assert sorted(np.concatenate(shares).tolist()) == list(range(n))
        assert all(np.all(np.diff(s) > 0) for s in shares)
        a = ExtractedLabelPredictionsLoader.load_predictions(str(one), split)
        b = ExtractedLabelPredictionsLoader.load_predictions(str(tmp_path), split)
        for kind in ("predictions", "targets", "inds", "images"):
            assert np.array_equal(a[kind], b[kind]), (split, kind)
        np.testing.assert_allclose(b["conf_scores"], a["conf_scores"], rtol=1e-5, atol=1e-7)
    log = (tmp_path / "log.txt").read_text()
    test_value = one_proc["values"]["TEST"]
    assert f"TEST: accuracy_list_meter {test_value}" in log  # synced over both ranks


@pytest.mark.integration
def test_several_layers_of_a_linear_eval_model(tmp_path: Path) -> None:
    """Linear evaluation of two trunk layers: one set of files per layer name."""
    values = run_config(
        SUP,
        "engine_name=extract_label_predictions",
        *DATA,
        "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
        "config.MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=True",
        "config.MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY=True",
        "config.MODEL.FEATURE_EVAL_SETTINGS.SHOULD_FLATTEN_FEATS=False",
        "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP="
        "[[res4,[AdaptiveAvgPool2d,[[1,1]]]],[res5avg,[Identity,[]]]]",
        "config.MODEL.HEAD.PARAMS=[[eval_mlp,{in_channels:64,dims:[64,10]}],"
        "[eval_mlp,{in_channels:128,dims:[128,10]}]]",
        "config.METERS.accuracy_list_meter.num_meters=2",
        "config.METERS.accuracy_list_meter.topk_values=[1,3]",
        "config.DATA.TRAIN.DATA_SOURCES=[]",  # TEST only
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    assert set(values) == {"TEST"}
    assert ExtractedLabelPredictionsLoader.layers(str(tmp_path), "test") == ["res4", "res5avg"]
    assert not list(tmp_path.glob("rank0_train_*"))
    for layer in ("res4", "res5avg"):
        pred = ExtractedLabelPredictionsLoader.load_predictions(str(tmp_path), "test", layer)
        assert pred["predictions"].shape == (45, 3) and pred["conf_scores"].shape == (45, 10)


@pytest.mark.integration
def test_needs_exactly_one_meter(tmp_path: Path) -> None:
    for names in ("[]", "[accuracy_list_meter,precision_at_k_list_meter]"):
        with pytest.raises(ConfigError, match=r"exactly one meter") as info:
            run_config(
                SUP,
                *ENGINE,
                f"config.METERS.names={names}",
                f"config.CHECKPOINT.DIR={tmp_path}",
            )
        assert info.value.key_path == "config.METERS.names"


def test_unique_layer_names_as_vissl() -> None:
    assert unique_layer_names(["res4", "res4", "res5", "res4"]) == [
        "res4",
        "res4_1",
        "res5",
        "res4_2",
    ]
    assert unique_layer_names([]) == []


def test_default_predictions_are_vissls_accuracy_meter_predictions() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0, 0.5], [3.0, 0.0, 0.0, 4.0]])
    (pred,), (scores,) = default_label_predictions([logits], topk=2)
    assert pred.tolist() == [[1, 3], [3, 0]]
    assert torch.allclose(scores, logits.softmax(dim=1))
    (pred,), _ = default_label_predictions([logits], topk=10)  # capped at the classes
    assert pred.shape == (2, 4)


def test_loader_names_the_layers_found(tmp_path: Path) -> None:
    for kind in PREDICTION_FILES:
        np.save(tmp_path / f"rank0_test_res5_{kind}.npy", np.zeros(2))
    with pytest.raises(FileNotFoundError, match=r"layer 'heads'.*\['res5'\]"):
        ExtractedLabelPredictionsLoader.load_predictions(str(tmp_path), "test")

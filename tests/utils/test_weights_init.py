"""MODEL.WEIGHTS_INIT: pretraining checkpoints into linear-evaluation models, and the errors."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import vissl
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.models import BaseSSLMultiInputOutputModel, build_model
from vissl.utils.weights_init import (
    init_model_from_checkpoint,
    init_model_from_consolidated_weights,
    init_model_from_weights_params_file,
    should_init_head_weights,
)

torch.set_num_threads(2)

_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL_DEFAULTS: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]

SIMCLR_HEAD = [
    ["mlp", {"dims": [128, 128], "use_relu": True, "skip_last_layer_relu_bn": False}],
    ["mlp", {"dims": [128, 32]}],
]
EVAL_HEADS = [
    ["eval_mlp", {"in_channels": 64, "dims": [256, 10]}],
    ["eval_mlp", {"in_channels": 128, "dims": [128, 10]}],
]
POOL_MAP = [
    ["res4", ["AdaptiveAvgPool2d", [[2, 2]]]],
    ["res5avg", ["Identity", []]],
]


def model_config(width: float = 0.25, heads: list[Any] | None = None, **fe: Any) -> AttrDict:
    cfg = AttrDict(copy.deepcopy(_MODEL_DEFAULTS))
    cfg.TRUNK.RESNETS.DEPTH = 18
    cfg.TRUNK.RESNETS.WIDTH_MULTIPLIER = width
    cfg.HEAD.PARAMS = heads if heads is not None else []
    for key, value in fe.items():
        cfg.FEATURE_EVAL_SETTINGS[key] = value
    return cfg


def linear_eval_config() -> AttrDict:
    return model_config(
        heads=EVAL_HEADS,
        EVAL_MODE_ON=True,
        FREEZE_TRUNK_ONLY=True,
        SHOULD_FLATTEN_FEATS=False,
        LINEAR_EVAL_FEAT_POOL_OPS_MAP=POOL_MAP,
    )


def build(cfg: AttrDict) -> BaseSSLMultiInputOutputModel:
    model = build_model(cfg, AttrDict())
    assert isinstance(model, BaseSSLMultiInputOutputModel)
    return model


def weights_cfg(path: Path | str = "", **kw: Any) -> AttrDict:
    cfg = AttrDict(copy.deepcopy(_MODEL_DEFAULTS["WEIGHTS_INIT"]))
    cfg.PARAMS_FILE = str(path)
    for key, value in kw.items():
        cfg[key] = value
    return cfg


@pytest.fixture(scope="module")
def simclr_model() -> BaseSSLMultiInputOutputModel:
    """A 'pretrained' SimCLR model (trunk + projection head) with non-trivial BN stats."""
    torch.manual_seed(1)
    model = build(model_config(heads=SIMCLR_HEAD))
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(8, 3, 32, 32) * 3 + 1)
    return model


@pytest.fixture
def simclr_file(tmp_path: Path, simclr_model: BaseSSLMultiInputOutputModel) -> Path:
    """The model saved in our (and VISSL's) checkpoint layout."""
    path = tmp_path / "model_final_checkpoint_phase5.torch"
    torch.save(
        {
            "phase_idx": 5,
            "iteration": 60,
            "classy_state_dict": {"base_model": simclr_model.get_classy_state()},
        },
        path,
    )
    return path


def test_simclr_checkpoint_into_linear_eval_model(
    simclr_file: Path, simclr_model: BaseSSLMultiInputOutputModel, caplog: pytest.LogCaptureFixture
) -> None:
    model = build(linear_eval_config())
    heads_before = {k: v.clone() for k, v in model.heads.state_dict().items()}
    with caplog.at_level(logging.INFO, logger="vissl.utils.weights_init"):
        report = init_model_from_weights_params_file(model, weights_cfg(simclr_file))

    pre_trunk = simclr_model.trunk.state_dict()
    lin_trunk = model.trunk.base_model.state_dict()
    skipped = {k for k in pre_trunk if k.endswith("num_batches_tracked")}  # default SKIP_LAYERS
    assert set(pre_trunk) == set(lin_trunk)
    assert all(torch.equal(pre_trunk[k], lin_trunk[k]) for k in set(pre_trunk) - skipped)
    assert len(report.loaded) == len(pre_trunk) - len(skipped)
    assert all(k.startswith("trunk.base_model.") for k in report.loaded)
    # eval_mlp heads are new; the projection head of the file is not used
    assert all(torch.equal(v, model.heads.state_dict()[k]) for k, v in heads_before.items())
    head_keys = {f"heads.{k}" for k in heads_before}
    assert set(report.heads_kept) == {k for k in head_keys if "num_batches" not in k}
    assert head_keys - set(report.heads_kept) <= set(report.skipped)
    assert report.unused and all(
        k.startswith("heads.") or "num_batches" in k for k in report.unused
    )
    assert "loaded" in caplog.text
    assert "heads kept at their initialisation, evaluation heads" in caplog.text
    assert "file entries not loaded" in caplog.text and "heads.0.clf.0.weight" in caplog.text


def test_simclr_checkpoint_into_frozen_trunk_without_pool_map(simclr_file: Path) -> None:
    cfg = model_config(
        heads=[["eval_mlp", {"in_channels": 128, "dims": [128, 10]}]],
        EVAL_MODE_ON=True,
        FREEZE_TRUNK_ONLY=True,
    )
    model = build(cfg)
    report = init_model_from_weights_params_file(model, weights_cfg(simclr_file))
    assert report.loaded and all(k.startswith("trunk._feature_blocks.") for k in report.loaded)


def test_feature_extractor_checkpoint_into_plain_model(tmp_path: Path) -> None:
    lin = build(linear_eval_config())
    path = tmp_path / "lin.torch"
    torch.save({"classy_state_dict": {"base_model": lin.get_classy_state()}}, path)
    plain = build(
        model_config(heads=SIMCLR_HEAD, EVAL_MODE_ON=True, EXTRACT_TRUNK_FEATURES_ONLY=True)
    )
    report = init_model_from_weights_params_file(plain, weights_cfg(path))
    assert all(k.startswith("trunk._feature_blocks.") for k in report.loaded)
    w = "_feature_blocks.conv1.weight"
    assert torch.equal(plain.trunk.state_dict()[w], lin.trunk.base_model.state_dict()[w])


def test_fine_tuning_loads_heads_and_a_head_shape_mismatch_needs_skip_layers(
    simclr_file: Path,
) -> None:
    same = build(model_config(heads=SIMCLR_HEAD))
    report = init_model_from_weights_params_file(same, weights_cfg(simclr_file))
    assert any(k.startswith("heads.") for k in report.loaded)

    other = build(model_config(heads=[["mlp", {"dims": [128, 10]}]]))
    with pytest.raises(ConfigError, match="shape mismatch") as info:
        init_model_from_weights_params_file(other, weights_cfg(simclr_file))
    assert "heads.0.clf.0.weight: file (128, 128) vs model (10, 128)" in str(info.value)
    assert info.value.key_path == "config.MODEL.WEIGHTS_INIT.PARAMS_FILE"

    report = init_model_from_weights_params_file(
        other, weights_cfg(simclr_file, SKIP_LAYERS=["num_batches_tracked", "heads."])
    )
    assert not any(k.startswith("heads.") for k in report.loaded)
    assert "heads.0.clf.0.weight" in report.skipped
    # VISSL's FSDP configs spell the layers with FSDP's wrapper levels: the same skip
    fsdp_skip = ["num_batches_tracked", "_fsdp_wrapped_module.heads._fpw_module."]
    fsdp = init_model_from_weights_params_file(
        other, weights_cfg(simclr_file, SKIP_LAYERS=fsdp_skip)
    )
    assert fsdp.skipped == report.skipped and fsdp.loaded == report.loaded
    # VISSL main's ASSERT_HEAD_LAYER_SHAPE_INIT: False skips the heads of another shape
    lenient = copy.deepcopy(other.model_config)
    lenient.FEATURE_EVAL_SETTINGS.ASSERT_HEAD_LAYER_SHAPE_INIT = False
    loose = init_model_from_weights_params_file(other, weights_cfg(simclr_file), lenient)
    assert "heads.0.clf.0.weight" in loose.skipped and "heads.0.clf.0.bias" in loose.skipped
    assert not any(k.startswith("heads.") for k in loose.loaded) and loose.loaded


def test_trunk_shape_mismatch_lists_the_keys(simclr_file: Path) -> None:
    # a head that fits the wider trunk (256 features): only the trunk differs from the file
    wider = build(
        model_config(width=0.5, heads=[["eval_mlp", {"in_channels": 256, "dims": [256, 10]}]])
    )
    with pytest.raises(ConfigError) as info:
        init_model_from_weights_params_file(wider, weights_cfg(simclr_file))
    message = str(info.value)
    assert (
        "trunk._feature_blocks.conv1.weight: file (16, 3, 7, 7) vs model (32, 3, 7, 7)" in message
    )
    assert "SKIP_LAYERS" in message


def test_nothing_matching_is_an_error_naming_the_keys(tmp_path: Path, simclr_model: Any) -> None:
    plain = tmp_path / "plain.torch"
    torch.save(dict(simclr_model.trunk.state_dict()), plain)  # no trunk. prefix
    model = build(linear_eval_config())
    with pytest.raises(ConfigError, match="nothing in .* matches the model") as info:
        init_model_from_weights_params_file(model, weights_cfg(plain, STATE_DICT_KEY_NAME=""))
    message = str(info.value)
    assert "missing in the file" in message
    assert "trunk.base_model._feature_blocks.conv1.weight" in message  # a model key
    assert "_feature_blocks.conv1.weight" in message and "APPEND_PREFIX" in message


def test_plain_state_dict_with_remove_and_append_prefix(tmp_path: Path, simclr_model: Any) -> None:
    trunk = simclr_model.trunk.state_dict()
    path = tmp_path / "ddp.torch"
    torch.save({"model": {f"module.{k}": v for k, v in trunk.items()}}, path)
    model = build(linear_eval_config())
    cfg = weights_cfg(
        path, STATE_DICT_KEY_NAME="model", REMOVE_PREFIX="module.", APPEND_PREFIX="trunk."
    )
    report = init_model_from_weights_params_file(model, cfg)
    assert len(report.loaded) == len([k for k in trunk if "num_batches" not in k])
    assert torch.equal(
        model.trunk.base_model.state_dict()["_feature_blocks.bn1.running_mean"],
        trunk["_feature_blocks.bn1.running_mean"],
    )


def test_state_dict_key_name_errors_and_nested_keys(tmp_path: Path, simclr_model: Any) -> None:
    path = tmp_path / "nested.torch"
    torch.save(
        {"outer": {"inner": {f"trunk.{k}": v for k, v in simclr_model.trunk.state_dict().items()}}},
        path,
    )
    model = build(linear_eval_config())
    with pytest.raises(ConfigError, match="'classy_state_dict' is not in the weights file") as info:
        init_model_from_weights_params_file(model, weights_cfg(path))
    assert "['outer']" in str(info.value)
    assert info.value.key_path == "config.MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME"
    report = init_model_from_weights_params_file(
        model, weights_cfg(path, STATE_DICT_KEY_NAME=["outer", "inner"])
    )
    assert report.loaded


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    model = build(linear_eval_config())
    with pytest.raises(ConfigError, match="cannot be loaded") as info:
        init_model_from_weights_params_file(model, weights_cfg(tmp_path / "nope.torch"))
    assert info.value.key_path == "config.MODEL.WEIGHTS_INIT.PARAMS_FILE"


def test_eval_trunk_and_head_needs_head_weights(tmp_path: Path, simclr_model: Any) -> None:
    path = tmp_path / "trunk_only.torch"
    state = simclr_model.get_classy_state()
    state["model"]["heads"] = {}
    torch.save({"classy_state_dict": {"base_model": state}}, path)
    cfg = model_config(
        heads=SIMCLR_HEAD, EVAL_MODE_ON=True, FREEZE_TRUNK_AND_HEAD=True, EVAL_TRUNK_AND_HEAD=True
    )
    with pytest.raises(ConfigError, match="holds no head weights") as info:
        init_model_from_weights_params_file(build(cfg), weights_cfg(path))
    assert info.value.key_path == "config.MODEL.FEATURE_EVAL_SETTINGS.EVAL_TRUNK_AND_HEAD"


def test_should_init_head_weights_follows_vissl() -> None:
    assert should_init_head_weights(model_config())
    assert not should_init_head_weights(model_config(EVAL_MODE_ON=True))
    assert should_init_head_weights(model_config(EVAL_MODE_ON=True, EVAL_TRUNK_AND_HEAD=True))


def test_numpy_weights_and_vissl_entry_points(simclr_model: Any) -> None:
    arrays = {f"trunk.{k}": v.numpy() for k, v in simclr_model.trunk.state_dict().items()}
    model = build(linear_eval_config())
    report = init_model_from_checkpoint(model, arrays, weights_cfg(STATE_DICT_KEY_NAME=""))
    assert report.loaded
    w = "_feature_blocks.conv1.weight"
    assert np.array_equal(model.trunk.base_model.state_dict()[w].numpy(), arrays[f"trunk.{w}"])

    # VISSL's names: the model method and init_model_from_consolidated_weights
    full = AttrDict({"MODEL": linear_eval_config()})
    checkpoint = {"classy_state_dict": {"base_model": simclr_model.get_classy_state()}}
    other = build(linear_eval_config())
    other.init_model_from_weights_params_file(full, checkpoint)
    assert torch.equal(other.trunk.base_model.state_dict()[w], simclr_model.trunk.state_dict()[w])
    third = build(linear_eval_config())
    init_model_from_consolidated_weights(
        full, third, checkpoint, "classy_state_dict", skip_layers=["num_batches_tracked"]
    )
    assert torch.equal(third.trunk.base_model.state_dict()[w], simclr_model.trunk.state_dict()[w])

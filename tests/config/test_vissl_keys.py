"""VISSL's config keys that used to be rejected (item 3 of the VISSL-compatibility issue):
keys VISSL's own configs set that VISSL never read are dropped with a warning naming why;
VISSL main's defaults keys we lacked are accepted and do what VISSL did."""

from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.config.validation import (
    DEFAULTS_PATH,
    VISSL_IGNORED_KEYS,
    UnsupportedConfigWarning,
    validate_config,
)
from vissl.data.data_sources.synthetic import SyntheticImageDataset
from vissl.errors import ConfigError
from vissl.hooks.ema_hook import EmaHook
from vissl.utils.hydra_config import hydra_compose_and_validate


def compose(*overrides: str) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, cfg = hydra_compose_and_validate(["config=quick_start", *overrides])
    return cfg, [str(w.message) for w in caught if issubclass(w.category, UnsupportedConfigWarning)]


def defaults() -> dict[str, Any]:
    with open(DEFAULTS_PATH, encoding="utf-8") as f:
        return copy.deepcopy(yaml.safe_load(f)["config"])


@pytest.mark.parametrize(
    ("fragment", "path"),
    [
        # VISSL main's pretrain/deepcluster_v2/transforms/multicrop_2x160_4x96.yaml
        ({"DATA": {"TRANSFORMS": [{"name": "ImgPilToMultiCrop"}]}}, "DATA.TRANSFORMS"),
        # pretrain/rotnet/rotnet_8gpu_resnet.yaml
        ({"LOSS": {"ignore_index": -1}}, "LOSS.ignore_index"),
        # debugging/pretrain/supervised/supervised_deit_b_integration_debug.yaml
        (
            {"MODEL": {"TRUNK": {"VISION_TRANSFORMERS": {"CONVIT": {"N_GPSA_LAYERS": 10}}}}},
            "MODEL.TRUNK.VISION_TRANSFORMERS.CONVIT",
        ),
        # feature_extraction/extract_dino_vit_trunk_only.yaml
        ({"MODEL": {"WEIGHTS_INIT": {"PARAM_FILE": "x.torch"}}}, "MODEL.WEIGHTS_INIT.PARAM_FILE"),
    ],
)
def test_keys_vissl_ignores_are_dropped_with_the_reason(fragment: dict, path: str) -> None:
    cfg = defaults()
    for section, content in fragment.items():
        node, update = cfg[section], content
        while isinstance(update, dict) and len(update) == 1 and next(iter(update)) in node:
            key = next(iter(update))
            node, update = node[key], update[key]
        node.update(update)
    with pytest.warns(UnsupportedConfigWarning, match=f"config.{path} is ignored, as VISSL"):
        validate_config(cfg)
    node: Any = cfg
    *parents, leaf = path.split(".")
    for part in parents:
        node = node[part]
    assert leaf not in node and path in VISSL_IGNORED_KEYS


def test_vissl_main_defaults_keys_are_accepted() -> None:
    cfg, messages = compose(
        "config.SVM_FEATURES_PATH=/features",
        "config.MODEL.TRUNK.VISION_TRANSFORMERS.HYBRID=null",
        "config.DATA.TRAIN.RANDOM_SYNTHETIC_IMAGES=true",
        "config.MODEL.FEATURE_EVAL_SETTINGS.ASSERT_HEAD_LAYER_SHAPE_INIT=false",
        "config.HOOKS.EMA_MODEL.WARMUP=0.05",
    )
    assert cfg.SVM.FEATURES.PATH == "/features" and "SVM_FEATURES_PATH" not in cfg
    assert messages == [
        "config.SVM_FEATURES_PATH is VISSL main's key: using it as config.SVM.FEATURES.PATH."
    ]
    _, messages = compose(
        "config.MODEL.TRUNK.VISION_TRANSFORMERS.HYBRID=hybrid_resnet",
        "config.DATA.TRAIN.RANDOM_SYNTHETIC_IMAGES=false",
    )
    assert len(messages) == 2 and all("does not implement" in m for m in messages)


def test_random_synthetic_labels_sets_the_classes() -> None:
    cfg, _ = compose(
        "config.DATA.TRAIN.RANDOM_SYNTHETIC_LABELS=3", "config.DATA.TRAIN.DATA_LIMIT=7"
    )
    source = SyntheticImageDataset(AttrDict(cfg), "", "TRAIN", "synthetic")
    assert source.get_labels().tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert source.num_classes == 3
    default, _ = compose()
    assert SyntheticImageDataset(AttrDict(default), "", "TRAIN", "synthetic").num_classes == 10
    bad, _ = compose("config.DATA.TRAIN.RANDOM_SYNTHETIC_LABELS=-1")
    with pytest.raises(ConfigError, match="RANDOM_SYNTHETIC_LABELS"):
        SyntheticImageDataset(AttrDict(bad), "", "TRAIN", "synthetic")


def test_ema_warmup_copies_the_model_then_averages() -> None:
    """VISSL main: while task.where < WARMUP the EMA is the model; then decay * ema + (1 -
    decay) * model."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    task = SimpleNamespace(base_model=model, device=torch.device("cpu"), iteration=0, where=0.0)
    hook = EmaHook(decay=0.5, warmup=0.5, stage_on_host=False)
    hook.on_start(task)
    with torch.no_grad():
        model.weight.fill_(2.0)
    task.where = 0.25
    hook.on_update(task)
    assert torch.equal(hook.model.weight, torch.full((2, 3), 2.0))  # copied
    with torch.no_grad():
        model.weight.fill_(4.0)
    task.where = 0.5
    hook.on_update(task)
    assert torch.equal(hook.model.weight, torch.full((2, 3), 3.0))  # averaged
    with pytest.raises(ConfigError, match="WARMUP"):
        EmaHook(warmup=1.5)

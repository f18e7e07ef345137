"""Linear evaluation end to end: pretrain a tiny SimCLR model, then train eval_mlp heads on
its frozen trunk with the shipped digits config (benchmark/linear_image_classification)."""

from __future__ import annotations

import glob
import os
import warnings
from typing import Any

import pytest
import torch

from tests.integration._runs import REPO, read_jsonl, run_config
from vissl.models import build_model
from vissl.utils.checkpoint import load_checkpoint
from vissl.utils.hydra_config import hydra_compose_and_validate

LINEAR = "benchmark/linear_image_classification/digits/linear_digits_quick_start"
LAYERS = ["res2", "res3", "res4", "res5avg"]
# ResNet-18 at width 0.25: 16, 32, 64, 128 channels; res2..res4 pooled to 2 x 2.
TINY_TRUNK = [
    "config.MODEL.TRUNK.NAME=resnet",
    "config.MODEL.TRUNK.RESNETS.DEPTH=18",
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
    "config.MODEL.TRUNK.RESNETS.SMALL_IMAGE_STEM=False",
]
TINY_HEADS = (
    "config.MODEL.HEAD.PARAMS=["
    "[eval_mlp,{in_channels:16,dims:[64,10]}],"
    "[eval_mlp,{in_channels:32,dims:[128,10]}],"
    "[eval_mlp,{in_channels:64,dims:[256,10]}],"
    "[eval_mlp,{in_channels:128,dims:[128,10]}]]"
)
LINEAR_CONFIGS = sorted(
    os.path.relpath(p, os.path.join(REPO, "configs", "config"))[: -len(".yaml")]
    for p in glob.glob(
        os.path.join(
            REPO, "configs", "config", "benchmark", "linear_image_classification", "**", "*.yaml"
        ),
        recursive=True,
    )
)
SYNTHETIC = [
    "config.DATA.TRAIN.DATA_SOURCES=[synthetic]",
    "config.DATA.TRAIN.DATA_PATHS=[]",
    "config.DATA.TEST.DATA_SOURCES=[synthetic]",
    "config.DATA.TEST.DATA_PATHS=[]",
    "config.MACHINE.DEVICE=cpu",
    "config.DISTRIBUTED.BACKEND=gloo",
]


def _run(name: str, *overrides: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_config(name, *overrides)


def _trunk_state(path: str) -> dict[str, torch.Tensor]:
    """The trunk tensors of a checkpoint, named as in a pretraining trunk."""
    trunk = load_checkpoint(path)["classy_state_dict"]["base_model"]["model"]["trunk"]
    return {k.removeprefix("base_model."): v for k, v in trunk.items()}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SimCLR checkpoint (2 steps) of the tiny trunk, with every trunk float tensor
    perturbed (x 1.01 + 1e-3: small enough to keep the activations finite) so that a trunk
    that did not load it cannot match it by chance."""
    folder = tmp_path_factory.mktemp("pretrain")
    _run(
        "test/cpu_test/tiny_simclr",
        *TINY_TRUNK,
        "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,32]}]]",
        "config.DATA.TRAIN.DATA_LIMIT=8",
        "config.OPTIMIZER.num_epochs=1",
        f"config.CHECKPOINT.DIR={folder}",
    )
    (final,) = glob.glob(str(folder / "model_final_checkpoint_phase*.torch"))
    ckpt = load_checkpoint(final)
    trunk = ckpt["classy_state_dict"]["base_model"]["model"]["trunk"]
    for key, value in trunk.items():
        if value.is_floating_point():
            trunk[key] = value * 1.01 + 1e-3
    shifted = str(folder / "shifted.torch")
    torch.save(ckpt, shifted)
    return shifted


@pytest.mark.integration
def test_linear_eval_trains_heads_on_the_loaded_frozen_trunk(tmp_path, pretrained: str) -> None:
    task = _run(
        LINEAR,
        *TINY_TRUNK,
        TINY_HEADS,
        "config.DATA.TRAIN.DATA_LIMIT=96",
        "config.DATA.TEST.DATA_LIMIT=64",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=32",
        "config.OPTIMIZER.num_epochs=2",
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={pretrained}",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    expected = _trunk_state(pretrained)

    # WEIGHTS_INIT loaded every trunk tensor (perturbed: no init can equal them) ...
    trunk = task.base_model.trunk.base_model.state_dict()
    compared = [k for k in expected if "num_batches_tracked" not in k]
    assert compared and set(compared) <= set(trunk)
    # ... and linear training changed none of them (no gradients, BatchNorm in eval mode)
    for key in compared:
        assert torch.equal(trunk[key], expected[key]), key
    (final,) = glob.glob(str(tmp_path / "model_final_checkpoint_phase*.torch"))
    saved = _trunk_state(final)
    assert all(torch.equal(saved[k], expected[k]) for k in compared)
    # while the heads were trained
    assert all(p.requires_grad for p in task.base_model.heads.parameters())
    assert not any(p.requires_grad for p in task.base_model.trunk.parameters())

    records = read_jsonl(str(tmp_path / "metrics.json"))
    tests = [r for r in records if "test_accuracy_list_meter" in r]
    trains = [r for r in records if "train_accuracy_list_meter" in r]
    assert len(tests) == 2 and len(trains) == 2
    for record in (tests[-1]["test_accuracy_list_meter"], trains[-1]["train_accuracy_list_meter"]):
        top1 = record["top_1"]
        assert sorted(top1) == sorted(LAYERS)
        assert all(isinstance(v, float) and 0.0 <= v <= 100.0 for v in top1.values())


@pytest.mark.integration
def test_weights_init_decides_the_features(tmp_path, pretrained: str) -> None:
    """Features of the linear-eval model built from the config follow PARAMS_FILE."""
    from vissl.utils.weights_init import init_model_from_weights_params_file

    _, cfg = hydra_compose_and_validate(
        [f"config={LINEAR}", *TINY_TRUNK, TINY_HEADS, "config.MODEL.WEIGHTS_INIT.PARAMS_FILE="]
    )
    images = torch.randn(4, 3, 32, 32)
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER).eval()
    with torch.no_grad():
        random_feats = model.get_features(images)
    report = init_model_from_weights_params_file(
        model, {**cfg.MODEL.WEIGHTS_INIT, "PARAMS_FILE": pretrained}, cfg.MODEL
    )
    assert report.loaded and all(k.startswith("trunk.base_model.") for k in report.loaded)
    assert report.heads_kept  # the eval_mlp heads are new, not SimCLR's projection
    with torch.no_grad():
        loaded_feats = model.get_features(images)
    assert len(loaded_feats) == len(LAYERS)
    assert all(not torch.allclose(a, b) for a, b in zip(random_feats, loaded_feats))


def test_list_meter_names_are_inferred_from_the_pool_ops_map() -> None:
    """VISSL's configs give only num_meters; the layers name the outputs."""
    _, cfg = hydra_compose_and_validate(
        [
            f"config={LINEAR}",
            "config.METERS.accuracy_list_meter.num_meters=1",
            "config.METERS.accuracy_list_meter.meter_names=[]",
        ]
    )
    assert cfg.METERS.accuracy_list_meter.num_meters == len(LAYERS)
    assert cfg.METERS.accuracy_list_meter.meter_names == LAYERS


def _eval_image_size(cfg: Any) -> int:
    sizes = {t["name"]: t.get("size") for t in cfg.DATA.TEST.TRANSFORMS}
    size = sizes.get("CenterCrop") or sizes.get("Resize") or 32
    return int(size[0] if isinstance(size, list) else size)


@pytest.mark.parametrize("name", LINEAR_CONFIGS)
def test_shipped_linear_config_heads_fit_the_pooled_features(name: str) -> None:
    """Every eval_mlp's in_channels / dims[0] match its pooled layer at the config's size."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, cfg = hydra_compose_and_validate([f"config={name}", *SYNTHETIC])
    model = build_model(cfg.MODEL, cfg.OPTIMIZER).eval()
    size = _eval_image_size(cfg)
    with torch.no_grad():
        out = model(torch.randn(2, 3, size, size))
    pool_map = cfg.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP
    meter = cfg.METERS[cfg.METERS.names[0]]  # accuracy_list_meter, or mean AP (VOC07)
    assert len(out) == len(pool_map) == meter.num_meters
    assert meter.meter_names == [item[0] for item in pool_map]
    assert all(o.shape[0] == 2 and o.ndim == 2 for o in out)

"""The Jigsaw ImageNet configs compose without warnings, build on the CPU, hold the
numbers their comments state (images per step, patch sizes, 2000 permutations, the
learning-rate steps, iterations per epoch), and one training step runs through the
patch transforms, siamese_collator and ResNet-50 on a 300 x 400 image (a local file of
2000 permutations stands in for VISSL's download)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tests._vissl_configs import copy_vissl_config, needs_vissl_configs
from tests.config.test_pretrain_method_configs import (
    IMAGENET_TRAIN_IMAGES,
    _build,
    _compose,
    _world_size,
)
from vissl.data import build_collate_fn
from vissl.data.ssl_transforms.ssl_transforms_wrapper import build_transforms
from vissl.losses.cross_entropy_multiple_output_single_target import (
    CrossEntropyMultipleOutputSingleTargetLoss,
)
from vissl.utils.hydra_config import hydra_compose_and_validate

# config -> (images per step, peak lr, warm-up start, iterations per epoch)
JIGSAW = {
    "pretrain/jigsaw/jigsaw_8gpu_resnet50": (256, 0.1, 0.025, 5004),
    "pretrain/jigsaw/jigsaw_64gpu_resnet50": (2048, 0.8, 0.1, 625),
}
SHUFFLE = 7  # the index of ShuffleImgPatches in DATA.TRAIN.TRANSFORMS
VISSL_2000 = (
    "https://dl.fbaipublicfiles.com/fair_self_supervision_benchmark/jigsaw_permutations/"
    "hamming_perms_2000_patches_9_max_avg.npy"
)


@pytest.fixture(scope="module")
def perms_2000(tmp_path_factory: pytest.TempPathFactory) -> str:
    rng = np.random.default_rng(0)
    rows: set[tuple[int, ...]] = set()
    while len(rows) < 2000:
        rows.add(tuple(rng.permutation(9).tolist()))
    path = tmp_path_factory.mktemp("perms") / "perms_2000.npy"
    np.save(path, np.array(sorted(rows)))
    return str(path)


@pytest.mark.parametrize("name", sorted(JIGSAW))
def test_jigsaw_config_builds_with_the_numbers_of_its_comments(name: str) -> None:
    images, peak, warm_start, iterations = JIGSAW[name]
    cfg = _compose(name)
    batch = int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA)
    assert batch * _world_size(cfg) == images
    assert math.ceil(IMAGENET_TRAIN_IMAGES / _world_size(cfg)) // batch == iterations
    transforms = cfg.DATA.TRAIN.TRANSFORMS
    assert transforms[2].size == 255
    assert (transforms[6].name, transforms[6].num_patches, transforms[6].patch_jitter) == (
        "ImgPatchesFromTensor",
        9,
        21,
    )
    assert (transforms[SHUFFLE].name, transforms[SHUFFLE].perm_file) == (
        "ShuffleImgPatches",
        VISSL_2000,
    )
    assert cfg.DATA.TRAIN.COLLATE_FUNCTION == "siamese_collator"
    heads = cfg.MODEL.HEAD.PARAMS
    assert heads[0][1]["dims"] == [2048, 1000]
    assert heads[1] == ["siamese_concat_view", {"num_towers": 9}]
    assert heads[2][1]["dims"] == [9 * 1000, 2000]  # one logit per permutation
    _, loss, schedules, _ = _build(cfg)
    assert isinstance(loss, CrossEntropyMultipleOutputSingleTargetLoss)
    assert peak == pytest.approx(0.1 * images / 256)
    epochs = int(cfg.OPTIMIZER.num_epochs)
    assert epochs == 105

    def lr(epoch: float) -> float:
        return float(schedules.values(epoch / epochs)["lr"])

    assert lr(0.0) == pytest.approx(warm_start)
    assert lr(5.0) == pytest.approx(peak, rel=1e-3)
    for start, end, value in [(5, 30, peak), (30, 60, peak / 10), (60, 90, peak / 100)]:
        assert lr(start + 0.01) == pytest.approx(value, rel=1e-3)
        assert lr(end - 0.01) == pytest.approx(value, rel=1e-3)
    assert lr(95) == pytest.approx(peak / 1000) and lr(104.9) == pytest.approx(peak / 10000)


@pytest.mark.slow
def test_one_jigsaw_step_on_a_300_by_400_image(perms_2000: str) -> None:
    """Resize, crop, patches, permutations, siamese_collator, ResNet-50 and the head
    chain fit end to end: 9 patches of 64 px per image, 2000 logits per image."""
    name = "pretrain/jigsaw/jigsaw_8gpu_resnet50"
    cfg = _compose(name, f"config.DATA.TRAIN.TRANSFORMS.{SHUFFLE}.perm_file={perms_2000}")
    data, logits = _one_step(cfg)
    assert data.shape == (18, 3, 64, 64)
    assert logits.shape == (2, 2000)


def _one_step(cfg) -> tuple[torch.Tensor, torch.Tensor]:
    model, loss, _, _ = _build(cfg)
    torch.manual_seed(0)
    chain = build_transforms(cfg.DATA.TRAIN.TRANSFORMS)
    samples = []
    for i in range(2):
        image = torch.randint(0, 256, (3, 300, 400), dtype=torch.uint8)
        samples.append(chain({"data": [image], "label": [0], "data_valid": [1], "data_idx": [i]}))
    out = build_collate_fn(cfg, "TRAIN")(samples)
    data, label = out["data"][0], out["label"][0]
    assert label.shape == (2,) and all(0 <= int(x) < 2000 for x in label)
    model.train()
    logits = model(data)
    value = loss(logits, label)
    value.backward()
    assert math.isfinite(value.item())
    return data, logits[0]


@needs_vissl_configs
def test_vissls_own_jigsaw_config_runs_a_step_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, perms_2000: str
) -> None:
    """VISSL's pretrain/jigsaw/jigsaw_8gpu_resnet.yaml, but for its permutation URL (a
    local file of 2000 instead): composes, builds and trains a step on the CPU."""
    name = copy_vissl_config(tmp_path, "pretrain/jigsaw/jigsaw_8gpu_resnet.yaml", monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # VISSL's MMAP_MODE etc.
        _, cfg = hydra_compose_and_validate(
            [
                f"config={name}",
                f"config.DATA.TRAIN.TRANSFORMS.{SHUFFLE}.perm_file={perms_2000}",
            ]
        )
    data, logits = _one_step(cfg)
    assert data.shape == (18, 3, 64, 64) and logits.shape == (2, 2000)

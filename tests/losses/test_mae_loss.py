"""mae_loss against MAE's formula written out here patch by patch (float64, loops), its
gradient only on the masked patches, its config inference and errors; the tiny MAE model
under bf16 autocast."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses.build import build_loss
from vissl.losses.mae_loss import MAELoss
from vissl.models import build_model
from vissl.models.token_masking import patchify, unpatchify
from vissl.utils.hydra_config import hydra_compose_and_validate


def reference_loss(
    pred: torch.Tensor, images: torch.Tensor, mask: torch.Tensor, p: int, norm: bool
) -> float:
    """The paper's loss, one patch at a time: the patch of image n at grid (r, c) is
    ``images[n, :, r p:(r+1) p, c p:(c+1) p]`` flattened in (row, column, channel) order;
    with ``norm`` it is standardised by its mean and unbiased variance (+1e-6); the loss is
    the mean over masked patches of the mean squared error over the patch's values."""
    n_img, _, height, width = images.shape
    total, count = 0.0, 0
    for n in range(n_img):
        for r in range(height // p):
            for c in range(width // p):
                if not bool(mask[n, r, c]):
                    continue
                patch = images[n, :, r * p : (r + 1) * p, c * p : (c + 1) * p].double()
                values = patch.permute(1, 2, 0).reshape(-1)
                if norm:
                    k = values.numel()
                    mean = values.sum() / k
                    var = ((values - mean) ** 2).sum() / (k - 1)
                    values = (values - mean) / torch.sqrt(var + 1e-6)
                guess = pred[n, r * (width // p) + c].double()
                total += float(((guess - values) ** 2).mean())
                count += 1
    return total / count


@pytest.mark.parametrize("norm", [True, False])
def test_loss_matches_the_formula(norm: bool) -> None:
    torch.manual_seed(0)
    images = torch.randn(3, 3, 12, 8)
    mask = torch.rand(3, 3, 2) < 0.6
    pred = torch.randn(3, 6, 4 * 4 * 3)
    loss = MAELoss(norm_pix_loss=norm, patch_size=4)(pred, {"data": images, "mask": mask})
    assert loss.dtype == torch.float32
    assert float(loss) == pytest.approx(reference_loss(pred, images, mask, 4, norm), rel=1e-5)


def test_patchify_round_trips_and_follows_the_patch_order() -> None:
    images = torch.arange(2 * 3 * 8 * 12, dtype=torch.float32).reshape(2, 3, 8, 12)
    patches = patchify(images, 4)
    assert patches.shape == (2, 6, 48)
    # patch 4 = grid row 1, column 1; its first values are pixel (4, 4) in channels 0, 1, 2
    assert patches[1, 4, :3].tolist() == images[1, :, 4, 4].tolist()
    assert torch.equal(unpatchify(patches, 4, (2, 3)), images)


def test_only_the_masked_patches_get_gradients() -> None:
    torch.manual_seed(0)
    images = torch.randn(2, 3, 8, 8)
    mask = torch.tensor([[[True, False], [False, True]], [[False, False], [True, False]]])
    pred = torch.randn(2, 4, 48, requires_grad=True)
    MAELoss(patch_size=4)(pred, {"data": images, "mask": mask}).backward()
    assert pred.grad is not None
    touched = pred.grad.abs().sum(-1) > 0
    assert torch.equal(touched, mask.reshape(2, 4))


def test_a_perfect_prediction_has_zero_loss_and_constant_patches_are_zero_targets() -> None:
    images = torch.zeros(1, 3, 8, 8)
    images[0, :, :4, :4] = torch.randn(3, 4, 4)
    mask = torch.ones(1, 2, 2, dtype=torch.bool)
    target = patchify(images, 4)
    mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
    perfect = (target - mean) / (var + 1e-6).sqrt()
    assert float(MAELoss(patch_size=4)(perfect, {"data": images, "mask": mask})) < 1e-10
    # constant (background) patches normalise to 0: predicting 0 there costs nothing
    assert torch.equal(perfect[0, 1:], torch.zeros(3, 48))


def test_target_and_shape_errors() -> None:
    loss = MAELoss(patch_size=4)
    with pytest.raises(ConfigError, match="TARGET_KEY_NAMES"):
        loss(torch.zeros(1, 4, 48), torch.zeros(1))
    with pytest.raises(ValueError, match="prediction has shape"):
        loss(torch.zeros(1, 4, 12), {"data": torch.zeros(1, 3, 8, 8), "mask": torch.ones(1, 2, 2)})
    with pytest.raises(ConfigError, match="norm_pix_loss"):
        MAELoss(norm_pix_loss="yes")  # type: ignore[arg-type]


@functools.cache
def _quick() -> AttrDict:
    _, cfg = hydra_compose_and_validate(["config=test/integration_test/quick_mae"])
    return cfg


def quick_config() -> AttrDict:
    return copy.deepcopy(_quick())


def test_patch_size_comes_from_the_trunk_and_must_agree() -> None:
    cfg = quick_config()
    assert cfg.LOSS.mae_loss.patch_size == 4  # written by the config stage (the trunk's)
    assert build_loss(cfg.LOSS, cfg).patch_size == 4
    cfg.LOSS.mae_loss.patch_size = 8
    with pytest.raises(ConfigError, match="differs from the trunk"):
        build_loss(cfg.LOSS, cfg)
    cfg = quick_config()
    cfg.DATA.TRAIN.TRANSFORMS[-1].patch_size = 8
    with pytest.raises(ConfigError, match=r"TRANSFORMS\[4\].patch_size=8"):
        build_loss(cfg.LOSS, cfg)
    cfg = quick_config()
    cfg.DATA.TRAIN.TARGET_KEY_NAMES = ["label"]
    with pytest.raises(ConfigError, match=r"TARGET_KEY_NAMES: \[data, mask\]"):
        build_loss(cfg.LOSS, cfg)


def _batch(cfg: Any, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    from vissl.data.masking import random_mask

    torch.manual_seed(0)
    images = torch.randn(n, 3, 16, 16)
    mask = torch.stack([random_mask((4, 4), 0.75) for _ in range(n)])
    return images, mask


def test_bf16_autocast_forward_and_backward_without_nan() -> None:
    """The quick model under CPU bf16 autocast, with inputs scaled up (a stress on the
    per-patch normalisation): a finite loss in float32 and finite gradients everywhere."""
    cfg = quick_config()
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss_fn = build_loss(cfg.LOSS, cfg)
    images, mask = _batch(cfg)
    for scale in (1.0, 1000.0):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model({"data": images * scale, "mask": mask})
            assert out[0].dtype == torch.bfloat16
            loss = loss_fn(out, {"data": images * scale, "mask": mask})
        assert loss.dtype == torch.float32 and torch.isfinite(loss)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        with torch.no_grad():
            fp32 = loss_fn(
                model({"data": images * scale, "mask": mask}),
                {"data": images * scale, "mask": mask},
            )
        assert float(loss.detach()) == pytest.approx(float(fp32), rel=0.05)

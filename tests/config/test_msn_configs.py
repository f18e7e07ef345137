"""The MSN recipes compose with their settings (masking, head, loss, schedules, parameter
groups); the ViT-S/16 recipe's model, target encoder and loss run a forward and backward
pass at 224 px on the CPU; the quick model runs under bf16 autocast without NaN, also with
inputs scaled up a thousandfold."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from vissl.data.masking import random_mask
from vissl.losses.build import build_loss
from vissl.models import build_model
from vissl.optimizers import build_optimizer
from vissl.utils.hydra_config import hydra_compose_and_validate


@pytest.mark.parametrize(
    ("name", "width", "mask_ratio", "epochs"),
    [("msn_8gpu_vits16", 384, 0.15, 800), ("msn_8gpu_vitb16", 768, 0.3, 600)],
)
def test_recipes_compose_with_their_settings(
    name: str, width: int, mask_ratio: float, epochs: int
) -> None:
    _, cfg = hydra_compose_and_validate([f"config=pretrain/msn/{name}"])
    vit = cfg.MODEL.TRUNK.VISION_TRANSFORMERS
    assert (vit.PATCH_SIZE, vit.MASKED_IMAGE_MODELING.NAME, vit.DROP_PATH_RATE) == (16, "mae", 0)
    crops = cfg.DATA.TRAIN.TRANSFORMS[0]
    assert list(crops.size_crops) == [224, 96] and list(crops.num_crops) == [2, 10]
    masking = cfg.DATA.TRAIN.TRANSFORMS[-1]
    assert masking.name == "RandomPatchMasking" and masking.mask_ratio == mask_ratio
    assert list(masking.indices) == list(range(1, 12))  # every anchor view, focal ones too
    assert "focal_mask" in cfg.DATA.TRAIN.INPUT_KEY_NAMES
    assert cfg.MODEL.MULTI_INPUT_HEAD_MAPPING[1][1]["additional_keys"] == {"mask": "focal_mask"}
    head, params = cfg.MODEL.HEAD.PARAMS[0]
    assert head == "msn_head" and params.in_dim == width and params.num_prototypes == 1024
    assert (params.hidden_dim, params.output_dim, params.use_bn) == (2048, 256, True)
    loss = build_loss(cfg.LOSS, cfg)
    assert (loss.temperature, loss.target_temperature, loss.momentum) == (0.1, 0.025, 0.996)
    assert loss.use_sinkhorn and loss.me_max_weight == 1.0 and loss.output_dim == 1024
    opt = cfg.OPTIMIZER
    assert opt.num_epochs == epochs
    lr = opt.param_schedulers.lr
    assert math.isclose(lr.lengths[0] * epochs, 15)  # warm-up epochs
    assert (lr.schedulers[0].start_value, lr.schedulers[0].end_value) == (0.0002, 0.001)
    wd = opt.param_schedulers.weight_decay
    assert (wd.start_value, wd.end_value) == (0.04, 0.4)
    if width == 384:  # the optimizer: no weight decay on the prototypes, the BN, the biases
        model = build_model(cfg.MODEL, cfg.OPTIMIZER)
        optimizer = build_optimizer(cfg.OPTIMIZER, model)
        names = {id(p): n for n, p in model.named_parameters()}
        decayed = {
            names[id(p)] for g in optimizer.param_groups if g["weight_decay"] for p in g["params"]
        }
        assert "heads.0.prototypes" not in decayed and "heads.0.fc.bn1.weight" not in decayed
        # MSN's init_opt decays every parameter of 2 or more dimensions, the embeddings too
        assert "heads.0.fc.fc1.weight" in decayed and "trunk.pos_embed" in decayed


def _inputs(batch: int, size: int, focal: int, focal_size: int, patch: int, ratio: float) -> dict:
    torch.manual_seed(0)
    grid = (size // patch, size // patch)
    out: dict[str, Any] = {
        "target_views": torch.randn(batch, 3, size, size),
        "anchor_views": torch.randn(batch, 3, size, size),
        "mask": torch.stack([random_mask(grid, ratio) for _ in range(batch)]),
    }
    if focal:
        out["focal_views"] = torch.randn(focal * batch, 3, focal_size, focal_size)
        focal_grid = (focal_size // patch, focal_size // patch)
        out["focal_mask"] = torch.stack(
            [random_mask(focal_grid, ratio) for _ in range(focal * batch)]
        )
    return out


@pytest.mark.slow
def test_vit_s16_recipe_forward_and_backward_at_224_px_on_cpu() -> None:
    """2 images: the model on the masked anchors and 2 masked focal views each (of the recipe's
    10), the target encoder on the whole target views, the loss, the backward pass."""
    _, cfg = hydra_compose_and_validate(
        ["config=pretrain/msn/msn_8gpu_vits16", "config.MACHINE.DEVICE=cpu"]
    )
    cfg.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN = False  # no process group here
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss_fn = build_loss(cfg.LOSS, cfg)
    loss_fn.bind_model(model)
    inputs = _inputs(2, 224, 2, 96, 16, 0.15)
    with torch.no_grad():
        loss_fn.teacher_output = loss_fn.run_teacher(inputs)
    out = model(inputs)
    assert [tuple(o.shape) for o in out] == [(2, 1024), (4, 1024)]
    result = loss_fn(out)
    assert all(torch.isfinite(v) for v in result.values())
    result["loss"].backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(p.numel() for p in model.trunk.parameters()) == 21_665_664  # ViT-S/16


def test_bf16_autocast_forward_and_backward_without_nan() -> None:
    """The quick model and target encoder under CPU bf16 autocast, with inputs scaled up (a
    stress on the 0.025 target temperature, Sinkhorn and the me-max): finite float32 losses
    and gradients, close to the float32 loss."""
    _, cfg = hydra_compose_and_validate(["config=test/integration_test/quick_msn"])
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss_fn = build_loss(cfg.LOSS, cfg)
    loss_fn.bind_model(model)
    base = _inputs(8, 16, 2, 8, 4, 0.5)
    for scale in (1.0, 1000.0):
        inputs = {k: v if k.endswith("mask") else v * scale for k, v in base.items()}
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.no_grad():
                loss_fn.teacher_output = loss_fn.run_teacher(inputs)
            out = model(inputs)
            result = loss_fn(out)
        assert result["loss"].dtype == torch.float32
        assert all(torch.isfinite(v) for v in result.values())
        result["loss"].backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        with torch.no_grad():
            loss_fn.teacher_output = loss_fn.run_teacher(inputs)
            fp32 = loss_fn(model(inputs))["loss"]
        assert float(result["loss"].detach()) == pytest.approx(float(fp32), rel=0.1)

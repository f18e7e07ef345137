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
    assert list(masking.indices) == [1]  # the anchor view only, as MSN's deit.py
    assert "focal_mask" not in cfg.DATA.TRAIN.INPUT_KEY_NAMES
    assert dict(cfg.MODEL.MULTI_INPUT_HEAD_MAPPING[1][1]) == {"feat_names": ["lastCLS"]}
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


@pytest.mark.parametrize(
    "name",
    [
        "pretrain/msn/msn_8gpu_vits16",
        "pretrain/msn/msn_8gpu_vitb16",
        "digits/msn",
        "test/integration_test/quick_msn",
    ],
)
def test_only_the_anchor_views_are_masked_as_in_msns_code(name: str) -> None:
    """facebookresearch/msn ``src/deit.py::VisionTransformer.forward`` drops patches of the
    first group of crops (the 224 px rand_views) and sets ``patch_drop = 0.`` for the focal
    views. The recipe's own transforms on one image, then msn_collator: a mask for each
    anchor view, none for the focal views (no ``focal_mask``)."""
    from PIL import Image

    from vissl.data import build_transforms, get_collator

    _, cfg = hydra_compose_and_validate([f"config={name}", "config.MACHINE.DEVICE=cpu"])
    transforms = list(cfg.DATA.TRAIN.TRANSFORMS)
    crops = transforms[0]
    anchors = int(crops.num_crops[0]) - 1  # crop 0 is the target
    masking = [t for t in transforms if t.name == "RandomPatchMasking"]
    assert [list(t.indices) for t in masking] == [list(range(1, 1 + anchors))]
    image = Image.fromarray(
        (torch.rand(int(crops.size_crops[0]), int(crops.size_crops[0]), 3) * 255)
        .to(torch.uint8)
        .numpy()
    )
    # the crops and the masks (the photometric transforms left out: not what is tested)
    kept = ("ImgPilToMultiCrop", "ToTensor", "RandomPatchMasking")
    chain = build_transforms([dict(t) for t in transforms if t.name in kept])
    samples = [
        chain({"data": [image], "label": [0], "data_valid": [1], "data_idx": [i]}) for i in range(2)
    ]
    batch = get_collator("msn_collator")(samples)
    assert "focal_views" in batch and "focal_mask" not in batch
    assert batch["mask"][0].shape[0] == 2 * anchors
    assert set(cfg.DATA.TRAIN.INPUT_KEY_NAMES) <= set(batch)


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
    return out


@pytest.mark.slow
def test_vit_s16_recipe_forward_and_backward_at_224_px_on_cpu() -> None:
    """2 images: the model on the masked anchors and 2 whole focal views each (of the recipe's
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
        teacher_output = loss_fn.run_teacher(inputs)
    out = model(inputs)
    assert [tuple(o.shape) for o in out] == [(2, 1024), (4, 1024)]
    result = loss_fn(out, teacher_output=teacher_output)
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
                teacher_output = loss_fn.run_teacher(inputs)
            out = model(inputs)
            result = loss_fn(out, teacher_output=teacher_output)
        assert result["loss"].dtype == torch.float32
        assert all(torch.isfinite(v) for v in result.values())
        result["loss"].backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        with torch.no_grad():
            teacher_output = loss_fn.run_teacher(inputs)
            fp32 = loss_fn(model(inputs), teacher_output=teacher_output)["loss"]
        assert float(result["loss"].detach()) == pytest.approx(float(fp32), rel=0.1)

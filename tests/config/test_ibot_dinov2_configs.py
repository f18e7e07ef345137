"""The iBOT and DINOv2 recipes compose with their settings; each ViT-S/16 recipe's model,
teacher and loss run a forward and backward pass at 224 px on the CPU; the quick models
run under bf16 autocast without NaN, also with inputs scaled up a thousandfold."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from vissl.data.masking import block_mask
from vissl.losses.build import build_loss
from vissl.models import build_model
from vissl.utils.hydra_config import hydra_compose_and_validate

ITERS_PER_EPOCH = 1281167 // 8 // 64  # 8 ranks x 64 (the sampler rounds up: 160146 // 64)


@pytest.mark.parametrize(
    ("name", "width", "peak", "out_dim"),
    [
        ("ibot/ibot_8gpu_vits16", 384, 0.0005 * 512 / 256, 8192),
        ("ibot/ibot_8gpu_vitb16", 768, 0.00075 * 512 / 256, 8192),
        ("dinov2/dinov2_8gpu_vits16", 384, 0.004 * math.sqrt(512 / 1024), 65536),
        ("dinov2/dinov2_8gpu_vitb16", 768, 0.004 * math.sqrt(512 / 1024), 65536),
    ],
)
def test_recipes_compose_with_their_settings(
    name: str, width: int, peak: float, out_dim: int
) -> None:
    _, cfg = hydra_compose_and_validate([f"config=pretrain/{name}"])
    vit = cfg.MODEL.TRUNK.VISION_TRANSFORMERS
    assert (vit.PATCH_SIZE, vit.MASKED_IMAGE_MODELING.NAME, vit.name) == (
        16,
        "ibot",
        "small" if width == 384 else "base",
    )
    masking = cfg.DATA.TRAIN.TRANSFORMS[-1]
    assert masking.name == "MaskedImageModeling" and masking.patch_size == 16
    assert list(masking.pred_ratio_mean) == [0.0, 0.3] and list(masking.pred_ratio_var) == [
        0.0,
        0.2,
    ]
    head, params = cfg.MODEL.HEAD.PARAMS[0]
    assert head == "ibot_head" and params.in_dim == width and params.out_dim == out_dim
    opt = cfg.OPTIMIZER
    batch = cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA * cfg.DISTRIBUTED.NUM_PROC_PER_NODE
    assert batch == 512 and ITERS_PER_EPOCH == 2502
    assert math.isclose(opt.param_schedulers.lr.schedulers[0].end_value, peak, rel_tol=1e-4)
    # DINOv2 counts epochs of 1250 iterations at batch 2048, two passes over ImageNet-1k
    # each: its 100 / 10 / 30 / 1 epochs are our 200 / 20 / 60 / 2; iBOT's are ours
    per = 1 if name.startswith("ibot") else 2
    assert int(opt.num_epochs) == 100 * per
    assert math.isclose(opt.param_schedulers.lr.lengths[0] * opt.num_epochs, 10 * per)
    wd = opt.param_schedulers.weight_decay
    assert (wd.start_value, wd.end_value) == (0.04, 0.4)
    frozen = dict(cfg.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP)
    assert frozen["module.heads.0.prototypes0.weight"] == per * ITERS_PER_EPOCH
    loss = build_loss(cfg.LOSS, cfg)
    if name.startswith("ibot"):
        assert (loss.num_global_crops, loss.num_local_crops) == (2, 10)
        assert loss.warmup_teacher_temp == 0.04 and loss.teacher_temp_final == 0.07
    else:
        assert (loss.num_global_crops, loss.num_local_crops) == (2, 8)
        assert loss.warmup_teacher_temp_iters == 60 * ITERS_PER_EPOCH
        assert (loss.momentum, loss.koleo_loss_weight) == (0.992, 0.1)
        assert (vit.NUM_REGISTER_TOKENS, vit.INIT_VALUES) == (4, 1e-5)
        assert opt.param_group_constructor == "lr_decay" and opt.layer_wise_lr_decay.decay == 0.9


def _masks(n: int, grid: tuple[int, int], seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.stack([block_mask(grid, int(grid[0] * grid[1] * 0.3)) for _ in range(n)])


def _inputs(globals_: int, locals_: int, size: int, local_size: int, patch: int) -> dict[str, Any]:
    torch.manual_seed(0)
    grid = (size // patch, size // patch)
    out: dict[str, Any] = {
        "global_views": torch.randn(globals_, 3, size, size),
        "mask": _masks(globals_, grid),
    }
    if locals_:
        out["local_views"] = torch.randn(locals_, 3, local_size, local_size)
    return out


@pytest.mark.parametrize("name", ["ibot/ibot_8gpu_vits16", "dinov2/dinov2_8gpu_vits16"])
def test_vit_s16_recipe_forward_and_backward_at_224_px_on_cpu(name: str) -> None:
    """One image: the student on its 2 masked global crops and its local crops, the teacher
    on the unmasked global crops, the loss, the backward pass."""
    _, cfg = hydra_compose_and_validate([f"config=pretrain/{name}", "config.MACHINE.DEVICE=cpu"])
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss_fn = build_loss(cfg.LOSS, cfg)
    loss_fn.bind_model(model)
    loss_fn.set_schedule_position(0, 0)
    loss_fn.num_local_crops = 2  # of the recipe's 10 or 8: the same model, less CPU time
    inputs = _inputs(2, 2, 224, 96, 16)
    with torch.no_grad():
        teacher_output = loss_fn.run_teacher(inputs)
    out = model(inputs)
    assert out[0][0].shape == (2, loss_fn.out_dim)
    result = loss_fn(out, inputs["mask"], teacher_output=teacher_output)
    assert all(torch.isfinite(v) for v in result.values())
    result["loss"].backward()
    grads = [p.grad for p in model.trunk.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.trunk.patch_masking.masked_embed.grad.abs().sum() > 0
    assert sum(p.numel() for n, p in model.trunk.named_parameters() if "blocks" in n) > 21e6


@pytest.mark.parametrize("name", ["quick_ibot", "quick_dinov2"])
def test_bf16_autocast_forward_and_backward_without_nan(name: str) -> None:
    """The quick model and teacher under CPU bf16 autocast, with inputs scaled up (a
    stress on the softmaxes and the centers): finite float32 losses and gradients, close
    to the float32 loss."""
    _, cfg = hydra_compose_and_validate([f"config=test/integration_test/{name}"])
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss_fn = build_loss(cfg.LOSS, cfg)
    loss_fn.bind_model(model)
    loss_fn.set_schedule_position(0, 0)
    base = _inputs(8, 8, 16, 8, 4)
    for scale in (1.0, 1000.0):
        inputs = {k: v * scale if k != "mask" else v for k, v in base.items()}
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.no_grad():
                teacher_output = loss_fn.run_teacher(inputs)
            out = model(inputs)
            assert out[0][0].dtype == torch.bfloat16
            result = loss_fn.eval()(out, inputs["mask"], teacher_output=teacher_output)
        assert result["loss"].dtype == torch.float32
        assert all(torch.isfinite(v) for v in result.values())
        result["loss"].backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        with torch.no_grad():
            teacher_output = loss_fn.run_teacher(inputs)
            fp32 = loss_fn(model(inputs), inputs["mask"], teacher_output=teacher_output)["loss"]
        assert float(result["loss"].detach()) == pytest.approx(float(fp32), rel=0.1)

"""The I-JEPA recipes compose and hold the paper's settings; the ViT-S/16 recipe's model,
target encoder and loss run a forward and backward pass at 224 px on the CPU; the
predictor builds its sequence as I-JEPA does (context tokens with their positions, then a
mask token at each target patch's position, per block)."""

from __future__ import annotations

import pytest
import torch

from vissl.data.collators.ijepa_multiblock_collator import multiblock_masks, multiblock_settings
from vissl.errors import ConfigError
from vissl.losses.build import build_loss
from vissl.models import build_model
from vissl.models.heads.ijepa_predictor import IJEPAPredictor
from vissl.models.token_masking import sincos_2d_position_embedding
from vissl.utils.hydra_config import hydra_compose_and_validate


@pytest.mark.parametrize(
    ("name", "preset", "width", "heads", "epochs"),
    [("ijepa_8gpu_vits16", "small", 384, 6, 300), ("ijepa_8gpu_vitb16", "base", 768, 12, 600)],
)
def test_recipes_compose_with_the_paper_settings(
    name: str, preset: str, width: int, heads: int, epochs: int
) -> None:
    _, cfg = hydra_compose_and_validate([f"config=pretrain/ijepa/{name}"])
    vit = cfg.MODEL.TRUNK.VISION_TRANSFORMERS
    assert (vit.name, vit.PATCH_SIZE, vit.USE_CLASS_TOKEN, vit.MASKED_IMAGE_MODELING.NAME) == (
        preset,
        16,
        False,
        "mae",
    )
    masks = cfg.DATA.TRAIN.COLLATE_FUNCTION_PARAMS
    assert cfg.DATA.TRAIN.COLLATE_FUNCTION == "ijepa_multiblock_collator"
    assert (masks.num_target_blocks, list(masks.target_scale), list(masks.target_aspect_ratio)) == (
        4,
        [0.15, 0.2],
        [0.75, 1.5],
    )
    assert list(masks.context_scale) == [0.85, 1.0] and not masks.allow_overlap
    crop = cfg.DATA.TRAIN.TRANSFORMS[0]
    assert (crop.name, list(crop.scale)) == ("RandomResizedCrop", [0.3, 1.0])
    _, params = cfg.MODEL.HEAD.PARAMS[0]
    assert (params.in_dim, params.predictor_dim, params.num_heads) == (width, 384, heads)
    opt = cfg.OPTIMIZER
    assert cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA * cfg.DISTRIBUTED.NUM_PROC_PER_NODE == 2048
    assert opt.num_epochs == epochs
    lr = opt.param_schedulers.lr
    assert lr.schedulers[0].end_value == 0.001 and lr.schedulers[1].end_value == 1e-6
    assert lr.lengths[0] * epochs == pytest.approx(15)  # 15 warm-up epochs
    wd = opt.param_schedulers.weight_decay
    assert (wd.start_value, wd.end_value) == (0.04, 0.4)
    loss = cfg.LOSS.ijepa_loss
    assert (loss.momentum, loss.final_momentum) == (0.996, 1.0)


def test_vit_s16_ijepa_forward_and_backward_at_224_px_on_cpu() -> None:
    """The ViT-S/16 recipe's model, target encoder and loss on one image of 224 px."""
    _, cfg = hydra_compose_and_validate(
        ["config=pretrain/ijepa/ijepa_8gpu_vits16", "config.MACHINE.DEVICE=cpu"]
    )
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss_fn = build_loss(cfg.LOSS, cfg)
    loss_fn.bind_model(model)
    settings = multiblock_settings(dict(cfg.DATA.TRAIN.COLLATE_FUNCTION_PARAMS))
    context, targets = multiblock_masks(1, (14, 14), settings, torch.Generator().manual_seed(0))
    images = torch.randn(1, 3, 224, 224)
    (pred,) = model({"data": images, "mask": ~context, "target_masks": targets})
    k = int(targets[0, 0].sum())
    assert pred.shape == (4, k, 384)
    loss = loss_fn(pred, targets, teacher_output=loss_fn.run_target_encoder(images))
    assert torch.isfinite(loss) and 0.01 < float(loss.detach()) < 2  # smooth L1 of ~N(0, 1)
    loss.backward()
    trunk_grads = [p.grad for p in model.trunk.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in trunk_grads)
    # the fixed sin-cos position embedding (POS_EMBED: sincos) is the only frozen one
    assert [n for n, p in model.trunk.named_parameters() if not p.requires_grad] == ["pos_embed"]
    assert model.trunk.pos_embed.grad is None
    assert model.heads[0].mask_token.grad is not None
    # ViT-S/16 (MAE's 21,665,664) less the class token and its position embedding
    assert sum(p.numel() for p in model.trunk.parameters()) == 21_665_664 - 2 * 384


def test_predictor_builds_the_sequence_of_i_jepa() -> None:
    torch.manual_seed(0)
    predictor = IJEPAPredictor({}, in_dim=12, predictor_dim=8, depth=1, num_heads=2)
    predictor.eval()
    grid = (3, 4)
    settings = multiblock_settings(
        {"num_target_blocks": 2, "target_scale": [0.2, 0.3], "min_context_patches": 1}
    )
    context, targets = multiblock_masks(2, grid, settings, torch.Generator().manual_seed(1))
    kc, kt = int(context[0].sum()), int(targets[0, 0].sum())
    x = torch.randn(2, kc, 12)
    out = predictor(x, ~context, targets)
    assert out.shape == (2 * 2, kt, 12)
    with torch.no_grad():  # by hand, block by block
        pos = sincos_2d_position_embedding(*grid, 8)
        for m in range(2):
            for n in range(2):
                ctx = torch.nonzero(context[n].flatten()).flatten()
                tgt = torch.nonzero(targets[n, m].flatten()).flatten()
                seq = torch.cat(
                    [predictor.predictor_embed(x[n]) + pos[ctx], predictor.mask_token[0] + pos[tgt]]
                )
                y = predictor.predictor_norm(predictor.predictor_blocks[0](seq[None]))[0]
                expected = predictor.predictor_proj(y[kc:])
                torch.testing.assert_close(out[m * 2 + n], expected)
    with pytest.raises(ValueError, match="lastPATCH"):
        predictor(torch.randn(2, kc + 1, 12), ~context, targets)
    with pytest.raises(ConfigError, match="divisible"):
        IJEPAPredictor({}, in_dim=12, predictor_dim=10, num_heads=2)


def test_digits_probe_and_fine_tune_build_the_trunk_digits_ijepa_trains() -> None:
    """The kNN probe and the fine-tuning config of a digits/ijepa checkpoint load its trunk
    into the same ViT (a different width or patch size would not load, or load elsewhere)."""
    keys = ("IMAGE_SIZE", "PATCH_SIZE", "HIDDEN_DIM", "NUM_LAYERS", "NUM_HEADS", "MLP_DIM")
    keys += ("QKV_BIAS", "USE_CLASS_TOKEN", "CLASSIFIER")
    trunks, cfgs = [], []
    for name in (
        "digits/ijepa",
        "benchmark/nearest_neighbor/digits/nn_digits_ijepa",
        "benchmark/fulltune/digits/ijepa_fulltune_digits",
    ):
        _, cfg = hydra_compose_and_validate([f"config={name}"])
        vit = cfg.MODEL.TRUNK.VISION_TRANSFORMERS
        trunks.append({k: vit[k] for k in keys})
        cfgs.append(cfg)
    assert trunks[0] == trunks[1] == trunks[2]
    assert (trunks[0]["PATCH_SIZE"], trunks[0]["USE_CLASS_TOKEN"]) == (2, False)
    tune = cfgs[2]
    assert list(tune.MODEL.WEIGHTS_INIT.SKIP_LAYERS) == ["heads."]
    assert list(tune.MODEL.HEAD.PARAMS[0][1]["dims"]) == [trunks[0]["HIDDEN_DIM"], 10]

"""The MAE recipes compose and hold the paper's settings; the ViT-S/16 recipe's model runs
a forward and backward pass at 224 px on the CPU; the decoder puts every token where the
mask says, with the fixed sin-cos position embedding."""

from __future__ import annotations

import math

import pytest
import torch

from vissl.data.masking import random_mask
from vissl.losses.build import build_loss
from vissl.models import build_model
from vissl.models.heads.mae_decoder import MAEDecoder
from vissl.models.token_masking import sincos_2d_position_embedding
from vissl.utils.hydra_config import hydra_compose_and_validate


@pytest.mark.parametrize(
    ("name", "width", "decoder", "micro"),
    [("mae_8gpu_vits16", 384, (256, 4, 8), 512), ("mae_8gpu_vitb16", 768, (512, 8, 16), 256)],
)
def test_recipes_compose_with_the_paper_settings(
    name: str, width: int, decoder: tuple[int, int, int], micro: int
) -> None:
    _, cfg = hydra_compose_and_validate([f"config=pretrain/mae/{name}"])
    vit = cfg.MODEL.TRUNK.VISION_TRANSFORMERS
    assert (vit.name, vit.PATCH_SIZE, vit.MASKED_IMAGE_MODELING.NAME) == (
        "small" if width == 384 else "base",
        16,
        "mae",
    )
    masking = cfg.DATA.TRAIN.TRANSFORMS[-1]
    assert (masking.name, masking.mask_ratio, masking.patch_size) == (
        "RandomPatchMasking",
        0.75,
        16,
    )
    _, params = cfg.MODEL.HEAD.PARAMS[0]
    assert (params.in_dim, params.decoder_dim, params.decoder_depth, params.decoder_num_heads) == (
        width,
        *decoder,
    )
    opt = cfg.OPTIMIZER
    batch = micro * cfg.DISTRIBUTED.NUM_PROC_PER_NODE * opt.GRAD_ACCUMULATION_STEPS
    assert batch == 4096 and list(opt.betas) == [0.9, 0.95] and opt.weight_decay == 0.05
    peak = opt.param_schedulers.lr.schedulers[0].end_value
    assert math.isclose(peak, 1.5e-4 * batch / 256)
    assert math.isclose(opt.param_schedulers.lr.lengths[0] * opt.num_epochs, 40)
    assert cfg.LOSS.mae_loss.norm_pix_loss is True


def test_vit_s16_mae_forward_and_backward_at_224_px_on_cpu() -> None:
    """The ViT-S/16 recipe's model and loss, 2 images of 224 px, 75% masked."""
    _, cfg = hydra_compose_and_validate(
        ["config=pretrain/mae/mae_8gpu_vits16", "config.MACHINE.DEVICE=cpu"]
    )
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss_fn = build_loss(cfg.LOSS, cfg)
    images = torch.randn(2, 3, 224, 224)
    mask = torch.stack([random_mask((14, 14), 0.75) for _ in range(2)])
    (pred,) = model({"data": images, "mask": mask})
    assert pred.shape == (2, 196, 16 * 16 * 3)
    loss = loss_fn(pred, {"data": images, "mask": mask})
    assert torch.isfinite(loss) and 0.5 < float(loss.detach()) < 5  # ~1 + var(pred) at first
    loss.backward()
    trunk_grads = [p.grad for p in model.trunk.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in trunk_grads)
    # the fixed sin-cos position embedding (POS_EMBED: sincos) is the only frozen one
    assert [n for n, p in model.trunk.named_parameters() if not p.requires_grad] == ["pos_embed"]
    assert model.trunk.pos_embed.grad is None
    assert model.heads[0].mask_token.grad is not None
    assert sum(p.numel() for p in model.trunk.parameters()) == 21_665_664  # ViT-S/16


def test_sincos_embedding_formula() -> None:
    dim, h, w = 8, 3, 5
    emb = sincos_2d_position_embedding(h, w, dim)
    assert emb.shape == (h * w, dim)
    row, col = 2, 3
    quarter = dim // 4
    omegas = [1.0 / 10000 ** (k / quarter) for k in range(quarter)]
    expected = (
        [math.sin(row * o) for o in omegas]
        + [math.cos(row * o) for o in omegas]
        + [math.sin(col * o) for o in omegas]
        + [math.cos(col * o) for o in omegas]
    )
    assert emb[row * w + col].tolist() == pytest.approx(expected, abs=1e-6)


def test_decoder_puts_visible_tokens_back_and_fills_the_rest_with_the_mask_token() -> None:
    torch.manual_seed(0)
    cfg = {"TRUNK": {"VISION_TRANSFORMERS": {"PATCH_SIZE": 4}}, "INPUT_TYPE": "rgb"}
    decoder = MAEDecoder(cfg, in_dim=12, decoder_dim=8, decoder_depth=1, decoder_num_heads=2)
    decoder.eval()
    mask = torch.stack([random_mask((2, 3), 0.5) for _ in range(2)])  # 3 visible of 6
    x = torch.randn(2, 1 + 3, 12)
    out = decoder(x, mask)
    assert out.shape == (2, 6, 4 * 4 * 3)
    with torch.no_grad():  # by hand, position by position
        pos = sincos_2d_position_embedding(2, 3, 8)
        rows = []
        for n in range(2):
            embedded = decoder.decoder_embed(x[n])
            seq, k = [embedded[0]], 1
            for j in range(6):
                if bool(mask[n].flatten()[j]):
                    seq.append(decoder.mask_token[0, 0] + pos[j])
                else:
                    seq.append(embedded[k] + pos[j])
                    k += 1
            rows.append(torch.stack(seq))
        tokens = torch.stack(rows)
        tokens = decoder.decoder_norm(decoder.decoder_blocks[0](tokens))
        expected = decoder.decoder_pred(tokens[:, 1:])
    torch.testing.assert_close(out, expected)
    with pytest.raises(ValueError, match="lastBLK"):
        decoder(torch.randn(2, 9, 12), mask)

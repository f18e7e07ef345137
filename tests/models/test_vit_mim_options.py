"""vision_transformer options of the masked-image methods: the unchanged default layout,
USE_CLASS_TOKEN, register tokens, layer scale (INIT_VALUES), PATCH features and the
patch masks (MASKED_IMAGE_MODELING: mae drops the masked patches, ibot replaces them by a
learned token, msn drops patches itself in training as VISSL's), checked against sequences
built by hand; and MULTI_INPUT_HEAD_MAPPING's dict form that hands the mask to the trunk
(also under another name)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.models.test_vision_transformer import DIM, KEY, model_config, trunk
from vissl.data.masking import random_mask
from vissl.errors import ConfigError
from vissl.models import build_model
from vissl.models.trunks.vision_transformer import Block, VisionTransformer, parse_vit_config

# the tiny test trunk: 32 px images, 4 px patches (8 x 8 grid), width 32, 2 blocks
GRID = 8


def images(n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def masks(n: int = 2, ratio: float = 0.75, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.stack([random_mask((GRID, GRID), ratio) for _ in range(n)])


def vit(**options: Any) -> VisionTransformer:
    torch.manual_seed(0)
    return trunk(**options).eval()


def test_default_layout_and_random_init_are_unchanged_by_the_new_options() -> None:
    """Off by default: the same parameter names and shapes as before, and turning the
    options on leaves the other parameters' random init as it was."""
    base = vit()
    names = {n for n, _ in base.named_parameters()}
    assert {"cls_token", "pos_embed", "norm.weight"} <= names
    assert not any(("ls1" in n) or ("register" in n) or ("masked_embed" in n) for n in names)
    assert base.pos_embed.shape == (1, 1 + GRID * GRID, DIM)
    rich = vit(NUM_REGISTER_TOKENS=2, INIT_VALUES=0.1, MASKED_IMAGE_MODELING={"NAME": "ibot"})
    rich_state = rich.state_dict()
    assert all(torch.equal(t, rich_state[n]) for n, t in base.state_dict().items())
    assert set(rich_state) - set(base.state_dict()) == {
        "register_tokens",
        "patch_masking.masked_embed",
        *(f"blocks.{i}.ls{j}.gamma" for i in range(2) for j in (1, 2)),
    }


def test_no_class_token() -> None:
    model = vit(USE_CLASS_TOKEN=False, CLASSIFIER="gap")
    assert model.cls_token is None and model.pos_embed.shape == (1, GRID * GRID, DIM)
    x = images()
    blk, patch, pool = model(x, ["lastBLK", "lastPATCH", "lastPOOL"])
    assert blk.shape == patch.shape == (2, GRID * GRID, DIM)
    torch.testing.assert_close(blk, patch)
    torch.testing.assert_close(pool, patch.mean(1))
    with pytest.raises(ConfigError, match="USE_CLASS_TOKEN") as e:
        model(x, ["lastCLS"])
    assert e.value.key_path == f"{KEY}.USE_CLASS_TOKEN"
    with pytest.raises(ConfigError, match="CLASSIFIER: gap"):
        parse_vit_config({"USE_CLASS_TOKEN": False})
    # other input sizes interpolate the patch embedding only
    assert model(torch.randn(1, 3, 16, 24), ["lastMAP"])[0].shape == (1, DIM, 4, 6)


def test_register_tokens_join_the_attention_but_no_output() -> None:
    model = vit(NUM_REGISTER_TOKENS=3)
    assert model.register_tokens is not None and model.register_tokens.shape == (1, 3, DIM)
    x = images()
    blk, cls, patch = model(x, ["lastBLK", "lastCLS", "lastPATCH"])
    assert blk.shape == (2, 1 + GRID * GRID, DIM)
    torch.testing.assert_close(blk, torch.cat([cls[:, None], patch], 1))
    # by hand: [cls + pos0, registers (no position), patches + pos], the blocks, the norm
    with torch.no_grad():
        pos = model.pos_embed
        tokens = torch.cat(
            [
                (model.cls_token + pos[:, :1]).expand(2, -1, -1),
                model.register_tokens.expand(2, -1, -1),
                model.patch_embed(x) + pos[:, 1:],
            ],
            1,
        )
        for block in model.blocks:
            tokens = block(tokens)
        tokens = model.norm(tokens)
    torch.testing.assert_close(patch, tokens[:, 4:])
    torch.testing.assert_close(cls, tokens[:, 0])
    with torch.no_grad():  # the registers matter
        model.register_tokens.add_(1.0)
    assert not torch.allclose(model(x, ["lastCLS"])[0], cls)
    assert "register_tokens" in model.no_weight_decay()


def test_layer_scale_scales_both_residual_branches() -> None:
    torch.manual_seed(0)
    block = Block(16, 2, 32, init_values=0.5).eval()
    x = torch.randn(2, 5, 16)
    y = x + 0.5 * block.attn(block.norm1(x))
    expected = y + 0.5 * block.mlp(block.norm2(y))
    torch.testing.assert_close(block(x), expected)
    assert block.ls1.gamma.shape == (16,) and block.ls1.gamma.requires_grad
    tiny = Block(16, 2, 32, init_values=1e-30).eval()
    torch.testing.assert_close(tiny(x), x)  # DINOv2's near-identity start
    for bad in (-1, "big"):
        with pytest.raises(ConfigError, match="INIT_VALUES"):
            parse_vit_config({"INIT_VALUES": bad})


def test_patch_features_of_blocks() -> None:
    model = vit()
    x = images()
    last, blk0, cat2, blk = model(x, ["lastPATCH", "blkPATCH0", "concatPATCH2", "lastBLK"])
    assert last.shape == blk0.shape == (2, GRID * GRID, DIM)
    assert cat2.shape == (2, GRID * GRID, 2 * DIM)
    torch.testing.assert_close(last, blk[:, 1:])
    torch.testing.assert_close(cat2, torch.cat([blk0, last], -1))


# ------------------------------------------------------------------------------ masks
def test_mae_mask_encodes_the_visible_patches_only() -> None:
    model = vit(MASKED_IMAGE_MODELING={"NAME": "mae"})
    x, mask = images(), masks()
    blk, patch, pool = model(x, ["lastBLK", "lastPATCH", "lastPOOL"], mask=mask)
    assert blk.shape == (2, 1 + 16, DIM) and patch.shape == (2, 16, DIM)
    torch.testing.assert_close(pool, patch.mean(1))
    with torch.no_grad():  # by hand: the visible patches (in patch order) and the class token
        pos = model.pos_embed
        embedded = model.patch_embed(x) + pos[:, 1:]
        rows = []
        for n in range(2):
            visible = embedded[n, ~mask[n].flatten()]
            rows.append(torch.cat([model.cls_token[0] + pos[0, :1], visible]))
        tokens = torch.stack(rows)
        for block in model.blocks:
            tokens = block(tokens)
    torch.testing.assert_close(blk, model.norm(tokens))
    # the masked patches' pixels do not matter
    noisy = x.clone()
    pixel_mask = mask.repeat_interleave(4, 1).repeat_interleave(4, 2)
    noisy[pixel_mask[:, None].expand_as(x)] = 100.0
    torch.testing.assert_close(model(noisy, ["lastBLK"], mask=mask)[0], blk)
    # without a mask: the whole image, as a plain trunk
    assert model(x, ["lastBLK"])[0].shape == (2, 1 + GRID * GRID, DIM)
    assert "masked_embed" not in "".join(n for n, _ in model.named_parameters())


def test_msn_drops_one_random_set_of_patches_in_training_only() -> None:
    """VISSL's ``msn``: in training, floor(L (1 - drop_ratio)) patches kept, one set drawn
    from the global generator for the whole batch (so a restored generator state draws
    it again); inputs under global_view_tokens patches and eval mode keep every patch; a
    given mask is dropped as with mae."""
    params = {"drop_ratio": 0.7, "global_view_tokens": 64}
    model = vit(MASKED_IMAGE_MODELING={"NAME": "msn", "PARAMS": params}).train()
    assert (model.settings.drop_ratio, model.settings.global_view_tokens) == (0.7, 64)
    x = images()
    torch.manual_seed(3)
    state = torch.get_rng_state()
    blk = model(x, ["lastBLK"])[0]
    assert blk.shape == (2, 1 + 19, DIM)  # int(64 * 0.3) = 19 patches kept
    # by hand: the same draw from the restored generator, the kept patches in patch order
    torch.set_rng_state(state)
    kept = torch.randperm(GRID * GRID)[:19].sort().values
    drop = torch.ones(2, GRID * GRID, dtype=torch.bool)
    drop[:, kept] = False
    mae = vit(MASKED_IMAGE_MODELING={"NAME": "mae"}).train()
    torch.testing.assert_close(blk, mae(x, ["lastBLK"], mask=drop)[0])
    torch.set_rng_state(state)
    torch.testing.assert_close(model(x, ["lastBLK"])[0], blk)  # resumable
    # a given mask: dropped as with mae, nothing drawn
    mask = masks()
    torch.testing.assert_close(
        model(x, ["lastBLK"], mask=mask)[0], mae(x, ["lastBLK"], mask=mask)[0]
    )
    # a focal-size input (16 px: 16 patches < 64) and eval mode: every patch
    assert model(x[:, :, :16, :16], ["lastBLK"])[0].shape == (2, 1 + 16, DIM)
    assert model.eval()(x, ["lastBLK"])[0].shape == (2, 1 + GRID * GRID, DIM)
    with pytest.raises(ConfigError, match="lastMAP"):
        model.train()(x, ["lastMAP"])
    # global_view_tokens 0 (MSN's paper: the focal views too)
    every = vit(
        MASKED_IMAGE_MODELING={
            "NAME": "msn",
            "PARAMS": {"drop_ratio": 0.5, "global_view_tokens": 0},
        }
    )
    assert every.train()(x[:, :, :16, :16], ["lastBLK"])[0].shape == (2, 1 + 8, DIM)


def test_ibot_mask_replaces_the_masked_patches_by_a_learned_token() -> None:
    model = vit(MASKED_IMAGE_MODELING={"NAME": "ibot"}).train()
    assert model.patch_masking is not None
    x, mask = images(), masks(ratio=0.3)
    with torch.no_grad():
        model.patch_masking.masked_embed.normal_()
    patch = model(x, ["lastPATCH"], mask=mask)[0]
    assert patch.shape == (2, GRID * GRID, DIM)
    with torch.no_grad():
        embedded = model.patch_embed(x)
        embedded[mask.flatten(1)] = model.patch_masking.masked_embed[0]
        tokens = torch.cat(
            [
                (model.cls_token + model.pos_embed[:, :1]).expand(2, -1, -1),
                embedded + model.pos_embed[:, 1:],
            ],
            1,
        )
        for block in model.blocks:
            tokens = block(tokens)
    torch.testing.assert_close(patch, model.norm(tokens)[:, 1:])
    noisy = x + 50.0 * mask.repeat_interleave(4, 1).repeat_interleave(4, 2)[:, None]
    torch.testing.assert_close(model(noisy, ["lastPATCH"], mask=mask)[0], patch)
    patch.sum().backward()
    assert model.patch_masking.masked_embed.grad is not None
    assert model.patch_masking.masked_embed.grad.abs().sum() > 0


def test_mask_mistakes() -> None:
    x = images()
    with pytest.raises(ConfigError, match="MASKED_IMAGE_MODELING.NAME is empty"):
        vit()(x, mask=masks())
    model = vit(MASKED_IMAGE_MODELING={"NAME": "mae"})
    with pytest.raises(ConfigError, match="lastMAP"):
        model(x, ["lastMAP"], mask=masks())
    uneven = masks()
    uneven[0, 0, :] = ~uneven[0, 0, :]
    if int(uneven[0].sum()) != int(uneven[1].sum()):
        with pytest.raises(ValueError, match="same number"):
            model(x, mask=uneven)
    with pytest.raises(ValueError, match="patch grid"):
        model(x, mask=torch.zeros(2, 4, 4, dtype=torch.bool))
    for bad, match in [
        ({"NAME": "msn", "PARAMS": {"drop_ratio": 1.0}}, "drop_ratio must be a number in"),
        ({"NAME": "msn", "PARAMS": {"global_view_tokens": -1}}, "global_view_tokens"),
        ({"NAME": "msn", "PARAMS": {"ratio": 0.5}}, r"no key\(s\) \['ratio'\]"),
        ({"NAME": "beit"}, "not supported"),
        ({"NAME": "mae", "PARAMS": {"drop_ratio": 0.5}}, "PARAMS"),
    ]:
        with pytest.raises(ConfigError, match=match):
            parse_vit_config({"MASKED_IMAGE_MODELING": bad})
    with pytest.raises(ConfigError, match="NUM_REGISTER_TOKENS"):
        parse_vit_config({"NUM_REGISTER_TOKENS": -1})


# ------------------------------------------------------- the mask through the model
def test_the_mapping_dict_form_passes_the_mask_to_the_trunk_and_the_head() -> None:
    cfg = model_config(MASKED_IMAGE_MODELING={"NAME": "mae"})
    cfg.MULTI_INPUT_HEAD_MAPPING = [
        ["data", {"feat_names": ["lastBLK"], "additional_keys": ["mask"]}]
    ]
    cfg.HEAD.PARAMS = [
        [
            "mae_decoder",
            {"in_dim": DIM, "decoder_dim": 16, "decoder_depth": 1, "decoder_num_heads": 2},
        ]
    ]
    torch.manual_seed(0)
    model = build_model(cfg, {}).eval()
    x, mask = images(), masks()
    (out,) = model({"data": x, "mask": mask})
    assert out.shape == (2, GRID * GRID, 4 * 4 * 3)
    with torch.no_grad():
        expected = model.heads[0](model.trunk(x, ["lastBLK"], mask=mask)[0], mask=mask)
    torch.testing.assert_close(out, expected)
    # {argument: batch key}: another batch entry under the name mask (MSN's focal_mask)
    cfg.MULTI_INPUT_HEAD_MAPPING = [
        ["data", {"feat_names": ["lastBLK"], "additional_keys": {"mask": "other"}}]
    ]
    torch.manual_seed(0)
    renamed = build_model(cfg, {}).eval()
    (out,) = renamed({"data": x, "other": mask, "mask": ~mask})
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        (["data", {"feat_names": "lastBLK"}], "feat_names required"),
        (["data", {"feat_names": ["lastBLK"], "extra": 1}], "dict form"),
        (["data", {"feat_names": ["lastBLK"], "head_index": -1}], "head_index"),
        (["data", {"feat_names": ["lastBLK"], "additional_keys": ["data"]}], "additional_keys"),
        (["data", {"feat_names": ["lastBLK"], "additional_keys": {"mask": 1}}], "additional_keys"),
    ],
)
def test_mapping_dict_form_mistakes(entry: list[Any], match: str) -> None:
    cfg = model_config()
    cfg.MULTI_INPUT_HEAD_MAPPING = [entry]
    with pytest.raises(ConfigError, match=match):
        build_model(cfg, {})


def test_mapping_head_index_shares_a_head() -> None:
    cfg = model_config()
    cfg.MULTI_INPUT_HEAD_MAPPING = [
        ["a", {"feat_names": ["lastCLS"], "head_index": 0}],
        ["b", {"feat_names": ["lastPOOL"], "head_index": 0}],
    ]
    model = build_model(cfg, {}).eval()
    a, b = images(), images(3)
    out = model({"a": a, "b": b})
    assert [o.shape for o in out] == [(2, 16), (3, 16)]
    with torch.no_grad():
        torch.testing.assert_close(out[1], model.heads[0](model.trunk(b, ["lastPOOL"])[0]))
    cfg.MULTI_INPUT_HEAD_MAPPING = [["a", {"feat_names": ["lastCLS"], "head_index": 1}]]
    with pytest.raises(ConfigError, match="using heads"):
        build_model(cfg, {})


def test_attention_is_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every attention of the trunk goes through scaled_dot_product_attention."""
    model = vit(NUM_REGISTER_TOKENS=1, INIT_VALUES=0.1, MASKED_IMAGE_MODELING={"NAME": "mae"})
    calls = []
    original = F.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(tuple(args[0].shape))
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model(images(), mask=masks())
    # 2 blocks; 2 images, 4 heads of 8 channels, class + 1 register + 16 visible tokens
    assert calls == [(2, 4, 18, DIM // 4)] * 2

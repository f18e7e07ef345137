"""vision_transformer trunk: config validation, presets, shapes and feature names, position
embedding interpolation, attention, activation checkpointing, drop path, weight decay and
one training step through the whole model."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import vissl.models.trunks.vision_transformer as vit_module
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.models import BaseSSLMultiInputOutputModel, build_model
from vissl.models.trunks import MODEL_TRUNKS_REGISTRY, get_model_trunk
from vissl.models.trunks.feature_extractor import FeatureExtractorModel
from vissl.models.trunks.vision_transformer import (
    PRESETS,
    Attention,
    Block,
    Mlp,
    VisionTransformer,
    parse_vit_config,
)
from vissl.optimizers.build import build_optimizer
from vissl.optimizers.param_groups import get_optimizer_param_groups
from vissl.utils.hydra_config import hydra_compose_and_validate

KEY = "config.MODEL.TRUNK.VISION_TRANSFORMERS"
DIM = 32  # the tiny test trunk: 32 px images, 4 px patches (8x8 grid), width 32, 2 blocks

TINY_OVERRIDES = [
    "config=quick_start",
    "config.MODEL.TRUNK.NAME=vision_transformer",
    "config.MODEL.TRUNK.VISION_TRANSFORMERS.IMAGE_SIZE=32",
    "config.MODEL.TRUNK.VISION_TRANSFORMERS.PATCH_SIZE=4",
    f"config.MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM={DIM}",
    "config.MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS=2",
    "config.MODEL.TRUNK.VISION_TRANSFORMERS.NUM_HEADS=4",
    "config.MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM=64",
    "config.MODEL.TRUNK.VISION_TRANSFORMERS.QKV_BIAS=True",
    f"config.MODEL.HEAD.PARAMS=[[mlp, {{dims: [{DIM}, 16]}}]]",
    "config.OPTIMIZER.name=adamw",
    "config.OPTIMIZER.weight_decay=0.05",
    "config.OPTIMIZER.regularize_bias=False",
    "config.OPTIMIZER.non_regularized_parameters=[pos_embed, cls_token]",
]


@functools.cache
def _composed() -> AttrDict:
    """The validated ``config`` of quick_start with a tiny ViT (composed once)."""
    _, cfg = hydra_compose_and_validate(TINY_OVERRIDES)
    return cfg


def full_config() -> AttrDict:
    return copy.deepcopy(_composed())


def model_config(**vit: Any) -> AttrDict:
    """config.MODEL of the composed tiny-ViT config, with VISION_TRANSFORMERS overrides."""
    cfg = copy.deepcopy(_composed().MODEL)
    cfg.TRUNK.VISION_TRANSFORMERS.update(vit)
    return cfg


def trunk(cfg: AttrDict | None = None, **vit: Any) -> VisionTransformer:
    cfg = cfg if cfg is not None else model_config(**vit)
    model = get_model_trunk("vision_transformer")(cfg, "vision_transformer")
    assert isinstance(model, VisionTransformer)
    return model


def images(size: int | tuple[int, int] = 32, n: int = 2) -> torch.Tensor:
    h, w = (size, size) if isinstance(size, int) else size
    return torch.randn(n, 3, h, w)


def count_calls(modules: Iterator[nn.Module], kind: type[nn.Module]) -> list[int]:
    """A one-element counter incremented by every forward of a ``kind`` module.

    A pre-hook: checkpoint's recomputation stops early, before a forward hook would run.
    """
    calls = [0]

    def hook(*_: Any) -> None:
        calls[0] += 1

    for m in modules:
        if isinstance(m, kind):
            m.register_forward_pre_hook(hook)
    return calls


# ------------------------------------------------------------------------------ shapes
def test_registered_with_dino_state_dict_keys() -> None:
    assert MODEL_TRUNKS_REGISTRY.get("vision_transformer") is VisionTransformer
    keys = set(trunk().state_dict())
    for key in (
        "cls_token",
        "pos_embed",
        "patch_embed.proj.weight",
        "blocks.0.norm1.weight",
        "blocks.0.attn.qkv.weight",
        "blocks.0.attn.qkv.bias",
        "blocks.1.attn.proj.bias",
        "blocks.1.mlp.fc1.weight",
        "blocks.1.mlp.fc2.bias",
        "norm.weight",
    ):
        assert key in keys
    assert trunk().pos_embed.shape == (1, 1 + 8 * 8, DIM)


def test_token_and_gap_outputs() -> None:
    torch.manual_seed(0)
    model = trunk().eval()
    x = images()
    out = model(x)
    assert isinstance(out, list) and len(out) == 1 and out[0].shape == (2, DIM)
    (all_tokens,) = model(x, ["lastBLK"])
    assert all_tokens.shape == (2, 65, DIM)
    torch.testing.assert_close(out[0], all_tokens[:, 0])

    gap = trunk(CLASSIFIER="gap").eval()
    gap.load_state_dict(model.state_dict())
    (pooled,) = gap(x)
    assert pooled.shape == (2, DIM)
    torch.testing.assert_close(pooled, all_tokens[:, 1:].mean(dim=1))


def test_feature_names_and_partial_forward() -> None:
    model = trunk().eval()
    x = images()
    feats = dict(
        zip(
            names := [
                "lastCLS",
                "blkCLS0",
                "blkCLS1",
                "concatCLS2",
                "lastPOOL",
                "concatPOOL2",
                "lastMAP",
                "concatMAP2",
                "concatBLK2",
            ],
            model(x, names),
        )
    )
    assert feats["concatCLS2"].shape == (2, 2 * DIM)
    torch.testing.assert_close(
        feats["concatCLS2"], torch.cat([feats["blkCLS0"], feats["blkCLS1"]], 1)
    )
    torch.testing.assert_close(feats["lastCLS"], feats["blkCLS1"])
    assert feats["concatPOOL2"].shape == (2, 2 * DIM)
    assert feats["lastMAP"].shape == (2, DIM, 8, 8)  # channels-first, for the 2D pool ops
    torch.testing.assert_close(feats["lastMAP"].mean(dim=(2, 3)), feats["lastPOOL"])
    assert feats["concatMAP2"].shape == (2, 2 * DIM, 8, 8)
    assert feats["concatBLK2"].shape == (2, 65, 2 * DIM)

    calls = count_calls(model.modules(), Block)
    model(x, ["blkCLS0"])
    assert calls[0] == 1  # only the blocks a feature needs run

    for bad in ("res5", "blkCLS2", "concatCLS0", "concatCLS3", "lastCLS1"):
        with pytest.raises(ConfigError) as e:
            model(x, [bad])
        assert (
            e.value.key_path == "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP"
        )
        assert repr(bad) in str(e.value) and "concatCLS" in str(e.value)


def test_linear_evaluation_of_several_layers() -> None:
    cfg = model_config()
    fe = cfg.FEATURE_EVAL_SETTINGS
    fe.EVAL_MODE_ON = True
    fe.FREEZE_TRUNK_ONLY = True
    fe.SHOULD_FLATTEN_FEATS = False
    fe.LINEAR_EVAL_FEAT_POOL_OPS_MAP = [
        ["concatCLS2", ["Identity", []]],
        ["lastMAP", ["AdaptiveAvgPool2d", [[1, 1]]]],
    ]
    cfg.HEAD.PARAMS = [
        ["eval_mlp", {"in_channels": 2 * DIM, "dims": [2 * DIM, 10]}],
        ["eval_mlp", {"in_channels": DIM, "dims": [DIM, 10]}],
    ]
    model = build_model(cfg, AttrDict())
    assert isinstance(model.trunk, FeatureExtractorModel)
    assert isinstance(model.trunk.base_model, VisionTransformer)
    out = model.train()(images())
    assert [o.shape for o in out] == [(2, 10), (2, 10)]


# ------------------------------------------------------------------------------ presets
@pytest.mark.parametrize(
    ("name", "params"),
    # timm's vit_{tiny,small,base}_patch16_224 without the classifier
    [("tiny", 5_524_416), ("small", 21_665_664), ("base", 85_798_656)],
)
def test_presets_widths_and_parameter_counts(name: str, params: int) -> None:
    cfg = model_config(name=name, IMAGE_SIZE=224, PATCH_SIZE=16, QKV_BIAS=True)
    # the composed config has the tiny test sizes: a preset needs the defaults there
    for key, value in {
        "HIDDEN_DIM": 768,
        "NUM_LAYERS": 12,
        "NUM_HEADS": 12,
        "MLP_DIM": 3072,
    }.items():
        cfg.TRUNK.VISION_TRANSFORMERS[key] = value
    with torch.device("meta"):  # structure only, no real init cost
        model = trunk(cfg)
    preset = PRESETS[name]
    assert model.output_dim == preset["HIDDEN_DIM"]
    assert len(model.blocks) == preset["NUM_LAYERS"]
    assert model.blocks[0].attn.num_heads == preset["NUM_HEADS"]
    assert model.blocks[0].mlp.fc1.out_features == preset["MLP_DIM"]
    assert sum(p.numel() for p in model.parameters()) == params
    if name == "small":
        assert abs(params / 1e6 - 21.7) < 0.05  # ViT-S/16: ~21.7M


def test_preset_value_given_explicitly_is_accepted() -> None:
    settings = parse_vit_config({"name": "small", "HIDDEN_DIM": 384, "NUM_HEADS": 12})
    assert (settings.hidden_dim, settings.num_heads, settings.mlp_dim) == (384, 6, 1536)


def test_preset_conflict_names_both_values() -> None:
    with pytest.raises(ConfigError) as e:
        parse_vit_config({"name": "small", "HIDDEN_DIM": 512})
    assert e.value.key_path == f"{KEY}.HIDDEN_DIM"
    assert "512" in str(e.value) and "384" in str(e.value) and "'small'" in str(e.value)


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("values", "key", "hint"),
    [
        ({"IMAGE_SIZE": 0}, "IMAGE_SIZE", "positive integer"),
        ({"PATCH_SIZE": -4}, "PATCH_SIZE", "positive integer"),
        ({"HIDDEN_DIM": 0}, "HIDDEN_DIM", "positive integer"),
        ({"NUM_LAYERS": 2.0}, "NUM_LAYERS", "positive integer"),
        ({"NUM_HEADS": True}, "NUM_HEADS", "positive integer"),
        ({"MLP_DIM": "3072"}, "MLP_DIM", "positive integer"),
        ({"HIDDEN_DIM": 30, "NUM_HEADS": 4}, "HIDDEN_DIM", "divisible by"),
        ({"IMAGE_SIZE": 30, "PATCH_SIZE": 4}, "IMAGE_SIZE", "multiple of PATCH_SIZE"),
        ({"name": "huge"}, "name", "['tiny', 'small', 'base']"),
        ({"CLASSIFIER": "mean"}, "CLASSIFIER", "'gap'"),
        ({"DROPOUT_RATE": 1.0}, "DROPOUT_RATE", "[0, 1)"),
        ({"ATTENTION_DROPOUT_RATE": -0.1}, "ATTENTION_DROPOUT_RATE", "[0, 1)"),
        ({"DROP_PATH_RATE": 1.5}, "DROP_PATH_RATE", "[0, 1)"),
        ({"QK_SCALE": True}, "QK_SCALE", "positive number"),
        ({"QK_SCALE": -0.5}, "QK_SCALE", "positive number"),
        ({"QKV_BIAS": "yes"}, "QKV_BIAS", "True or False"),
        ({"CHECKPOINT_BLOCK": 1}, "CHECKPOINT_BLOCK", "True or False"),
    ],
)
def test_bad_values_name_the_key(values: dict[str, Any], key: str, hint: str) -> None:
    with pytest.raises(ConfigError) as e:
        trunk(**values)
    assert e.value.key_path == f"{KEY}.{key}"
    assert f"{KEY}.{key}" in str(e.value) and hint in str(e.value)


def test_input_size_must_be_a_multiple_of_the_patch_size() -> None:
    with pytest.raises(ConfigError) as e:
        trunk()(images(30))
    assert e.value.key_path == f"{KEY}.PATCH_SIZE"
    assert "30x30" in str(e.value) and "28x28" in str(e.value)


# ------------------------------------------------------------------------------ sizes
def test_position_embedding_interpolation_for_other_input_sizes() -> None:
    torch.manual_seed(0)
    model = trunk().eval()
    assert model.interpolate_pos_encoding(8, 8) is model.pos_embed
    for size, grid in [(16, (4, 4)), (48, (12, 12)), ((16, 24), (4, 6))]:
        x = images(size)
        (cls,) = model(x)
        assert cls.shape == (2, DIM)
        assert model(x, ["lastMAP"])[0].shape == (2, DIM, *grid)
        pos = model.interpolate_pos_encoding(*grid)
        assert pos.shape == (1, 1 + grid[0] * grid[1], DIM)
        torch.testing.assert_close(pos[:, 0], model.pos_embed[:, 0])
        expected = F.interpolate(
            model.pos_embed[:, 1:].reshape(1, 8, 8, DIM).permute(0, 3, 1, 2),
            size=grid,
            mode="bicubic",
        )
        torch.testing.assert_close(pos[0, 1:], expected[0].flatten(1).T)

    # DINO's multi-crop: global and local crops through one model, and the small crops'
    # loss reaches the position embedding through the interpolation
    model.train()
    model.zero_grad()
    (model(images(16))[0] * torch.randn(DIM)).sum().backward()
    assert model.pos_embed.grad is not None and model.pos_embed.grad[0, 1:].abs().sum() > 0


@pytest.mark.parametrize(("patch", "tokens"), [(4, 65), (2, 257)])
def test_small_image_setting_for_digits(patch: int, tokens: int) -> None:
    model = trunk(IMAGE_SIZE=32, PATCH_SIZE=patch).eval()
    x = images(32)
    assert model(x, ["lastBLK"])[0].shape == (2, tokens, DIM)
    assert model(x)[0].shape == (2, DIM)
    assert model(images(16))[0].shape == (2, DIM)  # a local crop of half the size


# ------------------------------------------------------------------------------ attention
def reference_attention(attn: Attention, x: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(Q K^T * scale) V written out, on ``attn``'s weights."""
    n, length, dim = x.shape
    heads = attn.num_heads
    qkv = x @ attn.qkv.weight.T + (attn.qkv.bias if attn.qkv.bias is not None else 0)
    q, k, v = (t.reshape(n, length, heads, dim // heads).transpose(1, 2) for t in qkv.chunk(3, -1))
    weights = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
    out = (weights @ v).transpose(1, 2).reshape(n, length, dim)
    return out @ attn.proj.weight.T + attn.proj.bias


@pytest.mark.parametrize(("qk_scale", "qkv_bias"), [(False, False), (False, True), (0.3, True)])
def test_attention_matches_hand_written_reference(qk_scale: float | bool, qkv_bias: bool) -> None:
    torch.manual_seed(0)
    model = trunk(QK_SCALE=qk_scale, QKV_BIAS=qkv_bias).eval()
    attn = model.blocks[1].attn
    assert (attn.qkv.bias is not None) == qkv_bias
    scale = 1 / math.sqrt(DIM // 4) if qk_scale is False else 0.3
    assert attn.scale == pytest.approx(scale)
    with torch.no_grad():
        for p in model.parameters():  # non-trivial biases too
            p.add_(0.05 * torch.randn_like(p))
    x = torch.randn(2, 65, DIM)
    torch.testing.assert_close(attn(x), reference_attention(attn, x, scale), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------ checkpointing
def _loss_and_grads(
    model: nn.Module, x: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    torch.manual_seed(123)  # the same dropout / drop-path draws in both runs
    out = model(x, ["concatCLS2", "lastPOOL"])
    loss = out[0].square().sum() + out[1].sum()
    loss.backward()
    return loss.detach(), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize(
    ("setting", "counted"),
    [("CHECKPOINT_BLOCK", Block), ("CHECKPOINT_MLP", Mlp), ("USE_ACTIVATION_CHECKPOINTING", Block)],
)
def test_activation_checkpointing_same_outputs_and_gradients(
    setting: str, counted: type[nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    rates = {"DROPOUT_RATE": 0.1, "ATTENTION_DROPOUT_RATE": 0.1, "DROP_PATH_RATE": 0.2}
    plain = trunk(**rates).train()
    cfg = model_config(**rates)
    if setting == "USE_ACTIVATION_CHECKPOINTING":
        cfg.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING = True
    else:
        cfg.TRUNK.VISION_TRANSFORMERS[setting] = True
    ckpt = trunk(cfg).train()
    ckpt.load_state_dict(plain.state_dict())
    x = images()

    plain_calls = count_calls(plain.modules(), counted)
    ckpt_calls = count_calls(ckpt.modules(), counted)
    loss, grads = _loss_and_grads(plain, x)
    ckpt_loss, ckpt_grads = _loss_and_grads(ckpt, x)
    torch.testing.assert_close(ckpt_loss, loss, rtol=0, atol=0)
    assert grads.keys() == ckpt_grads.keys() and len(grads) == len(list(plain.parameters()))
    for name, grad in grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=1e-6, atol=1e-7, msg=name)
    # recomputed in the backward pass: every checkpointed module ran twice
    assert plain_calls[0] == 2 and ckpt_calls[0] == 4

    # no recomputation in eval mode or without gradients
    calls = [0]
    real = vit_module.checkpoint

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(vit_module, "checkpoint", counting)
    ckpt(x)[0].sum().backward()
    assert calls[0] == 2
    with torch.no_grad():
        ckpt(x)
    ckpt.eval()(x)
    assert calls[0] == 2


# ------------------------------------------------------------------------------ drop path
def test_drop_path_and_dropout_are_identity_in_eval_mode() -> None:
    torch.manual_seed(0)
    noisy = trunk(DROP_PATH_RATE=0.5, DROPOUT_RATE=0.3, ATTENTION_DROPOUT_RATE=0.3)
    # stochastic depth grows linearly over the blocks, from 0 on the first
    assert isinstance(noisy.blocks[0].drop_path, nn.Identity)
    assert noisy.blocks[1].drop_path.p == pytest.approx(0.5)
    clean = trunk()
    clean.load_state_dict(noisy.state_dict())
    x = images()
    noisy.eval()
    clean.eval()
    torch.testing.assert_close(noisy(x)[0], clean(x)[0])
    torch.testing.assert_close(noisy(x)[0], noisy(x)[0])
    noisy.train()
    assert not torch.allclose(noisy(x)[0], noisy(x)[0])


# ------------------------------------------------------------------------------ optimisation
def test_no_weight_decay_for_norms_biases_and_embeddings() -> None:
    cfg = full_config()
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    names = dict(model.named_parameters())
    assert {f"trunk.{n}" for n in model.trunk.no_weight_decay()} <= names.keys()
    groups = {g["param_group_name"]: g for g in get_optimizer_param_groups(model, cfg.OPTIMIZER)}
    decayed = {id(p) for p in groups["trunk_regularized"]["params"]}
    assert groups["trunk_regularized"]["weight_decay"] == 0.05
    assert groups["trunk_unregularized"]["weight_decay"] == 0.0
    for name, param in names.items():
        if not name.startswith("trunk."):
            continue
        # only weight matrices and the patch projection are decayed
        should_decay = param.ndim >= 2 and not name.endswith(("pos_embed", "cls_token"))
        assert (id(param) in decayed) == should_decay, name


def test_one_training_step_through_the_model_changes_the_weights() -> None:
    cfg = full_config()
    cfg.MODEL.TRUNK.VISION_TRANSFORMERS.DROP_PATH_RATE = 0.1
    cfg.MODEL.TRUNK.VISION_TRANSFORMERS.CHECKPOINT_MLP = True
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    assert isinstance(model, BaseSSLMultiInputOutputModel)
    assert isinstance(model.trunk, VisionTransformer)
    optimizer = build_optimizer(cfg.OPTIMIZER, model)
    for group in optimizer.param_groups:
        group["lr"] = 1e-3
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.train()
    # multi-crop: two 32 px global and two 16 px local crops
    out = model([images(32), images(32), images(16), images(16)])
    assert len(out) == 1 and out[0].shape == (8, 16)
    loss = F.cross_entropy(out[0], torch.arange(8) % 16)
    assert torch.isfinite(loss)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_autocast_with_checkpointing_on_gpu() -> None:
    torch.manual_seed(0)
    model = trunk(CHECKPOINT_BLOCK=True, DROP_PATH_RATE=0.1).cuda().train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(images(16).cuda(), ["lastCLS", "lastMAP"])
    assert out[0].shape == (2, DIM) and out[1].shape == (2, DIM, 4, 4)
    out[0].float().square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.pos_embed.grad is not None

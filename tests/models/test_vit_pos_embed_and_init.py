"""MODEL.TRUNK.VISION_TRANSFORMERS.POS_EMBED and INIT: the authors' position embedding and
initialisation of MAE, I-JEPA and MoCo v3.

Each is checked against the authors' code written out here: MAE's
``util/pos_embed.py::get_2d_sincos_pos_embed`` and ``models_mae.py::initialize_weights``,
I-JEPA's ``src/models/vision_transformer.py`` (``_init_weights``, ``fix_init_weight``), MoCo
v3's ``vits.py::VisionTransformerMoCo``. The frozen sin-cos ``pos_embed`` keeps the
learned one's key and shape, so checkpoints load both ways, and is in no optimizer group.
"""

from __future__ import annotations

import math
import os
import tempfile
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.models import build_model
from vissl.models.trunks.vision_transformer import VisionTransformer, parse_vit_config
from vissl.optimizers.param_groups import get_param_group_constructor
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.weights_init import init_model_from_weights_params_file

KEY = "config.MODEL.TRUNK.VISION_TRANSFORMERS"


def trunk(seed: int = 0, **vit: Any) -> VisionTransformer:
    """A ViT of 56 px images in 4 px patches (a 14 x 14 grid, as ViT/16 at 224 px)."""
    settings = {
        "IMAGE_SIZE": 56,
        "PATCH_SIZE": 4,
        "HIDDEN_DIM": 64,
        "NUM_LAYERS": 2,
        "NUM_HEADS": 4,
        "MLP_DIM": 128,
        "QKV_BIAS": True,
        **vit,
    }
    torch.manual_seed(seed)
    return VisionTransformer({"TRUNK": {"VISION_TRANSFORMERS": settings}})


def mae_sincos(grid: int, dim: int, cls_token: bool) -> torch.Tensor:
    """MAE's get_2d_sincos_pos_embed, written out: ``np.meshgrid(grid_w, grid_h)`` puts the
    column first, so the first dim / 2 channels are [sin, cos](column * omega) and the last
    dim / 2 [sin, cos](row * omega), omega_k = 1 / 10000^(k / (dim / 4))."""
    quarter = dim // 4
    omega = [1.0 / 10000 ** (k / quarter) for k in range(quarter)]
    rows = []
    for r in range(grid):
        for c in range(grid):
            rows.append(
                [math.sin(c * o) for o in omega]
                + [math.cos(c * o) for o in omega]
                + [math.sin(r * o) for o in omega]
                + [math.cos(r * o) for o in omega]
            )
    if cls_token:
        rows.insert(0, [0.0] * dim)
    return torch.tensor(rows, dtype=torch.float32).unsqueeze(0)


# ----------------------------------------------------------------------------- POS_EMBED
def test_defaults_are_the_learned_embedding_and_dinos_init() -> None:
    s = parse_vit_config({})
    assert (s.pos_embed, s.init) == ("learned", "default")
    model = trunk()
    assert model.pos_embed.requires_grad
    assert 0.015 < float(model.pos_embed.detach().std()) < 0.025


@pytest.mark.parametrize("cls_token", [True, False])
def test_sincos_is_frozen_and_equals_maes_formula(cls_token: bool) -> None:
    extra = {} if cls_token else {"USE_CLASS_TOKEN": False, "CLASSIFIER": "gap"}
    model = trunk(POS_EMBED="sincos", **extra)
    assert model.pos_embed.requires_grad is False
    assert isinstance(model.pos_embed, nn.Parameter)  # still in state_dict and parameters()
    torch.testing.assert_close(model.pos_embed.data, mae_sincos(14, 64, cls_token))
    # the same with any INIT and any seed: no random draw
    other = trunk(seed=5, POS_EMBED="sincos", INIT="ijepa", **extra)
    assert torch.equal(other.pos_embed, model.pos_embed)


def test_sincos_gets_no_gradient_and_is_in_no_param_group() -> None:
    model = trunk(POS_EMBED="sincos").train()
    model(torch.randn(2, 3, 56, 56))[0].sum().backward()
    assert model.pos_embed.grad is None
    assert model.cls_token is not None and model.cls_token.grad is not None
    wrapped = nn.Module()
    wrapped.trunk = model  # type: ignore[assignment]
    model_config = AttrDict(
        {"TRUNK": {"NAME": "vision_transformer", "VISION_TRANSFORMERS": {"NUM_LAYERS": 2}}}
    )
    optimizer_config = AttrDict({"weight_decay": 0.05, "layer_wise_lr_decay": {"decay": 0.9}})
    for name in ("default", "dino", "lr_decay"):
        groups = get_param_group_constructor(name)(wrapped, model_config, optimizer_config)
        grouped = {id(p) for g in groups for p in g["params"]}
        assert id(model.pos_embed) not in grouped, name
        assert len(grouped) == sum(1 for p in model.parameters() if p.requires_grad), name


def test_sincos_other_grids_are_the_sincos_of_the_resized_positions() -> None:
    """A crop of another size gets, exactly, the sin-cos at the positions that a bicubic
    resize of the 14 x 14 table samples ((j + 0.5) 14 / n - 0.5), close to that resize."""
    model = trunk(POS_EMBED="sincos").eval()
    assert model.interpolate_pos_encoding(14, 14) is model.pos_embed
    quarter = 16
    omega = [1.0 / 10000 ** (k / quarter) for k in range(quarter)]
    for grid in [(6, 6), (20, 20), (6, 10)]:
        pos = model.interpolate_pos_encoding(*grid)
        assert pos.shape == (1, 1 + grid[0] * grid[1], 64) and not pos.requires_grad
        assert torch.equal(pos[0, 0], torch.zeros(64))
        r_pos = [(i + 0.5) * 14 / grid[0] - 0.5 for i in range(grid[0])]
        c_pos = [(j + 0.5) * 14 / grid[1] - 0.5 for j in range(grid[1])]
        want = torch.tensor(
            [
                [math.sin(c * o) for o in omega]
                + [math.cos(c * o) for o in omega]
                + [math.sin(r * o) for o in omega]
                + [math.cos(r * o) for o in omega]
                for r in r_pos
                for c in c_pos
            ]
        )
        torch.testing.assert_close(pos[0, 1:], want)
        resized = (
            F.interpolate(
                model.pos_embed[:, 1:].reshape(1, 14, 14, 64).permute(0, 3, 1, 2),
                size=grid,
                mode="bicubic",
            )[0]
            .flatten(1)
            .T
        )
        assert float((resized - pos[0, 1:]).abs().mean()) < 0.05
        # and the whole trunk runs on such crops
        out = model(torch.randn(2, 3, 4 * grid[0], 4 * grid[1]), ["lastMAP"])[0]
        assert out.shape == (2, 64, *grid)


def test_a_learned_checkpoint_loads_into_both_and_sincos_stays_frozen() -> None:
    """Today's checkpoints (learned pos_embed) load unchanged: same keys and shapes."""
    learned = trunk(seed=1)
    assert set(learned.state_dict()) == set(trunk(POS_EMBED="sincos").state_dict())
    model = build_model(
        AttrDict(
            {
                "TRUNK": {
                    "NAME": "vision_transformer",
                    "VISION_TRANSFORMERS": dict(
                        learned.model_config["TRUNK"]["VISION_TRANSFORMERS"]
                    ),
                },
                "HEAD": {"PARAMS": []},
            }
        ),
        AttrDict({}),
    )
    for pos in ("learned", "sincos"):
        target = trunk(seed=2, POS_EMBED=pos)
        target.load_state_dict(learned.state_dict(), strict=True)
        assert torch.equal(target.pos_embed, learned.pos_embed)
        assert target.pos_embed.requires_grad is (pos == "learned")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "weights.torch")
        torch.save({f"trunk.{k}": v for k, v in learned.state_dict().items()}, path)
        weights = AttrDict(
            {
                "PARAMS_FILE": path,
                "STATE_DICT_KEY_NAME": "",
                "SKIP_LAYERS": [],
                "REMOVE_PREFIX": "",
                "APPEND_PREFIX": "",
            }
        )
        init_model_from_weights_params_file(model, weights, model.model_config)
    assert torch.equal(model.trunk.pos_embed, learned.pos_embed)


@pytest.mark.parametrize(
    ("values", "key", "hint"),
    [
        ({"POS_EMBED": "fixed"}, "POS_EMBED", "sincos"),
        ({"POS_EMBED": "sincos", "HIDDEN_DIM": 66, "NUM_HEADS": 6}, "POS_EMBED", "divisible by 4"),
        ({"INIT": "xavier"}, "INIT", "moco_v3"),
        ({"INIT": 1}, "INIT", "ijepa"),
    ],
)
def test_bad_values_name_the_key(values: dict[str, Any], key: str, hint: str) -> None:
    with pytest.raises(ConfigError, match=hint) as err:
        parse_vit_config(values)
    assert err.value.key_path == f"{KEY}.{key}"


def test_a_bad_value_from_the_config_stops_the_model_build() -> None:
    _, cfg = hydra_compose_and_validate(
        [
            "config=quick_start",
            "config.MODEL.TRUNK.NAME=vision_transformer",
            f"{KEY}.POS_EMBED=fixed",
        ]
    )
    with pytest.raises(ConfigError, match="POS_EMBED") as err:
        build_model(cfg.MODEL, cfg.OPTIMIZER)
    assert err.value.key_path == f"{KEY}.POS_EMBED"


# ----------------------------------------------------------------------------- INIT
WIDE = {"HIDDEN_DIM": 256, "NUM_LAYERS": 4, "NUM_HEADS": 4, "MLP_DIM": 1024}


def _assert_uniform(weight: torch.Tensor, bound: float, what: str) -> None:
    """Uniform in [-bound, bound]: inside it, with the uniform's std bound / sqrt(3)."""
    w = weight.detach().flatten()
    assert float(w.abs().max()) <= bound * (1 + 1e-6), what
    assert float(w.abs().max()) > 0.95 * bound, what
    assert float(w.std()) == pytest.approx(bound / math.sqrt(3), rel=0.05), what


def _linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}


def test_mae_init_is_xavier_uniform_on_linears_and_the_flattened_patch_projection() -> None:
    model = trunk(INIT="mae", **WIDE)
    for name, m in _linears(model).items():
        fan_out, fan_in = m.weight.shape  # the fused qkv as one (3 D, D) matrix, as timm's
        _assert_uniform(m.weight, math.sqrt(6 / (fan_in + fan_out)), name)
        assert m.bias is not None and not m.bias.any(), name
    proj = model.patch_embed.proj
    _assert_uniform(proj.weight, math.sqrt(6 / (3 * 4 * 4 + 256)), "patch_embed.proj")
    # MAE leaves the Conv2d's default bias: uniform in +-1/sqrt(fan_in)
    assert proj.bias is not None and proj.bias.any()
    assert float(proj.bias.detach().abs().max()) <= 1 / math.sqrt(3 * 4 * 4)
    assert model.cls_token is not None
    assert float(model.cls_token.detach().std()) == pytest.approx(0.02, rel=0.15)
    assert all(bool((n.weight == 1).all() and (n.bias == 0).all()) for n in _norms(model))


def _norms(model: nn.Module) -> list[nn.LayerNorm]:
    return [m for m in model.modules() if isinstance(m, nn.LayerNorm)]


def test_ijepa_init_trunc_normal_conv_and_the_depth_rescale() -> None:
    model = trunk(INIT="ijepa", POS_EMBED="sincos", **WIDE)
    proj = model.patch_embed.proj
    assert float(proj.weight.detach().std()) == pytest.approx(0.02, rel=0.05)
    assert proj.bias is not None and not proj.bias.any()
    for i, block in enumerate(model.blocks):
        scale = math.sqrt(2 * (i + 1))
        for rescaled in (block.attn.proj.weight, block.mlp.fc2.weight):
            assert float(rescaled.detach().std()) == pytest.approx(0.02 / scale, rel=0.05), i
            assert float(rescaled.detach().abs().max()) <= 2 / scale  # trunc_normal_'s a=-2, b=2
        for plain in (block.attn.qkv.weight, block.mlp.fc1.weight):
            assert float(plain.detach().std()) == pytest.approx(0.02, rel=0.05), i
    assert all(m.bias is None or not m.bias.any() for m in _linears(model).values())


def test_moco_v3_init_q_k_v_apart_and_the_patch_projection() -> None:
    model = trunk(INIT="moco_v3", **WIDE)
    for name, m in _linears(model).items():
        fan_out, fan_in = m.weight.shape
        if name.endswith("attn.qkv"):
            fan_out //= 3  # MoCo v3 treats the weights of Q, K, V separately
        _assert_uniform(m.weight, math.sqrt(6 / (fan_in + fan_out)), name)
        assert m.bias is not None and not m.bias.any(), name
    proj = model.patch_embed.proj
    _assert_uniform(proj.weight, math.sqrt(6 / (3 * 4 * 4 + 256)), "patch_embed.proj")
    assert proj.bias is not None and not proj.bias.any()
    assert model.cls_token is not None
    assert float(model.cls_token.detach().std()) == pytest.approx(1e-6, rel=0.3)


def test_default_init_is_unchanged_by_the_options_existing() -> None:
    """INIT default with POS_EMBED learned draws exactly as before the keys existed (the
    same calls in the same order), so seeded runs and tests keep their numbers."""
    model = trunk(seed=3)
    torch.manual_seed(3)
    patch_default = nn.Conv2d(3, 64, kernel_size=4, stride=4)  # drawn at construction
    assert torch.equal(model.patch_embed.proj.weight, patch_default.weight)
    torch.testing.assert_close(
        float(model.blocks[0].attn.qkv.weight.detach().std()), 0.02, rtol=0.1, atol=0
    )

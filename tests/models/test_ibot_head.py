"""ibot_head: outputs for class tokens and for class + patch tokens, shared or separate last
layers, masked patches only (the same rows as every patch's at the mask), the trunk's class
token for KoLeo, errors; TEMP_FROZEN_PARAMS_ITER_MAP resolves VISSL's weight-norm names and
the shared layer's second name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from vissl.errors import ConfigError
from vissl.hooks.state_update_hooks import FreezeParametersHook, resolve_parameter_name
from vissl.models.heads.ibot_head import IBOTHead

D, K, KP = 8, 12, 10


def head(**kw) -> IBOTHead:
    torch.manual_seed(0)
    args = dict(in_dim=D, out_dim=K, patch_out_dim=KP, hidden_dim=16, bottleneck_dim=6)
    args.update(kw)
    return IBOTHead({}, **args)


def test_class_tokens_and_blocks_give_cls_and_patch_logits() -> None:
    h = head()
    (cls,) = h(torch.randn(5, D))
    assert cls.shape == (5, K)
    x = torch.randn(3, 1 + 4, D)
    cls, patch = h(x)
    assert cls.shape == (3, K) and patch.shape == (3, 4, KP)
    # one MLP for every token; the class token's row is scored by prototypes0
    z = torch.nn.functional.normalize(h.mlp(x[:, 0]), dim=-1)
    torch.testing.assert_close(cls, h.prototypes0(z))
    zp = torch.nn.functional.normalize(h.mlp(x[:, 1:]), dim=-1)
    torch.testing.assert_close(patch, h.prototypes1(zp))
    assert h.prototypes1 is not h.prototypes0


def test_shared_head_registers_one_last_layer() -> None:
    h = head(shared_head=True, patch_out_dim=0)
    names = [n for n, _ in h.named_parameters()]
    assert "prototypes0.weight" in names and not any("prototypes1" in n for n in names)
    assert h.prototypes1 is h.prototypes0 and h.last_norm2 is h.last_norm
    _, patch = h(torch.randn(2, 5, D))
    assert patch.shape == (2, 4, K)
    with pytest.raises(ConfigError, match="patch_out_dim"):
        head(shared_head=True, patch_out_dim=KP)


def test_masked_patches_only_scores_the_masked_rows_in_mask_order() -> None:
    full, only = head(), head(masked_patches_only=True)
    only.load_state_dict(full.state_dict())
    x = torch.randn(3, 1 + 6, D)
    mask = torch.rand(3, 2, 3) < 0.5
    mask[0, 0, 0] = True
    cls_a, patch_a = full(x, mask=mask)  # masks are ignored without masked_patches_only
    cls_b, rows = only(x, mask=mask)
    torch.testing.assert_close(cls_a, cls_b)
    torch.testing.assert_close(rows, patch_a[mask.reshape(3, -1)])
    _, every = only(x)  # no mask: every patch
    assert every.shape == (3, 6, KP)


def test_output_cls_token_appends_the_trunks_class_token() -> None:
    h = head(output_cls_token=True)
    x = torch.randn(2, 5, D)
    out = h(x)
    assert len(out) == 3 and torch.equal(out[2], x[:, 0])
    assert len(h(torch.randn(2, D))) == 1  # local crops: [CLS] logits only


def test_last_layer_init_and_normalisation() -> None:
    h = head(normalize_last_layer=True)
    assert h.prototypes0.scale is None
    bound = 1 / 6**0.5  # nn.Linear's default: U(+-1/sqrt(bottleneck))
    assert h.prototypes0.weight.abs().max() <= bound
    assert h.prototypes0.weight.std() > 0.2 * bound
    learn = head(normalize_last_layer=False)
    assert learn.prototypes0.scale is not None and learn.prototypes1.scale is not None


def test_norms_and_errors() -> None:
    h = head(norm="bn", last_norm="ln")
    assert any(isinstance(m, nn.BatchNorm1d) for m in h.mlp)
    cls, patch = h(torch.randn(4, 3, D))
    assert cls.shape == (4, K) and patch.shape == (4, 2, KP)
    with pytest.raises(ConfigError, match="norm"):
        head(norm="group")
    with pytest.raises(ConfigError, match="act"):
        head(act="tanh")
    with pytest.raises(ConfigError, match="in_dim"):
        head()(torch.randn(2, 3, D + 1))


def test_frozen_params_map_accepts_vissls_names() -> None:
    """VISSL's iBOT configs freeze prototypes{0,1}.weight_v / weight_g of a shared head."""
    model = nn.Module()
    model.heads = nn.ModuleList(
        [head(shared_head=True, patch_out_dim=0, normalize_last_layer=False)]
    )
    named = dict(model.named_parameters())
    assert resolve_parameter_name("heads.0.prototypes0.weight_v", model, named) == (
        "heads.0.prototypes0.weight"
    )
    assert resolve_parameter_name("heads.0.prototypes1.weight_v", model, named) == (
        "heads.0.prototypes0.weight"
    )
    assert resolve_parameter_name("heads.0.prototypes1.weight_g", model, named) == (
        "heads.0.prototypes0.scale"
    )
    assert resolve_parameter_name("heads.0.prototypes2.weight_v", model, named) is None
    fixed = nn.Module()
    fixed.heads = nn.ModuleList([head(normalize_last_layer=True)])
    fixed_named = dict(fixed.named_parameters())
    assert resolve_parameter_name("heads.0.prototypes0.weight_g", fixed, fixed_named) == ""

    hook = FreezeParametersHook(
        {"heads.0.prototypes0.weight_v": 2, "heads.0.prototypes1.weight_g": 2}
    )
    hook.on_start(SimpleNamespace(base_model=model))  # type: ignore[arg-type]
    assert set(hook.frozen) == {"heads.0.prototypes0.weight", "heads.0.prototypes0.scale"}
    with pytest.raises(ConfigError, match="does not have"):
        FreezeParametersHook({"heads.0.nothing.weight_v": 1}).on_start(
            SimpleNamespace(base_model=model)  # type: ignore[arg-type]
        )


def test_last_layers_share_dino_heads_init() -> None:
    """ibot_head's and dino_head's last layers are the one WeightNormLinear, started by the
    one function (nn.Linear's default init): same seed, same weights."""
    from vissl.models.heads.dino_head import DINOHead, WeightNormLinear

    torch.manual_seed(0)
    alone = WeightNormLinear(64, 1000).weight
    torch.manual_seed(0)
    reference = nn.Linear(64, 1000, bias=False).weight
    assert torch.equal(alone, reference)
    torch.manual_seed(0)
    ibot = IBOTHead({}, 32, 1000, hidden_dim=48, bottleneck_dim=64, shared_head=True)
    torch.manual_seed(0)
    dino = DINOHead({}, 32, [1000], hidden_dim=48, bottleneck_dim=64)
    assert torch.equal(ibot.mlp[0].weight, dino.mlp[0].weight)
    assert torch.equal(ibot.prototypes0.weight, dino.prototypes0.weight)

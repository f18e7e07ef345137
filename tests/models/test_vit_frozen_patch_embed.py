"""MODEL.TRUNK.VISION_TRANSFORMERS.FREEZE_PATCH_EMBED (MoCo v3's random patch projection):
the patch projection keeps its random init and gets no gradient; it is in no optimizer
group (no weight decay, no LARS step), DDP and the manual reduction need no
find_unused_parameters for it and still give every rank rank 0's values, the momentum
copy carries it unchanged, WEIGHTS_INIT loads it and leaves it frozen, a non-bool value is
a ConfigError."""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any

import pytest
import torch
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses import build_loss
from vissl.models import build_model
from vissl.models.momentum import ema_update_, momentum_copy
from vissl.models.trunks.vision_transformer import VisionTransformer, parse_vit_config
from vissl.optimizers.build import build_optimizer
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import spawn_gloo
from vissl.utils.weights_init import init_model_from_weights_params_file

KEY = "config.MODEL.TRUNK.VISION_TRANSFORMERS.FREEZE_PATCH_EMBED"
PATCH = ("trunk.patch_embed.proj.weight", "trunk.patch_embed.proj.bias")
QUICK_VIT = "config=test/integration_test/quick_moco_v3_vit"  # FREEZE_PATCH_EMBED: True


@functools.cache
def _config(*overrides: str) -> AttrDict:
    _, cfg = hydra_compose_and_validate([QUICK_VIT, *overrides])
    return cfg


def _model(*overrides: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    cfg = _config(*overrides)
    return build_model(cfg.MODEL, cfg.OPTIMIZER)


def _patch(model: nn.Module) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    return {n: params[n].detach().clone() for n in PATCH}


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 3, 16, 16, generator=g)
    optimizer.zero_grad()
    model(x)[0].pow(2).sum().backward()
    optimizer.step()


# ----------------------------------------------------------------------------- the key
def test_frozen_patch_projection_gets_no_gradient_and_the_rest_trains() -> None:
    model = _model()
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert sorted(frozen) == sorted(PATCH)
    model(torch.randn(2, 3, 16, 16))[0].sum().backward()
    params = dict(model.named_parameters())
    assert all(params[n].grad is None for n in PATCH)
    assert params["trunk.cls_token"].grad is not None
    assert params["trunk.blocks.0.attn.qkv.weight"].grad is not None


def test_off_by_default() -> None:
    assert parse_vit_config({}).freeze_patch_embed is False
    model = _model(f"{KEY}=False")
    assert all(p.requires_grad for p in model.parameters())


def test_the_random_init_is_the_unfrozen_one() -> None:
    """Freezing changes no value: the same seed gives the same projection either way."""
    frozen = _model(seed=3)
    trained = _model(f"{KEY}=False", seed=3)
    for n, t in _patch(frozen).items():
        assert torch.equal(t, _patch(trained)[n])


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_non_bool_is_a_config_error(value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        parse_vit_config({"FREEZE_PATCH_EMBED": value})
    assert err.value.key_path == KEY
    with pytest.raises(ConfigError, match="FREEZE_PATCH_EMBED"):
        VisionTransformer({"TRUNK": {"VISION_TRANSFORMERS": {"FREEZE_PATCH_EMBED": value}}})


def test_a_non_bool_in_the_config_stops_validation() -> None:
    with pytest.raises(ConfigError, match="FREEZE_PATCH_EMBED"):
        hydra_compose_and_validate([QUICK_VIT, f"{KEY}=yes"])


# ----------------------------------------------------------------------------- optimizers
@pytest.mark.parametrize(
    "optimizer",
    [
        ["config.OPTIMIZER.name=adamw", "config.OPTIMIZER.weight_decay=0.5"],
        [
            "config.OPTIMIZER.name=lars",
            "config.OPTIMIZER.weight_decay=0.5",
            "config.OPTIMIZER.exclude_bias_and_norm=True",
        ],
        ["config.OPTIMIZER.name=sgd", "config.OPTIMIZER.weight_decay=0.5"],
    ],
    ids=["adamw", "lars", "sgd"],
)
def test_in_no_param_group_and_unchanged_by_steps_with_weight_decay(optimizer: list[str]) -> None:
    cfg = _config(*optimizer)
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    opt = build_optimizer(cfg.OPTIMIZER, model)
    for group in opt.param_groups:
        group["lr"] = 0.1
    grouped = {id(p) for g in opt.param_groups for p in g["params"]}
    params = dict(model.named_parameters())
    assert not any(id(params[n]) in grouped for n in PATCH)
    assert len(grouped) == len(params) - len(PATCH)
    before = _patch(model)
    qkv = params["trunk.blocks.0.attn.qkv.weight"].detach().clone()
    for seed in range(2):
        _step(model, opt, seed)
    for n, t in _patch(model).items():
        assert torch.equal(t, before[n]), n  # bitwise: not even weight decay touched it
    assert not torch.equal(params["trunk.blocks.0.attn.qkv.weight"], qkv)


# ----------------------------------------------------------------------------- copies
def test_momentum_encoder_carries_the_frozen_projection_unchanged() -> None:
    cfg = _config()
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss = build_loss(cfg.LOSS, cfg)
    loss.bind_model(model)
    target = loss.target_network
    assert target is not None and len(target.heads) == 1
    opt = build_optimizer(cfg.OPTIMIZER, model)
    for group in opt.param_groups:
        group["lr"] = 0.01
    for seed in range(2):
        _step(model, opt, seed)
        ema_update_(target, model, 0.9)
    copy_params = dict(target.named_parameters())
    for n, t in _patch(model).items():
        assert torch.equal(copy_params[n], t)  # lerp of equal values: bitwise equal
    moved = "trunk.blocks.0.attn.qkv.weight"
    assert not torch.equal(copy_params[moved], dict(model.named_parameters())[moved])
    # a plain momentum copy pairs every parameter, frozen ones included
    plain = momentum_copy(model)
    ema_update_(plain, model, 0.5)


def test_weights_init_loads_the_projection_and_keeps_it_frozen() -> None:
    source = _model(seed=1)
    model = _model(seed=2)
    assert not torch.equal(_patch(source)[PATCH[0]], _patch(model)[PATCH[0]])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "weights.torch")
        torch.save(source.state_dict(), path)
        weights = AttrDict(
            {
                "PARAMS_FILE": path,
                "STATE_DICT_KEY_NAME": "",
                "SKIP_LAYERS": ["num_batches_tracked"],
                "REMOVE_PREFIX": "",
                "APPEND_PREFIX": "",
            }
        )
        init_model_from_weights_params_file(model, weights, _config().MODEL)
    loaded = _patch(model)
    for n, t in _patch(source).items():
        assert torch.equal(loaded[n], t)
    params = dict(model.named_parameters())
    assert not any(params[n].requires_grad for n in PATCH)


# ----------------------------------------------------------------------------- 2 ranks
def _ddp_worker(rank: int, world: int) -> dict[str, Any]:
    from vissl.trainer.gradient_reduction import build_gradient_reducer

    out: dict[str, Any] = {}
    for manual in (False, True):
        # each rank its own init, as the trainer seeds with SEED_VALUE + rank
        model = _model(seed=100 + rank)
        cfg = _config()
        opt = build_optimizer(cfg.OPTIMIZER, model)
        for group in opt.param_groups:
            group["lr"] = 0.01
        # find_unused_parameters False: the frozen projection is not a missing gradient
        reducer = build_gradient_reducer(world, manual=manual, find_unused_parameters=False)
        wrapped = reducer.wrap(model, torch.device("cpu"))
        start = _patch(model)  # rank 0's values: DDP broadcasts frozen parameters too
        for step in range(2):
            g = torch.Generator().manual_seed(10 * rank + step)
            x = torch.randn(4, 3, 16, 16, generator=g)
            opt.zero_grad()
            with reducer.context(wrapped):
                wrapped(x)[0].pow(2).sum().backward()
            reducer.after_backward(wrapped)
            opt.step()
        out[f"manual={manual}"] = {
            "start": start,
            "end": _patch(model),
            "qkv": dict(model.named_parameters())["trunk.blocks.0.attn.qkv.weight"].detach(),
        }
    return out


def test_ddp_and_manual_reduction_without_find_unused_keep_it_equal_on_every_rank() -> None:
    results = spawn_gloo(_ddp_worker, 2)
    rank0_init = _patch(_model(seed=100))
    for key in ("manual=False", "manual=True"):
        r0, r1 = results[0][key], results[1][key]
        for n in PATCH:
            assert torch.equal(r0["start"][n], rank0_init[n])
            assert torch.equal(r1["start"][n], rank0_init[n])  # broadcast from rank 0
            assert torch.equal(r0["end"][n], rank0_init[n])  # never trained
            assert torch.equal(r1["end"][n], rank0_init[n])
        torch.testing.assert_close(r0["qkv"], r1["qkv"])  # trained in step on both ranks

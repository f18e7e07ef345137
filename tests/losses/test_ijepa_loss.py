"""ijepa_loss against I-JEPA's formulas written out here block by block and patch by patch
(float64, loops), the target encoder (layer-normed tokens, the heads left out, EMA with
the linear momentum schedule through IJEPAHook), its config inference and errors; the
quick model under bf16 autocast with large inputs."""

from __future__ import annotations

import copy
import functools
from types import SimpleNamespace

import pytest
import torch

from vissl.config.attr_dict import AttrDict
from vissl.data.collators.ijepa_multiblock_collator import multiblock_masks, multiblock_settings
from vissl.errors import ConfigError
from vissl.hooks.ijepa_hooks import IJEPAHook
from vissl.losses.build import build_loss
from vissl.losses.ijepa_loss import IJEPALoss, linear_momentum
from vissl.models import build_model
from vissl.utils.hydra_config import hydra_compose_and_validate


def random_blocks(n: int, m: int, grid: tuple[int, int], k: int, seed: int) -> torch.Tensor:
    """``(N, M, h, w)`` masks of ``k`` random patches each (any shape: the loss only needs
    the same count per block)."""
    g = torch.Generator().manual_seed(seed)
    length = grid[0] * grid[1]
    masks = torch.zeros(n, m, length, dtype=torch.bool)
    for i in range(n):
        for j in range(m):
            masks[i, j, torch.randperm(length, generator=g)[:k]] = True
    return masks.reshape(n, m, *grid)


def reference_loss(
    pred: torch.Tensor, tokens: torch.Tensor, masks: torch.Tensor, loss_type: str
) -> float:
    """Eq. 1 of the paper averaged: image n, block i, the j-th patch of the block in patch
    order; prediction row ``i * N + n``. l2: the squared L2 norm over the channels, the
    mean over (n, i, j); smooth_l1: Huber (beta 1) per channel, the mean over everything."""
    n_img, n_blocks = masks.shape[:2]
    total, count = 0.0, 0
    for n in range(n_img):
        for i in range(n_blocks):
            patches = [int(p) for p in torch.nonzero(masks[n, i].flatten()).flatten()]
            for j, patch in enumerate(patches):
                diff = pred[i * n_img + n, j].double() - tokens[n, patch].double()
                if loss_type == "l2":
                    total += float((diff**2).sum())
                    count += 1
                else:
                    a = diff.abs()
                    total += float(torch.where(a < 1, 0.5 * a**2, a - 0.5).sum())
                    count += diff.numel()
    return total / count


@pytest.mark.parametrize("loss_type", ["l2", "smooth_l1"])
def test_loss_matches_the_formula(loss_type: str) -> None:
    torch.manual_seed(0)
    n, m, grid, k, dim = 3, 4, (4, 5), 3, 6
    masks = random_blocks(n, m, grid, k, seed=1)
    tokens = torch.randn(n, 20, dim)
    pred = torch.randn(m * n, k, dim) * 1.5
    loss_fn = IJEPALoss(loss_type=loss_type)
    loss = loss_fn([pred], masks, teacher_output=tokens)
    assert loss.dtype == torch.float32
    assert float(loss) == pytest.approx(reference_loss(pred, tokens, masks, loss_type), rel=1e-5)


def test_gradient_reaches_the_prediction_only_and_a_perfect_prediction_costs_nothing() -> None:
    torch.manual_seed(0)
    masks = random_blocks(2, 2, (3, 3), 2, seed=0)
    tokens = torch.randn(2, 9, 4, requires_grad=True)
    rows = [
        tokens[n, torch.nonzero(masks[n, i].flatten()).flatten()]
        for i in range(2)
        for n in range(2)
    ]
    perfect = torch.stack(rows).detach().requires_grad_(True)
    loss_fn = IJEPALoss()
    loss = loss_fn(perfect, masks, teacher_output=tokens)
    assert float(loss.detach()) == 0.0
    (loss_fn(perfect + 1.0, masks, teacher_output=tokens)).backward()
    assert perfect.grad is not None and perfect.grad.abs().sum() > 0
    assert tokens.grad is None  # the targets are detached


def test_shape_and_state_errors() -> None:
    loss_fn = IJEPALoss()
    masks = random_blocks(2, 2, (3, 3), 2, seed=0)
    with pytest.raises(TypeError, match="teacher_output="):
        loss_fn(torch.zeros(4, 2, 4), masks)
    with pytest.raises(ValueError, match="predictor gave"):
        loss_fn(torch.zeros(4, 3, 4), masks, teacher_output=torch.zeros(2, 9, 4))
    uneven = masks.clone()
    uneven[0, 0] = True
    with pytest.raises(ValueError, match="same number"):
        loss_fn(torch.zeros(4, 2, 4), uneven, teacher_output=torch.zeros(2, 9, 4))
    with pytest.raises(ConfigError, match="TARGET_KEY_NAMES"):
        loss_fn(torch.zeros(4, 2, 4), {"data": masks})
    with pytest.raises(ConfigError, match="loss_type"):
        IJEPALoss(loss_type="l1")
    with pytest.raises(ConfigError, match="final_momentum"):
        IJEPALoss(final_momentum=1.5)


def test_linear_momentum_schedule() -> None:
    assert linear_momentum(0, 100, 0.996, 1.0) == 0.996
    assert linear_momentum(50, 100, 0.996, 1.0) == pytest.approx(0.998)
    assert linear_momentum(100, 100, 0.996, 1.0) == 1.0
    assert linear_momentum(7, 0, 0.99, 1.0) == 0.99


@functools.cache
def _quick() -> AttrDict:
    _, cfg = hydra_compose_and_validate(["config=test/integration_test/quick_ijepa"])
    return cfg


def quick_config() -> AttrDict:
    return copy.deepcopy(_quick())


def _batch(n: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cfg = quick_config()
    settings = multiblock_settings(dict(cfg.DATA.TRAIN.COLLATE_FUNCTION_PARAMS))
    g = torch.Generator().manual_seed(seed)
    context, targets = multiblock_masks(n, (8, 8), settings, g)
    torch.manual_seed(seed)
    return torch.randn(n, 3, 16, 16), ~context, targets


def test_target_encoder_is_the_trunk_layer_normed_and_follows_it_linearly() -> None:
    cfg = quick_config()
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss_fn = build_loss(cfg.LOSS, cfg)
    loss_fn.bind_model(model)
    target = loss_fn.target_encoder
    assert target is not None and len(target.heads) == 0  # the predictor is not copied
    assert not any(p.requires_grad for p in target.parameters())
    images, _, _ = _batch()
    tokens = loss_fn.run_target_encoder(images)
    with torch.no_grad():
        (by_hand,) = model.trunk(images, ["lastPATCH"])
        by_hand = torch.nn.functional.layer_norm(by_hand, (32,))
    torch.testing.assert_close(tokens, by_hand)
    assert tokens.shape == (4, 64, 32)
    torch.testing.assert_close(tokens.mean(-1), torch.zeros(4, 64), atol=1e-5, rtol=0)
    # one EMA step through the hook at iteration 3 of 10: m = 0.996 + 0.004 * 0.3
    before = {k: v.clone() for k, v in target.trunk.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    hook = IJEPAHook(loss_fn)
    hook.on_update(SimpleNamespace(iteration=3, max_iteration=10, base_model=model))  # type: ignore[arg-type]
    m = 0.996 + 0.004 * 0.3
    assert hook.last_momentum == pytest.approx(m)
    source = model.trunk.state_dict()
    for name, value in target.trunk.state_dict().items():
        torch.testing.assert_close(value, m * before[name] + (1 - m) * source[name])


def test_config_inference_checks_the_pieces() -> None:
    cfg = quick_config()
    assert isinstance(build_loss(cfg.LOSS, cfg), IJEPALoss)
    cases = [
        ("DATA.TRAIN.COLLATE_FUNCTION", "default_collate", "COLLATE_FUNCTION"),
        ("DATA.TRAIN.TARGET_KEY_NAMES", ["data"], r"TARGET_KEY_NAMES: \[target_masks\]"),
        ("DATA.TRAIN.INPUT_KEY_NAMES", ["data", "mask"], "INPUT_KEY_NAMES"),
        ("MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.NAME", "ibot", "NAME: mae"),
        ("DATA.TRAIN.COLLATE_FUNCTION_PARAMS.patch_size", 4, "patch_size=4 differs"),
    ]
    for path, value, match in cases:
        cfg = quick_config()
        *parents, leaf = path.split(".")
        node = cfg
        for key in parents:
            node = node[key]
        node[leaf] = value
        with pytest.raises(ConfigError, match=match):
            build_loss(cfg.LOSS, cfg)
    cfg = quick_config()
    cfg.LOSS.ijepa_loss.beta = 1.0
    with pytest.raises(ConfigError, match="no key"):
        build_loss(cfg.LOSS, cfg)


def test_bf16_autocast_forward_and_backward_without_nan() -> None:
    """The quick model under CPU bf16 autocast with inputs scaled up 1000x (a stress on the
    layer norms and on the squared distances): a finite float32 loss close to fp32's and
    finite gradients everywhere."""
    cfg = quick_config()
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss_fn = build_loss(cfg.LOSS, cfg)
    loss_fn.bind_model(model)
    images, mask, targets = _batch()
    for scale in (1.0, 1000.0):
        batch = {"data": images * scale, "mask": mask, "target_masks": targets}
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(batch)
            assert out[0].dtype == torch.bfloat16
            tokens = loss_fn.run_target_encoder(batch["data"])
            loss = loss_fn(out, targets, teacher_output=tokens)
        assert loss.dtype == torch.float32 and torch.isfinite(loss)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        with torch.no_grad():
            tokens = loss_fn.run_target_encoder(batch["data"])
            fp32 = loss_fn(model(batch), targets, teacher_output=tokens)
        assert float(loss.detach()) == pytest.approx(float(fp32), rel=0.05)

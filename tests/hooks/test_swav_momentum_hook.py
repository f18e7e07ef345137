"""SwAVMomentumHook against VISSL's ``swav_momentum_hooks.py``: the momentum encoder's
BatchNorm running statistics follow the model's (``_update_momentum_network`` copies every
``running_*`` buffer), and the encoder forwards only the ``crops_for_assign`` crops
(``on_forward``), whose codes the loss pairs with the right crops."""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from tests.losses.test_swav_momentum_loss import make_loss, ref_loss
from vissl.hooks.swav_hooks import SwAVMomentumHook, assign_crops
from vissl.losses.swav_momentum_loss import SwAVMomentumLoss
from vissl.models.heads.swav_head import SwAVHead


class BNModel(nn.Module):
    """conv -> BatchNorm -> pool, then a swav_head; a list of crops (any sizes) runs one
    trunk pass per crop, rows concatenated in list order (as the multi-resolution model)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.heads = nn.ModuleList([SwAVHead({}, dims=[8, 4], num_clusters=[5])])

    def forward(self, x: torch.Tensor | list[torch.Tensor]) -> list[Any]:
        crops = x if isinstance(x, list) else [x]
        return [self.heads[0](torch.cat([self.trunk(c) for c in crops]))]


def _task(model: nn.Module, loss: SwAVMomentumLoss, inputs: Any, iteration: int) -> Any:
    return SimpleNamespace(
        base_model=model,
        loss=loss,
        iteration=iteration,
        train=True,
        precision=SimpleNamespace(autocast=contextlib.nullcontext),
        last_batch=SimpleNamespace(sample={"input": inputs}),
    )


def _crops(batch: int, sizes: list[int]) -> list[torch.Tensor]:
    """Non-standardised crops (mean 5, std 3), as real images before normalisation."""
    return [5.0 + 3.0 * torch.randn(batch, 3, s, s) for s in sizes]


def _train(
    model: nn.Module, loss: SwAVMomentumLoss, steps: int, sizes: list[int], check: Any = None
) -> None:
    """``steps`` SGD steps driven by the hook, in the trainer's order: model forward,
    on_forward, loss, backward, step, on_update."""
    hook = SwAVMomentumHook()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for it in range(steps):
        crops = _crops(4, sizes)
        task = _task(model, loss, crops, it)
        output = model(crops)
        hook.on_forward(task)
        if check is not None:
            check(task, crops)
        opt.zero_grad()
        loss(output[0]).backward()
        opt.step()
        hook.on_update(task)


def test_encoder_bn_statistics_follow_the_model_at_the_default_eval_mode() -> None:
    torch.manual_seed(0)
    model = BNModel()
    loss = make_loss(num_crops=2, crops_for_assign=[0, 1])  # momentum_eval_mode_iter_start 0
    assert loss.momentum_eval_mode_iter_start == 0
    loss.bind_model(model)
    encoder = loss.momentum_encoder
    _train(model, loss, steps=3, sizes=[6, 6])
    assert not encoder.training  # eval mode from iteration 0
    bn, m_bn = model.trunk[1], encoder.trunk[1]
    assert float(bn.running_mean.abs().max()) > 0.1  # the model's statistics moved
    assert torch.equal(m_bn.running_mean, bn.running_mean)
    assert torch.equal(m_bn.running_var, bn.running_var)


def test_eval_encoder_normalises_with_the_statistics_of_the_models_forward() -> None:
    """VISSL's on_forward order: the buffers are copied after the model's forward of this
    batch, before the encoder's. With momentum 0 the encoder is then the model in eval mode."""
    torch.manual_seed(1)
    model = BNModel()
    loss = make_loss(num_crops=2, crops_for_assign=[0, 1], momentum=0.0)
    loss.bind_model(model)

    def check(task: Any, crops: list[torch.Tensor]) -> None:
        reference = copy.deepcopy(model).eval()
        with torch.no_grad():
            emb, scores = reference(crops)[0]
        m_emb, m_scores = task.loss.momentum_output
        assert torch.allclose(m_scores, scores, atol=1e-5)
        assert torch.allclose(m_emb, emb, atol=1e-5)

    _train(model, loss, steps=3, sizes=[6, 6], check=check)


def test_encoder_forwards_only_the_assign_crops() -> None:
    """4 crops of two resolutions (2 x 8 px, 2 x 6 px), crops_for_assign [0, 1]: the
    encoder's trunk sees the 2 assignment crops' rows only (VISSL's on_forward)."""
    torch.manual_seed(2)
    model = BNModel()
    loss = make_loss(num_crops=4, crops_for_assign=[0, 1])
    loss.bind_model(model)
    seen: list[torch.Tensor] = []
    handle = loss.momentum_encoder.trunk.register_forward_pre_hook(
        lambda _m, args: seen.append(args[0])
    )

    def check(task: Any, crops: list[torch.Tensor]) -> None:
        assert [t.shape[0] for t in seen] == [4, 4]  # 2 crops of 4 samples
        assert torch.equal(seen[0], crops[0]) and torch.equal(seen[1], crops[1])
        assert task.loss.momentum_output[1].shape == (8, 5)
        seen.clear()

    _train(model, loss, steps=2, sizes=[8, 8, 6, 6], check=check)
    handle.remove()


def test_loss_pairs_the_codes_with_their_crops_through_the_hook() -> None:
    """crops_for_assign [3, 0] of 4 multi-resolution crops, momentum 0: the codes of crop 3
    are Sinkhorn of the (eval) model's scores of crop 3, predicted by crops 0, 1, 2."""
    torch.manual_seed(3)
    model = BNModel()
    loss = make_loss(num_crops=4, crops_for_assign=[3, 0], momentum=0.0)
    loss.bind_model(model)
    crops = _crops(4, [8, 8, 6, 6])
    output = model(crops)
    SwAVMomentumHook().on_forward(_task(model, loss, crops, 0))
    with torch.no_grad():
        _, m_scores = copy.deepcopy(model).eval()([crops[3], crops[0]])[0]
    got = loss(output[0]).item()
    assert got == pytest.approx(ref_loss(output[0][1], m_scores, 4, [3, 0]), rel=1e-5)


def test_assign_crops_of_a_crop_major_tensor_and_bad_inputs() -> None:
    x = torch.arange(12.0).reshape(12, 1)  # 3 crops of 4 samples, crop-major
    assert torch.equal(assign_crops(x, [2, 0], 3), torch.cat([x[8:], x[:4]]))
    crops = [torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)]
    assert assign_crops(crops, [0, 1, 2], 3) is crops  # every crop: no copy
    assert assign_crops(crops, [1], 3) == [crops[1]]
    with pytest.raises(ValueError, match="2 crop tensors but num_crops=3"):
        assign_crops(crops[:2], [0], 3)
    with pytest.raises(ValueError, match="not num_crops=5 crops"):
        assign_crops(x, [0], 5)

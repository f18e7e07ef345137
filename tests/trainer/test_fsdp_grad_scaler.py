"""fp16 loss scaling on FSDP2-sharded gradients (the FSDP task's ``AMP_PARAMS`` fp16 path).

Each rank holds a slice of every gradient (a DTensor shard), so an overflow can sit in one
rank's slice only. The scaler must then skip the step on *every* rank and back off the
scale alike, or the ranks' weights part. Gradient clipping after the unscale must use the
norm of the whole gradient, not of a rank's slice. Checked with two gloo processes against
one process holding the whole model, through vissl's ``GradScalerPrecision`` and
``GradClipHook`` (the CUDA suite runs the fp16 task itself; this is the CPU half).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from vissl.hooks.state_update_hooks import GradClipHook
from vissl.trainer.precision import GradScalerPrecision
from vissl.utils.test_utils import spawn_gloo

INIT_SCALE = 2.0**10
MAX_NORM = 0.05  # below the first step's gradient norm: clipping acts


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)


def _full(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).detach().clone()


def _train(rank: int, world_size: int, sharded: bool) -> dict[str, Any]:
    net = _net()
    if sharded:
        from torch.distributed.fsdp import fully_shard

        for layer in (net[0], net[2]):
            fully_shard(layer)
        fully_shard(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    precision = GradScalerPrecision("cpu", {"init_scale": INIT_SCALE})
    task = SimpleNamespace(precision=precision, optimizer=opt, base_model=net)
    clip = GradClipHook(max_norm=MAX_NORM)
    x, y = _batch()
    per = x.shape[0] // world_size
    rows = slice(rank * per, (rank + 1) * per)
    out: dict[str, Any] = {"norms": [], "scales": []}
    for step in range(3):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(net(x[rows]), y[rows])
        precision.backward(loss)
        if step == 1 and (rank == world_size - 1):
            # an overflow in the last rank's slice of the first weight's gradient only
            grad = net[0].weight.grad
            local = grad.to_local() if hasattr(grad, "to_local") else grad
            local.view(-1)[-1] = float("inf")
        clip.on_backward(task)  # type: ignore[arg-type]  # unscales, then clips
        grads = [_full(p.grad) for p in net.parameters() if p.grad is not None]
        out["norms"].append(
            float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])))
        )
        precision.step(opt)
        out["scales"].append(precision.grad_scaler.get_scale())
        out[f"weights_{step}"] = {n: _full(p) for n, p in net.named_parameters()}
    return out


def _reference() -> dict[str, Any]:
    """One process, whole model, same batch; step 1 overflows too."""
    return _train(0, 1, sharded=False)


@pytest.mark.slow  # 2 processes and FSDP2's first sharded steps: ~20 s on 2 busy cores
def test_an_overflow_in_one_ranks_shard_skips_the_step_on_every_rank() -> None:
    ranks = spawn_gloo(_train, 2, True)
    ref = _reference()
    for out in ranks:
        # step 1 skipped everywhere: the weights after it are those after step 0
        for name, value in out["weights_1"].items():
            assert torch.equal(value, out["weights_0"][name]), name
        # the scale backed off once, on both ranks, as on one process
        assert out["scales"] == ref["scales"] == [INIT_SCALE, INIT_SCALE / 2, INIT_SCALE / 2]
    # the ranks hold the same full weights and they equal the one-process run's: clipping
    # used the whole gradient's norm (a rank's slice has a smaller one)
    for step in (0, 2):
        for name, value in ref[f"weights_{step}"].items():
            for out in ranks:
                torch.testing.assert_close(
                    out[f"weights_{step}"][name], value, rtol=1e-5, atol=1e-6
                )
    # after clipping, the whole gradient's norm is MAX_NORM on every rank (it was above)
    for out in ranks:
        assert abs(out["norms"][0] - MAX_NORM) < 1e-5
    assert abs(ref["norms"][0] - MAX_NORM) < 1e-5

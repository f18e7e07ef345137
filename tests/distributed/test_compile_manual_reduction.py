"""``MODEL.COMPILE`` with manual gradient reduction: gradients are reduced once.

The task wraps the model in DDP (the reducer's ``wrap``) and then in ``torch.compile``;
the manual reducer must still find DDP under the compile wrapper and run forward and
backward under ``no_sync``, or DDP reduces the gradients during backward and the
reducer then reduces them a second time.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from vissl.trainer.gradient_reduction import ManualReduction, unwrap_compiled
from vissl.utils.test_utils import spawn_gloo


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_unwrap_compiled_sees_through_torch_compile() -> None:
    model = _model()
    compiled = torch.compile(model, backend="eager")
    assert compiled is not model
    assert unwrap_compiled(compiled) is model
    assert unwrap_compiled(model) is model


def _compiled_manual(rank: int, world_size: int) -> Any:
    model = _model()
    reducer = ManualReduction()
    ddp = reducer.wrap(model, torch.device("cpu"))
    assert isinstance(ddp, DistributedDataParallel)
    ddp_reductions = []

    # No annotations: DDP checks them and this module's are strings (future import).
    def count(state, bucket):  # type: ignore[no-untyped-def]
        ddp_reductions.append(bucket.index())
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, count)
    compiled = torch.compile(ddp, backend="eager")  # what MODEL.COMPILE does in the task
    x, y = _batch()
    per = x.shape[0] // world_size
    rows = slice(rank * per, (rank + 1) * per)
    with reducer.context(compiled):
        grad_sync_during_backward = ddp.require_backward_grad_sync
        F.cross_entropy(compiled(x[rows]), y[rows]).backward()
    reducer.after_backward(compiled)
    return grad_sync_during_backward, len(ddp_reductions), _grads(model)


def test_compiled_ddp_model_is_reduced_once_and_matches_one_process() -> None:
    reference = _model()
    x, y = _batch()
    F.cross_entropy(reference(x), y).backward()
    expected = _grads(reference)
    for grad_sync, ddp_reductions, grads in spawn_gloo(_compiled_manual, 2):
        assert not grad_sync, "forward/backward must run under DDP's no_sync"
        assert ddp_reductions == 0, "DDP reduced the gradients as well as the reducer"
        assert grads.keys() == expected.keys()
        for name, grad in expected.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6)

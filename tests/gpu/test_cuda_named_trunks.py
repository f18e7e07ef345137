"""VISSL's named trunks (efficientnet, convnext, mobilenetv3, swin, xcit, convit, beit,
resnet_sk) on CUDA: fp32 agrees with the CPU, bf16 autocast trains (finite gradients)."""

from __future__ import annotations

import pytest
import torch

from tests.models.test_vissl_named_trunks import TINY, build


@pytest.mark.parametrize("name", list(TINY))
def test_named_trunk_on_cuda_matches_cpu_and_trains_in_bf16(name: str) -> None:
    pytest.importorskip("timm")
    size = TINY[name][1]
    x = torch.randn(4, 3, size, size)
    cpu = build(name).eval()
    gpu = build(name).eval().cuda()
    with torch.no_grad():
        (ref,) = cpu(x)
        (out,) = gpu(x.cuda())
    torch.testing.assert_close(out.float().cpu(), ref, rtol=1e-3, atol=1e-3)

    gpu.train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        (y,) = gpu(x.cuda().contiguous(memory_format=torch.channels_last))
    y.float().square().mean().backward()
    grads = [p.grad for p in gpu.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)

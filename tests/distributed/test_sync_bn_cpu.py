"""MODEL.SYNC_BN_CONFIG on CPU: BatchNorm statistics synchronised over gloo.

Two processes with half a batch each must compute what one process computes on the
whole batch: outputs, input and parameter gradients, running statistics.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.utils.sync_bn import CpuSyncBatchNorm, convert_sync_batchnorm
from vissl.utils.test_utils import spawn_gloo


def _config(convert: bool = True, group_size: int = -1, sync_type: str = "pytorch") -> AttrDict:
    return AttrDict(
        {
            "MODEL": {
                "SYNC_BN_CONFIG": {
                    "CONVERT_BN_TO_SYNC_BN": convert,
                    "SYNC_BN_TYPE": sync_type,
                    "GROUP_SIZE": group_size,
                }
            },
            "DISTRIBUTED": {"NUM_PROC_PER_NODE": 2, "NUM_NODES": 1},
        }
    )


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten())
    with torch.no_grad():
        net[1].weight.uniform_(0.5, 1.5)
        net[1].bias.uniform_(-0.5, 0.5)
    return net


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 3, 6, 6, generator=g) * 2 + 1
    return x, torch.randn(8, 64, generator=g)


def _run(net: nn.Module, x: torch.Tensor, w: torch.Tensor, scale: float) -> dict[str, Any]:
    x = x.clone().requires_grad_(True)
    for _ in range(2):  # two steps: running statistics accumulate
        out = net(x)
    ((out * w).sum() * scale).backward()
    bn = net[1]
    return {
        "out": out.detach(),
        "x_grad": x.grad,
        "w_grad": bn.weight.grad,
        "b_grad": bn.bias.grad,
        "conv_grad": net[0].weight.grad,
        "running_mean": bn.running_mean.clone(),
        "running_var": bn.running_var.clone(),
        "type": type(bn).__name__,
    }


def _two_ranks(rank: int, world_size: int) -> dict[str, Any]:
    net = convert_sync_batchnorm(_net(), _config(), torch.device("cpu"))
    x, w = _data()
    per = x.shape[0] // world_size
    sl = slice(rank * per, (rank + 1) * per)
    result = _run(net, x[sl], w[sl], 1.0)
    for key in ("w_grad", "b_grad", "conv_grad"):  # what DDP would do: average
        torch.distributed.all_reduce(result[key])
        result[key] /= world_size
    return result


def test_cpu_sync_bn_two_processes_equal_one_process_whole_batch():
    x, w = _data()
    # One process, whole batch; the 1/2 factor matches the averaged per-rank gradients.
    ref = _run(_net(), x, w, 0.5)
    r0, r1 = spawn_gloo(_two_ranks, 2)
    assert r0["type"] == "CpuSyncBatchNorm"
    torch.testing.assert_close(torch.cat([r0["out"], r1["out"]]), ref["out"])
    torch.testing.assert_close(
        torch.cat([r0["x_grad"], r1["x_grad"]]), ref["x_grad"] * 2, rtol=1e-4, atol=1e-6
    )
    for r in (r0, r1):
        for key in ("w_grad", "b_grad", "conv_grad"):
            torch.testing.assert_close(r[key], ref[key], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(r["running_mean"], ref["running_mean"])
        torch.testing.assert_close(r["running_var"], ref["running_var"])


def test_sync_bn_one_process_is_a_no_op_and_off_when_not_asked():
    net = _net()
    assert convert_sync_batchnorm(net, _config(), torch.device("cpu")) is net
    assert isinstance(net[1], nn.BatchNorm2d)
    assert convert_sync_batchnorm(net, _config(convert=False), torch.device("cpu")) is net


def test_cpu_sync_bn_eval_and_single_process_behave_like_batchnorm():
    ref, bn = _net(), _net()
    bn[1] = CpuSyncBatchNorm(4)
    bn[1].load_state_dict(ref[1].state_dict())
    x, _ = _data()
    torch.testing.assert_close(bn(x), ref(x))
    bn.eval()
    ref.eval()
    torch.testing.assert_close(bn(x), ref(x))


def _bad_group(rank: int, world_size: int) -> str:
    try:
        convert_sync_batchnorm(_net(), _config(group_size=3), torch.device("cpu"))
    except ConfigError as err:
        return f"{err.key_path}: {err}"
    return "no error"


def test_sync_bn_bad_group_size_and_type_are_config_errors():
    msg, _ = spawn_gloo(_bad_group, 2)
    assert msg.startswith("config.MODEL.SYNC_BN_CONFIG.GROUP_SIZE:")
    assert "divide" in msg
    with pytest.raises(ConfigError, match="SYNC_BN_TYPE"):
        convert_sync_batchnorm(_net(), _config(sync_type="fast"), torch.device("cpu"))

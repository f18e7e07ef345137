#!/usr/bin/env python3
"""Memory per rank of the model's state, FSDP2 (``self_supervision_fsdp_task``) vs DDP.

N processes (gloo on CPU, nccl on GPUs) each build the same model with vissl's
``build_model`` (a ViT trunk and a DINO-style MLP head by default, or a RegNet), wrap it
as the trainer does (DDP, or :func:`vissl.trainer.fsdp.shard_task_model`: the trunk's
blocks and the head sharded), build AdamW over it and take one training step on random
images. Then each rank counts the bytes of the tensors it holds: parameters, gradients
and optimizer state (a DTensor counts its local shard only). The table shows the largest
rank's figures and the ratio to DDP; with FSDP the state falls to about 1/N (buffers and
the rounding of each parameter's split to N rows stay). On a GPU the peak allocated
memory of the step is shown too (``torch.cuda.max_memory_allocated``: the gathered units
of the forward and backward come on top of the state).

CPU (default): ViT-S/16 (22M parameters) at 32 px, 2 and 4 processes::

    python benchmarks/fsdp_memory.py --nprocs 2 4

A larger model or a RegNet, on GPUs::

    python benchmarks/fsdp_memory.py --device cuda --nprocs 2 4 8 --model vit_large
    python benchmarks/fsdp_memory.py --model regnet_y_16gf --nprocs 2 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from vissl.utils.distributed import find_free_port  # noqa: E402

#: --model -> (overrides of the composed config, the trunk's output width)
VITS = {
    "vit_tiny": (192, 12, 3, 768),
    "vit_small": (384, 12, 6, 1536),
    "vit_base": (768, 12, 12, 3072),
    "vit_large": (1024, 24, 16, 4096),
}


def model_overrides(model: str, image_size: int) -> list[str]:
    """Config overrides building ``model`` (a ViT size or a named RegNet) with a head."""
    if model in VITS:
        dim, layers, heads, mlp = VITS[model]
        trunk = [
            "config.MODEL.TRUNK.NAME=vision_transformer",
            f"config.MODEL.TRUNK.VISION_TRANSFORMERS.IMAGE_SIZE={image_size}",
            "config.MODEL.TRUNK.VISION_TRANSFORMERS.PATCH_SIZE=16",
            f"config.MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM={dim}",
            f"config.MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS={layers}",
            f"config.MODEL.TRUNK.VISION_TRANSFORMERS.NUM_HEADS={heads}",
            f"config.MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM={mlp}",
        ]
    else:
        trunk = ["config.MODEL.TRUNK.NAME=regnet", f"+config.MODEL.TRUNK.REGNET.name={model}"]
        dim = 0  # read from the built trunk
    head = f"config.MODEL.HEAD.PARAMS=[[mlp,{{dims:[{dim},2048,256]}}]]"
    return [*trunk, head]


def _state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    from vissl.trainer.fsdp import local_tensor

    def size(t: torch.Tensor) -> int:
        t = local_tensor(t)
        return t.numel() * t.element_size()

    params = sum(size(p) for p in model.parameters())
    grads = sum(size(p.grad) for p in model.parameters() if p.grad is not None)
    buffers = sum(size(b) for b in model.buffers())
    opt = sum(
        size(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    )
    return {"params": params, "grads": grads, "optimizer": opt, "buffers": buffers}


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    from vissl.models import build_model
    from vissl.trainer.fsdp import shard_task_model
    from vissl.utils.hydra_config import hydra_compose_and_validate

    overrides = model_overrides(args.model, args.image_size)
    if args.model not in VITS:  # the head's input width is the RegNet's output width
        _, probe = hydra_compose_and_validate(["config=quick_start", *overrides])
        with torch.device("meta"):
            trunk = build_model(probe.MODEL, probe.OPTIMIZER).trunk
            width = trunk(torch.empty(1, 3, 32, 32))[-1].shape[1]
        overrides[-1] = f"config.MODEL.HEAD.PARAMS=[[mlp,{{dims:[{width},2048,256]}}]]"
    _, cfg = hydra_compose_and_validate(["config=quick_start", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER).to(device)
    if args.mode == "fsdp":
        shard_task_model(model, [], {}, device)
        forward: torch.nn.Module = model
    else:
        forward = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[rank] if cuda else None
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    out_tensors = forward(images)
    loss = sum(o.float().pow(2).mean() for o in out_tensors[0])
    loss.backward()  # type: ignore[union-attr]
    optimizer.step()
    figures: dict[str, Any] = _state_bytes(model, optimizer)
    if cuda:
        figures["peak_allocated"] = torch.cuda.max_memory_allocated()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, figures)
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(gathered, f)
    dist.destroy_process_group()


def measure(args: argparse.Namespace, mode: str, nprocs: int) -> dict[str, Any]:
    """The largest rank's figures for ``mode`` on ``nprocs`` processes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "figures.json")
        run_args = argparse.Namespace(**{**vars(args), "mode": mode})
        mp.spawn(_worker, args=(nprocs, find_free_port(), run_args, out), nprocs=nprocs)
        with open(out, encoding="utf-8") as f:
            ranks = json.load(f)
    keys = ranks[0].keys()
    worst = {k: max(r[k] for r in ranks) for k in keys}
    worst["state"] = worst["params"] + worst["grads"] + worst["optimizer"]
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--model",
        default="vit_small",
        help="vit_tiny|vit_small|vit_base|vit_large or a RegNet name",
    )
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--json", default="", help="also write the rows to this file")
    args = parser.parse_args(argv)
    mib = 1024 * 1024
    rows = []
    header = "| processes | mode | params MiB | grads MiB | optimizer MiB | state MiB | vs DDP |"
    if args.device == "cuda":
        header += " peak allocated MiB |"
    print(f"model {args.model}, images {args.image_size} px, AdamW, max over ranks")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for n in args.nprocs:
        ddp = measure(args, "ddp", n)
        fsdp = measure(args, "fsdp", n)
        for mode, fig in (("ddp", ddp), ("fsdp", fsdp)):
            ratio = fig["state"] / ddp["state"]
            row = (
                f"| {n} | {mode} | {fig['params'] / mib:.1f} | {fig['grads'] / mib:.1f} | "
                f"{fig['optimizer'] / mib:.1f} | {fig['state'] / mib:.1f} | {ratio:.3f} |"
            )
            if "peak_allocated" in fig:
                row += f" {fig['peak_allocated'] / mib:.1f} |"
            print(row, flush=True)
            rows.append({"nprocs": n, "mode": mode, **fig, "vs_ddp": ratio})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

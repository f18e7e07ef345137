"""DINO training throughput and peak memory, with and without activation checkpointing.

The student, teacher, loss and optimizer come from a composed vissl config (by default
``pretrain/dino/dino_8gpu_vits16``: ViT-S/16, 2 global crops of 224 px and 10 local
crops of 96 px, dino_head of 65536 outputs, AdamW); the batches are random tensors of the
config's crop sizes, made once on the device, so data loading is not measured. One step
is what ``standard_train_step`` and ``DINOHook`` do: the teacher on the global crops
(no grad), the student on every crop, ``dino_loss``, backward, optimizer step, EMA update
of the teacher, all under the config's autocast (bf16 unless ``--fp32``).

Each variant (``CHECKPOINT_BLOCK`` off / on) runs ``--warmup`` untimed steps, then
``--steps`` timed steps, ``--rounds`` times interleaved; the table gives the median
images/s (samples, each of all its crops) and the peak memory of the device
(``torch.cuda.max_memory_allocated``; on a CPU it is not measured).

Usage::

    python benchmarks/dino_vit.py --device cuda --batch-size 64        # GPU, ViT-S/16
    python benchmarks/dino_vit.py --config test/integration_test/quick_dino_vit \\
        --batch-size 8 --steps 3 --rounds 1 --warmup 1                  # CPU smoke test
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from vissl.losses.build import build_loss
from vissl.losses.dino_loss import cosine_momentum, single_tensor
from vissl.models import build_model
from vissl.models.momentum import ema_update_
from vissl.optimizers import build_optimizer
from vissl.utils.hydra_config import hydra_compose_and_validate


def crop_sizes(cfg: Any) -> list[int]:
    """One side length per crop, from the config's ImgPilToMultiCrop transform."""
    for t in cfg.DATA.TRAIN.TRANSFORMS:
        if t.get("name") == "ImgPilToMultiCrop":
            return [int(s) for s, n in zip(t["size_crops"], t["num_crops"]) for _ in range(n)]
    raise SystemExit("the config has no ImgPilToMultiCrop transform")


def build(args: argparse.Namespace, checkpoint_blocks: bool) -> dict[str, Any]:
    overrides = [
        f"config={args.config}",
        f"config.MODEL.TRUNK.VISION_TRANSFORMERS.CHECKPOINT_BLOCK={checkpoint_blocks}",
        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={args.batch_size}",
        "config.DISTRIBUTED.NUM_NODES=1",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
        *args.overrides,
    ]
    _, cfg = hydra_compose_and_validate(overrides)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER).to(device)
    loss = build_loss(cfg.LOSS, cfg).to(device)
    loss.bind_model(model)
    optimizer = build_optimizer(cfg.OPTIMIZER, model)
    sizes = crop_sizes(cfg)
    crops = [torch.randn(args.batch_size, 3, s, s, device=device) for s in sizes]
    return {"model": model, "loss": loss, "optimizer": optimizer, "crops": crops}


def step(parts: dict[str, Any], iteration: int, dtype: torch.dtype | None, device: str) -> None:
    model, loss, optimizer, crops = (
        parts["model"],
        parts["loss"],
        parts["optimizer"],
        parts["crops"],
    )
    enabled = dtype is not None
    with torch.autocast(device_type=device, dtype=dtype or torch.float32, enabled=enabled):
        with torch.no_grad():
            loss.teacher_output = single_tensor(loss.teacher(loss.teacher_input(crops)), "teacher")
        out = model(crops)
        value = loss(out)
    optimizer.zero_grad(set_to_none=True)
    value.backward()
    optimizer.step()
    ema_update_(loss.teacher, model, cosine_momentum(iteration, 10_000, loss.momentum))


def run_variant(args: argparse.Namespace, checkpoint_blocks: bool) -> tuple[float, float]:
    parts = build(args, checkpoint_blocks)
    dtype = None if args.fp32 else torch.bfloat16
    cuda = args.device.startswith("cuda")
    for i in range(args.warmup):
        step(parts, i, dtype, args.device.split(":")[0])
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for i in range(args.steps):
        step(parts, args.warmup + i, dtype, args.device.split(":")[0])
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    del parts
    if cuda:
        torch.cuda.empty_cache()
    return args.batch_size * args.steps / seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="pretrain/dino/dino_8gpu_vits16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fp32", action="store_true", help="no autocast (default: bf16)")
    parser.add_argument("overrides", nargs="*", help="extra config overrides")
    args = parser.parse_args()
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for r in range(args.rounds):
        for ckpt in [False, True] if r % 2 == 0 else [True, False]:
            results[ckpt].append(run_variant(args, ckpt))
            print(
                f"round {r + 1}: checkpointing={ckpt} {results[ckpt][-1][0]:.1f} img/s", flush=True
            )
    print(
        f"\n{args.config} batch {args.batch_size} on {args.device} "
        f"({'fp32' if args.fp32 else 'bf16'}):"
    )
    print("| activation checkpointing | images/s (median) | peak memory (GiB) |")
    print("|---|---|---|")
    for ckpt in (False, True):
        ips = statistics.median(x[0] for x in results[ckpt])
        peak = max(x[1] for x in results[ckpt])
        memory = "n/a (CPU)" if peak != peak else f"{peak:.2f}"
        print(f"| {'on' if ckpt else 'off'} | {ips:.1f} | {memory} |")


if __name__ == "__main__":
    main()

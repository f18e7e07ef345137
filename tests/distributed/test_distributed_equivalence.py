"""1 process against 2 processes on the same global batch and seed: equal parameters.

Why the runs are comparable:
- Data: ``synthetic`` images depend only on (seed, index); the only transform is
  ToTensor, so a sample is the same tensor in every process. The DistributedSampler
  draws one permutation from the seed; with 2 ranks and 4 samples each, the two ranks'
  batch ``j`` together are exactly the 8 samples of the single process's batch ``j``.
- Model: a ResNet-18 trunk with GroupNorm (no BatchNorm: batch statistics would couple
  the samples of a rank), so every sample's loss depends on that sample only.
- Loss: cross-entropy averaged over the batch; averaging the two ranks' gradients (what
  DDP and the manual reduction do) gives the gradient of the 8-sample mean.
- Init: rank 0 builds the model with SEED_VALUE as the single process does; DDP's
  constructor broadcasts rank 0's weights.
- Optimizer: SGD with momentum, deterministic given the gradients.
Floating-point sums differ in order, so parameters agree to ~1e-6, not bitwise.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest
import torch

from tests.integration._runs import REPO, run_config
from vissl.utils.checkpoint import load_checkpoint
from vissl.utils.distributed_launcher import launch_distributed
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import find_free_port

TOOL = os.path.join(REPO, "tools", "run_distributed_engines.py")
CONFIG = "test/cpu_test/tiny_supervised"
GLOBAL_BATCH = 8
STEPS = 6
COMMON = [
    "config.TEST_MODEL=False",
    "config.METERS.names=[]",
    "config.DATA.TRAIN.DATA_SOURCES=[synthetic]",
    "config.DATA.TRAIN.LABEL_TYPE=standard",
    f"config.DATA.TRAIN.DATA_LIMIT={GLOBAL_BATCH * STEPS}",
    "config.DATA.TRAIN.DEFAULT_GRAY_IMG_SIZE=16",
    "config.DATA.TRAIN.TRANSFORMS=[{name: ToTensor}]",
    "config.MODEL.TRUNK.RESNETS.NORM=GroupNorm",
    "config.MODEL.TRUNK.RESNETS.GROUPNORM_GROUPS=4",
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
    "config.MODEL.HEAD.PARAMS=[[mlp, {dims: [128, 10]}]]",
    "config.OPTIMIZER.num_epochs=1",
    "config.MULTI_PROCESSING_METHOD=fork",
    "config.CHECKPOINT.AUTO_RESUME=False",
]
FINAL = "model_final_checkpoint_phase0.torch"


def _overrides(folder, nproc: int, nodes: int = 1) -> list[str]:
    return [
        *COMMON,
        f"config.DISTRIBUTED.NUM_NODES={nodes}",
        f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc}",
        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={GLOBAL_BATCH // (nproc * nodes)}",
        f"config.CHECKPOINT.DIR={folder}",
    ]


def _params(folder) -> dict[str, torch.Tensor]:
    model = load_checkpoint(str(folder / FINAL))["classy_state_dict"]["base_model"]["model"]
    return {f"{part}.{k}": v for part in ("trunk", "heads") for k, v in model[part].items()}


def _world_size(folder) -> int:
    return int(load_checkpoint(str(folder / FINAL))["classy_state_dict"]["world_size"])


def _assert_same(run, ref, what: str) -> None:
    assert run.keys() == ref.keys()
    worst = max((run[k].float() - ref[k].float()).abs().max().item() for k in ref)
    assert worst <= 1e-5, f"{what}: parameters differ by up to {worst:.2e}"


def _tool(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(env_extra or {})
    return subprocess.Popen(
        [*args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, global batch 8."""
    folder = tmp_path_factory.mktemp("one_process")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each of the 2 workers below
    try:
        run_config(CONFIG, *_overrides(folder, 1))
    finally:
        torch.set_num_threads(threads)
    params = _params(folder)
    # The run trained: parameters moved away from the initial ones.
    assert load_checkpoint(str(folder / FINAL))["iteration"] == STEPS
    return params


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_two_spawned_processes_ddp_equal_one_process(tmp_path, reference):
    run_config(CONFIG, *_overrides(tmp_path, 2))
    assert _world_size(tmp_path) == 2
    _assert_same(_params(tmp_path), reference, "2 processes, DDP")


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_two_processes_manual_reduction_with_activation_checkpointing(tmp_path, reference):
    run_config(
        CONFIG,
        *_overrides(tmp_path, 2),
        "config.DISTRIBUTED.MANUAL_GRADIENT_REDUCTION=True",
        "config.MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True",
        "config.MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS=2",
    )
    log = (tmp_path / "log.txt").read_text()
    assert "gradient reduction manual" in log
    _assert_same(_params(tmp_path), reference, "2 processes, manual reduction + checkpointing")


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_torchrun_two_processes_equal_one_process(tmp_path, reference):
    proc = _tool(
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        TOOL,
        f"config={CONFIG}",
        *_overrides(tmp_path, 2),
        env_extra={"OMP_NUM_THREADS": "1"},
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    assert _world_size(tmp_path) == 2
    _assert_same(_params(tmp_path), reference, "torchrun --nproc_per_node 2")


def _launch_node(overrides: list[str], node_id: int) -> None:
    root, cfg = hydra_compose_and_validate([f"config={CONFIG}", *overrides])
    launch_distributed(cfg, node_id=node_id, engine_name=str(root.engine_name))


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_two_nodes_on_one_machine_train_to_completion(tmp_path, reference):
    """Two launches, as on two machines: node 1 in another (forked) process, node 0 here."""
    run_id = f"127.0.0.1:{find_free_port()}"
    overrides = [*_overrides(tmp_path, 1, nodes=2), f"config.DISTRIBUTED.RUN_ID={run_id}"]
    node1 = multiprocessing.get_context("fork").Process(target=_launch_node, args=(overrides, 1))
    node1.start()
    try:
        _launch_node(overrides, 0)
        node1.join(timeout=120)
    finally:
        if node1.is_alive():
            node1.kill()
    assert node1.exitcode == 0
    assert _world_size(tmp_path) == 2
    _assert_same(_params(tmp_path), reference, "2 nodes x 1 process")

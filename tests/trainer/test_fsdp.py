"""vissl.trainer.fsdp in one process: the wrap policy, MODEL.FSDP_CONFIG's reading, the
fairscale notes, VISSL's *_fsdp names and the FSDP task in config validation. The
sharded runs themselves are in tests/integration/test_fsdp.py (2 gloo processes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vissl.config.validation import VISSL_UNSUPPORTED_PREFIXES
from vissl.errors import ConfigError
from vissl.models import build_model
from vissl.trainer.fsdp import FSDPSettings, fairscale_notes, sharding_units
from vissl.utils.hydra_config import hydra_compose_and_validate

CPU = torch.device("cpu")


def _model(config: str, *overrides: str) -> nn.Module:
    _, cfg = hydra_compose_and_validate([f"config={config}", *overrides])
    return build_model(cfg.MODEL, cfg.OPTIMIZER)


def test_default_units_are_the_trunks_blocks_and_each_head() -> None:
    model = _model("quick_start")
    names = [n for n, _ in sharding_units(model, FSDPSettings())]
    blocks = [f"trunk._feature_blocks.layer{s}.{b}" for s in range(1, 5) for b in range(2)]
    assert sorted(names) == sorted([*blocks, "heads.0", "heads.1"])
    # the innermost first (fully_shard is applied bottom-up)
    depths = [n.count(".") for n in names]
    assert depths == sorted(depths, reverse=True)


def test_vit_blocks_are_units() -> None:
    model = _model("test/integration_test/quick_dino_vit")
    names = [n for n, _ in sharding_units(model, FSDPSettings())]
    assert names[:2] == ["trunk.blocks.0", "trunk.blocks.1"]
    assert "heads.0" in names


def test_size_threshold_wraps_bottom_up_like_fairscale() -> None:
    model = nn.Sequential(
        nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10)),  # 110 + 110 parameters
        nn.Linear(10, 2),  # 22
    )
    units = dict(sharding_units(model, FSDPSettings(auto_wrap_threshold=100)))
    # each 110-parameter Linear reaches 100; their parent then has none left over
    assert set(units) == {"0.0", "0.1"}
    units = dict(sharding_units(model, FSDPSettings(auto_wrap_threshold=200)))
    assert set(units) == {"0"}  # 220 parameters together


def test_wrap_modules_by_class_name() -> None:
    model = _model("quick_start")
    units = sharding_units(model, FSDPSettings(wrap_modules=["BasicBlock"]))
    assert len(units) == 8 and all(type(m).__name__ == "BasicBlock" for _, m in units)


def test_settings_map_fairscale_precision_keys() -> None:
    fp32 = FSDPSettings.from_config({"mixed_precision": True, "compute_dtype": "float32"}, CPU)
    assert fp32.param_dtype is None and fp32.reduce_dtype is None
    bf16 = FSDPSettings.from_config(
        {"mixed_precision": True, "compute_dtype": "bfloat16", "fp32_reduce_scatter": True}, CPU
    )
    assert bf16.param_dtype == torch.bfloat16 and bf16.reduce_dtype == torch.float32
    # float16 needs CUDA: bfloat16 on a CPU
    fp16 = FSDPSettings.from_config({"mixed_precision": True, "compute_dtype": "float16"}, CPU)
    assert fp16.param_dtype == torch.bfloat16
    off = FSDPSettings.from_config({"mixed_precision": False, "compute_dtype": "float16"}, CPU)
    assert off.param_dtype is None
    assert not FSDPSettings.from_config({"CPU_OFFLOAD": True}, CPU).cpu_offload
    with pytest.raises(ConfigError, match="config.MODEL.FSDP_CONFIG.compute_dtype"):
        FSDPSettings.from_config({"compute_dtype": "float8"}, CPU)
    with pytest.raises(ConfigError, match="AUTO_WRAP_THRESHOLD"):
        FSDPSettings.from_config({"AUTO_WRAP_THRESHOLD": -1}, CPU)


def test_fairscale_only_keys_get_one_line_each() -> None:
    notes = fairscale_notes({"flatten_parameters": False, "bucket_cap_mb": 0, "AMP_TYPE": "O2"})
    assert len(notes) == 2
    assert notes[0].startswith("config.MODEL.FSDP_CONFIG.AMP_TYPE='O2': ")
    assert "first dimension" in notes[1]


def test_seer_and_dino_fsdp_settings_compose() -> None:
    """VISSL's FSDP names and keys (SEER's regnet10B model file) compose and build."""
    _, cfg = hydra_compose_and_validate(
        [
            "config=quick_start",
            "config.TRAINER.TASK_NAME=self_supervision_fsdp_task",
            "config.OPTIMIZER.name=sgd_fsdp",
            "config.MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD=100000000",
            "config.MODEL.FSDP_CONFIG.flatten_parameters=False",
            "config.MODEL.FSDP_CONFIG.compute_dtype=float16",
            "config.MODEL.HEAD.PARAMS=[[mlp_fsdp,{dims:[256,512]}],[swav_head_fsdp,{dims:[512,64],num_clusters:[16]}]]",
            "config.MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True",
            "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        ]
    )
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    assert [type(h).__name__ for h in model.heads] == ["MLP", "SwAVHead"]
    assert not any(p.startswith("MODEL.FSDP_CONFIG") for p in VISSL_UNSUPPORTED_PREFIXES)


@pytest.mark.parametrize(
    "name,features",
    [("seer_swav_regnety128gf_32gpu", 7392), ("seer_swav_regnety256gf_64gpu", 5088)],
)
def test_seer_configs_build_their_model_on_the_meta_device(name: str, features: int) -> None:
    """The SEER recipes compose, select the FSDP task and name registered components; the
    model is built without memory (meta device) and its head fits the trunk."""
    _, cfg = hydra_compose_and_validate(
        [
            f"config=pretrain/seer/{name}",
            "config.MACHINE.DEVICE=cpu",
            "config.DISTRIBUTED.BACKEND=gloo",
            "config.DISTRIBUTED.NUM_NODES=1",
            "config.DISTRIBUTED.RUN_ID=auto",
        ]
    )
    assert cfg.TRAINER.TASK_NAME == "self_supervision_fsdp_task"
    with torch.device("meta"):
        model = build_model(cfg.MODEL, cfg.OPTIMIZER)
        out = model(torch.empty(2, 3, 64, 64))
    assert model.heads[0].projection_head[0].in_features == features
    assert out[0][-1].shape == (2, 16000)  # the prototype scores
    units = sharding_units(model, FSDPSettings())
    assert len(units) == 27 + 1  # the RegNet's blocks (one stage has one), the head


def test_ema_copy_for_sharding_and_the_cpu_device_refusal() -> None:
    """EmaHook.sharded_model_copies (the FSDP task calls it before sharding): the average,
    a frozen copy of the full model; with EMA_DEVICE cpu and the model on a GPU it is
    refused with a ConfigError naming the key (a sharded copy lives on the model's
    device)."""
    from types import SimpleNamespace

    from vissl.hooks.ema_hook import EmaHook
    from vissl.models.momentum import is_momentum_copy

    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    task = SimpleNamespace(base_model=model, device=CPU)
    (copy,) = EmaHook(ema_device="cpu").sharded_model_copies(task)
    assert is_momentum_copy(copy) and not copy.training
    assert all(not p.requires_grad for p in copy.parameters())
    assert torch.equal(copy[0].weight, model[0].weight)
    gpu_task = SimpleNamespace(base_model=model, device=torch.device("cuda", 0))
    with pytest.raises(ConfigError, match="EMA_DEVICE: gpu") as info:
        EmaHook(ema_device="cpu").sharded_model_copies(gpu_task)
    assert info.value.key_path == "config.HOOKS.EMA_MODEL.EMA_DEVICE"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_hook_entry_missing_from_a_sharded_checkpoint_is_not_loaded(tmp_path) -> None:
    """A checkpoint written before HOOKS.EMA_MODEL was turned on has no ema_model: only the
    entries it holds are asked of DCP (the hook then restarts the average, and says so)."""
    import torch.distributed.checkpoint as dcp

    from vissl.trainer.sharded_checkpoint import _saved_entries

    path = str(tmp_path / "ck.dcp")
    dcp.save({"hook_entries": {"other": {"x": torch.ones(2)}}}, checkpoint_id=path, no_dist=True)
    live = {
        "ema_model": {"model": {"trunk": {"w": torch.zeros(2)}}},
        "other": {"x": torch.zeros(2)},
    }
    assert set(_saved_entries(path, live)) == {"other"}

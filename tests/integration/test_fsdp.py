"""``TRAINER.TASK_NAME: self_supervision_fsdp_task`` (FSDP2) end to end on 2 gloo processes.

- The sharded run trains the same model as DDP: the consolidated final weights, DINO's
  teacher and center included, equal the DDP run's to 1e-4 (quick_start too, under
  ``-m slow``).
- Sharded checkpoints (index + DCP folder) resume on another world size (2 -> 1, and
  1 -> 2 under ``-m slow``); a kill -9 inside a phase, then auto-resume, ends bitwise
  equal to the uninterrupted sharded run (``-m slow``).
- ``extra_scripts/convert_sharded_checkpoint.py`` writes a consolidated file that
  ``MODEL.WEIGHTS_INIT`` loads.
- ``HOOKS.EMA_MODEL`` under the sharded task: the average is sharded like the model, equals
  the DDP run's to 1e-5, is saved in the DCP checkpoint, resharded on resume, and the
  converter writes it as ``classy_state_dict["ema_model"]``; its test-phase meters
  (``ENABLE_EMA_METERS``) equal DDP's and a kill -9 resume is bitwise equal, the average
  included (``-m slow``).
- VISSL's ``self_supervision_sdp_task`` (DDP with ZeroRedundancyOptimizer here) equals
  the DDP run to 1e-4.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests._vissl_configs import needs_vissl_configs
from tests.integration._runs import run_config
from vissl.errors import ConfigError
from vissl.trainer.sharded_checkpoint import consolidate_sharded_checkpoint
from vissl.utils.checkpoint import load_checkpoint

DINO = "test/integration_test/quick_dino"
FSDP = "config.TRAINER.TASK_NAME=self_supervision_fsdp_task"
TWO = "config.DISTRIBUTED.NUM_PROC_PER_NODE=2"
# 16 images, 4 per process: 2 steps per phase on 2 processes, 4 steps in all
TINY = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]
# the EMA model, saved in the checkpoints (a small decay, so it moves visibly each step)
EMA = ["config.HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True", "config.HOOKS.EMA_MODEL.DECAY=0.5"]


@functools.cache
def _final_checkpoint(folder: Path) -> dict[str, Any]:
    """The final checkpoint in ``folder``, consolidated when sharded (read once; not to
    be changed)."""
    (path,) = folder.glob("model_final_checkpoint_phase*.torch")
    state = load_checkpoint(str(path))
    if state.get("checkpoint_format"):
        state = consolidate_sharded_checkpoint(str(path))
    return state


def final_state(folder: Path) -> dict[str, torch.Tensor]:
    """The final checkpoint's model and loss state (consolidated when sharded)."""
    classy = _final_checkpoint(folder)["classy_state_dict"]
    model = classy["base_model"]["model"]
    flat = {f"trunk.{k}": v for k, v in model["trunk"].items()}
    flat |= {f"heads.{k}": v for k, v in model["heads"].items()}
    flat |= {f"loss.{k}": v for k, v in classy["loss"].items()}
    return flat


def ema_state(folder: Path) -> dict[str, torch.Tensor]:
    """The final checkpoint's ``classy_state_dict["ema_model"]`` (consolidated when
    sharded), flat (``trunk.*``, ``heads.*``)."""
    ema = _final_checkpoint(folder)["classy_state_dict"]["ema_model"]
    assert set(ema) == {"model", "meta"} and set(ema["model"]) == {"trunk", "heads", "other"}
    return {f"{part}.{k}": v for part in ("trunk", "heads") for k, v in ema["model"][part].items()}


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    assert worst <= atol, f"the runs differ by {worst}"


@pytest.fixture(scope="module")
def dino_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """quick_dino on 2 processes, with DDP and sharded with FSDP2 (4 steps each), with
    the EMA model on."""
    root = tmp_path_factory.mktemp("fsdp_dino")
    folders = {"ddp": root / "ddp", "fsdp": root / "fsdp"}
    run_config(DINO, TWO, *TINY, *EMA, f"config.CHECKPOINT.DIR={folders['ddp']}")
    run_config(DINO, TWO, *TINY, *EMA, FSDP, f"config.CHECKPOINT.DIR={folders['fsdp']}")
    return folders


@pytest.mark.integration
def test_fsdp_dino_equals_ddp_teacher_included(dino_runs: dict[str, Path]) -> None:
    fsdp = dino_runs["fsdp"]
    # the sharded layout: an index and a DCP folder with one file per rank
    index = load_checkpoint(str(fsdp / "model_final_checkpoint_phase1.torch"))
    assert index["checkpoint_format"] == "sharded_dcp"
    assert not index["classy_state_dict"]["base_model"]["model"]["trunk"]
    assert len(list((fsdp / index["sharded_dir"]).glob("*.distcp"))) == 2
    assert "FSDP: 10 units over 2 ranks" in (fsdp / "log.txt").read_text()
    ddp_state, fsdp_state = final_state(dino_runs["ddp"]), final_state(fsdp)
    assert any(k.startswith("loss.teacher.trunk.") for k in fsdp_state)
    assert "loss.center" in fsdp_state
    assert_close(ddp_state, fsdp_state, atol=1e-4)


@pytest.mark.integration
def test_fsdp_ema_model_is_sharded_and_equals_ddps(dino_runs: dict[str, Path]) -> None:
    """HOOKS.EMA_MODEL under the sharded task: the average is held in shards (the DCP
    folder has one chunk per rank of each of its weights) and, consolidated, equals the
    DDP run's average to 1e-5."""
    from torch.distributed.checkpoint import FileSystemReader

    folder = dino_runs["fsdp"] / "model_final_checkpoint_phase1.dcp"
    saved = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    weight = "hook_entries.ema_model.model.trunk._feature_blocks.layer1.0.conv1.weight"
    assert len(saved[weight].chunks) == 2  # type: ignore[union-attr]
    ddp, fsdp = ema_state(dino_runs["ddp"]), ema_state(dino_runs["fsdp"])
    assert_close(ddp, fsdp, atol=1e-5)
    # the average is not the model (DECAY 0.5 over 4 steps)
    model = final_state(dino_runs["fsdp"])
    assert max((model[k] - v).abs().max().item() for k, v in fsdp.items() if "weight" in k) > 0


@pytest.mark.integration
def test_sharded_checkpoint_resumes_on_one_process_and_converts(
    dino_runs: dict[str, Path], tmp_path: Path
) -> None:
    """The 2-process iteration checkpoint (inside phase 1) resumes on 1 process; the
    converter's consolidated file loads with WEIGHTS_INIT."""
    folder = tmp_path / "one"
    folder.mkdir()
    for name in ("model_iteration3.torch", "model_iteration3.dcp"):
        src = dino_runs["fsdp"] / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, folder / name)
    run_config(DINO, *TINY, *EMA, FSDP, f"config.CHECKPOINT.DIR={folder}")
    log = (folder / "log.txt").read_text()
    assert "resuming from" in log and "resumed inside phase 2/" in log  # (1-based)
    assert "checkpoint was written by 2 processes, this run has 1" in log
    assert "holds no EMA model" not in log  # the sharded average was restored, unsharded
    final = final_state(folder)
    assert all(torch.isfinite(v).all() for v in final.values() if v.is_floating_point())
    assert ema_state(folder).keys() == ema_state(dino_runs["fsdp"]).keys()

    from tests.extra_scripts._helpers import run_as_main

    out = tmp_path / "consolidated.torch"
    dcp_folder = dino_runs["fsdp"] / "model_final_checkpoint_phase1.dcp"
    code, stdout, stderr = run_as_main("convert_sharded_checkpoint", str(dcp_folder), str(out))
    assert code == 0, stderr
    assert f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={out}" in stdout
    converted = load_checkpoint(str(out))
    assert "checkpoint_format" not in converted
    assert converted["classy_state_dict"]["optimizer"]["state"]

    from vissl.models import build_model
    from vissl.utils.hydra_config import hydra_compose_and_validate
    from vissl.utils.weights_init import init_model_from_weights_params_file

    _, cfg = hydra_compose_and_validate([f"config={DINO}"])
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    # the index itself is refused with the command that consolidates it
    cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE = str(dino_runs["fsdp"] / "model_phase0.torch")
    with pytest.raises(ConfigError, match="convert_sharded_checkpoint.py"):
        init_model_from_weights_params_file(model, cfg.MODEL.WEIGHTS_INIT)
    cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE = str(out)
    init_model_from_weights_params_file(model, cfg.MODEL.WEIGHTS_INIT)
    expected = final_state(dino_runs["fsdp"])
    # (WEIGHTS_INIT skips num_batches_tracked by default, as VISSL)
    loaded = {k: v for k, v in model.state_dict().items() if "num_batches" not in k}
    differ = [k for k in loaded if not torch.equal(loaded[k], expected[k])]
    assert not differ, differ[:5]
    # the EMA model, consolidated as a DDP run writes it, loads by its key name
    assert converted["classy_state_dict"]["ema_model"]["meta"] == {}
    cfg.MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME = "ema_model"
    init_model_from_weights_params_file(model, cfg.MODEL.WEIGHTS_INIT)
    expected = ema_state(dino_runs["fsdp"])
    loaded = {k: v for k, v in model.state_dict().items() if "num_batches" not in k}
    differ = [k for k in loaded if not torch.equal(loaded[k], expected[k])]
    assert not differ, differ[:5]


# ----------------------------------------------------------------------------- slow
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)  # several 2-process runs
def test_fsdp_quick_start_equals_ddp(tmp_path: Path) -> None:
    """quick_start (SimCLR, ResNet-18) on 2 processes, shortened to 2 epochs of 512
    digits: the consolidated sharded weights equal DDP's to 1e-4."""
    short = [
        TWO,
        "config.OPTIMIZER.num_epochs=2",
        "config.DATA.TRAIN.DATA_LIMIT=512",
        "config.DATA.NUM_DATALOADER_WORKERS=0",
        "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=False",
    ]
    run_config("quick_start", *short, f"config.CHECKPOINT.DIR={tmp_path / 'ddp'}")
    run_config("quick_start", *short, FSDP, f"config.CHECKPOINT.DIR={tmp_path / 'fsdp'}")
    assert_close(final_state(tmp_path / "ddp"), final_state(tmp_path / "fsdp"), atol=1e-4)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)  # several 2-process runs
def test_fsdp_sigkill_and_resume_is_bitwise_exact(tmp_path: Path) -> None:
    """A real kill -9 of the 2 sharded processes after iteration 7, the iteration
    checkpoint at 6 inside phase 1, then the same command again."""
    from tests.integration.test_quick_dino_barlow import SIGKILL_PLUGIN, run_cli
    from tests.integration.test_quick_vicreg import assert_bitwise_equal

    args = [f"config={DINO}", TWO, *TINY, *EMA, FSDP, "config.DATA.TRAIN.DATA_LIMIT=32"]
    plugin = tmp_path / "sigkill_plugin.py"
    plugin.write_text(SIGKILL_PLUGIN)
    full, killed = tmp_path / "full", tmp_path / "killed"
    proc = run_cli(tmp_path, *args, f"config.CHECKPOINT.DIR={full}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_cli(
        tmp_path,
        *args,
        f"config.CHECKPOINT.DIR={killed}",
        f"config.IMPORTS=[{plugin}]",
        "config.HOOKS.CUSTOM_HOOKS=[{name: sigkill_at, iteration: 7}]",
    )
    # the launcher reports its workers' SIGKILL
    assert proc.returncode != 0 and "killed by signal SIGKILL" in proc.stderr, proc.stderr[-3000:]
    assert not list(killed.glob("model_final*"))
    assert (killed / "model_iteration6.dcp").is_dir()
    proc = run_cli(tmp_path, *args, f"config.CHECKPOINT.DIR={killed}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed inside phase 2/" in (killed / "log.txt").read_text()  # (1-based)
    assert_bitwise_equal(final_state(full), final_state(killed))
    assert_bitwise_equal(ema_state(full), ema_state(killed))  # the sharded EMA model too


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)  # several 2-process runs
def test_one_process_sharded_checkpoint_resumes_on_two(tmp_path: Path) -> None:
    """1 -> 2 processes: a 1-process run of the FSDP task stops after iteration 4 (its
    iteration checkpoint at 3); 2 processes resume from it, sharded, and finish."""
    from tests.integration.test_exact_resume import crash_generator

    args = [*TINY, FSDP, "config.DATA.TRAIN.DATA_LIMIT=32"]
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            DINO, *args, f"config.CHECKPOINT.DIR={tmp_path}", hook_generator=crash_generator(4)
        )
    run_config(DINO, TWO, *args, f"config.CHECKPOINT.DIR={tmp_path}")
    log = (tmp_path / "log.txt").read_text()
    assert "checkpoint was written by 1 processes, this run has 2" in log
    assert "FSDP: 10 units over 2 ranks" in log
    assert (tmp_path / "model_final_checkpoint_phase1.torch").exists()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)  # several 2-process runs
def test_use_zero_equals_ddp_and_resumes_exactly(
    dino_runs: dict[str, Path], tmp_path: Path
) -> None:
    """OPTIMIZER.use_zero (ZeroRedundancyOptimizer) on 2 processes: DDP's weights to 1e-4,
    and a crash after iteration 4 resumed from the iteration checkpoint at 3 ends bitwise
    equal to the uninterrupted ZeRO run."""
    from tests.integration._runs import crash_and_resume_states

    zero = [TWO, *TINY, "config.OPTIMIZER.use_zero=True"]
    full, _ = crash_and_resume_states(tmp_path, DINO, zero, crash_after=4, checkpoint_at=3, last=4)
    assert_close(final_state(dino_runs["ddp"]), full, atol=1e-4)
    log = (tmp_path / "full" / "log.txt").read_text()
    assert "state sharded over the ranks (ZeroRedundancyOptimizer)" in log


@pytest.mark.integration
def test_sdp_task_is_ddp_with_zero_and_equals_ddp(
    dino_runs: dict[str, Path], tmp_path: Path
) -> None:
    """VISSL's TRAINER.TASK_NAME: self_supervision_sdp_task (fairscale's ShardedDDP + OSS)
    on 2 processes: DDP with the optimizer state sharded by ZeroRedundancyOptimizer
    (without OPTIMIZER.use_zero), the weights and the EMA model of the DDP run to 1e-4."""
    run_config(
        DINO,
        TWO,
        *TINY,
        *EMA,
        "config.TRAINER.TASK_NAME=self_supervision_sdp_task",
        "config.MODEL.SHARDED_DDP_SETUP.reduce_buffer_size=1024",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    log = (tmp_path / "log.txt").read_text()
    assert "self_supervision_sdp_task (fairscale's ShardedDDP + OSS)" in log
    assert "AdamW state sharded over the ranks (ZeroRedundancyOptimizer)" in log
    assert "config.MODEL.SHARDED_DDP_SETUP.reduce_buffer_size=1024: no meaning" in log
    assert "gradient reduction ddp" in log
    assert_close(final_state(dino_runs["ddp"]), final_state(tmp_path), atol=1e-4)
    assert_close(ema_state(dino_runs["ddp"]), ema_state(tmp_path), atol=1e-4)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)  # several 2-process runs
def test_fsdp_ema_meters_equal_ddps(tmp_path: Path) -> None:
    """HOOKS.EMA_MODEL.ENABLE_EMA_METERS under the sharded task: the sharded average runs
    in the test phases (gathered unit by unit) and its meters equal the DDP run's; the
    average itself equals DDP's to 1e-5 (the tiny supervised run, 2 processes)."""
    from tests._tiny_run import SMALL
    from tests._tiny_run import TINY as SUPERVISED
    from tests.integration._runs import read_jsonl

    args = [
        *SMALL,
        TWO,
        "config.HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True",
        "config.HOOKS.EMA_MODEL.ENABLE_EMA_METERS=True",
        "config.HOOKS.EMA_MODEL.DECAY=0.6",
    ]
    run_config(SUPERVISED, *args, f"config.CHECKPOINT.DIR={tmp_path / 'ddp'}")
    run_config(SUPERVISED, *args, FSDP, f"config.CHECKPOINT.DIR={tmp_path / 'fsdp'}")
    key = "test_ema_accuracy_list_meter"
    meters = {
        name: [r[key] for r in read_jsonl(str(tmp_path / name / "metrics.json")) if key in r]
        for name in ("ddp", "fsdp")
    }
    assert len(meters["fsdp"]) == 2 and meters["fsdp"] == meters["ddp"]
    assert_close(ema_state(tmp_path / "ddp"), ema_state(tmp_path / "fsdp"), atol=1e-5)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)  # several 2-process runs
def test_fsdp_with_bf16_amp_mixed_precision_and_activation_checkpointing(tmp_path: Path) -> None:
    """FSDP2's bfloat16 parameters and float32 reduce-scatter, bf16 autocast, activation
    checkpointing of the trunk and gradient clipping (quick_dino's) compose: the run
    finishes with finite weights, kept in float32."""
    run_config(
        DINO,
        TWO,
        *TINY,
        FSDP,
        "config.MODEL.FSDP_CONFIG.mixed_precision=True",
        "config.MODEL.FSDP_CONFIG.compute_dtype=bfloat16",
        "config.MODEL.FSDP_CONFIG.fp32_reduce_scatter=True",
        "config.MODEL.AMP_PARAMS.USE_AMP=True",
        "config.MODEL.AMP_PARAMS.AMP_DTYPE=bfloat16",
        "config.MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    log = (tmp_path / "log.txt").read_text()
    assert "mixed precision torch.bfloat16/torch.float32" in log
    state = final_state(tmp_path)
    student = {k: v for k, v in state.items() if not k.startswith("loss.")}
    assert all(v.dtype == torch.float32 for v in student.values() if v.is_floating_point())
    assert all(torch.isfinite(v).all() for v in student.values() if v.is_floating_point())


@pytest.mark.slow
@needs_vissl_configs
def test_vissl_fsdp_configs_pass_key_checks_and_name_registered_components() -> None:
    """Every config of VISSL's folder that selects self_supervision_fsdp_task (91 in
    VISSL's main) or the ShardedDDP task (self_supervision_sdp_task, USE_SDP: none in
    VISSL's main): its TRAINER, OPTIMIZER and MODEL.FSDP_CONFIG / SHARDED_DDP_SETUP /
    AMP_PARAMS keys are known (they no longer warn), and the trunk, heads, optimizer and
    task it names are registered."""
    import warnings

    import yaml

    import vissl.models
    import vissl.optimizers  # noqa: F401
    from vissl.config.validation import TASK_NAMES, UnsupportedConfigWarning, check_keys
    from vissl.models.heads import MODEL_HEADS_REGISTRY
    from vissl.models.trunks import MODEL_TRUNKS_REGISTRY
    from vissl.optimizers import OPTIMIZER_REGISTRY

    found = 0
    for path in sorted(Path(os.environ["VISSL_CONFIGS_DIR"]).rglob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        if not any(
            name in text
            for name in ("self_supervision_fsdp_task", "self_supervision_sdp_task", "USE_SDP")
        ):
            continue
        cfg = (yaml.safe_load(text) or {}).get("config") or {}
        found += 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # the sections the FSDP task reads (other keys of these files are not ours
            # to judge here, e.g. old VISSL keys VISSL's own defaults lack)
            model = cfg.get("MODEL") or {}
            check_keys(
                {
                    "TRAINER": cfg["TRAINER"],
                    "OPTIMIZER": cfg.get("OPTIMIZER") or {},
                    "MODEL": {
                        k: model[k]
                        for k in ("FSDP_CONFIG", "SHARDED_DDP_SETUP", "AMP_PARAMS")
                        if k in model
                    },
                }
            )
        warned = [
            str(w.message) for w in caught if issubclass(w.category, UnsupportedConfigWarning)
        ]
        assert not [m for m in warned if "FSDP_CONFIG" in m or "SHARDED_DDP" in m], (path, warned)
        assert cfg["TRAINER"]["TASK_NAME"] in TASK_NAMES
        model = cfg.get("MODEL") or {}
        trunk = (model.get("TRUNK") or {}).get("NAME")
        assert trunk is None or trunk in MODEL_TRUNKS_REGISTRY, (path, trunk)
        for head in (model.get("HEAD") or {}).get("PARAMS") or []:
            assert head[0] in MODEL_HEADS_REGISTRY, (path, head[0])
        optimizer = (cfg.get("OPTIMIZER") or {}).get("name")
        assert optimizer is None or optimizer in OPTIMIZER_REGISTRY, (path, optimizer)
    assert found >= 80

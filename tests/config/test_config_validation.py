"""Config composition and validation: unknown keys, legacy keys, types, impossible values."""

from __future__ import annotations

import pickle

import pytest

from vissl.config import AttrDict, register_config_defaults
from vissl.config.validation import UnsupportedConfigWarning
from vissl.errors import ConfigError, UnknownKeyError
from vissl.utils.hydra_config import hydra_compose_and_validate

BASE = ["config=quick_start"]


def compose(*overrides: str):
    return hydra_compose_and_validate([*BASE, *overrides])


def test_quick_start_composes_with_attribute_access():
    root, cfg = compose("config.LOG_FREQUENCY=3")
    assert root.engine_name == "train"
    assert cfg.LOG_FREQUENCY == 3
    assert cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA == 128
    assert cfg.MODEL.HEAD.PARAMS[0][0] == "mlp"
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_misspelt_override_names_the_right_key():
    with pytest.raises(UnknownKeyError) as info:
        compose("config.DATA.TRAIN.BATCHSIZE_PER_REPLICAS=4")
    assert "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA" in str(info.value)
    assert "Did you mean config.DATA.TRAIN.BATCHSIZE_PER_REPLICA?" in str(info.value)


def test_a_dict_override_fills_a_key_whose_default_is_an_empty_mapping():
    # Hydra merges {...} into the node; the composed config's struct flag used to refuse
    # the new keys of an empty one ("Unknown config key").
    _, cfg = compose(
        "config.MODEL.TRUNK.TIMM.KWARGS={drop_rate:0.1}",
        "config.DATA.TRAIN.COLLATE_FUNCTION_PARAMS={num_angles:4}",
    )
    assert cfg.MODEL.TRUNK.TIMM.KWARGS == {"drop_rate": 0.1}
    assert cfg.DATA.TRAIN.COLLATE_FUNCTION_PARAMS == {"num_angles": 4}
    with pytest.raises(UnknownKeyError):  # a non-empty mapping is still checked
        compose("config.OPTIMIZER={momentun:0.5}")


def test_misspelt_plus_override_names_the_right_key():
    with pytest.raises(UnknownKeyError) as info:
        compose("+config.OPTIMIZER.momentun=0.5")
    assert "config.OPTIMIZER.momentun" in str(info.value)
    assert "config.OPTIMIZER.momentum" in str(info.value)


def test_misspelt_key_in_yaml_names_full_path_and_closest(tmp_path, monkeypatch):
    folder = tmp_path / "configs" / "config"
    folder.mkdir(parents=True)
    (folder / "typo.yaml").write_text(
        "# @package _global_\nconfig:\n  HOOKS:\n    TENSORBOARD_SETUP:\n      USE_TENSORBORD: true\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownKeyError) as info:
        hydra_compose_and_validate(["config=typo"])
    msg = str(info.value)
    assert "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBORD" in msg
    assert "Did you mean config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD?" in msg


def test_group_file_composition(tmp_path, monkeypatch):
    folder = tmp_path / "configs" / "config" / "extra"
    folder.mkdir(parents=True)
    (folder / "small.yaml").write_text("# @package _global_\nconfig:\n  LOG_FREQUENCY: 7\n")
    monkeypatch.chdir(tmp_path)
    _, cfg = hydra_compose_and_validate([*BASE, "+config/extra=small"])
    assert cfg.LOG_FREQUENCY == 7


def test_vissl_key_not_implemented_warns_by_name():
    with pytest.warns(UnsupportedConfigWarning, match="config.GEO_LOCALIZATION"):
        compose("+config.GEO_LOCALIZATION.ACC_KM_THRESHOLDS=[1]")


def test_use_sdp_selects_the_sdp_task_with_zero_and_sharded_ddp_keys_are_known(recwarn):
    """VISSL's MODEL.SHARDED_DDP_SETUP: USE_SDP rewrites the task name and use_zero as
    VISSL does; reduce_buffer_size is accepted (no warning) and gets its one-line note."""
    from vissl.optimizers.zero import sharded_ddp_notes

    _, cfg = compose(
        "config.MODEL.SHARDED_DDP_SETUP.USE_SDP=true",
        "config.MODEL.SHARDED_DDP_SETUP.reduce_buffer_size=1024",
    )
    assert not [w for w in recwarn if issubclass(w.category, UnsupportedConfigWarning)]
    assert cfg.TRAINER.TASK_NAME == "self_supervision_sdp_task"
    assert cfg.OPTIMIZER.use_zero is True
    (note,) = sharded_ddp_notes(cfg.MODEL.SHARDED_DDP_SETUP)
    assert note.startswith("config.MODEL.SHARDED_DDP_SETUP.reduce_buffer_size=1024: no meaning")
    assert "DATA.DDP_BUCKET_CAP_MB" in note
    assert not sharded_ddp_notes({"USE_SDP": False, "reduce_buffer_size": -1})


def test_not_implemented_value_warns():
    with pytest.warns(UnsupportedConfigWarning, match="COPY_TO_LOCAL_DISK"):
        compose("config.DATA.TRAIN.COPY_TO_LOCAL_DISK=true")


def test_negative_batch_size_names_key():
    with pytest.raises(ConfigError) as info:
        compose("config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=-4")
    assert info.value.key_path == "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA"
    assert "must be >= 1" in str(info.value)


def test_wrong_type_names_key():
    with pytest.raises(ConfigError) as info:
        compose("config.LOG_FREQUENCY=often")
    assert "config.LOG_FREQUENCY must be int" in str(info.value)


def test_bool_is_not_an_int():
    with pytest.raises(ConfigError, match="config.OPTIMIZER.num_epochs"):
        compose("config.OPTIMIZER.num_epochs=true")


def test_missing_data_path_names_key(tmp_path):
    with pytest.raises(ConfigError) as info:
        compose(
            "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
            f"config.DATA.TRAIN.DATA_PATHS=[{tmp_path}/does_not_exist]",
        )
    assert info.value.key_path == "config.DATA.TRAIN.DATA_PATHS"
    assert "does not exist" in str(info.value)


def test_disk_source_without_paths_needs_dataset_names():
    with pytest.raises(ConfigError, match=r"DATA_PATHS\[0\] is missing"):
        compose("config.DATA.TRAIN.DATA_SOURCES=[disk_folder]")
    # with DATASET_NAMES the paths come from the dataset catalog when the data set is built
    _, cfg = compose(
        "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
        "config.DATA.TRAIN.DATASET_NAMES=[imagenet1k_folder]",
    )
    assert list(cfg.DATA.TRAIN.DATA_PATHS) == []


def test_bad_choice_names_key():
    with pytest.raises(ConfigError, match=r"config.MACHINE.DEVICE='tpu' is not one of"):
        compose("config.MACHINE.DEVICE=tpu")


def test_no_config_given_is_a_clear_error():
    with pytest.raises(ConfigError, match="config=quick_start"):
        hydra_compose_and_validate([])


def test_unknown_config_name_is_a_clear_error():
    with pytest.raises(
        ConfigError, match="config=quik_start: no such config.*Closest: quick_start"
    ):
        hydra_compose_and_validate(["config=quik_start"])


def test_legacy_trunk_params_and_perf_stats_are_moved(tmp_path, monkeypatch):
    folder = tmp_path / "configs" / "config"
    folder.mkdir(parents=True)
    (folder / "legacy.yaml").write_text(
        "# @package _global_\nconfig:\n  MONITOR_PERF_STATS: True\n  MODEL:\n    TRUNK:\n"
        "      NAME: resnet\n      TRUNK_PARAMS:\n        RESNETS:\n          DEPTH: 101\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UnsupportedConfigWarning, match="TRUNK_PARAMS"):
        _, cfg = hydra_compose_and_validate(["config=legacy"])
    assert cfg.MODEL.TRUNK.RESNETS.DEPTH == 101
    assert "TRUNK_PARAMS" not in cfg.MODEL.TRUNK
    assert cfg.HOOKS.PERF_STATS.MONITOR_PERF_STATS is True


def test_loss_section_for_registered_or_torch_loss_is_accepted():
    _, cfg = compose("config.LOSS.name=MSELoss", "+config.LOSS.MSELoss.reduction=sum")
    assert cfg.LOSS.MSELoss.reduction == "sum"


def test_plugin_declared_defaults(tmp_path):
    register_config_defaults("MODEL.TRUNK.MY_TRUNK", {"WIDTH": 3})
    _, cfg = compose("+config.MODEL.TRUNK.MY_TRUNK.WIDTH=5")
    assert cfg.MODEL.TRUNK.MY_TRUNK.WIDTH == 5
    with pytest.raises(UnknownKeyError, match="config.MODEL.TRUNK.MY_TRUNK.WIDTH"):
        compose("+config.MODEL.TRUNK.MY_TRUNK.WIDHT=5")


def test_custom_hook_spec_must_have_a_name():
    with pytest.raises(ConfigError, match=r"CUSTOM_HOOKS\[0\]"):
        compose("config.HOOKS.CUSTOM_HOOKS=[{priority: 3}]")


def test_attrdict_missing_attribute_lists_keys():
    d = AttrDict({"A": {"B": 1}})
    assert d.A.B == 1
    with pytest.raises(AttributeError, match="available keys"):
        _ = d.C


def test_plugin_declared_defaults_are_inserted():
    register_config_defaults("LOSS.my_inserted_loss_params", {"alpha": 0.5})
    _, cfg = compose()
    assert cfg.LOSS.my_inserted_loss_params.alpha == 0.5


def test_unknown_task_name_is_an_error():
    with pytest.raises(ConfigError, match="TASK_NAME"):
        compose("config.TRAINER.TASK_NAME=self_supervision_fdsp_task")


@pytest.mark.parametrize("source", ["digits", "synthetic"])
def test_data_paths_for_a_source_that_reads_none_is_an_error_not_ignored(tmp_path, source):
    """#41 item 2: DATA_PATHS without DATA_SOURCES=[disk_folder] silently trained on the
    built-in digits."""
    with pytest.raises(ConfigError) as info:
        compose(
            f"config.DATA.TRAIN.DATA_SOURCES=[{source}]",
            f"config.DATA.TRAIN.DATA_PATHS=[{tmp_path}]",
        )
    message = str(info.value)
    assert info.value.key_path == "config.DATA.TRAIN.DATA_PATHS[0]"
    assert f"is {source!r}, which reads no path" in message
    assert "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]" in message


def test_data_paths_for_a_source_that_reads_none_is_an_error_from_python_too(tmp_path):
    from vissl.data.ssl_dataset import GenericSSLDataset

    _, cfg = compose()
    cfg.DATA.TRAIN.DATA_PATHS = [str(tmp_path)]  # set after validation, from Python
    with pytest.raises(ConfigError, match="which reads no path") as info:
        GenericSSLDataset(cfg, "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.DATA_PATHS[0]"


def test_data_paths_with_disk_folder_still_validate(tmp_path):
    (tmp_path / "a").mkdir()
    _, cfg = compose(
        "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]", f"config.DATA.TRAIN.DATA_PATHS=[{tmp_path}]"
    )
    assert cfg.DATA.TRAIN.DATA_PATHS == [str(tmp_path)]

"""``hydra_compose_and_validate`` from a project with its own ``configs/`` folder (#41
item 7): the shipped configs are still found, and a missing config is the "not found"
error the docs promise (it was ``TypeError: expected str ... not NoneType``)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import pytest

from vissl.errors import ConfigError
from vissl.utils.hydra_config import hydra_compose_and_validate

MINE = "# @package _global_\nconfig:\n  LOG_FREQUENCY: 3\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The current folder is a project with configs/config/my_exp/mine.yaml, and
    ``configs`` imports as that folder (a namespace package), as it does when Python runs
    from there with vissl installed."""
    (tmp_path / "configs" / "config" / "my_exp").mkdir(parents=True)
    (tmp_path / "configs" / "config" / "my_exp" / "mine.yaml").write_text(MINE)
    monkeypatch.chdir(tmp_path)
    spec = importlib.machinery.ModuleSpec("configs", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path / "configs")]
    shadow = importlib.util.module_from_spec(spec)
    assert getattr(shadow, "__file__", None) is None
    monkeypatch.setitem(sys.modules, "configs", shadow)
    return tmp_path


def test_the_shipped_configs_are_found_beside_the_vissl_package():
    from vissl.utils.hydra_config import shipped_configs_dir

    folder = shipped_configs_dir()
    assert folder is not None and (folder / "config" / "quick_start.yaml").is_file()


def test_shipped_and_own_configs_compose_from_a_project_with_configs(project):
    _, cfg = hydra_compose_and_validate(["config=quick_start"])
    assert cfg.LOSS.name == "simclr_info_nce_loss"
    _, cfg = hydra_compose_and_validate(["config=my_exp/mine"])
    assert cfg.LOG_FREQUENCY == 3


def test_a_missing_config_is_the_not_found_error_from_a_project_with_configs(project):
    with pytest.raises(ConfigError) as info:
        hydra_compose_and_validate(["config=my_exp/mien"])
    message = str(info.value)
    assert "config=my_exp/mien: no such config" in message
    assert str(Path(project) / "configs" / "config") in message
    assert "Closest: my_exp/mine" in message


# ---------------------------------------------------------------------- list entries
def test_a_list_entry_is_addressed_by_its_name():
    """#41 item 5: the crop size by name, the same override for every config that has
    the transform, instead of its index (TRANSFORMS.1.size here, 0 elsewhere)."""
    _, cfg = hydra_compose_and_validate(
        ["config=quick_start", "config.DATA.TRAIN.TRANSFORMS.RandomResizedCrop.size=32"]
    )
    assert cfg.DATA.TRAIN.TRANSFORMS[1] == {
        "name": "RandomResizedCrop",
        "size": 32,
        "scale": [0.5, 1.0],
    }
    _, cfg = hydra_compose_and_validate(
        ["config=digits/dino", "config.DATA.TRAIN.TRANSFORMS.ImgPilToMultiCrop.size_crops=[16]"]
    )
    assert cfg.DATA.TRAIN.TRANSFORMS[0].size_crops == [16]
    _, cfg = hydra_compose_and_validate(
        ["config=quick_start", "+config.DATA.TRAIN.TRANSFORMS.RandomResizedCrop.ratio=[0.5,2.0]"]
    )
    assert cfg.DATA.TRAIN.TRANSFORMS[1].ratio == [0.5, 2.0]


ENTRIES = (
    "[0] ImgReplicatePil (num_times=2), [1] RandomResizedCrop (size=8, scale=[0.5, 1.0]), "
    "[2] ColorJitter (brightness=0.6, contrast=0.6), [3] ToTensor, [4] Normalize"
)


@pytest.mark.parametrize(
    "override,what",
    [
        (
            "config.DATA.TRAIN.TRANSFORMS.5.size=32",
            "config.DATA.TRAIN.TRANSFORMS has 5 entries, so there is no index 5",
        ),
        (
            "config.DATA.TRAIN.TRANSFORMS.0.size=32",
            "config.DATA.TRAIN.TRANSFORMS.0 is ImgReplicatePil, which does not set 'size'",
        ),
        (
            "config.DATA.TRAIN.TRANSFORMS.RandomCrop.size=32",
            "config.DATA.TRAIN.TRANSFORMS has no entry named 'RandomCrop'",
        ),
    ],
)
def test_a_bad_list_index_or_name_says_what_is_at_each_index(override, what):
    with pytest.raises(ConfigError) as info:
        hydra_compose_and_validate(["config=quick_start", override])
    message = str(info.value)
    assert what in message
    assert ENTRIES in message
    assert "config.DATA.TRAIN.TRANSFORMS.RandomResizedCrop.size=8" in message  # the example
    assert info.value.key_path == "config.DATA.TRAIN.TRANSFORMS"


def test_an_ambiguous_name_asks_for_the_index():
    with pytest.raises(ConfigError, match=r"has 2 entries named 'mlp' \(\[0, 1\]\)"):
        hydra_compose_and_validate(
            ["config=quick_start", "config.MODEL.HEAD.PARAMS.mlp.1.dims=[1]"]
        )

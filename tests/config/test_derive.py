"""vissl.config.derive: derived loss values are computed once, in the config stage, and
the saved config (train_config.yaml) is what the loss is built from."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import yaml

from vissl.config.attr_dict import AttrDict
from vissl.config.derive import derived_config, derived_loss_config
from vissl.losses import build_loss
from vissl.trainer.trainer_main import SelfSupervisionTrainer
from vissl.utils.hydra_config import hydra_compose_and_validate

_QUICK = "config=test/integration_test/quick_barlow_twins"


def _quick() -> AttrDict:
    _, cfg = hydra_compose_and_validate([_QUICK])
    return cfg


def test_the_config_stage_writes_the_derived_values() -> None:
    cfg = _quick()
    # the head's last dim is 64; defaults.yaml says 8192
    assert cfg.LOSS.barlow_twins_loss.embedding_dim == 64


def test_the_build_neither_changes_the_config_nor_differs_from_it() -> None:
    cfg = _quick()
    before = copy.deepcopy(cfg.to_dict())
    loss = build_loss(cfg.LOSS, cfg)
    assert cfg.to_dict() == before
    assert loss.embedding_dim == cfg.LOSS.barlow_twins_loss.embedding_dim == 64


def test_deriving_is_idempotent() -> None:
    cfg = _quick()
    assert derived_loss_config(cfg) == {"barlow_twins_loss": cfg.LOSS.barlow_twins_loss.to_dict()}
    assert derived_config(cfg).to_dict() == cfg.to_dict()


def test_a_config_that_skipped_the_stage_is_derived_on_a_copy() -> None:
    cfg = _quick()
    cfg.LOSS.barlow_twins_loss.embedding_dim = 8192
    derived = derived_config(cfg)
    assert derived.LOSS.barlow_twins_loss.embedding_dim == 64
    assert cfg.LOSS.barlow_twins_loss.embedding_dim == 8192


def test_train_config_yaml_holds_what_the_loss_is_built_from(tmp_path: Path) -> None:
    cfg = _quick()
    cfg.LOSS.barlow_twins_loss.embedding_dim = 8192  # as a hand-made config would say
    trainer = SelfSupervisionTrainer(cfg, str(tmp_path), torch.device("cpu"), hooks=[])
    trainer._commit_run_folder()
    saved = yaml.safe_load((tmp_path / "train_config.yaml").read_text())["config"]
    loss = build_loss(cfg.LOSS, cfg)
    assert saved["LOSS"]["barlow_twins_loss"]["embedding_dim"] == loss.embedding_dim == 64
    rebuilt = build_loss(AttrDict(saved).LOSS, AttrDict(saved))
    assert rebuilt.embedding_dim == loss.embedding_dim

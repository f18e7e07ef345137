"""FreezeParametersHook (MODEL.TEMP_FROZEN_PARAMS_ITER_MAP): a listed parameter stays
unchanged for its first N optimizer steps, then trains; VISSL's ``module.`` prefix;
unknown names and malformed entries are ConfigErrors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tests._tiny_run import tiny_config, train_in_process
from vissl.errors import ConfigError
from vissl.hooks import VisslHook, default_hook_generator
from vissl.hooks.state_update_hooks import FreezeParametersHook, parse_frozen_params_map

FROZEN = "heads.0.clf.0.weight"
OTHER = "trunk._feature_blocks.conv1.weight"


class _Snapshots(VisslHook):
    """The frozen and another parameter after every optimizer step."""

    def __init__(self) -> None:
        self.frozen: list[torch.Tensor] = []
        self.other: list[torch.Tensor] = []

    def on_start(self, task) -> None:
        params = dict(task.base_model.named_parameters())
        self.frozen.append(params[FROZEN].detach().clone())
        self.other.append(params[OTHER].detach().clone())

    def on_update(self, task) -> None:
        self.on_start(task)


def test_parameter_frozen_for_n_steps_then_trains(tmp_path) -> None:
    cfg = tiny_config(tmp_path, "config.TEST_MODEL=False")
    frozen = parse_frozen_params_map([[f"module.{FROZEN}", 3]])
    snaps = _Snapshots()
    task = train_in_process(cfg, [FreezeParametersHook(frozen), snaps])
    assert task.iteration == 8
    # Updates 1..3 leave it (no gradient step, no weight decay, no momentum); 4.. move it.
    for i in range(1, 4):
        assert torch.equal(snaps.frozen[i], snaps.frozen[0]), i
    for i in range(4, 9):
        assert not torch.equal(snaps.frozen[i], snaps.frozen[i - 1]), i
    # The rest of the model trains from the first step.
    assert not torch.equal(snaps.other[1], snaps.other[0])


def test_default_hooks_include_it_only_with_a_map(tmp_path) -> None:
    plain = tiny_config(tmp_path)
    assert not any(isinstance(h, FreezeParametersHook) for h in default_hook_generator(plain))
    cfg = tiny_config(tmp_path, f"config.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP=[[module.{FROZEN}, 5]]")
    hooks = [h for h in default_hook_generator(cfg) if isinstance(h, FreezeParametersHook)]
    assert len(hooks) == 1 and hooks[0].frozen == {FROZEN: 5}


def test_unknown_name_names_the_closest() -> None:
    model = nn.Sequential(nn.Linear(2, 3))
    hook = FreezeParametersHook({"0.weigth": 2})
    with pytest.raises(ConfigError, match=r"'0\.weigth' \(closest: '0\.weight'\)") as err:
        hook.on_start(SimpleNamespace(base_model=model))
    assert err.value.key_path == "config.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP"


@pytest.mark.parametrize(
    "entry", [["a.weight"], ["a.weight", -1], ["a.weight", 1.5], [3, 2], "a.weight", ["a", True]]
)
def test_malformed_entry(entry) -> None:
    with pytest.raises(ConfigError, match=r"TEMP_FROZEN_PARAMS_ITER_MAP\[1\]"):
        parse_frozen_params_map([["ok.weight", 1], entry])


def test_fsdp_wrapped_spellings_name_our_parameter(caplog) -> None:
    """VISSL's quick_swav lists the prototypes twice: DDP's and fairscale FSDP's spelling.
    Both are our ``heads.0.prototypes0.weight`` (FSDP2 keeps the original names); the
    dropped wrapper levels are logged; conflicting counts are refused."""
    fsdp = (
        "_fsdp_wrapped_module.heads.0._fsdp_wrapped_module._fpw_module."
        "prototypes0._fsdp_wrapped_module.weight"
    )
    with caplog.at_level("INFO", logger="vissl.utils.vissl_key_maps"):
        frozen = parse_frozen_params_map([["module.heads.0.prototypes0.weight", 313], [fsdp, 313]])
    assert frozen == {"heads.0.prototypes0.weight": 313}
    assert "FSDP-wrapped name" in caplog.text and "TEMP_FROZEN_PARAMS_ITER_MAP[1]" in caplog.text
    with pytest.raises(ConfigError, match=r"again, with 5 iterations instead of 313"):
        parse_frozen_params_map([["heads.0.prototypes0.weight", 313], [fsdp, 5]])


def test_fsdp_wrapped_names_in_the_other_parameter_keys() -> None:
    """OPTIMIZER.non_regularized_parameters and WEIGHTS_INIT.SKIP_LAYERS read FSDP-wrapped
    spellings as our names too."""
    from vissl.optimizers.param_groups.default import non_regularized_substrings

    substrings = non_regularized_substrings(
        {"non_regularized_parameters": ["_fsdp_wrapped_module._fpw_module.pos_embed", "cls"]}
    )
    assert substrings == ["pos_embed", "cls"]

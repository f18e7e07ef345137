"""VISSL 0.1.6's and main's arguments of every transform, collator and head we have are
accepted (item 1 of the VISSL-compatibility issue), and the ones added for it work:
swav_head's ``activation_name`` / ``use_weight_norm_prototypes`` / ``normalize_last_layer``,
eval_mlp's ``use_residual`` (the ``mlp_res`` head), ImgPilRandomSolarize's ``prob``.

The table lists, per component, the union of the argument names of VISSL's constructor
and ``from_config`` at tag v0.1.6 and at main (internal ones left out: ``unique_id``,
which VISSL's ``vision_transformer_head.from_config`` pops and no config sets).
Losses are configured through ``LOSS.<name>`` blocks, hooks through ``HOOKS.*``: their
keys are checked against VISSL's defaults.yaml in tests/config.
"""

from __future__ import annotations

import inspect
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from vissl.data.collators import get_collator
from vissl.data.ssl_transforms.registry import get_transform
from vissl.errors import ConfigError
from vissl.hooks.state_update_hooks import resolve_parameter_name
from vissl.models.heads import get_model_head
from vissl.models.heads.dino_head import WeightNormLinear
from vissl.models.heads.swav_head import SwAVHead

VISSL_ARGUMENTS: dict[tuple[str, str], list[str]] = {
    # transforms
    ("transform", "ImgPatchesFromTensor"): ["num_patches", "patch_jitter"],
    ("transform", "ImgPil2LabTensor"): [],
    ("transform", "ImgPilColorDistortion"): ["brightness", "contrast", "hue", "saturation", "strength"],
    ("transform", "ImgPilGaussianBlur"): ["p", "radius_max", "radius_min"],
    ("transform", "ImgPilMultiCropRandomApply"): ["prob", "transforms", "nmb_crops", "total_nmb_crops"],
    ("transform", "ImgPilRandomPhotometric"): ["p"],
    ("transform", "ImgPilRandomSolarize"): ["p", "prob"],
    ("transform", "ImgPilToMultiCrop"): ["crop_scales", "num_crops", "size_crops", "total_num_crops"],
    ("transform", "ImgPilToPatchesAndImage"): [
        "crop_scale_image", "crop_scale_patches", "crop_size_image", "crop_size_patches",
        "num_patches", "permute_patches",
    ],
    ("transform", "ImgPilToRawTensor"): [],
    ("transform", "ImgReplicatePil"): ["num_times"],
    ("transform", "ImgRotatePil"): ["num_angles", "num_rotations_per_img"],
    ("transform", "MaskedImageModeling"): ["log_aspect_ratio", "patch_size", "pred_ratio_mean", "pred_ratio_var"],
    ("transform", "RandAugment"): ["increasing_severity", "magnitude", "magnitude_std", "num_layers", "weight_choice"],
    ("transform", "ShuffleImgPatches"): ["perm_file"],
    # collators (besides the batch)
    ("collator", "cutmixup_collator"): [],
    ("collator", "ibot_multicrop_masking_collator"): [],
    ("collator", "moco_collator"): [],
    ("collator", "multicrop_collator"): ["create_multidimensional_tensor"],
    ("collator", "patch_and_image_collator"): [],
    ("collator", "siamese_collator"): [],
    ("collator", "simclr_collator"): [],
    ("collator", "targets_one_hot_default_collator"): ["num_classes"],
    # heads (besides model_config)
    ("head", "dino_head"): ["bottleneck_dim", "hidden_dim", "in_dim", "normalize_last_layer", "num_clusters", "num_layers", "use_bn"],
    ("head", "eval_mlp"): ["dims", "in_channels", "use_bn", "use_relu", "use_residual"],
    ("head", "ibot_head"): [
        "act", "bottleneck_dim", "hidden_dim", "in_dim", "last_norm", "norm",
        "normalize_last_layer", "num_layers", "out_dim", "patch_out_dim", "shared_head",
    ],
    ("head", "identity"): [],
    ("head", "mlp"): ["dims", "skip_last_layer_relu_bn", "use_bias", "use_bn", "use_dropout", "use_relu"],
    ("head", "mlp_res"): ["dims", "skip_last_layer_relu_bn", "use_bias", "use_bn", "use_dropout", "use_relu"],
    ("head", "siamese_concat_view"): ["num_towers"],
    ("head", "swav_head"): [
        "activation_name", "dims", "normalize_feats", "normalize_last_layer", "num_clusters",
        "return_embeddings", "skip_last_bn", "use_bias", "use_bn", "use_weight_norm_prototypes",
    ],
    ("head", "vision_transformer_head"): ["hidden_dim", "in_plane", "num_classes"],
}  # fmt: skip

GETTERS = {"transform": get_transform, "collator": get_collator, "head": get_model_head}


def accepted(obj) -> tuple[set[str], bool]:
    """The argument names ``obj`` takes (a transform that checks its own keys lists them
    in its module's ``_KEYS``) and whether it takes any keyword."""
    function = obj if inspect.isfunction(obj) else obj.__init__
    params = inspect.signature(function).parameters.values()
    names = {p.name for p in params}
    names |= set(getattr(sys.modules[obj.__module__], "_KEYS", ()))
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


@pytest.mark.parametrize("kind,name", sorted(VISSL_ARGUMENTS))
def test_vissl_arguments_are_accepted(kind: str, name: str) -> None:
    names, any_keyword = accepted(GETTERS[kind](name))
    missing = [a for a in VISSL_ARGUMENTS[kind, name] if a not in names]
    assert any_keyword or not missing, f"{kind} {name} does not take VISSL's {missing}"


def test_swav_head_gelu_and_weight_normalised_prototypes() -> None:
    torch.manual_seed(0)
    head = SwAVHead(
        {}, dims=[6, 8, 4], use_bn=False, num_clusters=[5], activation_name="GELU",
        use_weight_norm_prototypes=True,
    )  # fmt: skip
    assert [type(m) for m in head.projection_head] == [nn.Linear, nn.GELU, nn.Linear]
    proto = head.prototypes0
    assert isinstance(proto, WeightNormLinear) and proto.scale is not None
    with torch.no_grad():
        proto.scale.mul_(torch.arange(1.0, 6.0)[:, None])  # a learnt g
    x = torch.randn(3, 6)
    linear1, _, linear2 = head.projection_head
    emb = F.normalize(linear2(F.gelu(linear1(x))), dim=1)
    v = proto.weight
    expected = emb @ (torch.arange(1.0, 6.0)[:, None] * v / v.norm(dim=1, keepdim=True)).t()
    out_emb, scores = head(x)
    assert torch.allclose(out_emb, emb, atol=1e-6) and torch.allclose(scores, expected, atol=1e-5)
    named = dict(head.named_parameters())
    # VISSL's weight_norm names freeze our direction / scale
    assert resolve_parameter_name("prototypes0.weight_v", head, named) == "prototypes0.weight"
    assert resolve_parameter_name("prototypes0.weight_g", head, named) == "prototypes0.scale"
    fixed = SwAVHead(
        {},
        dims=[6, 4],
        num_clusters=[5],
        use_weight_norm_prototypes=True,
        normalize_last_layer=True,
    )
    assert fixed.prototypes0.scale is None
    assert (
        resolve_parameter_name("prototypes0.weight_g", fixed, dict(fixed.named_parameters())) == ""
    )
    with pytest.raises(ConfigError, match="activation_name"):
        SwAVHead({}, dims=[6, 4], num_clusters=[5], activation_name="Tanh")


def test_eval_mlp_use_residual_and_mlp_res() -> None:
    """mlp_res adds each block's input back where the sizes are equal: [6, 6, 3] is
    x + relu(W1 x + b1), then W2 (.) + b2 (no skip: 6 -> 3)."""
    torch.manual_seed(0)
    head = get_model_head("eval_mlp")(
        {}, in_channels=6, dims=[6, 6, 3], use_relu=True, use_residual=True
    )
    head.eval()
    x = torch.randn(4, 6, 1, 1)
    block1, block2 = head.clf.clf
    flat = head.channel_bn(x).flatten(1)
    hidden = flat + F.relu(block1.mlp_res_block[0](flat))
    expected = block2.mlp_res_block[0](hidden)
    assert torch.allclose(head(x), expected, atol=1e-6)
    plain = get_model_head("eval_mlp")({}, in_channels=6, dims=[6, 6, 3], use_relu=True)
    assert type(plain.clf).__name__ == "MLP"


def test_solarize_takes_vissl_constructor_name() -> None:
    solarize = get_transform("ImgPilRandomSolarize")
    assert solarize(prob=0.25).p == 0.25 and solarize(0.5).p == 0.5 and solarize().p == 0.66


def test_log_hooks_take_vissl_arguments(tmp_path) -> None:
    """VISSL's LogLossLrEtaHook(checkpoint_folder, btime_freq) and
    LogPerfTimeMetricsHook(log_freq)."""
    from vissl.hooks.log_hooks import LogLossLrEtaHook, LogPerfTimeMetricsHook

    positional = LogLossLrEtaHook(str(tmp_path), 20)
    assert positional.rolling_btime_freq == 20 and positional.progress_bar is True
    assert LogLossLrEtaHook(str(tmp_path), btime_freq=7).rolling_btime_freq == 7
    assert LogLossLrEtaHook(str(tmp_path), False).progress_bar is False
    assert LogPerfTimeMetricsHook(log_freq=5).perf_stat_frequency == 5
    assert LogPerfTimeMetricsHook(3).perf_stat_frequency == 3

"""VISSL's and ClassyVision's parameter names for our ``regnet``, ``resnet`` and ``vision_transformer``.

``MODEL.WEIGHTS_INIT`` (vissl/utils/weights_init.py) calls :func:`map_vissl_state_dict`
on every weights file: when the file's names are VISSL's or ClassyVision's and the model
has the trunk they belong to, they are renamed to ours, so VISSL model-zoo weights load
with ``PARAMS_FILE`` alone. The converters in ``extra_scripts/`` use the same maps.

**RegNet.** VISSL's ``regnet`` trunk wraps ClassyVision's RegNet; ours is built from
torchvision's blocks. Both keep the stem under ``_feature_blocks.conv1`` and stage ``s``
under ``_feature_blocks.res{s+1}`` with blocks ``block{s}-{i}``; inside the blocks the
names differ (trunk-relative names, after ``_feature_blocks.``):

===========================================  ==========================================
VISSL / ClassyVision                         ours (torchvision's blocks)
===========================================  ==========================================
``conv1.stem.0.weight`` (conv)               ``conv1.0.weight``
``conv1.stem.1.*`` (BatchNorm)               ``conv1.1.*``
``res2.block1-0.proj.weight``                ``res2.block1-0.proj.0.weight``
``res2.block1-0.bn.*``                       ``res2.block1-0.proj.1.*``
``res2.block1-0.f.a.{0,1}.*``                the same
``res2.block1-0.f.b.{0,1}.*``                the same
``res2.block1-0.f.se.excitation.0.*``        ``res2.block1-0.f.se.fc1.*``
``res2.block1-0.f.se.excitation.2.*``        ``res2.block1-0.f.se.fc2.*``
``res2.block1-0.f.c.weight``                 ``res2.block1-0.f.c.0.weight``
``res2.block1-0.f.final_bn.*``               ``res2.block1-0.f.c.1.*``
===========================================  ==========================================

Also read: SEER's layout (VISSL's ``regnet_fsdp`` / ``regnet_v2`` trunks, e.g. the
published RegNet-10B), whose stages hold groups of blocks,
``res2.block1-part0.block1-0.*``, the group level being dropped; FSDP and activation
checkpointing wrapper levels (``_fsdp_wrapped_module.``, ``_fpw_module.``,
``_checkpoint_wrapped_module.``), dropped wherever they are; and ClassyVision's own RegNet
model (``stem.stem.0.weight``, ``trunk_output.block1.block1-0.*``), whose ``stem`` is
our ``conv1`` and ``trunk_output.block{s}`` our ``res{s+1}``.

**ViT.** VISSL's ``vision_transformer`` names are ours (DINO's), so its checkpoints need
no renaming. VISSL's ``classy_vit`` trunk (ClassyVision's VisionTransformer under
``model.``) is renamed: ``conv_proj`` -> ``patch_embed.proj``, ``class_token`` ->
``cls_token``, ``encoder.pos_embedding`` (sequence first, ``(S, 1, D)``) -> ``pos_embed``
(``(1, S, D)``, transposed), ``encoder.layers.layer_{i}.`` -> ``blocks.{i}.`` with
``ln_1`` -> ``norm1``, ``self_attention.in_proj_weight/in_proj_bias`` ->
``attn.qkv.weight/bias``, ``self_attention.out_proj`` -> ``attn.proj``, ``ln_2`` ->
``norm2``, ``mlp.linear_1/linear_2`` -> ``mlp.fc1/fc2``, and ``encoder.ln`` -> ``norm``.
ClassyVision's attention has biases, so the trunk needs ``QKV_BIAS: True``; its ``gap``
classifier has no class token and does not map.

**ResNet.** ClassyVision's ResNe(X)t names (VISSL's ``convert_classy_vision_to_vissl_resnet``
reads them) map to our ``resnet`` trunk's (torchvision's under ``_feature_blocks.``):
``initial_block._module.{0,1}`` -> ``conv1`` / ``bn1``, ``blocks.{s}.block{s}-{i}`` ->
``layer{s+1}.{i}``, ``convolutional_block.{0,1,3,4,6}`` -> ``conv1`` / ``bn1`` / ``conv2`` /
``bn2`` / ``conv3``, the block's ``bn`` -> ``bn3`` (``bn2`` in basic blocks), ``downsample``
unchanged.

**A trunk's own names.** A plain state dict whose names are the model's trunk names
without ``trunk.`` (VISSL trunk exports such as ``_feature_blocks.conv1.weight``, DINO's
``dino_deitsmall16_pretrain.pth``) gets the ``trunk.`` prefix
(:func:`prefix_trunk_names`).

This module works on names only (utils imports nothing above it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from vissl.errors import ConfigError

logger = logging.getLogger(__name__)

KEY = "config.MODEL.WEIGHTS_INIT"
FEATURE_BLOCKS = "_feature_blocks."
#: Module levels that FSDP (fairscale's and torch's) and activation checkpointing wrappers
#: add to parameter names; never part of a model's own names.
WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_fpw_module.", "_checkpoint_wrapped_module.")
#: Classifier names of other libraries' models, which our trunks do not have.
CLASSIFIER_PREFIXES = ("fc.", "head.", "classifier.", "last_linear.", "head_dist.")

# Trunk-relative RegNet names (after ``_feature_blocks.``): VISSL/ClassyVision -> ours.
_REGNET_TO_OURS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), r)
    for p, r in (
        (r"^conv1\.stem\.(\d+)\.", r"conv1.\1."),
        (r"\.proj\.weight$", ".proj.0.weight"),
        (r"\.bn\.(\w+)$", r".proj.1.\1"),
        (r"\.f\.se\.excitation\.0\.", ".f.se.fc1."),
        (r"\.f\.se\.excitation\.2\.", ".f.se.fc2."),
        (r"\.f\.c\.weight$", ".f.c.0.weight"),
        (r"\.f\.final_bn\.", ".f.c.1."),
    )
)
# ours -> VISSL/ClassyVision, the inverse of the above.
_REGNET_TO_CLASSY: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), r)
    for p, r in (
        (r"^conv1\.(\d+)\.", r"conv1.stem.\1."),
        (r"\.proj\.0\.weight$", ".proj.weight"),
        (r"\.proj\.1\.(\w+)$", r".bn.\1"),
        (r"\.f\.se\.fc1\.", ".f.se.excitation.0."),
        (r"\.f\.se\.fc2\.", ".f.se.excitation.2."),
        (r"\.f\.c\.0\.weight$", ".f.c.weight"),
        (r"\.f\.c\.1\.", ".f.final_bn."),
    )
)
_SEER_GROUP = re.compile(r"^(res\d+)\.block\d+-part\d+\.")
_CLASSY_MODEL_STAGE = re.compile(r"^trunk_output\.block(\d+)\.")
_OUR_STAGE = re.compile(r"^res(\d+)\.")
# a (file or model) key of a RegNet trunk: optional prefixes, then the trunk-relative name
_REGNET_VISSL_KEY = re.compile(
    r"^(?P<pre>(?:trunk\.)?(?:base_model\.)?)" + re.escape(FEATURE_BLOCKS) + r"(?P<rest>.+)$"
)
_REGNET_CLASSY_MODEL_KEY = re.compile(
    r"^(?P<pre>(?:trunk\.)?(?:base_model\.)?)(?P<rest>(?:stem\.stem\.|trunk_output\.block\d+\.).+)$"
)

# ClassyVision's VisionTransformer (VISSL's classy_vit trunk keeps it under ``model.``)
_CLASSY_VIT_KEY = re.compile(
    r"^(?P<pre>(?:trunk\.)?(?:base_model\.)?)(?:model\.)?"
    r"(?P<rest>conv_proj\.(?:weight|bias)|class_token|encoder\..+)$"
)
_CLASSY_VIT_LAYER = re.compile(r"^encoder\.layers\.layer_(\d+)\.(.+)$")
_CLASSY_VIT_IN_LAYER = {
    "ln_1.": "norm1.",
    "self_attention.in_proj_weight": "attn.qkv.weight",
    "self_attention.in_proj_bias": "attn.qkv.bias",
    "self_attention.out_proj.": "attn.proj.",
    "ln_2.": "norm2.",
    "mlp.linear_1.": "mlp.fc1.",
    "mlp.linear_2.": "mlp.fc2.",
}


_CLASSY_RESNET_KEY = re.compile(
    r"^(?P<pre>(?:trunk\.)?(?:base_model\.)?)(?P<rest>(?:initial_block\._module|blocks)\..+)$"
)
_CLASSY_RESNET_BLOCK = re.compile(r"^blocks\.(\d+)\.block\1-(\d+)\.(.+)$")
_OUR_RESNET_BLOCK = re.compile(r"^layer(\d+)\.(\d+)\.(.+)$")
# inside a block: ClassyVision's convolutional_block index -> torchvision's layer
_CLASSY_CONV_BLOCK = {"0": "conv1", "1": "bn1", "3": "conv2", "4": "bn2", "6": "conv3"}
_OUR_CONV_BLOCK = {v: k for k, v in _CLASSY_CONV_BLOCK.items()}


def strip_wrappers(name: str) -> str:
    """``name`` without FSDP / activation-checkpointing wrapper levels and a leading
    ``module.`` (DDP)."""
    for segment in WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name[len("module.") :] if name.startswith("module.") else name


def config_parameter_name(name: str, key: str) -> str:
    """A parameter name (or name substring) from a config key, in our model's spelling.

    VISSL's FSDP configs name parameters as fairscale's FSDP wrappers spelled them
    (``_fsdp_wrapped_module.heads.0._fsdp_wrapped_module._fpw_module.prototypes0...``);
    our models' ``named_parameters()`` never hold wrapper levels (torch's FSDP2 keeps the
    original names, and FSDP1 with ``use_orig_params`` reports them clean), so the levels
    and DDP's leading ``module.`` are dropped. A dropped wrapper level is logged.
    """
    ours = strip_wrappers(name)
    if any(segment in name for segment in WRAPPER_SEGMENTS):
        logger.info("%s: %r is an FSDP-wrapped name; reading it as %r", key, name, ours)
    return ours


def _apply(rules: Iterable[tuple[re.Pattern[str], str]], name: str) -> str:
    for pattern, replacement in rules:
        name = pattern.sub(replacement, name, count=1)
    return name


def regnet_name_to_ours(rest: str) -> str:
    """A trunk-relative RegNet name (after ``_feature_blocks.``) in VISSL's / ClassyVision's
    spelling, SEER's grouped stages included, in ours."""
    return _apply(_REGNET_TO_OURS, _SEER_GROUP.sub(r"\1.", strip_wrappers(rest), count=1))


def regnet_name_to_classy(rest: str) -> str:
    """A trunk-relative name of our RegNet in VISSL's (ClassyVision's) spelling."""
    return _apply(_REGNET_TO_CLASSY, rest)


def classy_model_name_to_vissl(rest: str) -> str:
    """A ClassyVision RegNet model name (``stem.stem.0.weight``, ``trunk_output.block1.*``)
    as VISSL's trunk-relative name (``conv1.stem.0.weight``, ``res2.*``)."""
    if rest.startswith("stem."):
        return "conv1." + rest[len("stem.") :]
    match = _CLASSY_MODEL_STAGE.match(rest)
    if match:
        return f"res{int(match.group(1)) + 1}." + rest[match.end() :]
    return rest


def vissl_name_to_classy_model(rest: str) -> str:
    """VISSL's trunk-relative RegNet name as ClassyVision's RegNet model name (the inverse
    of :func:`classy_model_name_to_vissl`)."""
    if rest.startswith("conv1."):
        return "stem." + rest[len("conv1.") :]
    match = _OUR_STAGE.match(rest)
    if match:
        return f"trunk_output.block{int(match.group(1)) - 1}." + rest[match.end() :]
    return rest


def classy_resnet_name_to_ours(rest: str, bottleneck: bool) -> str:
    """A ClassyVision ResNe(X)t trunk name as our ``resnet`` trunk's (after
    ``_feature_blocks.``, i.e. torchvision's)."""
    if rest.startswith("initial_block._module."):
        inner = rest[len("initial_block._module.") :]
        index, _, param = inner.partition(".")
        return {"0": "conv1.", "1": "bn1."}.get(index, f"initial_block._module.{index}.") + param
    match = _CLASSY_RESNET_BLOCK.match(rest)
    if not match:
        return rest
    stage, block, inner = int(match.group(1)), match.group(2), match.group(3)
    if inner.startswith("convolutional_block."):
        index, _, param = inner[len("convolutional_block.") :].partition(".")
        inner = f"{_CLASSY_CONV_BLOCK.get(index, 'convolutional_block.' + index)}.{param}"
    elif inner.startswith("bn."):
        inner = ("bn3." if bottleneck else "bn2.") + inner[len("bn.") :]
    return f"layer{stage + 1}.{block}.{inner}"


def resnet_name_to_classy(rest: str, bottleneck: bool) -> str:
    """Our ``resnet`` trunk name (after ``_feature_blocks.``) as ClassyVision's ResNe(X)t
    name; the inverse of :func:`classy_resnet_name_to_ours`."""
    stem = {"conv1.": "initial_block._module.0.", "bn1.": "initial_block._module.1."}
    for ours, theirs in stem.items():
        if rest.startswith(ours):
            return theirs + rest[len(ours) :]
    match = _OUR_RESNET_BLOCK.match(rest)
    if not match:
        return rest
    stage, block, inner = int(match.group(1)) - 1, match.group(2), match.group(3)
    layer, _, param = inner.partition(".")
    final_bn = "bn3" if bottleneck else "bn2"
    if layer == final_bn:
        inner = "bn." + param
    elif layer in _OUR_CONV_BLOCK:
        inner = f"convolutional_block.{_OUR_CONV_BLOCK[layer]}.{param}"
    return f"blocks.{stage}.block{stage}-{block}.{inner}"


def is_resnet_model(model_keys: Iterable[str]) -> bool:
    """Whether a model's (or trunk's) state dict keys are those of our ``resnet`` trunk."""
    keys = list(model_keys)
    return any(k.endswith(FEATURE_BLOCKS + "conv1.weight") for k in keys) and any(
        FEATURE_BLOCKS + "layer1.0.conv1.weight" in k for k in keys
    )


def is_regnet_model(model_keys: Iterable[str]) -> bool:
    """Whether a model's (or trunk's) state dict keys are those of our ``regnet`` trunk."""
    keys = list(model_keys)
    return any(k.endswith(FEATURE_BLOCKS + "conv1.0.weight") for k in keys) and any(
        ".f.a.0.weight" in k for k in keys
    )


_OUR_VIT_KEY = re.compile(
    r"^(?:trunk\.)?(?:base_model\.)?(?:cls_token|blocks\.0\.attn\.qkv\.weight)$"
)


def is_vit_model(model_keys: Iterable[str]) -> bool:
    """Whether a model's state dict keys are those of our ``vision_transformer`` trunk (not
    a timm ViT under ``timm_model.``)."""
    matched = [k for k in model_keys if _OUR_VIT_KEY.match(k)]
    return any(k.endswith("cls_token") for k in matched) and any(
        k.endswith("qkv.weight") for k in matched
    )


def _trunk_prefix(pre: str) -> str:
    """A file key's prefix before the trunk-relative name, as a model prefix (``trunk.``
    added for a plain trunk state dict)."""
    return pre if pre.startswith("trunk.") else "trunk." + pre


def _map_regnet(state: Mapping[str, Any]) -> tuple[dict[str, Any], bool] | None:
    """(renamed state, whether SEER's grouped stages were found), or None when no name is
    VISSL's / ClassyVision's."""
    found = seer = False
    out: dict[str, Any] = {}
    for key, value in state.items():
        name = strip_wrappers(str(key))
        vissl = _REGNET_VISSL_KEY.match(name)
        classy = None if vissl else _REGNET_CLASSY_MODEL_KEY.match(name)
        if vissl:
            pre, rest = vissl.group("pre"), vissl.group("rest")
        elif classy:
            pre, rest = classy.group("pre"), classy_model_name_to_vissl(classy.group("rest"))
        else:
            out[name] = value
            continue
        rest = strip_wrappers(rest)
        grouped = bool(_SEER_GROUP.match(rest))
        found = found or grouped or rest.startswith("conv1.stem.")
        seer = seer or grouped
        out[_trunk_prefix(pre) + FEATURE_BLOCKS + regnet_name_to_ours(rest)] = value
    return (out, seer) if found else None


def _map_classy_resnet(state: Mapping[str, Any]) -> dict[str, Any] | None:
    names = [strip_wrappers(str(k)) for k in state]
    if not any(n.endswith("initial_block._module.0.weight") for n in names):
        return None
    bottleneck = any(n.endswith(".convolutional_block.6.weight") for n in names)
    out: dict[str, Any] = {}
    for name, value in zip(names, state.values(), strict=True):
        match = _CLASSY_RESNET_KEY.match(name)
        if not match:
            out[name] = value
            continue
        rest = classy_resnet_name_to_ours(match.group("rest"), bottleneck)
        out[_trunk_prefix(match.group("pre")) + FEATURE_BLOCKS + rest] = value
    return out


def _map_classy_vit(state: Mapping[str, Any], source: str) -> dict[str, Any] | None:
    if not any("self_attention.in_proj_weight" in str(k) for k in state):
        return None
    has_class_token = False
    out: dict[str, Any] = {}
    for key, value in state.items():
        name = strip_wrappers(str(key))
        match = _CLASSY_VIT_KEY.match(name)
        if not match:
            out[name] = value
            continue
        pre, rest = _trunk_prefix(match.group("pre")), match.group("rest")
        layer = _CLASSY_VIT_LAYER.match(rest)
        if rest.startswith("conv_proj."):
            rest = "patch_embed.proj." + rest[len("conv_proj.") :]
        elif rest == "class_token":
            rest, has_class_token = "cls_token", True
        elif rest == "encoder.pos_embedding":
            # ClassyVision keeps the sequence first, (S, 1, D); ours is (1, S, D)
            rest, value = "pos_embed", value.permute(1, 0, 2).contiguous()
        elif rest.startswith("encoder.ln."):
            rest = "norm." + rest[len("encoder.ln.") :]
        elif layer:
            inner = layer.group(2)
            for theirs, ours in _CLASSY_VIT_IN_LAYER.items():
                if inner.startswith(theirs):
                    inner = ours + inner[len(theirs) :]
                    break
            rest = f"blocks.{layer.group(1)}.{inner}"
        out[pre + rest] = value
    if not has_class_token:
        raise ConfigError(
            f"{KEY}.PARAMS_FILE: {source} holds a ClassyVision VisionTransformer without a "
            "class token (classifier 'gap'); the vision_transformer trunk always has one, "
            "so these weights do not map to it. Only ClassyVision ViTs with classifier "
            "'token' load.",
            f"{KEY}.PARAMS_FILE",
        )
    return out


def map_vissl_state_dict(
    state: Mapping[str, Any], model_keys: Iterable[str], source: str = "the weights file"
) -> dict[str, Any] | None:
    """``state`` renamed to the model's names when its names are VISSL's / ClassyVision's.

    Args:
        state: the file's flat state dict (``trunk.*`` / ``heads.*`` names of a VISSL
            checkpoint, or a plain state dict).
        model_keys: the model's state dict keys.
        source: the file, for messages.

    Returns:
        The renamed state dict (trunk names ``trunk.[base_model.]<ours>``; other names
        unchanged but for wrapper levels), or None when the model is no ``regnet`` /
        ``resnet`` / ``vision_transformer`` trunk or the file does not use those names.

    Raises:
        ConfigError: a ClassyVision ViT without class token for a ``vision_transformer``.
    """
    keys = list(model_keys)
    mapped: dict[str, Any] | None = None
    layout = ""
    if is_regnet_model(keys):
        regnet = _map_regnet(state)
        if regnet is not None:
            mapped, seer = regnet
            layout = "SEER's grouped RegNet" if seer else "VISSL / ClassyVision RegNet"
    elif is_resnet_model(keys):
        mapped = _map_classy_resnet(state)
        layout = "ClassyVision ResNe(X)t"
    elif is_vit_model(keys):
        mapped = _map_classy_vit(state, source)
        layout = "VISSL classy_vit (ClassyVision VisionTransformer)"
    if mapped is None:
        return None
    logger.info("%s: %s read with %s names, renamed to ours", KEY, source, layout)
    return mapped


def prefix_trunk_names(
    state: Mapping[str, Any], model_keys: Iterable[str], source: str = "the weights file"
) -> dict[str, Any] | None:
    """A plain state dict named as the model's trunk (without ``trunk.``), prefixed.

    Every name (a leading ``module.`` and wrapper levels removed) must be a trunk name of
    the model, except classifiers (``head.*``, ``fc.*``, ...) the trunk lacks, which are
    left out with a log line; otherwise None (the file is in no layout of ours).
    """
    keys = list(model_keys)
    trunk = {k[len("trunk.") :] for k in keys if k.startswith("trunk.")}
    if not trunk or any(str(k).startswith(("trunk.", "heads.")) for k in state):
        return None
    names = {strip_wrappers(str(k)): k for k in state}
    dropped = sorted(n for n in names if n not in trunk and n.startswith(CLASSIFIER_PREFIXES))
    kept = [n for n in names if n not in dropped]
    if not kept or any(n not in trunk for n in kept):
        return None
    if dropped:
        logger.info(
            "%s: %s: the classifier %s is not part of the trunk; left out.",
            KEY,
            source,
            dropped[:5],
        )
    logger.info("%s: %s read as the trunk's own names (trunk. prefix added)", KEY, source)
    return {"trunk." + n: state[names[n]] for n in kept}


def regnet_trunk_to_classy(trunk_state: Mapping[str, Any], layout: str = "vissl") -> dict[str, Any]:
    """Our RegNet trunk's state dict (keys ``_feature_blocks.*``) in VISSL's names.

    Args:
        trunk_state: the trunk's state dict, without ``trunk.``.
        layout: ``vissl`` for VISSL's ``regnet`` trunk (``_feature_blocks.conv1.stem.*``),
            ``classy`` for ClassyVision's RegNet model (``stem.stem.*``,
            ``trunk_output.block{s}.*``).

    Raises:
        ValueError: a key outside ``_feature_blocks.`` (not our RegNet trunk).
    """
    out: dict[str, Any] = {}
    for key, value in trunk_state.items():
        if not key.startswith(FEATURE_BLOCKS):
            raise ValueError(f"{key!r} is not a RegNet trunk name (no {FEATURE_BLOCKS!r})")
        rest = regnet_name_to_classy(key[len(FEATURE_BLOCKS) :])
        if layout == "classy":
            out[vissl_name_to_classy_model(rest)] = value
        else:
            out[FEATURE_BLOCKS + rest] = value
    return out

"""``default``: the optimizer parameter groups of VISSL's default param-group constructor.

Every trainable parameter falls into one of four groups:

* ``trunk_regularized`` / ``trunk_unregularized``: parameters outside ``model.heads``;
* ``head_regularized`` / ``head_unregularized``: parameters of ``model.heads`` (names
  starting with ``heads.``, after any ``module.`` prefix of a DDP wrapper); with
  ``head_optimizer_params.head_indices`` only those heads (the others join the trunk's
  groups), as SimSiam's ``--fix-pred-lr`` gives its predictor alone a fixed rate.

A parameter is unregularized (``weight_decay`` 0) when it belongs to a normalisation layer
and ``regularize_bn`` is false (a norm layer's bias also needs ``regularize_bias``), when
it is a bias and ``regularize_bias`` is false, or when its name contains one of
``non_regularized_parameters``. Head groups use ``head_optimizer_params.weight_decay``
when ``use_different_wd`` is true, otherwise ``weight_decay``. Each group carries
``"is_head"`` and ``"param_group_name"``; empty groups are left out. With
``construct_single_param_group_only`` there is one group, ``all``, with ``weight_decay``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from vissl.errors import ConfigError
from vissl.optimizers._checks import get_bool, get_number, get_section
from vissl.optimizers.param_groups.registry import register_param_group_constructor
from vissl.utils.vissl_key_maps import config_parameter_name

_PATH = "config.OPTIMIZER"

NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,  # BatchNorm*, SyncBatchNorm, InstanceNorm*
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)

GROUP_NAMES = ("trunk_regularized", "trunk_unregularized", "head_regularized", "head_unregularized")


def is_head_parameter(name: str, head_indices: frozenset[int] | None = None) -> bool:
    """Whether the parameter ``name`` belongs to ``model.heads`` (to one of the heads
    ``head_indices`` when given)."""
    while name.startswith("module."):
        name = name[len("module.") :]
    if not name.startswith("heads."):
        return False
    if head_indices is None:
        return True
    index = name.split(".", 2)[1]
    return index.isdigit() and int(index) in head_indices


def head_indices(optimizer_config: Mapping[str, Any], num_heads: int) -> frozenset[int] | None:
    """``head_optimizer_params.head_indices``: the heads (indices into
    ``MODEL.HEAD.PARAMS``) that form the head groups; ``None`` (the default, VISSL's) for
    every head.

    Raises:
        ConfigError: not a list of distinct head indices of this model.
    """
    head = get_section(optimizer_config, "head_optimizer_params", _PATH)
    value = head.get("head_indices")
    if value is None:
        return None
    key = f"{_PATH}.head_optimizer_params.head_indices"
    if (
        isinstance(value, str)
        or not hasattr(value, "__iter__")
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in value)
        or len(set(value)) != len(list(value))
        or not all(0 <= i < num_heads for i in value)
    ):
        raise ConfigError(
            f"{key} must list distinct indices of MODEL.HEAD.PARAMS (this model has "
            f"{num_heads} head(s): 0..{num_heads - 1}), or be null for every head; got "
            f"{value!r}.",
            key,
        )
    return frozenset(value)


def is_bias(param_name: str) -> bool:
    return param_name == "bias" or param_name.endswith("_bias")


def head_weight_decay(optimizer_config: Mapping[str, Any]) -> float:
    """The weight decay of head parameters (VISSL's ``infer_learning_rate`` rule)."""
    weight_decay = get_number(optimizer_config, "weight_decay", _PATH, default=0.0, min_value=0.0)
    head = get_section(optimizer_config, "head_optimizer_params", _PATH)
    head_path = f"{_PATH}.head_optimizer_params"
    if get_bool(head, "use_different_wd", head_path):
        return get_number(head, "weight_decay", head_path, min_value=0.0)
    return weight_decay


def non_regularized_substrings(optimizer_config: Mapping[str, Any]) -> list[str]:
    """``non_regularized_parameters``: a parameter whose name contains one gets no decay.

    FSDP-wrapped spellings (``_fsdp_wrapped_module.``, ``_fpw_module.``) are read in our
    names (:func:`vissl.utils.vissl_key_maps.config_parameter_name`).

    Raises:
        ConfigError: it is not a list of strings.
    """
    non_regularized = optimizer_config.get("non_regularized_parameters") or []
    if isinstance(non_regularized, str) or not all(isinstance(s, str) for s in non_regularized):
        raise ConfigError(
            f"{_PATH}.non_regularized_parameters must be a list of parameter-name substrings, "
            f"got {non_regularized!r}.",
            f"{_PATH}.non_regularized_parameters",
        )
    key = f"{_PATH}.non_regularized_parameters"
    return [config_parameter_name(s, key) for s in non_regularized if s]


def get_optimizer_param_groups(
    model: nn.Module,
    optimizer_config: Mapping[str, Any],
    *,
    lr: float = 0.1,
    lr_head: float | None = None,
) -> list[dict[str, Any]]:
    """The optimizer param groups of ``model`` (see the module docstring).

    Args:
        model: the model; its head parameters are those of ``model.heads``.
        optimizer_config: ``config.OPTIMIZER``.
        lr: initial learning rate of trunk groups.
        lr_head: initial learning rate of head groups (default: ``lr``).

    Raises:
        ConfigError: on invalid ``weight_decay`` / ``regularize_*`` values.
        ValueError: when the model has no trainable parameter.
    """
    weight_decay = get_number(optimizer_config, "weight_decay", _PATH, default=0.0, min_value=0.0)
    wd_head = head_weight_decay(optimizer_config)
    regularize_bn = get_bool(optimizer_config, "regularize_bn", _PATH, default=False)
    regularize_bias = get_bool(optimizer_config, "regularize_bias", _PATH, default=True)
    non_regularized = non_regularized_substrings(optimizer_config)
    heads = getattr(getattr(model, "module", model), "heads", None)
    selected = head_indices(optimizer_config, len(heads) if heads is not None else 0)
    lr_head = lr if lr_head is None else lr_head

    buckets: dict[str, list[nn.Parameter]] = {name: [] for name in GROUP_NAMES}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        is_norm = isinstance(module, NORM_TYPES)
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if not param.requires_grad:
                continue
            full_name = f"{module_name}.{param_name}" if module_name else param_name
            bias = is_bias(param_name)
            if is_norm:
                regularized = regularize_bn and (regularize_bias or not bias)
            elif bias:
                regularized = regularize_bias
            else:
                regularized = True
            if any(s in full_name for s in non_regularized):
                regularized = False
            part = "head" if is_head_parameter(full_name, selected) else "trunk"
            buckets[f"{part}_{'regularized' if regularized else 'unregularized'}"].append(param)

    trainable = [p for group in buckets.values() for p in group]
    if not trainable:
        raise ValueError("the model has no trainable parameter (requires_grad=True) to optimize.")

    if get_bool(optimizer_config, "construct_single_param_group_only", _PATH):
        return [
            {
                "params": trainable,
                "lr": lr,
                "weight_decay": weight_decay,
                "is_head": False,
                "param_group_name": "all",
            }
        ]

    settings = {
        "trunk_regularized": (lr, weight_decay, False),
        "trunk_unregularized": (lr, 0.0, False),
        "head_regularized": (lr_head, wd_head, True),
        "head_unregularized": (lr_head, 0.0, True),
    }
    groups = []
    for name in GROUP_NAMES:
        if buckets[name]:
            group_lr, group_wd, is_head = settings[name]
            groups.append(
                {
                    "params": buckets[name],
                    "lr": group_lr,
                    "weight_decay": group_wd,
                    "is_head": is_head,
                    "param_group_name": name,
                }
            )
    return groups


@register_param_group_constructor("default")
def default_param_groups(
    model: nn.Module, model_config: Mapping[str, Any] | None, optimizer_config: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """VISSL's ``default`` constructor: :func:`get_optimizer_param_groups`."""
    return get_optimizer_param_groups(model, optimizer_config)

"""What the predictor methods share: BYOL, SimSiam, MoCo v3 and NNCLR.

**The model.** ``MODEL.HEAD.PARAMS`` is a flat chain ``[projector, predictor]`` (VISSL
main's BYOL layout): the trunk feature goes through the projector (one or more head
modules), then through the predictor (the last head module). The model's output is the
predictor's, ``p``. Each module is an ``mlp`` whose ``dims`` say its widths::

    HEAD:
      PARAMS: [
        ["mlp", {"dims": [512, 1024, 128], "use_relu": True, "use_bn": True}],  # projector
        ["mlp", {"dims": [128, 1024, 128], "use_relu": True, "use_bn": True}],  # predictor
      ]

**The batch.** Two views of each sample, view-major (``simclr_collator`` after
``ImgReplicatePil`` with ``num_times: 2``, or ``multicrop_collator`` with 2 crops): the
output's rows ``0..B-1`` are view 1 and ``B..2B-1`` view 2.

**Both views in one forward.** The model (and a target network) runs once on the ``2B``
rows of both views, so every BatchNorm of trunk and heads normalises with statistics over
both views together (over the global ``2 * W * B`` rows with SyncBN), and its running
statistics get one update per step. The references normalise each view on its own:
SimSiam's ``SimSiam.forward`` calls ``encoder(x1)`` and ``encoder(x2)``, MoCo v3's
``MoCo.forward`` calls ``base_encoder`` and ``momentum_encoder`` once per view, BYOL's
``byol_experiment.py`` applies its network to each view separately (``apply_once_fn``),
and NNCLR's paper describes no joint forward. The views are drawn from the same
distribution (MoCo v3's and BYOL's asymmetric augmentations aside), so the batch
statistics of ``2B`` rows estimate the same moments as those of ``B`` with less noise;
the difference is expected to be small, and with SyncBN over a large global batch
smaller still. No config switches it.

**Projections.** SimSiam and NNCLR also need the projector's output ``z`` of the same
forward pass: :class:`ProjectionCapture` keeps the predictor's input (a forward pre-hook
on the last head module), so no second forward is run.

**Target networks.** BYOL and MoCo v3 compare with a *target* (momentum) network: a frozen
copy of the model without its predictor (a :class:`~vissl.models.momentum.MomentumTeacher`
with ``drop_last_heads=1``), run on the same views without gradients by
:class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook` (``MomentumTargetHook`` is
an alias) after the model's forward, its projections passed to the loss as
``teacher_output``, and moved towards the model after each optimizer step with the cosine momentum schedule of BYOL
(``m = 1 - (1 - base) * (cos(pi * k / K) + 1) / 2``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import torch
from fvcore.common.param_scheduler import ParamScheduler
from torch import nn
from torch.utils.hooks import RemovableHandle

from vissl.errors import ConfigError
from vissl.losses.config_inference import transform_num_crops
from vissl.losses.teacher_hooks import DrivenByMomentumTeacherHook
from vissl.models.momentum import (
    MomentumTeacher,
    MomentumTeacherOwner,
    TeacherStep,
    _plain,
    build_momentum_schedule,
)

logger = logging.getLogger(__name__)

_HEAD_KEY = "config.MODEL.HEAD.PARAMS"


def _module_specs(params: Any) -> list[tuple[str, Mapping[str, Any]]] | None:
    """The flat chain's ``(name, kwargs)``; None when PARAMS is not a flat chain."""
    if not isinstance(params, Sequence) or isinstance(params, str) or not params:
        return None
    specs = []
    for item in params:
        if (
            not isinstance(item, Sequence)
            or isinstance(item, str)
            or not item
            or not isinstance(item[0], str)
        ):
            return None
        kwargs = item[1] if len(item) > 1 and isinstance(item[1], Mapping) else {}
        specs.append((item[0], kwargs))
    return specs


def projector_predictor_dims(config: Mapping[str, Any], method: str) -> tuple[int, int]:
    """The projector's and the predictor's output widths from ``MODEL.HEAD.PARAMS``.

    Raises:
        ConfigError: PARAMS is not a flat chain of at least 2 modules (projector then
            predictor), or the predictor's input width is not the projector's output width.
    """
    params = (config.get("MODEL") or {}).get("HEAD", {}).get("PARAMS") or []
    specs = _module_specs(params)
    example = (
        '[["mlp", {"dims": [512, 1024, 128], "use_relu": True, "use_bn": True}], '
        '["mlp", {"dims": [128, 1024, 128], "use_relu": True, "use_bn": True}]]'
    )
    if specs is None or len(specs) < 2:
        raise ConfigError(
            f"{method} needs a projector and a predictor: {_HEAD_KEY} must be a flat chain "
            f"of at least 2 head modules, the last one the predictor, e.g. {example}; got "
            f"{params!r}.",
            _HEAD_KEY,
        )
    dims = [list(kwargs.get("dims") or []) for _, kwargs in specs]
    projector, predictor = dims[-2], dims[-1]
    if not projector or not predictor:
        raise ConfigError(
            f"{method}: the last two modules of {_HEAD_KEY} (projector, predictor) must give "
            f"their widths in 'dims', e.g. {example}.",
            _HEAD_KEY,
        )
    if int(predictor[0]) != int(projector[-1]):
        raise ConfigError(
            f"{method}: the predictor's input width {predictor[0]} is not the projector's "
            f"output width {projector[-1]} in {_HEAD_KEY}.",
            _HEAD_KEY,
        )
    return int(projector[-1]), int(predictor[-1])


def check_two_views(config: Mapping[str, Any], key: str, method: str) -> None:
    """The transforms must make 2 views per sample.

    Raises:
        ConfigError: they make another number of views.
    """
    views = transform_num_crops(config["DATA"]["TRAIN"].get("TRANSFORMS", []))
    if views is not None and views != 2:
        raise ConfigError(
            f"{key}: {method} compares exactly 2 views of each sample, the transforms of "
            f"config.DATA.TRAIN.TRANSFORMS make {views}; use ImgReplicatePil with "
            "num_times: 2 (or ImgPilToMultiCrop with 2 crops).",
            "config.DATA.TRAIN.TRANSFORMS",
        )


def infer_predictor_config(
    params: MutableMapping[str, Any],
    config: Mapping[str, Any],
    loss_name: str,
    method: str,
    dim_key: str = "embedding_dim",
) -> None:
    """The ``infer_config`` of a loss comparing predictions with projections of the same
    width (BYOL, SimSiam, NNCLR): the width from the head, 2 views.

    Args:
        params: ``LOSS.<loss_name>``, completed in place.
        config: the whole config.
        loss_name: the loss's name (its key under LOSS).
        method: the method's name, for messages.
        dim_key: where the width goes in ``params``, dotted (VISSL's keys put it under
            ``buffer_params.embedding_dim``).

    Raises:
        ConfigError: HEAD.PARAMS is not ``[projector, predictor]``, their output widths
            differ, or the transforms do not make 2 views.
    """
    key = f"config.LOSS.{loss_name}"
    projection, prediction = projector_predictor_dims(config, loss_name)
    if projection != prediction:
        raise ConfigError(
            f"{loss_name} compares the predictor's output with a projection: their widths "
            f"must match, but config.MODEL.HEAD.PARAMS makes projections of {projection} and "
            f"predictions of {prediction}; end the predictor's dims with {projection}.",
            _HEAD_KEY,
        )
    *parents, leaf = dim_key.split(".")
    node = params
    for part in parents:
        node = node.setdefault(part, {})
    if node.get(leaf) != projection:
        logger.info("%s.%s set to %d, the head's output width", key, dim_key, projection)
        node[leaf] = projection
    check_two_views(config, key, method)


def single_output(output: Any, method: str) -> torch.Tensor:
    """The one tensor of a model output (a tensor, or a list of one tensor)."""
    while not isinstance(output, torch.Tensor):
        items = list(output)
        if len(items) != 1:
            raise ValueError(
                f"{method} expects one output tensor (the predictor's), got {len(items)}."
            )
        output = items[0]
    return output


def checked_prediction(
    output: Any, method: str, embedding_dim: int, key: str | None = None
) -> torch.Tensor:
    """The predictor's output ``(2 * B, embedding_dim)`` of a model output.

    Raises:
        ConfigError: its width is not ``embedding_dim``; the error names ``key``
            (default ``config.LOSS.<method>.embedding_dim``).
    """
    prediction = single_output(output, method)
    if prediction.ndim != 2 or prediction.shape[1] != embedding_dim:
        key = key or f"config.LOSS.{method}.embedding_dim"
        raise ConfigError(
            f"{key} is {embedding_dim} but the model outputs shape "
            f"{tuple(prediction.shape)}; set it to the predictor's last dim.",
            key,
        )
    return prediction


def captured_projection(
    capture: ProjectionCapture | None, prediction: torch.Tensor, method: str
) -> torch.Tensor:
    """The projections kept by ``capture`` for this forward, shaped as ``prediction``."""
    if capture is None:
        raise RuntimeError(
            f"{method}.bind_model was not called: no projections (the trainer calls it "
            "when it builds the task)."
        )
    projection = capture.take(method)
    if projection.shape != prediction.shape:
        raise ValueError(
            f"{method}: projections of shape {tuple(projection.shape)} for predictions "
            f"of shape {tuple(prediction.shape)}."
        )
    return projection


def two_views(x: torch.Tensor, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``0..B-1`` and ``B..2B-1`` of a view-major ``(2B, D)`` tensor."""
    if x.ndim != 2 or x.shape[0] % 2 != 0:
        raise ValueError(f"{method} expects (2 * B, D) rows of 2 views, got {tuple(x.shape)}.")
    a, b = x.chunk(2, dim=0)
    return a, b


class ProjectionCapture:
    """Keeps the projector's output ``z`` of each forward: the predictor's input.

    A forward pre-hook on the last module of ``model.heads`` (the predictor). The tensor
    is kept with its graph; :meth:`take` hands it over once.

    Args:
        model: the model (wrappers are seen through); its heads must be a chain of at
            least 2 modules.
    """

    def __init__(self, model: nn.Module) -> None:
        heads = getattr(_plain(model), "heads", None)
        if not isinstance(heads, nn.ModuleList) or len(heads) < 2:
            raise ValueError("the model has no [projector, predictor] heads to capture.")
        self.value: torch.Tensor | None = None
        self.module: nn.Module = heads[-1]
        self.handle: RemovableHandle = heads[-1].register_forward_pre_hook(self._keep)

    def __deepcopy__(self, memo: dict[int, Any]) -> ProjectionCapture:
        # A copy of the model (EMA, momentum copies) carries the hook: it must not copy
        # this object (nor a captured tensor); the identity check below ignores the copy.
        return self

    def _keep(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if module is self.module:
            self.value = args[0]

    def take(self, method: str) -> torch.Tensor:
        """The projections of the last forward (once).

        Raises:
            RuntimeError: no forward ran since the last call.
        """
        value = self.value
        if value is None:
            raise RuntimeError(
                f"{method}: no projector output was captured for this batch (the model's "
                "predictor did not run)."
            )
        self.value = None
        return value

    def remove(self) -> None:
        self.handle.remove()


class MomentumTargetLoss(DrivenByMomentumTeacherHook, MomentumTeacherOwner, nn.Module):
    """The target network of BYOL and MoCo v3: a :class:`~vissl.models.momentum.
    MomentumTeacher` copy of the model without its predictor (the last head), in the
    mode of the loss (its BatchNorm layers normalise with the batch's statistics in
    training), whose EMA factor follows a cosine from ``momentum`` to 1.

    The copy is the submodule ``target_network`` (VISSL's name, the checkpoint key;
    ``loss.teacher`` in code). Its projections of both views reach ``forward`` as
    ``teacher_output``
    (:class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook` in the trainer).
    """

    teacher_state_key = "target_network"
    teacher_mode = False
    momentum: float

    def momentum_schedule(self) -> ParamScheduler:
        return build_momentum_schedule("cosine", self.momentum, 1.0)

    def bind_model(self, model: nn.Module) -> None:
        """Make the target network: a frozen copy of ``model`` without its predictor."""
        self.attach_teacher(
            MomentumTeacher(model, self.momentum_schedule(), drop_last_heads=1, teacher_mode=False)
        )

    def teacher_loss_inputs(self, sample: dict[str, Any], step: TeacherStep) -> dict[str, Any]:
        """The target network's projections of ``sample["input"]`` (both views)."""
        teacher = self.momentum_teacher
        assert teacher is not None
        out = teacher(sample["input"])
        return {"teacher_output": single_output(out, "the target network").detach()}


def __getattr__(name: str) -> Any:
    # VISSL's name of the hook (hooks import losses, not the reverse: resolved lazily)
    if name == "MomentumTargetHook":
        from vissl.hooks.momentum_teacher_hook import MomentumTeacherHook

        return MomentumTeacherHook
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MomentumTargetLoss",
    "ProjectionCapture",
    "check_two_views",
    "infer_predictor_config",
    "projector_predictor_dims",
    "single_output",
    "two_views",
]

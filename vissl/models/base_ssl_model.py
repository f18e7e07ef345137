"""``multi_input_output_model``: VISSL's trunk + heads model.

The model is a ``trunk`` (MODEL.TRUNK.NAME) and ``heads`` (an ``nn.ModuleList`` built
from MODEL.HEAD.PARAMS), so state-dict keys start with ``trunk.`` and ``heads.`` as in
VISSL. ``forward`` returns a list with one tensor per output.

HEAD.PARAMS forms:

- ``[]``: no head; the output is the trunk feature(s).
- ``[[name, {kwargs}], ...]`` (flat): one head module per entry. With one trunk feature
  the modules are chained (output list of length 1); when the trunk returns N features
  (feature evaluation on N layers) and there are N entries, entry i is applied to
  feature i.
- ``[[[name, {kwargs}], ...], [[name, {kwargs}], ...]]`` (list of chains): each chain is
  one head (an ``nn.Sequential``); the heads run in parallel on the trunk feature, one
  output each (or head i on feature i when the trunk returns one feature per head).

A batch is a tensor (N, C, H, W) or a list of tensors (multi-crop): consecutive tensors
of the same shape are concatenated and run through the trunk together, and the features
are concatenated along the batch dimension in input order before the heads.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn as nn

from vissl.errors import ConfigError
from vissl.models import register_model
from vissl.models.heads import MODEL_HEADS_REGISTRY, get_model_head
from vissl.models.model_helpers import (
    cfg_get,
    get_trunk_output_feature_names,
    is_feature_extractor_model,
)
from vissl.models.shape_check import check_head_input_widths
from vissl.models.trunks import get_model_trunk
from vissl.models.trunks.feature_extractor import FeatureExtractorModel
from vissl.utils.registry import closest_match

logger = logging.getLogger(__name__)

_HEAD_KEY = "config.MODEL.HEAD.PARAMS"
_EXPECTED_HEADS = (
    "Expected a list of head modules [[name, {kwargs}], ...], e.g. "
    '[["mlp", {"dims": [2048, 128]}]] (chained on the trunk feature, or one per trunk '
    "feature), or a list of such chains [[[name, {kwargs}], ...], [[name, {kwargs}]]] "
    "for several parallel heads."
)

HeadSpec = tuple[str, dict[str, Any]]

_MAPPING_KEY = "config.MODEL.MULTI_INPUT_HEAD_MAPPING"


class InputHeadMapping(NamedTuple):
    """One MULTI_INPUT_HEAD_MAPPING entry: the input, its trunk features, its head and the
    batch entries passed along to the trunk (and to heads whose ``forward`` takes them)."""

    key: str
    feature_names: list[str]
    head_index: int | None = None
    #: the keyword arguments passed along (the batch key of the same name, unless renamed)
    additional_keys: tuple[str, ...] = ()
    #: (argument, batch key) pairs where the batch key differs from the argument's name
    renamed: tuple[tuple[str, str], ...] = ()

    def batch_key(self, argument: str) -> str:
        """The batch key whose value is passed as keyword argument ``argument``."""
        return dict(self.renamed).get(argument, argument)


def _str_list(value: Any) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and all(isinstance(name, str) for name in value)
    )


def _parse_mapping_dict(i: int, key: str, spec: Mapping[str, Any]) -> InputHeadMapping:
    where = f"{_MAPPING_KEY}[{i}]"
    unknown = sorted(set(spec) - {"feat_names", "head_index", "additional_keys"})
    if unknown or not _str_list(spec.get("feat_names", None)):
        raise ConfigError(
            f"{where} must be [input_key, {{feat_names: [...], head_index: <int>, "
            "additional_keys: [...]}] (VISSL's dict form; feat_names required, e.g. "
            f'["data", {{"feat_names": ["lastBLK"], "additional_keys": ["mask"]}}]); got '
            f"{[key, dict(spec)]!r}.",
            where,
        )
    head = spec.get("head_index", None)
    if head is not None and (isinstance(head, bool) or not isinstance(head, int) or head < 0):
        raise ConfigError(
            f"{where}.head_index must be an integer >= 0 (the head, in HEAD.PARAMS order), "
            f"got {head!r}.",
            where,
        )
    extra = spec.get("additional_keys", None) or []
    # (new in vissl) {argument: batch key}: a batch entry passed under another name, e.g.
    # MSN's focal views' masks {mask: focal_mask}
    renamed = dict(extra) if isinstance(extra, Mapping) else {}
    sources = list(renamed.values()) if renamed else extra
    if not _str_list(sources) or not _str_list(list(renamed)) or key in sources:
        raise ConfigError(
            f"{where}.additional_keys must be a list of other batch keys (e.g. [mask]) "
            "passed to the trunk as keyword arguments of the same name, or a mapping "
            "{argument: batch key} (e.g. {mask: focal_mask}); got "
            f"{extra!r}.",
            where,
        )
    return InputHeadMapping(
        key,
        list(spec["feat_names"]),
        head,
        tuple(renamed) if renamed else tuple(extra),
        tuple((a, b) for a, b in renamed.items() if a != b),
    )


def parse_multi_input_head_mapping(mapping: Any) -> list[InputHeadMapping]:
    """``MULTI_INPUT_HEAD_MAPPING`` as a list of :class:`InputHeadMapping`.

    VISSL's forms, one entry per input: ``[input_key, [feature_name, ...]]`` (PIRL:
    ``[["patches", ["flatten"]], ["images", ["flatten"]]]``; head i for entry i), or
    ``[input_key, {feat_names: [...], head_index: <int>, additional_keys: [...]}]``:
    ``head_index`` picks the head (default: head i for entry i, the last head for the
    entries beyond the number of heads, as in VISSL), ``additional_keys`` names batch
    entries (listed in INPUT_KEY_NAMES, e.g. a patch ``mask``) given as keyword arguments
    to the trunk and to the head, each where its ``forward`` has a parameter of that name
    (every key must be taken by one of them); a mapping ``{argument: batch_key}`` instead
    of the list passes a batch entry under another name (MSN's focal views:
    ``{mask: focal_mask}``).

    Raises:
        ConfigError: a malformed entry or a repeated key.
    """
    if not isinstance(mapping, Sequence) or isinstance(mapping, str):
        raise ConfigError(
            f"{_MAPPING_KEY} must be a list of [input_key, [feature_names]] entries, got "
            f"{mapping!r}.",
            _MAPPING_KEY,
        )
    out: list[InputHeadMapping] = []
    for i, entry in enumerate(mapping):
        is_pair = (
            isinstance(entry, Sequence)
            and not isinstance(entry, str)
            and len(entry) == 2
            and isinstance(entry[0], str)
        )
        if is_pair and isinstance(entry[1], Mapping):
            parsed = _parse_mapping_dict(i, entry[0], entry[1])
        elif is_pair and _str_list(entry[1]):
            parsed = InputHeadMapping(entry[0], list(entry[1]))
        else:
            raise ConfigError(
                f"{_MAPPING_KEY}[{i}] must be [input_key, [feature_name, ...]], e.g. "
                f'["images", ["flatten"]], or [input_key, {{feat_names: [...], '
                f"additional_keys: [...]}}]; got {entry!r}.",
                f"{_MAPPING_KEY}[{i}]",
            )
        if any(m.key == parsed.key for m in out):
            raise ConfigError(
                f"{_MAPPING_KEY}[{i}] maps input {parsed.key!r} a second time; each input "
                "key has one entry (and one head).",
                f"{_MAPPING_KEY}[{i}]",
            )
        out.append(parsed)
    return out


def _forward_takes(module: nn.Module, name: str) -> bool:
    """Whether ``module``'s ``forward`` has a parameter ``name`` (or ``**kwargs``)."""
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _is_list(item: Any) -> bool:
    return isinstance(item, Sequence) and not isinstance(item, str | bytes)


def _is_module_spec(item: Any) -> bool:
    return (
        _is_list(item)
        and len(item) in (1, 2)
        and isinstance(item[0], str)
        and (len(item) == 1 or item[1] is None or isinstance(item[1], Mapping))
    )


def _is_chain(item: Any) -> bool:
    return _is_list(item) and len(item) > 0 and all(map(_is_module_spec, item))


def _to_spec(item: Sequence[Any]) -> HeadSpec:
    kwargs = item[1] if len(item) == 2 and item[1] is not None else {}
    return item[0], dict(kwargs)


def parse_head_params(params: Any) -> tuple[list[list[HeadSpec]], bool]:
    """Normalise HEAD.PARAMS into a list of heads, each a chain of (name, kwargs).

    Returns:
        (heads, parallel): ``parallel`` is True when PARAMS uses the list-of-chains form.

    Raises:
        ConfigError: PARAMS does not have one of the accepted shapes.
    """
    if params is None:
        return [], False
    if not _is_list(params):
        raise ConfigError(
            f"{_HEAD_KEY} must be a list; got {params!r}. {_EXPECTED_HEADS}", _HEAD_KEY
        )
    if len(params) == 0:
        return [], False
    if isinstance(params[0], str):  # a single module given without the outer list
        if not _is_module_spec(params):
            raise ConfigError(f"{_HEAD_KEY}={params!r} is malformed. {_EXPECTED_HEADS}", _HEAD_KEY)
        return [[_to_spec(params)]], False
    heads: list[list[HeadSpec]] = []
    parallel = False
    for i, item in enumerate(params):
        if _is_module_spec(item):
            heads.append([_to_spec(item)])
        elif _is_chain(item):
            heads.append([_to_spec(x) for x in item])
            parallel = True
        else:
            raise ConfigError(
                f"{_HEAD_KEY}[{i}]={item!r} is malformed: each entry must be "
                f"[name, {{kwargs}}] or a list of those. {_EXPECTED_HEADS}",
                _HEAD_KEY,
            )
    return heads, parallel


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """Fix the CPU RNG inside the block (without disturbing the global stream)."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


_FE_KEY = "config.MODEL.FEATURE_EVAL_SETTINGS"


def check_feature_eval_settings(model_config: Mapping[str, Any]) -> None:
    """Reject contradictory FEATURE_EVAL_SETTINGS; warn about flags that have no effect.

    The settings, as in VISSL: ``EVAL_MODE_ON`` turns evaluation on (heads are new unless
    ``EVAL_TRUNK_AND_HEAD``); ``FREEZE_TRUNK_ONLY`` / ``FREEZE_TRUNK_AND_HEAD`` freeze the
    trunk (kept in eval mode, no gradients) / the whole model; a non-empty
    ``LINEAR_EVAL_FEAT_POOL_OPS_MAP`` taps several trunk layers (one head per layer);
    ``EXTRACT_TRUNK_FEATURES_ONLY`` returns the trunk features without heads;
    ``EVAL_TRUNK_AND_HEAD`` evaluates the pretraining head (loaded from WEIGHTS_INIT) on the
    trunk output.

    Raises:
        ConfigError: EVAL_TRUNK_AND_HEAD together with EXTRACT_TRUNK_FEATURES_ONLY, with a
            multi-layer LINEAR_EVAL_FEAT_POOL_OPS_MAP, or without any head.
    """
    fe = cfg_get(model_config, "FEATURE_EVAL_SETTINGS", {}) or {}
    eval_on = bool(fe.get("EVAL_MODE_ON", False))
    trunk_and_head = bool(fe.get("EVAL_TRUNK_AND_HEAD", False))
    trunk_only = bool(fe.get("EXTRACT_TRUNK_FEATURES_ONLY", False))
    pool_map = fe.get("LINEAR_EVAL_FEAT_POOL_OPS_MAP", []) or []
    if not eval_on:
        ignored = [k for k in ("EVAL_TRUNK_AND_HEAD", "EXTRACT_TRUNK_FEATURES_ONLY") if fe.get(k)]
        if pool_map and not is_feature_extractor_model(model_config):
            ignored.append("LINEAR_EVAL_FEAT_POOL_OPS_MAP")
        if ignored:
            logger.warning(
                "%s.%s have no effect without EVAL_MODE_ON: True (as in VISSL).",
                _FE_KEY,
                "/".join(ignored),
            )
        return
    if pool_map and not is_feature_extractor_model(model_config):
        logger.warning(
            "%s.LINEAR_EVAL_FEAT_POOL_OPS_MAP is used only with FREEZE_TRUNK_ONLY or "
            "FREEZE_TRUNK_AND_HEAD; it is ignored and the trunk returns its default output.",
            _FE_KEY,
        )
    if not trunk_and_head:
        return
    if trunk_only:
        raise ConfigError(
            f"{_FE_KEY}: EVAL_TRUNK_AND_HEAD (evaluate the pretraining head's output) and "
            "EXTRACT_TRUNK_FEATURES_ONLY (return the trunk features, no head) contradict "
            "each other; set one of them to False.",
            f"{_FE_KEY}.EVAL_TRUNK_AND_HEAD",
        )
    if pool_map and is_feature_extractor_model(model_config):
        raise ConfigError(
            f"{_FE_KEY}: EVAL_TRUNK_AND_HEAD evaluates the pretraining head on the trunk's "
            "final output, while LINEAR_EVAL_FEAT_POOL_OPS_MAP taps several trunk layers for "
            "new per-layer heads. Use EVAL_TRUNK_AND_HEAD with an empty "
            "LINEAR_EVAL_FEAT_POOL_OPS_MAP and the pretraining MODEL.HEAD.PARAMS, or set "
            "EVAL_TRUNK_AND_HEAD: False for linear evaluation of several layers.",
            f"{_FE_KEY}.EVAL_TRUNK_AND_HEAD",
        )
    if not (cfg_get(model_config, "HEAD.PARAMS", []) or []):
        raise ConfigError(
            f"{_FE_KEY}.EVAL_TRUNK_AND_HEAD is on but config.MODEL.HEAD.PARAMS is empty: "
            "give the pretraining head (e.g. SimCLR's projection MLP) so its weights can be "
            "loaded from config.MODEL.WEIGHTS_INIT and evaluated.",
            _HEAD_KEY,
        )


@register_model("multi_input_output_model")
class BaseSSLMultiInputOutputModel(nn.Module):
    """Self-supervised model: a trunk computing features, heads computing outputs.

    Supports single- and multi-output heads, heads per trunk layer (linear evaluation),
    multi-resolution crops, frozen trunk / heads (FEATURE_EVAL_SETTINGS.FREEZE_*) and
    MODEL.NON_TRAINABLE_PARAMS.

    Args:
        model_config: config.MODEL.
        optimizer_config: config.OPTIMIZER (kept for VISSL compatibility).
    """

    def __init__(
        self, model_config: Mapping[str, Any], optimizer_config: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__()
        self.model_config = model_config
        self.optimizer_config = optimizer_config
        self._trunk_frozen = False
        self._heads_frozen = False
        #: MULTI_INPUT_HEAD_MAPPING: input key, trunk features, head, additional keys
        self.input_head_mapping = parse_multi_input_head_mapping(
            cfg_get(model_config, "MULTI_INPUT_HEAD_MAPPING", []) or []
        )
        check_feature_eval_settings(model_config)
        self.eval_mode = is_feature_extractor_model(model_config)
        self.trunk = self._get_trunk()
        self._output_feature_names = get_trunk_output_feature_names(model_config)
        self.heads = nn.ModuleList()
        self.head_names: list[str] = []
        self._parallel_heads = False
        self._get_heads()
        self._apply_freezing()

    # ------------------------------------------------------------------ construction
    def _get_trunk(self) -> nn.Module:
        if self.eval_mode:
            return FeatureExtractorModel(self.model_config)
        name = cfg_get(self.model_config, "TRUNK.NAME", "resnet")
        return get_model_trunk(name)(self.model_config, name)

    def _build_head_module(self, spec: HeadSpec, where: str) -> nn.Module:
        name, kwargs = spec
        cls = get_model_head(name)
        try:
            inspect.signature(cls).bind(self.model_config, **kwargs)
        except TypeError as e:
            try:
                accepted = [p for p in inspect.signature(cls).parameters][1:]
            except (TypeError, ValueError):
                accepted = []
            raise ConfigError(
                f"{_HEAD_KEY}{where}: head {name!r} cannot take the arguments "
                f"{sorted(kwargs)} ({e}). It accepts: {accepted}.",
                _HEAD_KEY,
            ) from None
        except ValueError:  # no introspectable signature: let the call decide
            pass
        return cls(self.model_config, **kwargs)

    def _get_heads(self) -> None:
        """Build ``self.heads`` from HEAD.PARAMS (see the module docstring)."""
        heads, self._parallel_heads = parse_head_params(
            cfg_get(self.model_config, "HEAD.PARAMS", [])
        )
        seed = cfg_get(self.model_config, "_MODEL_INIT_SEED", None)
        for i, chain in enumerate(heads):
            modules = []
            for j, spec in enumerate(chain):
                where = f"[{i}][{j}]" if self._parallel_heads else f"[{i}]"
                with _seeded(None if seed is None else int(seed) + j):
                    modules.append(self._build_head_module(spec, where))
            if self._parallel_heads:
                self.heads.append(nn.Sequential(*modules))
                self.head_names.append("->".join(name for name, _ in chain))
            else:
                self.heads.append(modules[0])
                self.head_names.append(chain[0][0])
        if self.input_head_mapping:
            self._check_multi_input_heads([[name for name, _ in chain] for chain in heads])
            return
        n_feats = max(1, len(self._output_feature_names))
        n_heads = len(self.heads)
        if n_heads and n_feats > 1 and n_heads != n_feats:
            raise ConfigError(
                f"{_HEAD_KEY} defines {n_heads} heads but the trunk returns {n_feats} "
                f"features ({self._output_feature_names}); give one head per feature.",
                _HEAD_KEY,
            )
        if not self._extract_trunk_features_only():
            check_head_input_widths(
                self.trunk,
                self._output_feature_names,
                self.heads,
                [[name for name, _ in chain] for chain in heads],
                self._parallel_heads,
            )

    def _check_multi_input_heads(self, chain_names: list[list[str]]) -> None:
        """Every head used by a MULTI_INPUT_HEAD_MAPPING entry (head i for entry i unless
        the entry names its ``head_index``), each able to take its input's trunk features.
        Finds, per entry, the additional keys its head's ``forward`` takes."""
        mapping = self.input_head_mapping
        # VISSL's default: entry i uses head i, the last head for entries beyond it (iBOT's
        # global and local views share one head)
        last = max(len(self.heads) - 1, 0)
        self._head_of_entry = [
            min(i, last) if m.head_index is None else m.head_index for i, m in enumerate(mapping)
        ]
        if sorted(set(self._head_of_entry)) != list(range(len(self.heads))):
            raise ConfigError(
                f"config.MODEL.MULTI_INPUT_HEAD_MAPPING has {len(mapping)} entries (using heads "
                f"{self._head_of_entry}) but {_HEAD_KEY} defines {len(self.heads)} heads: head "
                "i runs on the input of mapping entry i (or of the entries whose head_index is "
                "i), so give one head (or head chain [[name, {kwargs}], ...]) per entry, and "
                "use every head.",
                "config.MODEL.MULTI_INPUT_HEAD_MAPPING",
            )
        self._head_extra_keys = [
            tuple(k for k in m.additional_keys if _forward_takes(self.heads[h], k))
            for m, h in zip(mapping, self._head_of_entry)
        ]
        # the trunk gets the additional keys its forward takes (I-JEPA's predictor alone
        # takes target_masks); a key neither takes would be silently dropped: an error
        self._trunk_extra_keys = [
            tuple(k for k in m.additional_keys if _forward_takes(self.trunk, k)) for m in mapping
        ]
        for i, (m, heads_keys, trunk_keys) in enumerate(
            zip(mapping, self._head_extra_keys, self._trunk_extra_keys)
        ):
            unused = [k for k in m.additional_keys if k not in (*heads_keys, *trunk_keys)]
            if unused:
                raise ConfigError(
                    f"{_MAPPING_KEY}[{i}].additional_keys: neither the trunk nor the head "
                    f"takes {unused} (their forward has no parameter of that name); remove "
                    "them or use a trunk / head that takes them.",
                    f"{_MAPPING_KEY}[{i}]",
                )
        if self._extract_trunk_features_only():
            return
        for m, h, extra in zip(mapping, self._head_of_entry, self._head_extra_keys):
            if extra:  # the head needs more than the features: not probed
                continue
            check_head_input_widths(
                self.trunk,
                m.feature_names,
                [self.heads[h]],
                [chain_names[h]] if self._parallel_heads else [[chain_names[h][0]]],
                True,
            )

    def head_for_input(self, key: str) -> tuple[list[str], nn.Module]:
        """The trunk features and the head MULTI_INPUT_HEAD_MAPPING gives input ``key``
        (a teacher runs them on an input of its own, e.g. iBOT's unmasked global views).

        Raises:
            ConfigError: no mapping entry for ``key``.
        """
        for i, entry in enumerate(self.input_head_mapping):
            if entry.key == key:
                return list(entry.feature_names), self.heads[self._head_of_entry[i]]
        raise ConfigError(
            f"config.MODEL.MULTI_INPUT_HEAD_MAPPING has no entry for input {key!r} (entries: "
            f"{[m.key for m in self.input_head_mapping]}).",
            _MAPPING_KEY,
        )

    def _apply_freezing(self) -> None:
        fe = cfg_get(self.model_config, "FEATURE_EVAL_SETTINGS", {}) or {}
        freeze_all = bool(fe.get("FREEZE_TRUNK_AND_HEAD", False))
        freeze_trunk = bool(fe.get("FREEZE_TRUNK_ONLY", False))
        if (freeze_all or freeze_trunk) and not fe.get("EVAL_MODE_ON", False):
            logger.warning(
                "config.MODEL.FEATURE_EVAL_SETTINGS.FREEZE_* is set without EVAL_MODE_ON; "
                "VISSL would ignore it, vissl freezes as asked."
            )
        if freeze_all:
            self.freeze_head_and_trunk()
            logger.info(
                "FREEZE_TRUNK_AND_HEAD: the model is fully frozen; evaluate it with "
                "engine_name=extract_features or config.TEST_ONLY=True (a training phase "
                "would have nothing to optimise)."
            )
        elif freeze_trunk or self.eval_mode:
            self.freeze_trunk()
        names = list(cfg_get(self.model_config, "NON_TRAINABLE_PARAMS", []) or [])
        if names:
            self.freeze_params(names)

    # ------------------------------------------------------------------ freezing
    def freeze_trunk(self) -> None:
        """Set requires_grad=False on the trunk and keep it in eval mode."""
        logger.info("Freezing model trunk...")
        for param in self.trunk.parameters():
            param.requires_grad = False
        self._trunk_frozen = True
        self.train(self.training)

    def freeze_head(self) -> None:
        """Set requires_grad=False on the heads and keep them in eval mode."""
        logger.info("Freezing model heads...")
        for param in self.heads.parameters():
            param.requires_grad = False
        self._heads_frozen = True
        self.train(self.training)

    def freeze_head_and_trunk(self) -> None:
        """Freeze the whole model."""
        self.freeze_trunk()
        self.freeze_head()

    def freeze_params(self, names: Sequence[str]) -> None:
        """Set requires_grad=False on parameters named in ``names`` (MODEL.NON_TRAINABLE_PARAMS).

        A name matches a parameter exactly (``trunk._feature_blocks.conv1.weight``) or is
        a module prefix (``heads.0``). Norm layers stay in their normal train/eval mode.

        Raises:
            ConfigError: a name matches no parameter.
        """
        params = dict(self.named_parameters())
        for name in names:
            hits = [n for n in params if n == name or n.startswith(name + ".")]
            if not hits:
                close = closest_match(name, list(params))
                hint = f" Did you mean {close!r}?" if close else ""
                raise ConfigError(
                    f"config.MODEL.NON_TRAINABLE_PARAMS: no parameter named {name!r}.{hint} "
                    "Names are those of model.named_parameters(), e.g. "
                    f"{list(params)[:3]}.",
                    "config.MODEL.NON_TRAINABLE_PARAMS",
                )
            for n in hits:
                params[n].requires_grad = False

    def init_model_from_weights_params_file(
        self, config: Mapping[str, Any], checkpoint: Mapping[str, Any], strict: bool = False
    ) -> None:
        """VISSL's method: load a loaded weights file following config.MODEL.WEIGHTS_INIT.

        Args:
            config: the full config (MODEL.WEIGHTS_INIT and MODEL.FEATURE_EVAL_SETTINGS).
            checkpoint: the loaded file (e.g. ``load_checkpoint(path)``).
            strict: accepted for VISSL compatibility; loading is always checked (missing
                or mis-shaped keys are errors unless in SKIP_LAYERS).
        """
        from vissl.utils.weights_init import init_model_from_checkpoint

        model_cfg = config["MODEL"]
        init_model_from_checkpoint(
            self, checkpoint, model_cfg["WEIGHTS_INIT"], model_cfg, source="the checkpoint"
        )

    def is_fully_frozen_model(self) -> bool:
        """True if no trunk or head parameter is trainable."""
        return not any(p.requires_grad for p in self.parameters())

    def train(self, mode: bool = True) -> BaseSSLMultiInputOutputModel:
        """Set train/eval mode; frozen trunk / heads always stay in eval mode."""
        super().train(mode)
        if self._trunk_frozen:
            self.trunk.train(False)
        if self._heads_frozen:
            self.heads.train(False)
        return self

    # ------------------------------------------------------------------ forward
    def _extract_trunk_features_only(self) -> bool:
        fe = cfg_get(self.model_config, "FEATURE_EVAL_SETTINGS", {}) or {}
        return bool(fe.get("EVAL_MODE_ON", False) and fe.get("EXTRACT_TRUNK_FEATURES_ONLY", False))

    def _run_trunk(
        self,
        batch: torch.Tensor,
        feature_names: list[str],
        extra: Mapping[str, Any] | None = None,
    ) -> list[torch.Tensor]:
        feats = (
            self.trunk(batch, feature_names or None, **extra)
            if extra
            else self.trunk(batch, feature_names or None)
        )
        if isinstance(feats, torch.Tensor):
            feats = [feats]
        return list(feats)

    def heads_forward(
        self, feats: Sequence[torch.Tensor], heads: nn.ModuleList | Sequence[nn.Module]
    ) -> list[torch.Tensor]:
        """Apply ``heads`` to the trunk features (see the module docstring)."""
        if len(heads) == 0:
            return list(feats)
        if len(feats) == len(heads):
            return [head(feat) for feat, head in zip(feats, heads)]
        if len(feats) == 1:
            if self._parallel_heads:
                return [head(feats[0]) for head in heads]
            out = feats[0]
            for head in heads:
                out = head(out)
            return [out]
        raise ConfigError(
            f"{_HEAD_KEY}: {len(heads)} heads cannot be applied to {len(feats)} trunk "
            "features; use one head per feature or a single trunk feature.",
            _HEAD_KEY,
        )

    def single_input_forward(
        self,
        batch: torch.Tensor,
        feature_names: list[str],
        heads: nn.ModuleList | Sequence[nn.Module],
    ) -> list[torch.Tensor]:
        """Trunk then heads on one input tensor."""
        feats = self._run_trunk(batch, feature_names)
        if self._extract_trunk_features_only():
            return feats
        return self.heads_forward(feats, heads)

    def multi_res_input_forward(
        self, batch: Sequence[torch.Tensor], feature_names: list[str]
    ) -> list[torch.Tensor]:
        """Run the trunk once per group of consecutive same-shape crops, concatenate the
        features along the batch dimension (input order), then run the heads."""
        if len(batch) == 0:
            raise ValueError("The model received an empty list of input tensors.")
        bounds: list[int] = []
        single_pass = bool(cfg_get(self.model_config, "SINGLE_PASS_EVERY_CROP", False))
        for i in range(1, len(batch) + 1):
            if i == len(batch) or single_pass or batch[i].shape[1:] != batch[i - 1].shape[1:]:
                bounds.append(i)
        per_feature: list[list[torch.Tensor]] = []
        start = 0
        for end in bounds:
            chunk = batch[start] if end - start == 1 else torch.cat(list(batch[start:end]))
            feats = self._run_trunk(chunk, feature_names)
            if not per_feature:
                per_feature = [[] for _ in feats]
            for store, feat in zip(per_feature, feats):
                store.append(feat)
            start = end
        all_feats = [f[0] if len(f) == 1 else torch.cat(f) for f in per_feature]
        if self._extract_trunk_features_only():
            return all_feats
        return self.heads_forward(all_feats, self.heads)

    def multi_input_with_head_mapping_forward(
        self, batch: Mapping[str, torch.Tensor]
    ) -> list[torch.Tensor]:
        """MULTI_INPUT_HEAD_MAPPING: for entry ``i`` = ``[key, features]``, the trunk on
        ``batch[key]`` (those features, and the entry's ``additional_keys`` of the batch that
        its ``forward`` takes as keyword arguments; missing ones are left out, as in VISSL),
        then head ``i`` (or the
        entry's ``head_index``; given the additional keys its ``forward`` takes); one output
        per entry."""
        if not isinstance(batch, Mapping):
            raise ConfigError(
                "config.MODEL.MULTI_INPUT_HEAD_MAPPING is set, so the model takes one input "
                "per mapped key, but the batch is a "
                f"{type(batch).__name__}: list the keys in config.DATA.<split>.INPUT_KEY_NAMES "
                "(e.g. [patches, images] with patch_and_image_collator).",
                "config.DATA.TRAIN.INPUT_KEY_NAMES",
            )
        outputs: list[torch.Tensor] = []
        for i, entry in enumerate(self.input_head_mapping):
            key, feature_names = entry.key, entry.feature_names
            if key not in batch:
                raise ConfigError(
                    f"config.MODEL.MULTI_INPUT_HEAD_MAPPING[{i}] maps input {key!r}, which "
                    f"the batch does not hold (inputs: {sorted(batch)}); the keys must be "
                    "among config.DATA.<split>.INPUT_KEY_NAMES.",
                    f"config.MODEL.MULTI_INPUT_HEAD_MAPPING[{i}]",
                )
            extra = {
                k: batch[entry.batch_key(k)]
                for k in entry.additional_keys
                if entry.batch_key(k) in batch
            }
            trunk_extra = {k: extra[k] for k in self._trunk_extra_keys[i] if k in extra}
            feats = self._run_trunk(batch[key], feature_names, trunk_extra)
            if self._extract_trunk_features_only():
                outputs.extend(feats)
                continue
            head = self.heads[self._head_of_entry[i]]
            head_kwargs = {k: extra[k] for k in self._head_extra_keys[i] if k in extra}
            if not head_kwargs:
                outputs.extend(self.heads_forward(feats, [head]))
            elif len(feats) == 1:
                outputs.append(head(feats[0], **head_kwargs))
            else:
                raise ConfigError(
                    f"config.MODEL.MULTI_INPUT_HEAD_MAPPING[{i}]: the head takes "
                    f"{sorted(head_kwargs)} besides the trunk feature, so map one feature "
                    f"to it, not {feature_names}.",
                    f"config.MODEL.MULTI_INPUT_HEAD_MAPPING[{i}]",
                )
        return outputs

    def forward(
        self, batch: torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
    ) -> list[torch.Tensor]:
        """Model outputs for a tensor batch, a list of (multi-crop) tensors, or (with
        MULTI_INPUT_HEAD_MAPPING) a dict of named inputs."""
        if self.input_head_mapping:
            return self.multi_input_with_head_mapping_forward(batch)  # type: ignore[arg-type]
        if isinstance(batch, torch.Tensor):
            return self.single_input_forward(batch, self._output_feature_names, self.heads)
        if isinstance(batch, Mapping):
            raise ConfigError(
                f"the model received named inputs {sorted(batch)} (several "
                "config.DATA.<split>.INPUT_KEY_NAMES) but config.MODEL.MULTI_INPUT_HEAD_MAPPING "
                "is empty: map each input key to its trunk features and head, e.g. "
                '[["patches", ["flatten"]], ["images", ["flatten"]]].',
                _MAPPING_KEY,
            )
        return self.multi_res_input_forward(batch, self._output_feature_names)

    def get_features(self, batch: torch.Tensor) -> list[torch.Tensor]:
        """The trunk features only (no heads)."""
        return self._run_trunk(batch, self._output_feature_names)

    # ------------------------------------------------------------------ state
    def get_classy_state(self, deep_copy: bool = False) -> dict[str, Any]:
        """VISSL's model state: ``{"model": {"trunk": sd, "heads": sd}, "meta": {...}}``."""
        state: dict[str, Any] = {
            "model": {"trunk": self.trunk.state_dict(), "heads": self.heads.state_dict()},
            "meta": {"trunk": {}, "heads": []},
        }
        return copy.deepcopy(state) if deep_copy else state

    def set_classy_state(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Load a state from :meth:`get_classy_state` (heads may be partial, as in VISSL)."""
        self.trunk.load_state_dict(state["model"]["trunk"], strict=strict)
        self.heads.load_state_dict(state["model"]["heads"], strict=False)

    def is_clustering_model(self) -> bool:
        """True for a single head containing SwAV prototypes (``swav_head``), if registered."""
        if "swav_head" not in MODEL_HEADS_REGISTRY or len(self.heads) != 1:
            return False
        swav_cls = MODEL_HEADS_REGISTRY.get("swav_head")
        return isinstance(swav_cls, type) and any(
            isinstance(m, swav_cls) for m in self.heads[0].modules()
        )

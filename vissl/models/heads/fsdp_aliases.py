"""VISSL's ``*_fsdp`` head names, registered as aliases of the heads they wrapped.

VISSL had FSDP-specific copies of its heads (``mlp_fsdp``, ``eval_mlp_fsdp``,
``swav_head_fsdp``, ``dino_head_fsdp``) because fairscale's FSDP had to wrap their layers
itself. Here sharding is applied from outside by ``TRAINER.TASK_NAME:
self_supervision_fsdp_task`` (:mod:`vissl.trainer.fsdp`), so each name builds the plain
head with the same parameters and the same state-dict keys.
"""

from __future__ import annotations

import importlib

from vissl.models.heads import MODEL_HEADS_REGISTRY, register_model_head

#: VISSL's FSDP head name -> the head it builds here.
FSDP_HEAD_ALIASES = {
    "mlp_fsdp": "mlp",
    "eval_mlp_fsdp": "eval_mlp",
    "swav_head_fsdp": "swav_head",
    "dino_head_fsdp": "dino_head",
}

# (the heads' own modules first: submodules are imported in alphabetical order)
for _module in ("mlp", "linear_eval_mlp", "swav_head", "dino_head"):
    importlib.import_module(f"vissl.models.heads.{_module}")
for _alias, _name in FSDP_HEAD_ALIASES.items():
    register_model_head(_alias)(MODEL_HEADS_REGISTRY.get(_name))

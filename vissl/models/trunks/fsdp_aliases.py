"""VISSL's ``*_fsdp`` trunk names, registered as aliases of the trunks they wrapped.

Sharding comes from ``TRAINER.TASK_NAME: self_supervision_fsdp_task``
(:mod:`vissl.trainer.fsdp`), not from the trunk: ``vision_transformer_fsdp`` and
``xcit_fsdp`` build the plain trunks, reading the same config sections
(``MODEL.TRUNK.VISION_TRANSFORMERS``, ``MODEL.TRUNK.XCIT``). ``regnet_fsdp`` is
registered in :mod:`vissl.models.trunks.regnet`.
"""

from __future__ import annotations

import importlib

from vissl.models.trunks import MODEL_TRUNKS_REGISTRY, register_model_trunk

#: VISSL's FSDP trunk name -> the trunk it builds here.
FSDP_TRUNK_ALIASES = {
    "vision_transformer_fsdp": "vision_transformer",
    "xcit_fsdp": "xcit",
}

# (the trunks' own modules first: submodules are imported in alphabetical order)
for _module in ("vision_transformer", "xcit"):
    importlib.import_module(f"vissl.models.trunks.{_module}")
for _alias, _name in FSDP_TRUNK_ALIASES.items():
    register_model_trunk(_alias)(MODEL_TRUNKS_REGISTRY.get(_name))

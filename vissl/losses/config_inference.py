"""What losses infer from the rest of the config (VISSL's config inference).

Shared by the losses' ``infer_config`` classmethods: the output width of the head, the
kwargs of a named head in ``MODEL.HEAD.PARAMS`` and the number of crops the transforms
make per sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def head_output_dim(config: Mapping[str, Any]) -> int | None:
    """The last ``dims`` entry of the last head module in MODEL.HEAD.PARAMS, if any."""
    params = (config.get("MODEL") or {}).get("HEAD", {}).get("PARAMS") or []
    stack = list(params)
    while stack:  # the last module spec with dims, in any of the PARAMS forms
        item = stack.pop()
        if isinstance(item, Sequence) and not isinstance(item, str):
            if len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], Mapping):
                dims = item[1].get("dims")
                if dims:
                    return int(list(dims)[-1])
            else:
                stack.extend(item)
    return None


def find_head_params(head_params: Any, head_name: str) -> Mapping[str, Any] | None:
    """The kwargs of the first ``head_name`` head in MODEL.HEAD.PARAMS, any of its forms."""
    if not isinstance(head_params, Sequence) or isinstance(head_params, str):
        return None
    if len(head_params) >= 1 and isinstance(head_params[0], str):
        if head_params[0] == head_name:
            kwargs = head_params[1] if len(head_params) > 1 else {}
            return kwargs if isinstance(kwargs, Mapping) else {}
        return None
    for item in head_params:
        found = find_head_params(item, head_name)
        if found is not None:
            return found
    return None


def transform_num_crops(transforms: Sequence[Any]) -> int | None:
    """Crops per sample made by the ImgPilToMultiCrop / ImgReplicatePil transform, if any."""
    for t in transforms or []:
        name = t.get("name") if isinstance(t, Mapping) else None
        if name == "ImgPilToMultiCrop":
            return int(t["total_num_crops"])
        if name == "ImgReplicatePil":
            return int(t.get("num_times", 2))
    return None

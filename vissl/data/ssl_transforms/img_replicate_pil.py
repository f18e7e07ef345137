"""``ImgReplicatePil``: K copies of an image (SimCLR/MoCo-style views)."""

from __future__ import annotations

from typing import Any, ClassVar

from vissl.data.ssl_transforms import register_transform
from vissl.data.ssl_transforms.tensor_path import TensorReplicate


@register_transform("ImgReplicatePil")
class ImgReplicatePil:
    """Return ``num_times`` copies of the input image.

    A "copies" transform: the sample's ``data`` list grows K-fold and its labels are
    repeated. Use ``simclr_collator`` to batch the copies.

    Args:
        num_times: number of copies (> 0).
    """

    ssl_transform_kind: ClassVar[str] = "copies"

    def __init__(self, num_times: int = 2) -> None:
        if isinstance(num_times, bool) or not isinstance(num_times, int) or num_times <= 0:
            raise ValueError(f"num_times must be a positive integer, got {num_times!r}")
        self.num_times = num_times

    def __call__(self, image: Any) -> list[Any]:
        copy = getattr(image, "copy", None) or image.clone
        return [copy() for _ in range(self.num_times)]

    def tensor_transform(self) -> TensorReplicate:
        """References instead of copies on the tensor path (see :mod:`.tensor_path`)."""
        return TensorReplicate(self.num_times)

    def __repr__(self) -> str:
        return f"ImgReplicatePil(num_times={self.num_times})"

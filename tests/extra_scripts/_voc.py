"""A fake PASCAL VOC year folder in the published VOCdevkit layout (no download)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

#: VOC's 20 classes (alphabetical, the label column order).
CLASSES = (
    "aeroplane bicycle bird boat bottle bus car cat chair cow diningtable dog horse "
    "motorbike person pottedplant sheep sofa train tvmonitor"
).split()


def make_fake_voc(
    root: Path, splits: dict[str, int], seed: int = 0, size: int = 16
) -> dict[str, dict[str, np.ndarray]]:
    """Write ``root/{JPEGImages,Annotations,ImageSets/Main}`` and return the expected
    ``{split: {image id: row}}`` (1: a non-difficult object, -1: only difficult ones, 0: none).

    Each image holds 1 to 3 objects; its pixels are the mean of fixed per-class colour
    patterns of its classes plus noise, so a classifier can learn the classes. VOC2007's
    ``trainval`` is written as well when ``train`` and ``val`` are given.
    """
    rng = np.random.default_rng(seed)
    patterns = rng.uniform(0, 255, size=(len(CLASSES), size, size, 3))
    main = root / "ImageSets" / "Main"
    for folder in (root / "JPEGImages", root / "Annotations", main):
        folder.mkdir(parents=True, exist_ok=True)
    expected: dict[str, dict[str, np.ndarray]] = {}
    next_id = 1
    for split, count in splits.items():
        rows = {}
        for _ in range(count):
            image_id = f"{next_id:06d}"
            next_id += 1
            classes = rng.choice(len(CLASSES), size=rng.integers(1, 4), replace=False)
            objects = [(int(c), bool(rng.random() < 0.25)) for c in classes]
            if rng.random() < 0.3:  # a second object of the first class, maybe not difficult
                objects.append((objects[0][0], bool(rng.random() < 0.5)))
            row = np.zeros(len(CLASSES), dtype=np.int32)
            for c, difficult in objects:
                if not difficult:
                    row[c] = 1
                elif row[c] != 1:
                    row[c] = -1
            rows[image_id] = row
            pixels = patterns[[c for c, _ in objects]].mean(0) + rng.normal(0, 8, (size, size, 3))
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
                root / "JPEGImages" / f"{image_id}.jpg", quality=95
            )
            xml_objects = "".join(
                f"<object><name>{CLASSES[c]}</name><pose>Unspecified</pose>"
                f"<truncated>0</truncated><difficult>{int(d)}</difficult>"
                "<bndbox><xmin>1</xmin><ymin>1</ymin><xmax>8</xmax><ymax>8</ymax></bndbox>"
                "</object>"
                for c, d in objects
            )
            (root / "Annotations" / f"{image_id}.xml").write_text(
                f"<annotation><folder>VOC2007</folder><filename>{image_id}.jpg</filename>"
                f"<size><width>{size}</width><height>{size}</height><depth>3</depth></size>"
                f"{xml_objects}</annotation>"
            )
        expected[split] = rows
    if "train" in expected and "val" in expected:
        expected["trainval"] = {**expected["train"], **expected["val"]}
    to_voc = {1: "1", 0: "-1", -1: "0"}  # VOC's files: 1 present, -1 absent, 0 difficult
    for split, rows in expected.items():
        ids = sorted(rows)
        (main / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))
        for c, cls in enumerate(CLASSES):
            lines = "".join(f"{i} {to_voc[int(rows[i][c])]:>2}\n" for i in ids)
            (main / f"{cls}_{split}.txt").write_text(lines)
    return expected

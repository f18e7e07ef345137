"""extra_scripts/datasets/create_*: each data set's published layout, faked small here, ->
VISSL's disk_folder / disk_filelist inputs with the right splits and labels.

Every case writes the published layout (file names, list files, annotation formats) of
its data set under tmp_path, runs the script as the command line does (in this process),
and compares what was written with what the layout says, worked out by hand in the case.
No download ever. Two outputs are then read back through vissl's data sources.
"""

from __future__ import annotations

import csv
import json
import math
import os
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.io
from PIL import Image

from tests.extra_scripts._helpers import EXTRA_SCRIPTS, assert_one_line_error, run_as_main
from vissl.config.attr_dict import AttrDict
from vissl.data import build_dataset
from vissl.data.dataset_catalog import VisslDatasetCatalog
from vissl.utils.hydra_config import hydra_compose_and_validate

DATASETS = os.path.join(EXTRA_SCRIPTS, "datasets")


def image(path: Path, value: int = 0, size: int = 4) -> Path:
    """A tiny image at ``path`` (format from the extension; none: JPEG, as Caltech's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.full((size, size, 3), value % 256, dtype=np.uint8)
    fmt = None if path.suffix else "JPEG"
    Image.fromarray(pixels).save(path, format=fmt)
    return path


def lines(path: Path, *rows: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{r}\n" for r in rows))
    return path


@dataclass
class Case:
    """One script on one fake layout.

    ``folders``: for a folder output, ``{split: {class: sorted file names}}``; ``filelist``:
    for a filelist output, ``{split: [(file name, label), ...]}`` in the written order
    (labels are class names when ``classes`` is given, else integers or rows).
    """

    script: str
    build: Callable[[Path], list[str]]
    folders: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    filelist: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)
    classes: list[str] | None = None
    needs: str = ""


# ----------------------------------------------------------------------------- layouts
def caltech(root: Path) -> list[str]:
    base = root / "101_ObjectCategories"
    for c in ("accordion", "BACKGROUND_Google"):
        for i in range(3):
            image(base / c / (f"image_{i:04d}.jpg" if i < 2 else f"image_{i:04d}"), i)
    return ["--num_train", "2"]


def clevr_scene(name: str, depths: list[float]) -> dict[str, Any]:
    return {"image_filename": name, "objects": [{"pixel_coords": [1, 2, d]} for d in depths]}


def clevr(root: Path) -> list[str]:
    base = root / "CLEVR_v1.0"
    scenes = {
        "train": [[9.2, 12.0, 15.0], [7.0, 11.0, 13.0], [10.0, 10.5, 11.0, 12.0]],
        "val": [[8.5, 9.0, 9.1], [5.0, 6.0, 7.0, 8.0, 9.0]],
    }
    for split, depth_lists in scenes.items():
        entries = []
        for i, depths in enumerate(depth_lists):
            name = f"CLEVR_{split}_{i:06d}.png"
            image(base / "images" / split / name, i)
            entries.append(clevr_scene(name, depths))
        path = base / "scenes" / f"CLEVR_{split}_scenes.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"info": {}, "scenes": entries}))
    return []


def coco(root: Path) -> list[str]:
    categories = [{"id": i, "name": n} for i, n in ((1, "person"), (3, "car"), (7, "train"))]

    def box(x: float, y: float, w: float, h: float) -> list[float]:
        return [x, y, w, h]

    files = {
        "train": (
            [(11, "COCO_train2014_000000000011.jpg"), (12, "COCO_train2014_000000000012.jpg")],
            [
                (11, 3, box(1, 1, 5, 5), 20.0, 0),  # valid: car
                (11, 7, box(1, 1, 5, 5), 20.0, 1),  # ignored
                (12, 1, box(0, 0, 4, 4), 0.0, 0),  # no area
                (12, 7, box(2, 2, 1, 6), 6.0, 0),  # one pixel wide: x2 == x1
                (12, 1, box(30, 2, 8, 8), 9.0, 0),  # clipped to the 20-wide image: x1 == x2
            ],
        ),
        "val": (
            [(21, "COCO_val2014_000000000021.jpg"), (20, "COCO_val2014_000000000020.jpg")],
            [(21, 7, box(0, 0, 3, 3), 9.0, 0), (21, 1, box(2, 2, 3, 3), 9.0, 0)],
        ),
    }
    for split, (images, objects) in files.items():
        for _, name in images:
            image(root / f"{split}2014" / name)
        data = {
            "categories": categories,
            "images": [{"id": i, "file_name": n, "width": 20, "height": 10} for i, n in images],
            "annotations": [
                {"image_id": i, "category_id": c, "bbox": b, "area": a, "ignore": g, "id": k}
                for k, (i, c, b, a, g) in enumerate(objects)
            ],
        }
        path = root / "annotations" / f"instances_{split}2014.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    return []


def dsprites(root: Path) -> list[str]:
    # latents: color, shape, scale, orientation, x, y
    latents = np.zeros((5, 6))
    latents[:, 3] = [0.0, math.pi, 2 * math.pi, 0.5, 6.0]
    latents[:, 4] = [0.0, 0.5, 1.0, 0.2, 0.9]
    imgs = np.zeros((5, 8, 8), dtype=np.uint8)
    for i in range(5):
        imgs[i, i, :] = 1
    path = root / "dsprites-dataset-master" / "dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz"
    path.parent.mkdir(parents=True)
    np.savez(path, imgs=imgs, latents_values=latents)
    return ["--train_fraction", "0.6"]


def dtd(root: Path) -> list[str]:
    base = root / "dtd"
    for c in ("banded", "woven"):
        for i in range(3):
            image(base / "images" / c / f"{c}_{i:04d}.jpg", i)
    lines(base / "labels" / "train1.txt", "banded/banded_0000.jpg", "woven/woven_0000.jpg")
    lines(base / "labels" / "val1.txt", "banded/banded_0001.jpg")
    lines(base / "labels" / "test1.txt", "banded/banded_0002.jpg", "woven/woven_0002.jpg")
    lines(base / "labels" / "train2.txt", "woven/woven_0001.jpg")
    return []


def euro_sat(root: Path) -> list[str]:
    for c in ("Forest", "River"):
        for i in (1, 2, 3, 10):
            image(root / "2750" / c / f"{c}_{i}.jpg", i)
    return ["--train_per_class", "2", "--val_per_class", "1"]


def aircraft(root: Path) -> list[str]:
    data = root / "fgvc-aircraft-2013b" / "data"
    for i in range(1, 6):
        image(data / "images" / f"{i:07d}.jpg", i)
    lines(data / "variants.txt", "Boeing 707", "F-16A/B")
    lines(data / "images_variant_train.txt", "0000001 Boeing 707", "0000002 F-16A/B")
    lines(data / "images_variant_val.txt", "0000003 F-16A/B")
    lines(
        data / "images_variant_trainval.txt",
        "0000001 Boeing 707",
        "0000002 F-16A/B",
        "0000003 F-16A/B",
    )
    lines(data / "images_variant_test.txt", "0000004 Boeing 707", "0000005 F-16A/B")
    return []


def food101(root: Path) -> list[str]:
    base = root / "food-101"
    for c in ("apple_pie", "ramen"):
        for i in range(2):
            image(base / "images" / c / f"{100 + i}.jpg", i)
    lines(base / "meta" / "classes.txt", "apple_pie", "ramen")
    lines(base / "meta" / "train.txt", "apple_pie/100", "ramen/100", "ramen/101")
    lines(base / "meta" / "test.txt", "apple_pie/101")
    return []


def gtsrb(root: Path) -> list[str]:
    train = root / "GTSRB" / "Training"
    image(train / "00000" / "00000_00000.ppm", 1)
    image(train / "00000" / "00000_00001.ppm", 2)
    image(train / "00002" / "00000_00000.ppm", 3)
    lines(train / "00000" / "GT-00000.csv", "Filename;ClassId")
    test = root / "GTSRB" / "Final_Test" / "Images"
    image(test / "00000.ppm", 4)
    image(test / "00001.ppm", 5)
    lines(
        root / "GT-final_test.csv",
        "Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId",
        "00000.ppm;4;4;0;0;3;3;2",
        "00001.ppm;4;4;0;0;3;3;0",
    )
    return []


def imagenet(root: Path) -> list[str]:
    image(root / "train" / "n01" / "n01_1.JPEG")
    image(root / "train" / "n01" / "n01_2.JPEG")
    image(root / "train" / "n02" / "n02_1.JPEG")
    image(root / "val" / "n02" / "val_1.JPEG")
    return ["--generate_json", "1"]


def imagenet_variant(folder: str) -> Callable[[Path], list[str]]:
    def build(root: Path) -> list[str]:
        image(root / folder / "n02" / "a b.jpg")  # ImageNet-A has spaces in names
        image(root / folder / "n03" / "c.jpg")
        classes = lines(root / "imagenet_classes.txt", "n03", "n01", "n02", "n04")
        return ["--imagenet_classes", str(classes)]

    return build


def imagenet_subset(root: Path) -> list[str]:
    imagenet(root)
    subset = lines(root / "1percent.txt", "n01_2.JPEG", "n02_1.JPEG")
    return ["--subset_file", str(subset)]


def inaturalist(root: Path) -> list[str]:
    names = {
        "train": ["train_val2018/Plantae/12/a.jpg", "train_val2018/Aves/3/b.jpg"],
        "val": ["train_val2018/Aves/3/c.jpg"],
    }
    for split, files in names.items():
        for name in files:
            image(root / name)
        (root / f"{split}2018.json").write_text(
            json.dumps({"images": [{"id": i, "file_name": n} for i, n in enumerate(files)]})
        )
    return []


def iwildcam(root: Path) -> list[str]:
    rows = [
        ("train", "a.jpg", 5),
        ("val", "b.jpg", 2),
        ("train", "c.jpg", 0),
        ("id_test", "d.jpg", 5),
    ]
    for _, name, _ in rows:
        image(root / "train" / name)
    with open(root / "metadata.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["", "split", "location_remapped", "filename", "y"])
        for i, (split, name, y) in enumerate(rows):
            writer.writerow([i, split, 7, name, y])
    return ["--val_split", "id_test"]


def kitti(root: Path) -> list[str]:
    objects = {
        "000000": ["Car 0.00 0 -1.5 10 10 50 50 1.5 1.6 3.9 1.0 1.5 5.0 0.1"],
        "000001": ["Pedestrian 0.00 0 -1.5 10 10 50 50 1.5 1.6 3.9 1.0 1.5 3.0 0.1"],
        "000002": [
            "Van 0.00 0 -1.5 10 10 50 50 1.5 1.6 3.9 1.0 1.5 15.0 0.1",
            "Truck 0.00 0 -1.5 10 10 50 50 1.5 1.6 3.9 1.0 1.5 45.0 0.1",
        ],
        "000003": ["Truck 0.00 0 -1.5 10 10 50 50 1.5 1.6 3.9 1.0 1.5 30.0 0.1", "DontCare -1"],
    }
    for name, rows in objects.items():
        image(root / "training" / "image_2" / f"{name}.png")
        lines(root / "training" / "label_2" / f"{name}.txt", *rows)
    return ["--train_fraction", "0.5"]


def flowers(root: Path) -> list[str]:
    for i in range(1, 6):
        image(root / "jpg" / f"image_{i:05d}.jpg", i)
    scipy.io.savemat(root / "imagelabels.mat", {"labels": np.array([[1, 12, 1, 12, 2]])})
    scipy.io.savemat(
        root / "setid.mat",
        {"trnid": np.array([[1]]), "valid": np.array([[2]]), "tstid": np.array([[3, 4, 5]])},
    )
    return []


def pets(root: Path) -> list[str]:
    for name in ("Abyssinian_1", "Abyssinian_2", "great_pyrenees_10"):
        image(root / "images" / f"{name}.jpg")
    lines(root / "annotations" / "trainval.txt", "Abyssinian_1 1 1 1", "great_pyrenees_10 22 2 11")
    lines(root / "annotations" / "test.txt", "Abyssinian_2 1 1 1")
    return []


def norb_matrix(path: Path, magic: int, array: np.ndarray, dtype: str) -> None:
    """NORB's binary format: int32 LE magic, ndim, max(3, ndim) dims, then the data."""
    dims = list(array.shape) + [1] * max(0, 3 - array.ndim)
    path.write_bytes(
        struct.pack(f"<{2 + len(dims)}i", magic, array.ndim, *dims) + array.astype(dtype).tobytes()
    )


def small_norb(root: Path) -> list[str]:
    stems = {
        "training": ("smallnorb-5x46789x9x18x6x2x96x96-training", [[0, 0, 0, 4], [0, 8, 17, 4]]),
        "testing": ("smallnorb-5x01235x9x18x6x2x96x96-testing", [[1, 2, 2, 0]]),
    }
    root.mkdir(parents=True, exist_ok=True)
    for stem, info in stems.values():
        n = len(info)
        pairs = np.zeros((n, 2, 6, 6), dtype=np.uint8)
        pairs[:, 0] = 50
        pairs[:, 1] = 200
        norb_matrix(root / f"{stem}-dat.mat", 0x1E3D4C55, pairs, "<u1")
        norb_matrix(root / f"{stem}-info.mat", 0x1E3D4C54, np.array(info), "<i4")
    return []


def stanford_cars(root: Path) -> list[str]:
    names = np.empty((1, 2), dtype=object)
    names[0, 0], names[0, 1] = "AM General Hummer SUV 2000", "Audi S4 Sedan 2007/2008"
    (root / "devkit").mkdir(parents=True)
    scipy.io.savemat(root / "devkit" / "cars_meta.mat", {"class_names": names})
    fields = [("bbox_x1", "O"), ("bbox_y1", "O"), ("bbox_x2", "O"), ("bbox_y2", "O")]
    fields += [("class", "O"), ("fname", "O")]
    for split, rows, rel in (
        ("train", [(2, "00001.jpg"), (1, "00002.jpg")], "devkit/cars_train_annos.mat"),
        ("test", [(2, "00001.jpg")], "cars_test_annos_withlabels.mat"),
    ):
        annotations = np.zeros((1, len(rows)), dtype=fields)
        for k, (target, name) in enumerate(rows):
            annotations[0, k] = (1, 2, 3, 4, np.array([[target]], dtype=np.uint8), name)
            image(root / f"cars_{split}" / name, k)
        scipy.io.savemat(root / rel, {"annotations": annotations})
    return []


def sun397(root: Path) -> list[str]:
    base = root / "SUN397"
    lines(base / "ClassName.txt", "/a/abbey", "/b/bakery/shop")
    for folder in ("a/abbey", "b/bakery/shop"):
        for i in range(10):
            image(base / folder / f"sun_{i:02d}.jpg", i)
    return []


def resisc45(root: Path) -> list[str]:
    for c in ("airport", "beach"):
        for i in range(5):
            image(root / "NWPU-RESISC45" / c / f"{c}_{i:03d}.jpg", i)
    return []


def places205(root: Path) -> list[str]:
    images = root / "data" / "vision" / "torralba" / "deeplearning" / "images256"
    for rel in ("a/abbey/gsun_1.jpg", "a/abbey/gsun_2.jpg", "b/baseball_field/gsun_3.jpg"):
        image(images / rel)
    split = root / "trainvalsplit_places205"
    lines(split / "train_places205.csv", "a/abbey/gsun_1.jpg 0", "b/baseball_field/gsun_3.jpg 1")
    lines(split / "val_places205.csv", "a/abbey/gsun_2.jpg 0")
    return []


def places365(root: Path) -> list[str]:
    image(root / "data_256" / "a" / "airfield" / "00000001.jpg")
    image(root / "data_256" / "b" / "bakery" / "shop" / "00000001.jpg")
    image(root / "val_256" / "Places365_val_00000001.jpg")
    lists = root / "filelist_places365-standard"
    lines(lists / "categories_places365.txt", "/a/airfield 0", "/b/bakery/shop 1")
    lines(
        lists / "places365_train_standard.txt",
        "/a/airfield/00000001.jpg 0",
        "/b/bakery/shop/00000001.jpg 1",
    )
    lines(lists / "places365_val.txt", "Places365_val_00000001.jpg 1")
    return []


def pcam(root: Path) -> list[str]:
    h5py = pytest.importorskip("h5py")
    root.mkdir(parents=True, exist_ok=True)
    for split, labels in (("train", [1, 0, 1]), ("valid", [0])):
        stem = f"camelyonpatch_level_2_split_{split}"
        with h5py.File(root / f"{stem}_x.h5", "w") as f:
            f["x"] = np.full((len(labels), 4, 4, 3), 9, dtype=np.uint8)
        with h5py.File(root / f"{stem}_y.h5", "w") as f:
            f["y"] = np.array(labels, dtype=np.uint8).reshape(-1, 1, 1, 1)
    return []


def ucf101(root: Path) -> list[str]:
    for c, n in (("ApplyEyeMakeup", 2), ("Archery", 1)):
        for g in range(n):
            fake_video(root / "UCF-101" / c / f"v_{c}_g0{g + 1}_c01.avi", 10 + g)
    lines(
        root / "ucfTrainTestlist" / "trainlist01.txt",
        "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi 1",
        "Archery/v_Archery_g01_c01.avi 2",
    )
    lines(
        root / "ucfTrainTestlist" / "testlist01.txt", "ApplyEyeMakeup/v_ApplyEyeMakeup_g02_c01.avi"
    )
    return []


def k700(root: Path) -> list[str]:
    fake_video(root / "train" / "abseiling" / "abc_000001_000011.mp4", 3)
    fake_video(root / "train" / "passing American football (in game)" / "x_1_2.mp4", 4)
    fake_video(root / "train" / "abseiling" / "broken_0_1.mp4", 0)  # no video stream
    fake_video(root / "val" / "abseiling" / "v_0_1.mp4", 5)
    return []


# ----------------------------------------------------------------------------- videos
def fake_video(path: Path, frames: int) -> None:
    """A stand-in clip: its frame count in the file (0: no video stream)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(frames))


def fake_middle_frame(path: str) -> Image.Image | None:
    """The test's decoder for :func:`fake_video` clips: an image whose value is the middle
    frame's index (frames // 2), None without frames."""
    frames = int(Path(path).read_text())
    if frames == 0:
        return None
    return Image.fromarray(np.full((4, 4, 3), frames // 2, dtype=np.uint8))


@pytest.fixture
def fake_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    if DATASETS not in sys.path:
        monkeypatch.syspath_prepend(DATASETS)
    import _video

    monkeypatch.setattr(_video, "middle_frame", fake_middle_frame)


# ----------------------------------------------------------------------------- cases
CASES = {
    "caltech101": Case(
        "create_caltech101_data_files",
        caltech,
        folders={
            "train": {"BACKGROUND_Google": ["*2"], "accordion": ["*2"]},
            "test": {"BACKGROUND_Google": ["*1"], "accordion": ["*1"]},
        },
    ),
    "clevr_count": Case(
        "create_clevr_count_data_files",
        clevr,
        classes=["count_3", "count_4"],
        filelist={
            "train": [
                ("CLEVR_train_000000.png", "count_3"),
                ("CLEVR_train_000001.png", "count_3"),
                ("CLEVR_train_000002.png", "count_4"),
            ],
            "val": [("CLEVR_val_000000.png", "count_3")],  # count_5 is not in train
        },
    ),
    "clevr_dist": Case(
        "create_clevr_dist_data_files",
        clevr,
        classes=["below_10.0", "below_8.0", "below_8.5", "below_9.5"],
        filelist={
            "train": [
                ("CLEVR_train_000000.png", "below_9.5"),
                ("CLEVR_train_000001.png", "below_8.0"),
                ("CLEVR_train_000002.png", "below_10.0"),
            ],
            "val": [("CLEVR_val_000000.png", "below_8.5"), ("CLEVR_val_000001.png", "below_8.0")],
        },
    ),
    "coco": Case(
        "create_coco_data_files",
        coco,
        filelist={
            "train": [
                ("COCO_train2014_000000000011.jpg", [0, 1, 0]),
                ("COCO_train2014_000000000012.jpg", [0, 0, 0]),
            ],
            "val": [
                ("COCO_val2014_000000000020.jpg", [0, 0, 0]),
                ("COCO_val2014_000000000021.jpg", [1, 0, 1]),
            ],
        },
    ),
    # x in [0, 1] -> floor(x * 31 * 16 / 32); orientation -> floor(o / 2 pi * 16), <= 15
    "dsprites_location": Case(
        "create_dsprites_location_data_files",
        dsprites,
        folders={
            "*": {
                "bin_0": ["image_0.png"],
                "bin_7": ["image_1.png"],
                "bin_15": ["image_2.png"],
                "bin_3": ["image_3.png"],
                "bin_13": ["image_4.png"],
            }
        },
    ),
    "dsprites_orientation": Case(
        "create_dsprites_orientation_data_files",
        dsprites,
        folders={
            "*": {
                "bin_0": ["image_0.png"],
                "bin_8": ["image_1.png"],
                "bin_15": ["image_2.png", "image_4.png"],
                "bin_1": ["image_3.png"],
            }
        },
    ),
    "dtd": Case(
        "create_dtd_data_files",
        dtd,
        folders={
            "train": {"banded": ["banded_0000.jpg"], "woven": ["woven_0000.jpg"]},
            "val": {"banded": ["banded_0001.jpg"]},
            "test": {"banded": ["banded_0002.jpg"], "woven": ["woven_0002.jpg"]},
            "trainval": {
                "banded": ["banded_0000.jpg", "banded_0001.jpg"],
                "woven": ["woven_0000.jpg"],
            },
        },
    ),
    "euro_sat": Case(
        "create_euro_sat_data_files",
        euro_sat,
        folders={  # sorted by name: _1, _10, _2, _3
            "train": {
                "Forest": ["Forest_1.jpg", "Forest_10.jpg"],
                "River": ["River_1.jpg", "River_10.jpg"],
            },
            "val": {"Forest": ["Forest_2.jpg"], "River": ["River_2.jpg"]},
        },
    ),
    "fgvc_aircraft": Case(
        "create_fgvc_aircraft_data_files",
        aircraft,
        folders={
            "train": {"Boeing-707": ["0000001.jpg"], "F-16A-B": ["0000002.jpg"]},
            "val": {"F-16A-B": ["0000003.jpg"]},
            "trainval": {"Boeing-707": ["0000001.jpg"], "F-16A-B": ["0000002.jpg", "0000003.jpg"]},
            "test": {"Boeing-707": ["0000004.jpg"], "F-16A-B": ["0000005.jpg"]},
        },
    ),
    "food101": Case(
        "create_food101_data_files",
        food101,
        folders={
            "train": {"apple_pie": ["100.jpg"], "ramen": ["100.jpg", "101.jpg"]},
            "test": {"apple_pie": ["101.jpg"]},
        },
    ),
    "gtsrb": Case(
        "create_gtsrb_data_files",
        gtsrb,
        folders={
            "train": {
                "00000": ["00000_00000.ppm", "00000_00001.ppm"],
                "00002": ["00000_00000.ppm"],
            },
            "test": {"00000": ["00001.ppm"], "00002": ["00000.ppm"]},
        },
    ),
    "imagenet": Case(
        "create_imagenet_data_files",
        imagenet,
        classes=["n01", "n02"],
        filelist={
            "train": [("n01_1.JPEG", "n01"), ("n01_2.JPEG", "n01"), ("n02_1.JPEG", "n02")],
            "val": [("val_1.JPEG", "n02")],  # val has no n01: n02 stays label 1
        },
    ),
    **{
        f"imagenet_{kind}": Case(
            f"create_imagenet_{kind}_data_files",
            imagenet_variant(folder),
            filelist={"test": [("a b.jpg", 1), ("c.jpg", 2)]},  # n01 n02 n03 n04
        )
        for kind, folder in (
            ("a", "imagenet-a"),
            ("r", "imagenet-r"),
            ("sketch", "imagenet_sketch"),
        )
    },
    "imagenet_subset": Case(
        "create_imagenet_subset_data_files",
        imagenet_subset,
        filelist={"train": [("n01_2.JPEG", 0), ("n02_1.JPEG", 1)]},
    ),
    "inaturalist2018": Case(
        "create_inaturalist2018_data_files",
        inaturalist,
        filelist={"train": [("a.jpg", 12), ("b.jpg", 3)], "val": [("c.jpg", 3)]},
    ),
    "iwilds_cam": Case(
        "create_iwilds_cam_data_files",
        iwildcam,
        filelist={
            "id_test": [("d.jpg", 5)],
            "train": [("a.jpg", 5), ("c.jpg", 0)],
            "val": [("b.jpg", 2)],
        },
    ),
    "kitti_dist": Case(
        "create_kitti_dist_data_files",
        kitti,
        folders={
            "*": {
                "below_8": ["000000.png"],
                "no_vehicle": ["000001.png"],
                "below_20": ["000002.png"],
                "above_20": ["000003.png"],
            }
        },
    ),
    "oxford_flowers": Case(
        "create_oxford_flowers_data_files",
        flowers,
        folders={
            "train": {"001": ["image_00001.jpg"], "012": ["image_00002.jpg"]},
            "test": {
                "001": ["image_00003.jpg"],
                "012": ["image_00004.jpg"],
                "002": ["image_00005.jpg"],
            },
        },
    ),
    "oxford_pets": Case(
        "create_oxford_pets_data_files",
        pets,
        folders={
            "train": {
                "Abyssinian": ["Abyssinian_1.jpg"],
                "great_pyrenees": ["great_pyrenees_10.jpg"],
            },
            "test": {"Abyssinian": ["Abyssinian_2.jpg"]},
        },
    ),
    "patch_camelyon": Case(
        "create_patch_camelyon_data_files",
        pcam,
        folders={
            "train": {"tumor": ["img_0.png", "img_2.png"], "no_tumor": ["img_1.png"]},
            "val": {"no_tumor": ["img_0.png"]},
        },
    ),
    # info rows: instance, elevation index, azimuth (x 10 degrees), lighting
    "small_norb_azimuth": Case(
        "create_small_norb_azimuth_data_files",
        small_norb,
        folders={
            "train": {"0": ["image_0.png"], "170": ["image_1.png"]},
            "test": {"20": ["image_0.png"]},
        },
    ),
    "small_norb_elevation": Case(
        "create_small_norb_elevation_data_files",
        small_norb,
        folders={
            "train": {"30": ["image_0.png"], "70": ["image_1.png"]},
            "test": {"40": ["image_0.png"]},
        },
    ),
    "stanford_cars": Case(
        "create_stanford_cars_data_files",
        stanford_cars,
        folders={
            "train": {
                "000_AM_General_Hummer_SUV_2000": ["00002.jpg"],
                "001_Audi_S4_Sedan_2007_2008": ["00001.jpg"],
            },
            "test": {"001_Audi_S4_Sedan_2007_2008": ["00001.jpg"]},
        },
    ),
    "sun397": Case(
        "create_sun397_data_files",
        sun397,
        filelist={
            "train": [("*", 0)] * 7 + [("*", 1)] * 7,
            "val": [("*", 0), ("*", 1)],
            "test": [("*", 0)] * 2 + [("*", 1)] * 2,
            "trainval": [("*", 0)] * 7 + [("*", 1)] * 7 + [("*", 0), ("*", 1)],
        },
    ),
    "resisc45": Case(
        "create_resisc45_data_files",
        resisc45,
        folders={
            "train": {"airport": ["*4"], "beach": ["*4"]},
            "test": {"airport": ["*1"], "beach": ["*1"]},
        },
    ),
    "places205": Case(
        "create_places205_data_files",
        places205,
        folders={
            "train": {"000_abbey": ["gsun_1.jpg"], "001_baseball_field": ["gsun_3.jpg"]},
            "val": {"000_abbey": ["gsun_2.jpg"]},
        },
    ),
    "places365": Case(
        "create_places365_data_files",
        places365,
        folders={
            "train": {"000_airfield": ["00000001.jpg"], "001_bakery_shop": ["00000001.jpg"]},
            "val": {"001_bakery_shop": ["Places365_val_00000001.jpg"]},
        },
    ),
    "ucf101": Case(
        "create_ucf101_data_files",
        ucf101,
        folders={
            "train": {
                "ApplyEyeMakeup": ["v_ApplyEyeMakeup_g01_c01.jpg"],
                "Archery": ["v_Archery_g01_c01.jpg"],
            },
            "val": {"ApplyEyeMakeup": ["v_ApplyEyeMakeup_g02_c01.jpg"]},
        },
        needs="decoder",
    ),
    "k700": Case(
        "create_k700_data_files",
        k700,
        folders={
            "train": {
                "abseiling": ["abc_000001_000011.jpg"],
                "passing_American_football_in_game": ["x_1_2.jpg"],
            },
            "val": {"abseiling": ["v_0_1.jpg"]},
        },
        needs="decoder",
    ),
}


def _names(expected: list[str], found: list[str]) -> bool:
    """``["*n"]`` stands for any n names."""
    if len(expected) == 1 and expected[0].startswith("*"):
        return len(found) == int(expected[0][1:])
    return found == expected


def check_folders(out: Path, expected: dict[str, dict[str, list[str]]]) -> None:
    written = {
        split: {c: sorted(os.listdir(out / split / c)) for c in sorted(os.listdir(out / split))}
        for split in sorted(os.listdir(out))
        if (out / split).is_dir()
    }
    if "*" in expected:  # a random split: the union over the splits is fixed
        union: dict[str, list[str]] = {}
        for classes in written.values():
            for c, names in classes.items():
                union[c] = sorted(union.get(c, []) + names)
        assert union == {c: sorted(n) for c, n in expected["*"].items()}
        return
    assert sorted(written) == sorted(expected)
    for split, classes in expected.items():
        assert sorted(written[split]) == sorted(classes), split
        for c, names in classes.items():
            assert _names(names, written[split][c]), (split, c, written[split][c])


def check_filelist(out: Path, case: Case) -> None:
    for split, expected in case.filelist.items():
        paths = np.load(out / f"{split}_images.npy")
        labels = np.load(out / f"{split}_labels.npy")
        assert len(paths) == len(labels) == len(expected), split
        assert all(os.path.isabs(p) and os.path.isfile(p) for p in paths)
        for path, label, (name, want) in zip(paths, labels, expected, strict=True):
            assert name == "*" or os.path.basename(path) == name, (split, path, name)
            if case.classes is not None:
                assert case.classes[int(label)] == want, (split, name)
            else:
                assert np.asarray(label).tolist() == want, (split, name)
    if case.classes is not None:
        assert json.loads((out / "classes.json").read_text()) == case.classes


@pytest.mark.parametrize("name", sorted(CASES))
def test_published_layout_to_vissl_inputs(name: str, tmp_path: Path, request) -> None:
    case = CASES[name]
    if case.needs == "decoder":
        request.getfixturevalue("fake_decoder")
    root, out = tmp_path / "archive", tmp_path / "out"
    extra = case.build(root)
    code, stdout, stderr = run_as_main(
        f"datasets/{case.script}", "-i", str(root), "-o", str(out), *extra
    )
    assert code == 0, stderr
    entry = json.loads(stdout[stdout.index("{") :])
    (catalog_name,) = entry
    for paths in entry[catalog_name].values():
        assert paths[0] == "<not_used>" or os.path.exists(paths[0])
    if case.folders:
        check_folders(out, case.folders)
    else:
        check_filelist(out, case)


def test_the_outputs_read_through_the_catalog_and_vissl_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder output (DTD) and a filelist output (CLEVR count), registered with --catalog,
    read by DATASET_NAMES alone through disk_folder / disk_filelist."""
    catalog = tmp_path / "catalog.json"
    for script, build, out in (
        ("create_dtd_data_files", dtd, tmp_path / "dtd"),
        ("create_clevr_count_data_files", clevr, tmp_path / "clevr"),
    ):
        args = ("-i", str(tmp_path / script), "-o", str(out), "--catalog", str(catalog))
        build(tmp_path / script)
        code, _, stderr = run_as_main(f"datasets/{script}", *args)
        assert code == 0, stderr
    entries = json.loads(catalog.read_text())
    assert sorted(entries) == ["clevr_count_filelist", "dtd_folder"]
    # a catalog of these two alone (the repository's has the same names)
    monkeypatch.setattr(VisslDatasetCatalog, "_datasets", {})
    monkeypatch.setattr(VisslDatasetCatalog, "_defaults_loaded", True)
    VisslDatasetCatalog.register_json(str(catalog))
    for name, source, split, labels in (
        ("dtd_folder", "disk_folder", "TEST", [0, 1]),
        ("clevr_count_filelist", "disk_filelist", "TRAIN", [0, 0, 1]),
    ):
        _, cfg = hydra_compose_and_validate(
            [
                "config=quick_start",
                f"config.DATA.{split}.DATA_SOURCES=[{source}]",
                f"config.DATA.{split}.LABEL_SOURCES=[{source}]",
                f"config.DATA.{split}.DATASET_NAMES=[{name}]",
                f"config.DATA.{split}.DATA_PATHS=[]",
                f"config.DATA.{split}.LABEL_PATHS=[]",
                f"config.DATA.{split}.TRANSFORMS=[{{name:ToTensor}}]",
            ]
        )
        cfg.DATA.NUM_DATALOADER_WORKERS = 0
        dataset = build_dataset(AttrDict(cfg), split)
        assert [dataset[i]["label"][0] for i in range(len(dataset))] == labels, name


def test_user_errors(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    code, _, stderr = run_as_main(
        "datasets/create_dtd_data_files", "-i", str(root), "-o", str(tmp_path / "o")
    )
    assert_one_line_error(code, stderr, str(root), "does not exist")
    dtd(root)
    code, _, stderr = run_as_main(
        "datasets/create_dtd_data_files", "-i", str(root), "-o", str(tmp_path / "o"), "-d"
    )
    assert_one_line_error(code, stderr, "do not download", "dtd-r1.0.1.tar.gz")
    (root / "dtd" / "images" / "woven" / "woven_0002.jpg").unlink()
    code, _, stderr = run_as_main(
        "datasets/create_dtd_data_files", "-i", str(root), "-o", str(tmp_path / "o")
    )
    assert_one_line_error(code, stderr, "woven_0002.jpg", "does not exist")
    imagenet_variant("imagenet-a")(root)
    lines(root / "imagenet_classes.txt", "n01")
    code, _, stderr = run_as_main(
        "datasets/create_imagenet_a_data_files",
        "-i",
        str(root),
        "-o",
        str(tmp_path / "o"),
        "--imagenet_classes",
        str(root / "imagenet_classes.txt"),
    )
    assert_one_line_error(code, stderr, "['n02', 'n03']", "not among the 1 ImageNet classes")
    code, _, stderr = run_as_main(
        "datasets/create_coco_data_files", "-o", str(tmp_path / "o"), "--format", "folder"
    )
    assert code == 2 and "invalid choice: 'folder'" in stderr


def test_k700_names_the_clips_without_a_frame(tmp_path: Path, fake_decoder) -> None:
    root, out = tmp_path / "k700", tmp_path / "out"
    k700(root)
    code, _, stderr = run_as_main(
        "datasets/create_k700_data_files", "-i", str(root), "-o", str(out)
    )
    assert code == 0, stderr
    assert (out / "train_errors.txt").read_text() == "broken_0_1.jpg\n"
    frame = np.asarray(Image.open(out / "train" / "abseiling" / "abc_000001_000011.jpg"))
    assert abs(int(frame.mean()) - 1) <= 1  # the middle of 3 frames: index 1 (JPEG)


def test_middle_frame_of_a_real_video(tmp_path: Path) -> None:
    """PyAV (optional) encodes 5 frames of values 0, 50, ..., 200; the middle one is 100."""
    av = pytest.importorskip("av")
    if DATASETS not in sys.path:
        sys.path.insert(0, DATASETS)
    import _video

    path = tmp_path / "clip.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=5)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        for value in range(0, 250, 50):
            frame = av.VideoFrame.from_ndarray(
                np.full((16, 16, 3), value, np.uint8), format="rgb24"
            )
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    middle = np.asarray(_video.middle_frame(str(path)))
    assert abs(float(middle.mean()) - 100) < 10


def test_folder_links(tmp_path: Path) -> None:
    """--link symlink / hardlink leave the images where they are."""
    root = tmp_path / "archive"
    food101(root)
    for link in ("symlink", "hardlink"):
        out = tmp_path / link
        code, _, stderr = run_as_main(
            "datasets/create_food101_data_files", "-i", str(root), "-o", str(out), "--link", link
        )
        assert code == 0, stderr
        made = out / "train" / "ramen" / "101.jpg"
        source = root / "food-101" / "images" / "ramen" / "101.jpg"
        if link == "symlink":
            assert made.is_symlink() and os.readlink(made) == str(source.resolve())
        else:
            assert not made.is_symlink() and os.path.samefile(made, source)


#: VISSL's dataset catalog names (0.1.6 and main together).
VISSL_CATALOG_NAMES = """airstore_imagenet imagenet1k_folder imagenet_a_filelist imagenet_r_filelist
imagenette_160_folder places205_folder places365_folder CIFAR10 CIFAR100 STL10 MNIST SVHN
VOC2012_SEGMENTATION inaturalist2018_filelist yfcc100m aircrafts_folder caltech101_folder
clevr_count_filelist clevr_dist_filelist dsprites_loc_folder dsprites_orient_folder dtd_folder
euro_sat_folder food101_folder gtsrb_folder iwilds_cam_val_filelist iwilds_cam_id_val_filelist
iwilds_cam_test_filelist iwilds_cam_id_test_filelist kitti_dist_folder oxford_flowers_folder
oxford_pets_folder patch_camelyon_folder pcam_folder small_norb_azimuth_folder
small_norb_elevation_folder stanford_cars_folder sun397_filelist ucf101_folder
kinetics700_frames_folder voc2007_folder voc2012_folder coco_folder imagenet1k-per01
imagenet1k-per10 google-imagenet1k-per01 google-imagenet1k-per10""".split()


def test_the_catalog_has_vissls_names_and_the_scripts_write_its_entries() -> None:
    """Our catalog has VISSL's 47 names; each script's default name and output folder
    (``-o /datasets/<folder>``) agree with an entry of it."""
    assert len(VISSL_CATALOG_NAMES) == 47
    path = Path(EXTRA_SCRIPTS).parent / "configs" / "config" / "dataset_catalog.json"
    catalog = json.loads(path.read_text())
    assert not set(VISSL_CATALOG_NAMES) - set(catalog)
    for case in CASES.values():
        spec = runpy_spec(case.script)
        if spec.catalog is None:
            assert spec.name in catalog, case.script


def runpy_spec(script: str) -> Any:
    if DATASETS not in sys.path:
        sys.path.insert(0, DATASETS)
    import importlib

    return importlib.import_module(script).SPEC

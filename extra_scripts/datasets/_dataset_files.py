"""What the ``create_*_data_files.py`` scripts share: samples, the two output formats, the CLI.

Each script reads one data set's published archive layout into ``{split: [Sample, ...]}``
and hands it to :func:`dataset_main`, which writes one of VISSL's two inputs:

``folder`` (VISSL's ``disk_folder`` data source)::

    OUTPUT/<split>/<class>/<image>

``filelist`` (VISSL's ``disk_filelist`` data and label sources)::

    OUTPUT/<split>_images.npy   1-D array of absolute image paths
    OUTPUT/<split>_labels.npy   class indices (int64; classes.json names them), the data
                                set's own integer labels, or multi-label rows
    OUTPUT/classes.json         the class names, index i = label i (named classes only)

Images that exist as files are copied into a folder output (``--link symlink`` or
``hardlink`` to save the space) and listed where they are in a filelist output; images the
script makes (decoded from arrays, frames of videos) are written as PNG/JPEG files under
``OUTPUT/<split>`` (folder) or ``OUTPUT/<split>_images/<class>/`` (filelist).

Every script prints the dataset catalog entry of what it wrote; ``--catalog FILE`` adds it
to FILE under ``--name`` (default: VISSL's catalog name of the data set).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _common import HelpFormatter, ScriptError, run_script
from create_disk_filelist import add_to_catalog

#: How a folder output gets an image that exists as a file.
LINK_MODES = ("copy", "symlink", "hardlink")
FORMATS = ("folder", "filelist")

#: A label: a class name, the data set's own integer label, or a multi-label row.
Label = str | int | np.ndarray


@dataclass(frozen=True)
class Sample:
    """One image of a split.

    Attributes:
        source: the image file, or a function returning the image (a PIL image) for images
            the script makes.
        label: the class name (str), an integer label, or a multi-label row.
        name: the output file name (default: the source's file name).
    """

    source: str | Callable[[], Any]
    label: Label
    name: str = ""

    def file_name(self) -> str:
        if self.name:
            return self.name
        if isinstance(self.source, str):
            return os.path.basename(self.source)
        raise AssertionError("a made image needs a name")


@dataclass
class Written:
    """What one split became: the folder or the two .npy files, and its size."""

    split: str
    count: int
    folder: str = ""
    images: str = ""
    labels: str = ""
    classes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- reading
def require_dir(path: str, what: str) -> str:
    """``path`` if it is a folder, else a ScriptError naming ``what`` it should hold."""
    if not os.path.isdir(path):
        raise ScriptError(f"{path} does not exist: it should hold {what}.")
    return path


def require_file(path: str, what: str) -> str:
    """``path`` if it is a file, else a ScriptError naming ``what`` it should be."""
    if not os.path.isfile(path):
        raise ScriptError(f"{path} does not exist: it should be {what}.")
    return path


def subdirs(folder: str) -> list[str]:
    """The sorted sub-folder names of ``folder`` (hidden ones left out)."""
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def files(folder: str, extensions: Iterable[str] | None = None) -> list[str]:
    """The sorted file names of ``folder`` (hidden ones left out), of ``extensions`` if given."""
    exts = tuple(e.lower() for e in extensions) if extensions else None
    return sorted(
        e.name
        for e in os.scandir(folder)
        if e.is_file()
        and not e.name.startswith(".")
        and (exts is None or e.name.lower().endswith(exts))
    )


def read_lines(path: str) -> list[str]:
    """The non-empty, stripped lines of a text file."""
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def class_folder_samples(folder: str, extensions: Iterable[str] | None = None) -> list[Sample]:
    """``folder/<class>/<image>`` -> samples labelled with the class folder's name."""
    return [
        Sample(os.path.join(folder, c, name), c)
        for c in subdirs(folder)
        for name in files(os.path.join(folder, c), extensions)
    ]


def random_split(
    items: Sequence[Any], fractions: Mapping[str, float], seed: int
) -> dict[str, list[Any]]:
    """Shuffle ``items`` (sorted first: the result does not depend on listing order) with
    ``seed`` and cut them by ``fractions`` (in order; the last split takes the rest)."""
    order = sorted(range(len(items)), key=lambda i: str(items[i]))
    random.Random(seed).shuffle(order)
    out: dict[str, list[Any]] = {}
    start = 0
    names = list(fractions)
    for k, name in enumerate(names):
        end = len(order) if k == len(names) - 1 else start + round(len(order) * fractions[name])
        out[name] = [items[i] for i in sorted(order[start:end])]
        start = end
    return out


# ----------------------------------------------------------------------------- writing
def _place(src: str, dst: str, link: str) -> None:
    if os.path.lexists(dst):
        os.remove(dst)
    if link == "symlink":
        os.symlink(os.path.abspath(src), dst)
    elif link == "hardlink":
        os.link(src, dst)
    else:
        shutil.copyfile(src, dst)


def _save_made(sample: Sample, path: str) -> bool:
    """Save the made image of ``sample``; False (nothing written) when there is none (a
    clip without a video stream)."""
    assert callable(sample.source)
    image = sample.source()
    if image is None:
        return False
    image.save(path)
    return True


def _missing(samples: Sequence[Sample]) -> None:
    for s in samples:
        if isinstance(s.source, str) and not os.path.isfile(s.source):
            raise ScriptError(f"the image {s.source} listed by the data set does not exist.")


def write_folder(out: str, split: str, samples: Sequence[Sample], link: str) -> Written:
    """``OUTPUT/<split>/<class>/<image>`` (VISSL's ``disk_folder``).

    Raises:
        ScriptError: a label is not a class name, or an image file is missing.
    """
    _missing(samples)
    root = os.path.abspath(os.path.join(out, split))
    skipped: list[str] = []
    for s in samples:
        if not isinstance(s.label, str):
            raise ScriptError(
                "this data set has integer or multi-label targets: write it with --format filelist."
            )
        folder = os.path.join(root, s.label)
        os.makedirs(folder, exist_ok=True)
        dst = os.path.join(folder, s.file_name())
        if isinstance(s.source, str):
            _place(s.source, dst, link)
        elif not _save_made(s, dst):
            skipped.append(s.file_name())
    classes = sorted({str(s.label) for s in samples})
    return Written(
        split, len(samples) - len(skipped), folder=root, classes=classes, skipped=skipped
    )


def write_filelist(
    out: str, split: str, samples: Sequence[Sample], classes: Sequence[str]
) -> Written:
    """``OUTPUT/<split>_images.npy`` and ``_labels.npy`` (VISSL's ``disk_filelist``).

    Class-name labels become indices into ``classes``; integer labels are written as
    int64, multi-label rows as an int32 matrix.
    """
    _missing(samples)
    paths: list[str] = []
    kept: list[Sample] = []
    skipped: list[str] = []
    for s in samples:
        if isinstance(s.source, str):
            paths.append(os.path.abspath(s.source))
            kept.append(s)
            continue
        folder = os.path.join(out, f"{split}_images", str(s.label))
        os.makedirs(folder, exist_ok=True)
        path = os.path.abspath(os.path.join(folder, s.file_name()))
        if not _save_made(s, path):
            skipped.append(s.file_name())
            continue
        paths.append(path)
        kept.append(s)
    samples = kept
    index = {c: i for i, c in enumerate(classes)}
    labels: np.ndarray
    if samples and isinstance(samples[0].label, np.ndarray):
        labels = np.stack([np.asarray(s.label) for s in samples]).astype(np.int32)
    elif samples and isinstance(samples[0].label, str):
        labels = np.asarray([index[str(s.label)] for s in samples], dtype=np.int64)
    else:
        labels = np.asarray([int(s.label) for s in samples], dtype=np.int64)  # type: ignore[arg-type]
    images_file = os.path.abspath(os.path.join(out, f"{split}_images.npy"))
    labels_file = os.path.abspath(os.path.join(out, f"{split}_labels.npy"))
    np.save(images_file, np.asarray(paths, dtype=str))
    np.save(labels_file, labels)
    return Written(split, len(samples), images=images_file, labels=labels_file, skipped=skipped)


def write_splits(
    out: str,
    splits: Mapping[str, Sequence[Sample]],
    fmt: str,
    link: str = "copy",
    classes: Sequence[str] | None = None,
) -> dict[str, Written]:
    """Write every split in ``fmt``; returns ``{split: Written}``.

    Args:
        classes: the class names in label order (default: the sorted union of the class
            names of all splits, so that a class missing from one split shifts no label).
    """
    os.makedirs(out, exist_ok=True)
    if fmt == "folder":
        return {name: write_folder(out, name, samples, link) for name, samples in splits.items()}
    names = {s.label for samples in splits.values() for s in samples if isinstance(s.label, str)}
    class_list = list(classes) if classes is not None else sorted(names)  # type: ignore[type-var]
    unknown = sorted(str(n) for n in names if n not in set(class_list))
    if unknown:
        raise ScriptError(f"labels {unknown[:5]} are not among the data set's classes.")
    if names:
        with open(os.path.join(out, "classes.json"), "w", encoding="utf-8") as f:
            json.dump(class_list, f)
    return {
        name: write_filelist(out, name, samples, class_list) for name, samples in splits.items()
    }


def catalog_entry(
    written: Mapping[str, Written], train: str | None, val: str | None
) -> dict[str, list[str]]:
    """The dataset catalog entry: ``train`` from split ``train``, ``val`` from ``val``."""
    entry: dict[str, list[str]] = {}
    for key, split in (("train", train), ("val", val)):
        if split is None or split not in written:
            continue
        w = written[split]
        entry[key] = [w.folder, "<unused>"] if w.folder else [w.images, w.labels]
    return entry


# ----------------------------------------------------------------------------- the CLI
@dataclass(frozen=True)
class DatasetScript:
    """One ``create_*`` script.

    Attributes:
        prog: the script's path, for ``--help``.
        doc: the script's docstring (first paragraph: description; rest: epilog).
        name: VISSL's dataset catalog name of what it writes.
        read: ``args -> {split: [Sample]}`` from the published layout under ``args.input``.
        fmt: the default output format (VISSL's: ``folder`` for ``*_folder`` names).
        catalog_splits: the splits the catalog entry's ``train`` and ``val`` point at.
        formats: the formats the data set can be written in.
        downloads: where the published archives are (``--download`` names them: the
            scripts never download).
        add_arguments: the script's own options.
        classes: ``args -> class names in label order`` (default: sorted names).
        input_required: whether ``-i`` must be given (COCO's own options may replace it).
        after: ``(args, splits) -> None``, run after the files are written (extra files).
        catalog: ``args -> (default name, train split, val split)`` where the options
            choose them (else ``name`` and ``catalog_splits``).
    """

    prog: str
    doc: str
    name: str
    read: Callable[[argparse.Namespace], Mapping[str, Sequence[Sample]]]
    fmt: str = "folder"
    catalog_splits: tuple[str | None, str | None] = ("train", "val")
    formats: tuple[str, ...] = FORMATS
    downloads: tuple[str, ...] = ()
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    classes: Callable[[argparse.Namespace], Sequence[str] | None] | None = None
    input_required: bool = True
    after: Callable[[argparse.Namespace, Mapping[str, Sequence[Sample]]], None] | None = None
    catalog: Callable[[argparse.Namespace], tuple[str, str | None, str | None]] | None = None


def build_parser(spec: DatasetScript) -> argparse.ArgumentParser:
    description, _, epilog = spec.doc.partition("\n\n")
    parser = argparse.ArgumentParser(
        prog=spec.prog, description=description, epilog=epilog, formatter_class=HelpFormatter
    )
    # VISSL's scripts spell these in several ways: every spelling is accepted
    parser.add_argument(
        "-i",
        "--input",
        "--data_source_dir",
        "--input_dir_path",
        dest="input",
        required=spec.input_required,
        default=None,
        help="the folder holding the extracted archive(s)",
    )
    parser.add_argument(
        "-o",
        "--output",
        "--output_dir",
        "--output_dir_path",
        dest="output",
        required=True,
        help="where to write the data set",
    )
    parser.add_argument(
        "-d",
        "--download",
        action="store_true",
        help="VISSL's download flag: these scripts never download; it prints where the "
        "published archives are",
    )
    parser.add_argument(
        "--format",
        choices=spec.formats,
        default=spec.fmt,
        help="folder: OUTPUT/<split>/<class>/<image> (disk_folder); filelist: "
        "OUTPUT/<split>_images.npy and _labels.npy (disk_filelist)",
    )
    parser.add_argument(
        "--link",
        choices=LINK_MODES,
        default="copy",
        help="how a folder output gets the existing image files",
    )
    parser.add_argument(
        "--name", default=None, help=f"the dataset catalog name (default {spec.name})"
    )
    parser.add_argument("--catalog", default=None, help="add the entry to this catalog JSON file")
    parser.add_argument(
        "--force", action="store_true", help="replace an entry of the same name in --catalog"
    )
    if spec.add_arguments is not None:
        spec.add_arguments(parser)
    return parser


def dataset_main(spec: DatasetScript, argv: Sequence[str] | None) -> int:
    """Parse ``argv``, read the layout, write it, print (and add) the catalog entry."""
    args = build_parser(spec).parse_args(argv)
    if args.download:
        where = ", ".join(spec.downloads) or "the data set's site"
        raise ScriptError(
            f"vissl's dataset scripts do not download: fetch {where} and extract it into "
            f"{args.input}, then run the script without --download."
        )
    if args.input is not None:
        require_dir(args.input, "the extracted archive(s) of the data set")
    splits = spec.read(args)
    if not any(splits.values()):
        raise ScriptError(f"no image found in {args.input}; see --help for the layout read.")
    classes = spec.classes(args) if spec.classes is not None else None
    written = write_splits(args.output, splits, args.format, args.link, classes)
    for w in written.values():
        where = w.folder or f"{w.images}, {w.labels}"
        print(f"{w.split}: {w.count} images -> {where}")
        if w.skipped:
            errors = os.path.abspath(os.path.join(args.output, f"{w.split}_errors.txt"))
            with open(errors, "w", encoding="utf-8") as f:
                f.write("".join(f"{name}\n" for name in w.skipped))
            print(f"{w.split}: {len(w.skipped)} left out (no image could be made) -> {errors}")
    if spec.after is not None:
        spec.after(args, splits)
    name, (train, val) = spec.name, spec.catalog_splits
    if spec.catalog is not None:
        name, train, val = spec.catalog(args)
    name = args.name or name
    entry = catalog_entry(written, train, val)
    if args.catalog:
        add_to_catalog(args.catalog, name, entry, args.force)
        print(f"added {name!r} to the dataset catalog {args.catalog}")
    else:
        print("dataset catalog entry (add it with --catalog FILE):")
    print(json.dumps({name: entry}, indent=4))
    return 0


def run(spec: DatasetScript, argv: Sequence[str] | None = None) -> int:
    """The script's exit code: :func:`dataset_main`, user mistakes as ``error: ...``."""
    return run_script(lambda a: dataset_main(spec, a), argv)

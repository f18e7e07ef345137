"""extra_scripts/export_digits_image_folder.py: the digits data source as an image folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from torchvision.datasets import ImageFolder

from tests.extra_scripts._helpers import (
    assert_one_line_error,
    import_script,
    run_as_main,
    run_script,
)
from vissl.config.attr_dict import AttrDict
from vissl.data.data_sources.digits import DigitsDataset
from vissl.data.data_sources.disk import DiskFolderDataset

SCRIPT = "export_digits_image_folder"
export = import_script(SCRIPT)


def digits(split: str) -> DigitsDataset:
    return DigitsDataset(AttrDict({"DATA": {split: {}}}), "", split, "digits")


@pytest.mark.slow
def test_cli_export_matches_the_digits_source(tmp_path: Path) -> None:
    out = tmp_path / "digits"
    proc = run_script(SCRIPT, str(out))
    assert proc.returncode == 0, proc.stderr
    assert "train 1438, test 359" in proc.stdout
    for split, folder in (("TRAIN", "train"), ("TEST", "test")):
        source = digits(split)
        labels = source.get_labels()
        images = ImageFolder(str(out / folder))
        assert images.classes == [str(c) for c in range(10)]
        assert len(images) == len(source)
        counts = np.bincount([label for _, label in images.samples], minlength=10)
        assert counts.tolist() == np.bincount(labels, minlength=10).tolist()
        # vissl's disk_folder reads each file as the image of its index, pixel for pixel
        disk = DiskFolderDataset(AttrDict({"DATA": {split: {}}}), str(out / folder), split, "x")
        assert len(disk) == len(source)
        for i, (path, label) in enumerate(disk.samples):
            idx = int(Path(path).stem)
            assert label == labels[idx]
            image, valid = disk[i]
            assert valid and np.array_equal(np.asarray(image), np.asarray(source[idx][0]))


def test_size_upscales_by_nearest_neighbour(tmp_path: Path) -> None:
    counts = export.export(str(tmp_path / "big"), size=32, splits=["TEST"])
    assert counts == {"test": 359}
    source = digits("TEST")
    folder = ImageFolder(str(tmp_path / "big" / "test"))
    path, label = folder.samples[0]
    idx = int(Path(path).stem)
    image = np.asarray(folder.loader(path))
    assert image.shape == (32, 32, 3) and label == source.get_labels()[idx]
    assert np.array_equal(image[::4, ::4], np.asarray(source[idx][0]))


def test_errors_and_help(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    code, _, err = run_as_main(SCRIPT, str(tmp_path / "full"))
    line = assert_one_line_error(code, err)
    assert line == f"error: {tmp_path / 'full'} is not empty; give a new or empty folder."
    code, _, err = run_as_main(SCRIPT, str(tmp_path / "new"), "--size", "0")
    assert_one_line_error(code, err, "--size must be a positive number of pixels; got 0.")
    assert not (tmp_path / "new").exists()
    with pytest.raises(SystemExit) as exit_info:
        export.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--size" in text and "examples:" in text and "1438" in text

"""The tensor path: which transforms it takes over, the same random draws, the same outputs."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import yaml
from PIL import Image, ImageDraw

from vissl.data import build_dataset, build_transforms
from vissl.data.ssl_transforms import SSLTransformsWrapper, tensor_ops
from vissl.data.ssl_transforms.tensor_path import (
    TensorToTensor,
    ToImageTensor,
    plan_tensor_path,
    tensor_twin,
)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {
    "simclr": "pretrain/simclr/simclr_8gpu_resnet",
    "swav": "pretrain/swav/swav_8gpu_resnet",
    "dino": "pretrain/dino/dino_8gpu_vits16",
}
STD = 0.226  # roughly ImageNet's std: normalised differences back to grey levels


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def config_transforms(chain: str) -> list[dict[str, Any]]:
    path = REPO / "configs" / "config" / f"{CONFIGS[chain]}.yaml"
    return yaml.safe_load(path.read_text())["config"]["DATA"]["TRAIN"]["TRANSFORMS"]


def photo(width: int = 200, height: int = 150, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    pixels = np.stack(
        [128 + 90 * np.sin(xx / 19), 128 + 80 * np.cos(yy / 13), 128 + 70 * np.sin((xx - yy) / 29)],
        axis=2,
    )
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(30):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        draw.rectangle(
            [x, y, x + int(rng.integers(3, 30)), y + int(rng.integers(3, 30))], fill=fill
        )
    return image


def sample(image: Any) -> dict[str, Any]:
    return {"data": [image], "label": [3], "data_valid": [1], "data_idx": [7]}


def run(chain: Any, image: Any, seed: int) -> tuple[list[torch.Tensor], Any]:
    """Outputs of ``chain`` with every generator seeded, and the generators' states after."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    out = chain(sample(image))["data"]
    return out, (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].tolist())


@pytest.mark.parametrize("chain", sorted(CONFIGS))
def test_pretraining_chains_run_on_tensors_up_to_a_fused_normalize(chain):
    built = build_transforms(config_transforms(chain))
    names = [w.name for w in built.transforms]
    assert names[0] == "ToImageTensor" and built.takes_image_tensors
    assert names[-1] == "ToTensor" and "Normalize" not in names
    assert isinstance(built.transforms[-1].transform, TensorToTensor)
    assert built.transforms[-1].transform.mean == [0.485, 0.456, 0.406]
    for wrapper in built.transforms[1:]:  # no PIL transform left behind
        assert not isinstance(wrapper.transform, T.ColorJitter | T.RandomResizedCrop | T.ToTensor)
    pil = build_transforms(config_transforms(chain), tensor_path=False)
    assert not pil.takes_image_tensors
    assert [w.name for w in pil.transforms] == [e["name"] for e in config_transforms(chain)]


@pytest.mark.parametrize("chain", sorted(CONFIGS))
def test_same_seed_same_draws_and_the_same_crops(chain):
    """Every generator is left in the same state by both paths (the very same random
    parameters were drawn), and the outputs agree to a grey level or two."""
    fast = build_transforms(config_transforms(chain))
    slow = build_transforms(config_transforms(chain), tensor_path=False)
    image = photo()
    diffs = []
    for seed in range(5):
        got, state_fast = run(fast, image, seed)
        expected, state_slow = run(slow, image, seed)
        assert torch.equal(state_fast[0], state_slow[0])
        assert state_fast[1:] == state_slow[1:]
        assert [t.shape for t in got] == [t.shape for t in expected]
        for a, b in zip(got, expected):
            assert a.dtype == torch.float32 and a.is_contiguous()
            diffs.append(float((a - b).abs().mean()) * STD * 255)
    assert max(diffs) < 3.0 and np.mean(diffs) < 1.5


def test_image_tensors_and_pil_images_give_the_same_output():
    fast = build_transforms(config_transforms("simclr"))
    image = photo()
    as_tensor = tensor_ops.pil_to_uint8(image)
    keep = as_tensor.clone()
    a, _ = run(fast, image, 3)
    b, _ = run(fast, as_tensor, 3)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(as_tensor, keep)  # the twins never modify their input


def test_evaluation_chain_matches_pil():
    entries = [
        {"name": "Resize", "size": 40},
        {"name": "CenterCrop", "size": 32},
        {"name": "ToTensor"},
        {"name": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
    ]
    fast, slow = build_transforms(entries), build_transforms(entries, tensor_path=False)
    assert [w.name for w in fast.transforms] == [
        "ToImageTensor",
        "Resize",
        "CenterCrop",
        "ToTensor",
    ]
    (a,), _ = run(fast, photo(), 0)
    (b,), _ = run(slow, photo(), 0)
    assert a.shape == b.shape == (3, 32, 32)
    assert float((a - b).abs().mean()) * 0.25 * 255 < 0.3


def test_the_run_starts_after_a_transform_without_twin():
    entries = [
        {"name": "RandomResizedCrop", "size": 24},
        {"name": "ImgPilRandomPhotometric", "p": 1.0},
        {"name": "RandomHorizontalFlip"},
        {"name": "ToTensor"},
    ]
    built = build_transforms(entries)
    assert [w.name for w in built.transforms] == [
        "RandomResizedCrop",
        "ImgPilRandomPhotometric",
        "ToImageTensor",
        "RandomHorizontalFlip",
        "ToTensor",
    ]
    assert isinstance(built.transforms[0].transform, T.RandomResizedCrop)  # still PIL
    assert not built.takes_image_tensors
    (out,), _ = run(built, photo(), 0)
    assert out.shape == (3, 24, 24) and out.dtype == torch.float32


def test_indices_and_bicubic_crops_stay_on_pil():
    entries = [
        {"name": "ImgReplicatePil", "num_times": 2},
        {"name": "RandomHorizontalFlip", "indices": [0]},
        {"name": "RandomResizedCrop", "size": 16, "interpolation": 3},  # bicubic
        {"name": "ColorJitter", "brightness": 0.4},
        {"name": "ToTensor"},
    ]
    built = build_transforms(entries)
    names = [w.name for w in built.transforms]
    assert names == [
        "ImgReplicatePil",
        "RandomHorizontalFlip",
        "RandomResizedCrop",
        "ToImageTensor",
        "ColorJitter",
        "ToTensor",
    ]
    out = built(sample(photo()))["data"]
    assert len(out) == 2 and all(t.shape == (3, 16, 16) for t in out)


def test_without_to_tensor_nothing_changes():
    entries = [{"name": "RandomResizedCrop", "size": 16}, {"name": "ToTensor", "indices": [0]}]
    built = build_transforms(entries)
    assert [w.name for w in built.transforms] == ["RandomResizedCrop", "ToTensor"]
    assert isinstance(build_transforms(entries[:1])(sample(photo()))["data"][0], Image.Image)


def test_a_plugin_transform_joins_with_tensor_transform():
    class Invert:
        def __call__(self, image: Image.Image) -> Image.Image:
            return Image.eval(image, lambda v: 255 - v)

        def tensor_transform(self) -> Any:
            return lambda image: 1.0 - tensor_ops.to_float(image)

    class PilOnly:
        def __call__(self, image: Image.Image) -> Image.Image:
            return image

    to_tensor = SSLTransformsWrapper(T.ToTensor(), "ToTensor")
    planned = plan_tensor_path([SSLTransformsWrapper(Invert(), "Invert"), to_tensor])
    assert [w.name for w in planned] == ["ToImageTensor", "Invert", "ToTensor"]
    image = photo(8, 6)
    result = planned[2](planned[1](planned[0](sample(image))))["data"][0]
    expected = T.ToTensor()(Invert()(image))
    assert torch.allclose(result, expected, atol=1e-6)
    assert tensor_twin(PilOnly()) is None
    kept = plan_tensor_path([SSLTransformsWrapper(PilOnly(), "PilOnly"), to_tensor])
    assert [w.name for w in kept] == ["PilOnly", "ToImageTensor", "ToTensor"]


def test_multicrop_random_apply_needs_twins_of_all_its_transforms():
    entry = {
        "name": "ImgPilMultiCropRandomApply",
        "transforms": [{"name": "ImgPilRandomPhotometric", "p": 1.0}],
        "prob": [0.5],
        "nmb_crops": [2],
    }
    crops = {
        "name": "ImgPilToMultiCrop",
        "total_num_crops": 2,
        "size_crops": [16],
        "num_crops": [2],
        "crop_scales": [[0.3, 1.0]],
    }
    built = build_transforms([crops, entry, {"name": "ToTensor"}])
    assert [w.name for w in built.transforms][:2] == ["ImgPilToMultiCrop", entry["name"]]
    blur = dict(entry, transforms=[{"name": "ImgPilGaussianBlur", "p": 1.0}])
    built = build_transforms([crops, blur, {"name": "ToTensor"}])
    assert built.takes_image_tensors


def test_to_image_tensor_takes_pil_arrays_and_tensors_only():
    to_tensor = ToImageTensor()
    array = np.zeros((4, 5, 3), np.uint8)
    assert to_tensor(array).shape == (3, 4, 5)
    assert to_tensor(np.zeros((4, 5), np.uint8)).shape == (1, 4, 5)
    image = torch.zeros(3, 2, 2, dtype=torch.uint8)
    assert to_tensor(image) is image
    with pytest.raises(TypeError, match="FAST_TRANSFORMS"):
        to_tensor([1, 2, 3])


def _jpeg_folder(root: Path) -> Path:
    folder = root / "images" / "a"
    folder.mkdir(parents=True)
    photo(64, 48, 1).save(folder / "0.jpg", quality=90)
    photo(64, 48, 2).convert("L").save(folder / "1.jpg", quality=90)
    photo(40, 30, 3).save(folder / "2.png")
    (folder / "3.jpg").write_bytes((folder / "0.jpg").read_bytes()[:300])  # truncated
    return root / "images"


def test_disk_source_reads_the_same_pixels_as_tensors(cfg_factory, tmp_path):
    root = _jpeg_folder(tmp_path)
    dataset = build_dataset(
        cfg_factory(train={"DATA_SOURCES": ["disk_folder"], "DATA_PATHS": [str(root)]}), "TRAIN"
    )
    source = dataset.data_objs[0]
    for idx in range(3):
        image, valid = source[idx]
        tensor, tensor_valid = source.get_image_tensor(idx)
        assert valid and tensor_valid and tensor.dtype == torch.uint8
        pixels = tensor_ops.pil_to_uint8(image.convert("RGB"))
        assert tensor.shape == pixels.shape
        # both decoders are libjpeg-turbo (identical here); allow for other builds' IDCT
        difference = (tensor.int() - pixels.int()).abs()
        assert int(difference.max()) <= 2 and float(difference.float().mean()) < 0.05
    gray, valid = source.get_image_tensor(3)
    assert not valid and gray.shape == (3, 224, 224) and int(gray.float().mean()) == 128


@pytest.mark.parametrize("fast", [True, False])
def test_dataset_reads_tensors_on_the_tensor_path(cfg_factory, tmp_path, fast):
    root = _jpeg_folder(tmp_path)
    train = {
        "DATA_SOURCES": ["disk_folder"],
        "DATA_PATHS": [str(root)],
        "FAST_TRANSFORMS": fast,
        "TRANSFORMS": config_transforms("simclr"),
    }
    dataset = build_dataset(cfg_factory(train=train), "TRAIN")
    assert dataset.transform.takes_image_tensors is fast
    calls = []
    source = dataset.data_objs[0]
    reader = source.get_image_tensor
    source.get_image_tensor = lambda idx: calls.append(idx) or reader(idx)
    items = [dataset[i] for i in range(4)]
    assert calls == ([0, 1, 2, 3] if fast else [])
    assert [item["data_valid"] for item in items] == [[1, 1], [1, 1], [1, 1], [-1, -1]]
    assert all(t.shape == (3, 224, 224) for item in items for t in item["data"])


def test_synthetic_source_tensors_are_its_images(cfg_factory):
    train = {"DATA_SOURCES": ["synthetic"], "DEFAULT_GRAY_IMG_SIZE": 16, "DATA_LIMIT": 30}
    source = build_dataset(cfg_factory(train=train), "TRAIN").data_objs[0]
    for idx in (0, 10, 29):
        tensor, valid = source.get_image_tensor(idx)
        assert valid and torch.equal(tensor, tensor_ops.pil_to_uint8(source[idx][0]))
    same_class = {source.get_image_tensor(i)[0].numpy().tobytes() for i in range(0, 30, 10)}
    assert len(same_class) == 3  # images of a class differ


def test_normalize_is_fused_only_when_it_follows_to_tensor_for_every_entry():
    normalize = {"name": "Normalize", "mean": [0.5] * 3, "std": [0.5] * 3}
    fused = build_transforms([{"name": "ToTensor"}, normalize])
    assert [w.name for w in fused.transforms] == ["ToImageTensor", "ToTensor"]
    (out,), _ = run(fused, photo(8, 6), 0)
    expected = T.Normalize([0.5] * 3, [0.5] * 3)(T.ToTensor()(photo(8, 6)))
    assert torch.allclose(out, expected, atol=1e-6)
    for other in (dict(normalize, indices=[0]), dict(normalize, std=[0.5, 0.0, 0.5])):
        built = build_transforms([{"name": "ToTensor"}, other])
        assert [w.name for w in built.transforms] == ["ToImageTensor", "ToTensor", "Normalize"]

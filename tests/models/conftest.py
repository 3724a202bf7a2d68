"""Fixtures for the model tests (helpers in tiny.py)."""

from __future__ import annotations

import pytest

from gc25d_core.compat import import_diffsynth

from .tiny import make_model

import_diffsynth()  # before any test module imports diffsynth directly (torchvision workaround)


@pytest.fixture(scope="module")
def tiny_model():
    return make_model(seed=0)


@pytest.fixture(scope="module")
def tiny_model_1layer():
    return make_model(seed=1, num_layers=1)

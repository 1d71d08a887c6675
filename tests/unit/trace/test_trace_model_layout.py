"""`trace.model` stays the one import point of the scheduling model after its split into layer modules."""

from __future__ import annotations

import inspect

import pytest

from trl_thundersync.trace import analytic, closed_forms, model, releases, replay


def public_names(layer) -> list[str]:
    """Functions and classes defined in `layer`, and its module constants; private names excluded."""
    names = []
    for name, value in vars(layer).items():
        if name.startswith("_"):
            continue
        defined_here = (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == layer.__name__
        if defined_here or name.isupper():
            names.append(name)
    return names


@pytest.mark.parametrize("layer", [replay, releases, closed_forms, analytic])
def test_model_re_exports_every_public_name_of_each_layer(layer):
    names = public_names(layer)
    assert names
    for name in names:
        assert name in model.__all__, name
        assert getattr(model, name) is getattr(layer, name)


def test_model_all_names_resolve():
    assert len(set(model.__all__)) == len(model.__all__)
    for name in model.__all__:
        assert hasattr(model, name), name

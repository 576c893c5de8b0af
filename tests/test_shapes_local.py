"""Issue 46 done-means 3 on the local backend: three public script shapes run unmodified
(tests/script_shapes.py says which and what is asserted)."""

from __future__ import annotations

import pytest

from conftest import needs_torch
from script_shapes import check_hydra, check_lightning, check_nanogpt, project

pytestmark = [pytest.mark.slow]

LOCAL = ("--cloud", "local")


@needs_torch
@pytest.mark.parametrize("shape,check", [("lightning_cli", check_lightning), ("hydra_app", check_hydra),
                                         ("nanogpt", check_nanogpt)])
def test_shape_runs_unmodified_on_local(home, tmp_path, shape, check):
    check(home, project(tmp_path, shape), LOCAL)

"""Shared pytest fixtures: a fresh random generator per test whose seed is printed on
failure (STRIDEATTN_TEST_SEED=N reproduces a run)."""

import os
import secrets

import numpy as np
import pytest


@pytest.fixture
def seed(request):
    s = int(os.environ.get("STRIDEATTN_TEST_SEED", secrets.randbits(32)))
    request.node.user_properties.append(("seed", s))
    return s


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


def pytest_runtest_makereport(item, call):
    if call.when == "call" and call.excinfo is not None:
        for k, v in item.user_properties:
            if k == "seed":
                item.add_report_section("call", "seed", f"STRIDEATTN_TEST_SEED={v}")

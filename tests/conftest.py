"""Shared test settings: hypothesis profiles (fast default, 'ci' larger, which .ci/run
selects with HYPOTHESIS_PROFILE=ci) and the `network` marker: such tests run only when asked
(--run-network or TG_NETWORK=1), so that a green run never depends on the network."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_addoption(parser):
    parser.addoption(
        "--run-network",
        action="store_true",
        help="also run the tests marked `network` (or set TG_NETWORK=1)",
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-network") or os.environ.get("TG_NETWORK") == "1":
        return
    skip = pytest.mark.skip(reason="needs the network: run with --run-network or TG_NETWORK=1")
    for item in items:
        if "network" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    import tensorgrad as tg

    tg.manual_seed(0)
    np.random.seed(0)


@pytest.fixture(autouse=True)
def _kernel_switches_kept():
    """A test that switches kernels on or off puts them back: under TG_KERNELS=0 every later
    test must still run the reference ops (a docs example once left them on, and a test
    comparing with the references saw the kernels' rounding)."""
    from tensorgrad import kernels

    before = (kernels.is_enabled(), sorted(kernels._disabled))
    yield
    after = (kernels.is_enabled(), sorted(kernels._disabled))
    assert after == before, f"the test left the kernel switches at {after}, not {before}"

import numpy as np
import pytest


@pytest.fixture
def rng():
    """Seeded generator: every random test is reproducible."""
    return np.random.default_rng(20261129)


def random_spd(rng, d, rank=None):
    """A random PSD matrix of the given rank (full rank by default)."""
    G = rng.standard_normal((d, d if rank is None else rank))
    return G @ G.T

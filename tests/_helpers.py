"""Small helpers shared by the tests (import as ``from _helpers import ...``)."""

import numpy as np


def random_spd(rng, d, rank=None):
    """A random PSD matrix of the given rank (full rank by default)."""
    G = rng.standard_normal((d, d if rank is None else rank))
    return G @ G.T


def relative_error(a, b):
    """Frobenius relative error over the last two axes."""
    return np.linalg.norm(np.asarray(a) - b, axis=(-2, -1)) / np.linalg.norm(b, axis=(-2, -1))

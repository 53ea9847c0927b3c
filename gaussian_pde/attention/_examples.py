"""The weights and initial moments of the built-in 2-D examples (main job and ``compare``).

Each type's ``example_setting()`` builds its example from these (``Attention.example_setting``).
"""

import numpy as np

__all__ = ["example_data"]


def example_data():
    """``(Q, K, V, q2, mean0, cov0)`` of the built-in 2-D examples."""
    return (np.array([[1.0, 0.5]]), np.array([[0.8, -0.2]]),
            np.array([[1.0, 0.3], [-0.2, 0.7]]), np.array([[0.2, 1.0]]),
            np.array([0.5, -0.3]), np.array([[1.0, 0.3], [0.3, 0.6]]))

"""The compiled softmax stack kernel against the generated NumPy products it replaces."""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde._generated import softmax as gen
from gaussian_pde.attention import compiled_kernel


@pytest.mark.parametrize("d, k", [(1, 1), (2, 1), (3, 5), (5, 5), (6, 2)])
@pytest.mark.parametrize("shared", [False, True])
def test_softmax_stack_kernel_matches_the_generated_products(rng, d, k, shared):
    """``softmax_apply_stack`` runs the products of the generated ``factor_apply`` in the
    same order, so equal to a few roundings, with one set of weights for all rows or one
    per row."""
    kernel = compiled_kernel("softmax_apply_stack")
    n = 7
    if shared:
        att = gp.Softmax(rng.standard_normal((k, d)), rng.standard_normal((k, d)),
                         rng.standard_normal((d, d)), scale=0.7)
        atts = [att] * n
    else:
        atts = [gp.Softmax(rng.standard_normal((k, d)), rng.standard_normal((k, d)),
                           rng.standard_normal((d, d)), scale=s)
                for s in rng.uniform(0.2, 2.0, n)]
    products = [gen.factor_weights(a.Q, a.K, a.V, a.scale) for a in atts]
    W = np.stack([p[0] for p in (products[:1] if shared else products)])
    L = rng.standard_normal((n, d, d))
    got = np.empty_like(L)
    kernel(W, L, got)
    want = np.stack([gen.factor_apply(p, Li) for p, Li in zip(products, L)])
    scale = np.abs(want).max(axis=(1, 2), keepdims=True)
    assert np.all(np.abs(got - want) <= 1e-14 * scale)

"""The compiled softmax kernels against the generated NumPy products they replace."""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde._generated import softmax as gen
from gaussian_pde.attention import compiled_kernel
from gaussian_pde.integrate._field import build_field


@pytest.mark.parametrize("d, k", [(1, 1), (2, 1), (3, 5), (5, 5), (6, 2)])
@pytest.mark.parametrize("shared", [False, True])
def test_field_of_a_softmax_stack_matches_the_generated_products(rng, monkeypatch, d, k,
                                                                 shared):
    """solve_batch's field runs a compiled loop for softmax stacks: the same products as
    the generated ``factor_apply`` in the same order, so equal to a few roundings, with
    one set of weights for all rows or one per row."""
    calls = []
    kernel = compiled_kernel("softmax_apply_stack")
    monkeypatch.setattr(gp.Softmax, "stack_kernel", classmethod(
        lambda cls: lambda *args: (calls.append(cls), kernel(*args))))
    n = 7
    if shared:
        att = gp.Softmax(rng.standard_normal((k, d)), rng.standard_normal((k, d)),
                         rng.standard_normal((d, d)), scale=0.7)
        atts = [att] * n
    else:
        atts = [gp.Softmax(rng.standard_normal((k, d)), rng.standard_normal((k, d)),
                           rng.standard_normal((d, d)), scale=s)
                for s in rng.uniform(0.2, 2.0, n)]
    field, _ = build_field(atts, n)
    idx = np.arange(n)
    field.set_active(idx)
    L = rng.standard_normal((n, d, d))
    got = field(L)
    want = np.stack([gen.factor_apply(gen.factor_weights(a.Q, a.K, a.V, a.scale), Li)
                     for a, Li in zip(atts, L)])
    scale = np.abs(want).max(axis=(1, 2), keepdims=True)
    assert np.all(np.abs(got - want) <= 1e-14 * scale)
    # a subset of rows (the active set shrinks as trajectories stop)
    sub = np.array([1, 4, 6])
    assert np.all(np.abs(field.at(sub, L[sub]) - want[sub]) <= 1e-14 * scale[sub])
    assert len(calls) == 2          # both evaluations ran the compiled loop


def test_complex_and_stacked_states_take_the_generated_products(rng):
    """The complex step and the finite-difference Jacobian's stacks (one more axis) are
    not real 3-D stacks: they run the generated products, and agree with the compiled
    real field on their real part."""
    atts = [gp.Softmax(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)),
                       rng.standard_normal((3, 3))) for _ in range(4)]
    field, _ = build_field(atts, 4)
    idx = np.arange(4)
    field.set_active(idx)
    L = rng.standard_normal((4, 3, 3))
    real = field(L)
    cplx = field(L + 1e-30j * rng.standard_normal((4, 3, 3)))
    assert np.iscomplexobj(cplx)
    np.testing.assert_allclose(cplx.real, real, rtol=1e-13)
    stack = field.at_stack(idx, np.repeat(L[:, None], 2, axis=1))
    assert stack.shape == (4, 2, 3, 3)
    np.testing.assert_allclose(stack[:, 1], real, rtol=1e-13)

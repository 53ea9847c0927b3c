"""The moment field of gp.solve's event loop: the compiled kernel, the NumPy reference, the
exact Jacobian.

``state_field`` is the right-hand side that :func:`scipy.integrate.solve_ivp` steps in the
event loop, ``moment_jacobian`` the Jacobian its implicit methods get; both must be the
type's compiled kernels where it has them and agree with the derivation's NumPy equations.
"""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.integrate._moment_field import (
    compiled_field_values,
    moment_jacobian,
    reference_field,
    state_field,
)

#: the registered types with exact moment equations whose covariance equation is mean-free
MEAN_FREE = [name for name, cls in gp.ATTENTIONS.items()
             if cls.gaussian_preserving and not cls.field_sees_mean]


def _instance(name, rng, d, k):
    """A random instance of ``name``: a head of query, key and value matrices alone with
    ``k``-row query and key matrices (scores of order one); a sum of heads, or a head with
    further weights (biases), by its class's ``example`` (all its weights random)."""
    cls = gp.ATTENTIONS[name]
    if (not issubclass(cls, gp.SingleHeadAttention)
            or cls.weight_names != gp.SingleHeadAttention.weight_names):
        return cls.example(d, rng)
    return cls(rng.standard_normal((k, d)), rng.standard_normal((k, d)),
               rng.standard_normal((d, d)) / np.sqrt(d))


#: those whose (random) instance has a closed-form Jacobian, sums of heads included
EXACT = [name for name in MEAN_FREE
         if _instance(name, np.random.default_rng(0), 3, 2).exact_jacobian]


@pytest.mark.parametrize("with_mean", [False, True])
@pytest.mark.parametrize("kind", EXACT)
def test_exact_jacobian_matches_finite_differences(kind, with_mean, rng):
    """The exact Jacobian of the factor form, and of the mean's rows ``[L | mean]``."""
    d, k = 3, 2
    att = _instance(kind, rng, d, k)
    jac = moment_jacobian(att, with_mean)
    m = d + 1 if with_mean else d

    def f(v):   # the generated moment equations, in the state layout [L | mean]
        Z = v.reshape(d, m)
        L = Z[:, :d]
        out = np.empty((d, m))
        out[:, :d] = att.factor_rhs(L)
        if with_mean:
            out[:, d] = gp.moment_rhs(att, Z[:, d], L @ L.T)[0]
        return out.ravel()

    y = rng.standard_normal(d * m)
    h = 1e-6
    fd = np.column_stack([(f(y + h * e) - f(y - h * e)) / (2 * h) for e in np.eye(d * m)])
    np.testing.assert_allclose(jac(0.0, y), fd, rtol=1e-6, atol=1e-7)
    for name in set(MEAN_FREE) - set(EXACT):    # no closed form: differences
        assert moment_jacobian(_instance(name, rng, d, k), with_mean) is None, name


#: every type of the package with exact moment equations (a field that sees the mean
#: included, with the mean only)
BUILT_IN = [name for name, cls in gp.ATTENTIONS.items()
            if cls.gaussian_preserving and cls.__module__.startswith("gaussian_pde.")]


def _without_compiled_field(att):
    """``att`` as an instance of a subclass without a compiled field (the reference path)."""
    cls = type(att)
    bare = type(cls.__name__, (cls,), {"compiled_field": lambda self: None})
    clone = object.__new__(bare)
    clone.__dict__.update(att.__dict__)
    return clone


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("kind", BUILT_IN)
def test_event_loop_field_is_the_compiled_kernel_and_the_numpy_reference(kind, k, rng):
    """The event loop's right-hand side is the type's compiled kernel, bit for bit, and
    agrees with the derivation's NumPy reference (``factor_rhs``, ``moment_rhs``) to
    1e-12 relative; its Jacobian is the compiled Jacobian kernel's; a type without a
    compiled field gets the reference itself. A field that sees the mean has no
    covariance-only state."""
    d = 4
    att = _instance(kind, rng, d, k)
    compiled = att.compiled_field()
    assert compiled is not None
    L, mean = rng.standard_normal((d, d)), rng.standard_normal(d)
    for with_mean in (False, True) if not att.field_sees_mean else (True,):
        m = d + 1 if with_mean else d
        Z = np.column_stack([L, mean]) if with_mean else L.copy()
        # the derivation's equations, independently of reference_field's assembly
        ref = np.empty((d, m))
        if with_mean:
            cov = L @ L.T
            ref[:, :d] = att.field_matrix_with_mean(cov, mean) @ L
            ref[:, d] = gp.moment_rhs(att, mean, cov)[0]
        else:
            ref[:] = att.factor_rhs(L)
        np.testing.assert_allclose(reference_field(att, with_mean)(Z), ref, rtol=1e-13,
                                   atol=1e-14 * np.abs(ref).max())
        field = state_field(att, with_mean)
        first = field(Z)
        np.testing.assert_array_equal(first, compiled_field_values(compiled, with_mean)(Z))
        np.testing.assert_allclose(first, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
        # a new array at every call (solve_ivp keeps the arrays it is given)
        second = field(2.0 * Z)
        assert not np.shares_memory(first, second)
        np.testing.assert_array_equal(field(Z), first)
        # the Jacobian: the compiled kernel's, where it has a closed form
        jac = moment_jacobian(att, with_mean)
        assert (jac is not None) == compiled.exact_jacobian == att.exact_jacobian
        if jac is not None:
            J = np.empty((d * m, d * m))
            assert compiled.jac(compiled.params, d, m, Z.ravel(), J, np.zeros(compiled.ws_size))
            np.testing.assert_array_equal(jac(0.0, Z.ravel()), J)
        # without a compiled field: the reference, and no closed-form Jacobian
        bare = _without_compiled_field(att)
        np.testing.assert_array_equal(state_field(bare, with_mean)(Z),
                                      reference_field(att, with_mean)(Z))
        assert moment_jacobian(bare, with_mean) is None and not bare.exact_jacobian
    # a non-finite trial state gives NaN (a rejected step), never a LAPACK error
    with np.errstate(all="ignore"):
        for field in (reference_field(att, True), compiled_field_values(compiled, True)):
            bad = field(np.full((d, d + 1), np.inf))
            assert bad.shape == (d, d + 1)


@pytest.mark.parametrize("with_mean", [False, True])
@pytest.mark.parametrize("kind", BUILT_IN)
def test_event_loop_jacobian_against_central_differences(kind, with_mean, rng):
    """``moment_jacobian`` (the compiled closed form) against central differences of the
    NumPy reference field, for every built-in type that has one."""
    from gaussian_pde._common.differences import central_jacobian

    d = 3
    att = _instance(kind, rng, d, 2)
    if att.field_sees_mean and not with_mean:
        pytest.skip("no covariance-only state")
    jac = moment_jacobian(att, with_mean)
    if not att.exact_jacobian:
        assert jac is None
        return
    m = d + 1 if with_mean else d
    Z = rng.standard_normal((d, m)) / 2
    ref = central_jacobian(reference_field(att, with_mean), Z)
    np.testing.assert_allclose(jac(0.0, Z.ravel()), ref, rtol=1e-6,
                               atol=1e-7 * np.abs(ref).max())


def test_a_field_that_sees_the_mean_needs_the_mean():
    att = gp.ATTENTIONS["linear"].example(2, np.random.default_rng(0))
    assert att.field_sees_mean
    with pytest.raises(TypeError, match="must hold the mean"):
        state_field(att, False)

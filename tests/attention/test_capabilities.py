"""What a type can do lives on the type: every registered type offers what it declares.

Parametrised over :data:`gaussian_pde.ATTENTIONS` (a new type is checked as soon as it is
registered, with the instance its ``example(d, rng)`` builds); the checks themselves are in
``tests/attention/capability_checks.py``.
"""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.attention import ParticleDiagnostics, capabilities, has_hook, names_with
from tests.attention import capability_checks as checks

NAMES = list(gp.ATTENTIONS)


@pytest.mark.parametrize("name", NAMES)
def test_type_offers_what_it_declares(name, rng):
    checks.check_all(gp.ATTENTIONS[name], rng)


@pytest.mark.parametrize("name", NAMES)
def test_example_is_reproducible_and_sized(name):
    cls = gp.ATTENTIONS[name]
    for d in (1, 3):
        a, b = cls.example(d, np.random.default_rng(5)), cls.example(d, 5)
        assert a.d == d and a == b


@pytest.mark.parametrize("name", NAMES)
def test_capabilities_are_what_the_type_implements(name):
    """``exact_jacobian`` and ``closure`` are read off what the type implements, never
    declared; ``exact_jacobian`` off its compiled field (a sum of heads: per instance)."""
    cls = gp.ATTENTIONS[name]
    caps = capabilities(cls)
    field = cls.example(2, 0).compiled_field() if cls.gaussian_preserving else None
    exact = (field is not None and field.exact_jacobian and not has_hook(cls, "from_heads"))
    assert caps["exact_jacobian"] == exact == cls.exact_jacobian
    expected = ("block_causal" if cls.uses_positions else
                "quadrature" if has_hook(cls, "gaussian_closure_field") else None)
    assert caps["closure"] == cls.closure == expected
    # a type with exact moments has no closure; one without has no Jacobian
    assert cls.gaussian_preserving == (cls.closure is None) or not cls.gaussian_preserving
    if not cls.gaussian_preserving:
        assert not cls.exact_jacobian
    for attr in ("exact_jacobian", "closure"):
        assert all(attr not in vars(base) for base in cls.__mro__
                   if base is not gp.Attention), (name, attr)


def test_every_class_declares_the_attributes():
    """On every public attention class, including the abstract bases (safe defaults)."""
    assert gp.Attention.exact_jacobian is False and gp.Attention.closure is None
    assert gp.SingleHeadAttention.exact_jacobian is False
    for cls in (gp.Attention, gp.SingleHeadAttention, *gp.ATTENTIONS.values()):
        for attr in ("gaussian_preserving", "exact_jacobian", "closure", "uses_positions",
                     "particle_kernel", "example"):
            assert hasattr(cls, attr), (cls, attr)


def test_mean_generator_only_where_the_mean_ignores_the_covariance(rng):
    """Sinkhorn's mean obeys alpha' = V alpha; softmax and L2 means involve Sigma."""
    sk = gp.Sinkhorn.example(3, rng)
    np.testing.assert_array_equal(sk.mean_generator(), sk.V)
    assert gp.Softmax.example(3, rng).mean_generator() is None
    assert gp.L2.example(3, rng).mean_generator() is None
    pair = gp.MultiHead.example(3, rng, heads=(gp.Sinkhorn, gp.Sinkhorn))
    np.testing.assert_allclose(pair.mean_generator(), pair.heads[0].V + pair.heads[1].V)
    assert gp.MultiHead.example(3, rng, heads=(gp.Sinkhorn, gp.L2)).mean_generator() is None


def test_multihead_capabilities_come_from_its_heads(rng):
    exact = gp.MultiHead.example(2, rng, heads=(gp.Softmax, gp.L2))
    assert exact.exact_jacobian is True
    mixed = gp.MultiHead.example(2, rng, heads=(gp.Softmax, gp.Sinkhorn))
    assert mixed.exact_jacobian is False
    nested = gp.MultiHead([exact, gp.Softmax.example(2, rng)])
    assert nested.exact_jacobian is True
    # the class value is the one every instance has
    assert gp.MultiHead.exact_jacobian is False and gp.MultiHead.gaussian_preserving
    for att in (exact, mixed):
        checks.check_declared(att)
        checks.check_jacobian(att, rng)


def test_names_with_filters_the_registry():
    for key, value in [("gaussian_preserving", True), ("exact_jacobian", True),
                       ("closure", "block_causal"), ("quadratic_score", True)]:
        assert names_with(**{key: value}) == [
            n for n, cls in gp.ATTENTIONS.items() if capabilities(cls)[key] == value]
    assert names_with() == NAMES
    # at least one built-in type on each side of every split the solvers make
    assert names_with(exact_jacobian=True) and names_with(exact_jacobian=False)
    assert names_with(gaussian_preserving=False) and names_with(closure="quadrature")


class _ParticlesOnly(gp.SingleHeadAttention):
    """Not Gaussian-preserving and no closure: the closure engine must refuse it."""

    name = "particles_only"
    gaussian_preserving = False

    def moment_rhs(self, mean, cov):
        raise TypeError("particles_only does not preserve Gaussians.")

    def particle_kernel(self, x, opts):
        return np.tanh(x) @ self.V.T, ParticleDiagnostics(ess=np.ones(x.shape[0]))


def test_non_preserving_type_without_closure_is_refused_by_the_closure_engine(rng):
    att = _ParticlesOnly.example(2, rng)
    with pytest.raises(TypeError, match="declares no Gaussian closure"):
        gp.AttentionField(att)
    with pytest.raises(TypeError, match="declares no Gaussian closure"):
        gp.closure_moment_rhs(att, np.zeros(2), np.eye(2))
    with pytest.raises(TypeError, match="declares no Gaussian closure"):
        gp.Stack(att, n_layers=2, h=0.1)
    checks.check_closure(att, rng)
    checks.check_particles(att, rng)


def _subclass(**attrs):
    return type("Bad", (gp.Softmax,), {"name": "bad", **attrs})


def _closure_field(self, mean, cov, x, tol):
    return x


@pytest.mark.parametrize("attrs, exc, match", [
    (dict(closure="moments"), TypeError, "`closure` is derived"),
    (dict(exact_jacobian=True), TypeError, "`exact_jacobian` is derived"),
    (dict(gaussian_closure_field=_closure_field), ValueError,
     "Gaussian-preserving type has exact"),
    (dict(gaussian_preserving=False, gaussian_closure_field=_closure_field), ValueError,
     "`compiled_field` needs exact moment equations"),
    (dict(uses_positions=1), TypeError, "`uses_positions` must be True or False"),
])
def test_register_checks_declared_capabilities(attrs, exc, match):
    before = dict(gp.ATTENTIONS)
    with pytest.raises(exc, match=match):
        gp.register_attention(_subclass(**attrs))
    assert gp.ATTENTIONS == before


def test_register_requires_a_particle_kernel():
    class NoKernel(gp.SingleHeadAttention):
        name = "no_kernel"

    before = dict(gp.ATTENTIONS)
    with pytest.raises(TypeError, match="no particle kernel"):
        gp.register_attention(NoKernel)
    assert gp.ATTENTIONS == before


def test_the_deprecated_field_hooks_warn_and_are_not_called(rng):
    """A class that still defines the NumPy right-hand sides or Jacobian pieces of the
    earlier contract is accepted with a DeprecationWarning, and ``gp.solve`` integrates
    its compiled field (hooks that raise are never reached)."""
    def never(*args, **kwargs):
        raise AssertionError("a deprecated hook was called")

    with pytest.warns(DeprecationWarning, match="`fused_term`, `jacobian_parts`"):
        Old = type("Old", (gp.Softmax,), {"fused_term": never,
                                          "jacobian_parts": classmethod(never)})
    assert capabilities(Old)["exact_jacobian"] is True
    att = Old.example(2, rng)
    ref = gp.Softmax(att.Q, att.K, att.V)
    for method in ("RK45", "Radau"):
        a = gp.solve(att, None, 0.3 * np.eye(2), (0.0, 0.5), method=method)
        b = gp.solve(ref, None, 0.3 * np.eye(2), (0.0, 0.5), method=method)
        assert a.status == b.status == "finished"
        np.testing.assert_array_equal(a.cov_final, b.cov_final)


def test_names_with_refuses_an_unknown_capability():
    with pytest.raises(ValueError, match="unknown capabilities"):
        names_with(jacobian_parts=True)


@pytest.mark.parametrize("name", NAMES)
def test_head_docstring_states_its_weights(name):
    """A head's docstring gets the shared weights entries where it says ``%(weights)s``: none
    is left unfilled, and a head that takes ``Q, K, V`` documents them."""
    cls = gp.ATTENTIONS[name]
    doc = cls.__doc__ or ""
    assert "%(" not in doc
    if issubclass(cls, gp.attention.SingleHeadAttention):
        assert "Q, K : array_like, shape (k, d)" in doc and "V : array_like, shape (d, d)" in doc


def test_weights_doc_is_filled_in_a_new_head():
    class Head(gp.attention.SingleHeadAttention):
        """A head.

        Parameters
        ----------
        %(weights)s
        %(scale)s
        """

    assert gp.attention.SingleHeadAttention.__doc__.count("Query and key matrices.") == 1
    assert "Query and key matrices." in Head.__doc__ and "Score scale" in Head.__doc__
    assert "%(" not in Head.__doc__

"""The compiled fields' one source, run uncompiled: each type's head body and Jacobian
parts, and the shared templates that sum heads, as plain Python against the NumPy hooks
(``factor_rhs``, ``moment_rhs``) and central differences."""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde._common.differences import central_jacobian
from gaussian_pde.attention import _compiled_fields as cf
from gaussian_pde.attention import has_hook, names_with


def _package_heads():
    """The single-head types whose field this package compiles from a head body."""
    return [name for name in names_with(gaussian_preserving=True)
            if issubclass(gp.ATTENTIONS[name], gp.SingleHeadAttention)
            and has_hook(gp.ATTENTIONS[name], "compiled_field")
            and gp.ATTENTIONS[name].example(2, 0).compiled_field().heads]


def _python_head(head):
    """A head's kernels as plain Python (nothing compiled, :func:`cf._plain_kernels`): its
    body and parts with the pack unpacked in front, its Jacobian assembled from its parts."""
    rhs, jac = cf._plain_kernels(head, "test")
    return rhs, jac if jac is not None else cf._no_jacobian


def _python_sum(heads, P):
    """The templates of :func:`cf._sum_kernels` bound as plain Python, the heads' own
    kernels too: each address in the pack ``P`` stands for its head's plain kernel."""
    table, o = {}, 1
    for head in heads:
        rhs, jac = _python_head(head)
        table[P[o], 0], table[P[o + 1], 1] = rhs, jac
        o += 3
        for _ in range(int(P[o - 1])):
            o += 1 + int(P[o])

    def fn_at(address, kind):
        return table[address, kind]

    return (cf._instance(cf._sum_rhs, "rhs", _fn_at=fn_at),
            cf._instance(cf._sum_jac, "jac", _fn_at=fn_at))


def _expected(att, Z, d):
    """``Z' = [M L | alpha']`` from the type's NumPy hooks (``factor_rhs`` without the mean)."""
    L = Z[:, :d]
    if Z.shape[1] == d:
        return att.factor_rhs(L)
    mean = Z[:, d]
    dmean, _ = gp.moment_rhs(att, mean, L @ L.T)
    return np.column_stack([att.field_matrix_with_mean(L @ L.T, mean) @ L, dmean])


def _states(att, d, rng):
    yield from ([] if att.field_sees_mean else [rng.standard_normal((d, d)) / 2])
    yield np.column_stack([rng.standard_normal((d, d)) / 2, rng.standard_normal(d)])


@pytest.mark.parametrize("name", _package_heads())
def test_each_head_body_uncompiled_is_the_types_numpy_field(name, rng, uncompiled):
    """A head body, as plain Python, against ``factor_rhs`` and ``moment_rhs``."""
    d = 3
    att = gp.ATTENTIONS[name].example(d, rng)
    field = att.compiled_field()
    uncompiled()
    head, = field.heads
    P = field.params
    size, k = int(P[1]), int(P[2])
    data = P[3:3 + size]
    assert not hasattr(head.body, "py_func")
    for Z in _states(att, d, rng):
        m = Z.shape[1]
        out = np.empty(d * m)
        head.body(data, k, d, m, np.ascontiguousarray(Z).ravel(), out, np.zeros(field.ws_size))
        np.testing.assert_allclose(out.reshape(d, m), _expected(att, Z, d), rtol=1e-12,
                                   atol=1e-12, err_msg=name)


@pytest.mark.parametrize("name", _package_heads())
def test_each_jacobian_uncompiled_against_central_differences(name, rng, uncompiled):
    """A head's Jacobian parts, assembled by the shared template, all plain Python,
    against central differences of its body; a type without parts says it has none."""
    d = 3
    att = gp.ATTENTIONS[name].example(d, rng)
    field = att.compiled_field()
    uncompiled()
    rhs, jac = _python_head(field.heads[0])
    assert field.exact_jacobian == (field.heads[0].parts is not None)
    for Z in _states(att, d, rng):
        m = Z.shape[1]
        ws = np.zeros(field.ws_size)

        def f(Zp, m=m, ws=ws):
            out = np.empty(d * m)
            rhs(field.params, d, m, np.ascontiguousarray(Zp).ravel(), out, ws)
            return out.reshape(d, m)

        J = np.zeros((d * m, d * m))
        assert jac(field.params, d, m, np.ascontiguousarray(Z).ravel(), J, ws) == field.exact_jacobian
        if field.exact_jacobian:
            ref = central_jacobian(f, Z)
            np.testing.assert_allclose(J, ref, rtol=1e-6, atol=1e-7 * np.abs(ref).max(),
                                       err_msg=name)


@pytest.mark.parametrize("exact", [False, True])
def test_a_sum_of_heads_uncompiled_is_the_sum_of_the_fields(rng, uncompiled, exact):
    """The shared templates that sum heads (runs of one kernel and different kernels, in
    the heads' order), as plain Python: the sum of the heads' NumPy fields, and, where
    every head has a closed form, its Jacobian against central differences; the
    compiled kernels give the same bits."""
    d, m = 3, 4
    names = [n for n in _package_heads() if not gp.ATTENTIONS[n].field_sees_mean
             and (not exact or gp.ATTENTIONS[n].example(2, 0).compiled_field().exact_jacobian)]
    heads = [gp.ATTENTIONS[n].example(d, rng) for n in names + names[:1]]
    heads.insert(1, gp.ATTENTIONS[names[0]].example(d, rng))     # a run of two
    att = gp.MultiHead(heads)
    field = att.compiled_field()
    assert len(field.heads) == len(names) + 1 and field.params[3] == 2.0
    assert field.exact_jacobian == exact
    Z = np.column_stack([rng.standard_normal((d, d)) / 2, rng.standard_normal(d)])
    ws = np.zeros(field.ws_size)
    compiled, J_compiled = np.empty(d * m), np.empty((d * m, d * m))
    field.rhs(field.params, d, m, Z.ravel(), compiled, ws)
    assert field.jac(field.params, d, m, Z.ravel(), J_compiled, ws) == exact
    uncompiled()
    rhs, jac = _python_sum(field.heads, field.params)

    def f(Zp):
        out = np.empty(d * m)
        rhs(field.params, d, m, np.ascontiguousarray(Zp).ravel(), out, ws)
        return out.reshape(d, m)

    np.testing.assert_allclose(f(Z), sum(_expected(h, Z, d) for h in heads), rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_array_equal(f(Z).ravel(), compiled)
    J = np.empty((d * m, d * m))
    assert jac(field.params, d, m, Z.ravel(), J, ws) == exact
    if exact:
        ref = central_jacobian(f, Z)
        np.testing.assert_allclose(J, ref, rtol=1e-6, atol=1e-7 * np.abs(ref).max())
        np.testing.assert_array_equal(J, J_compiled)


def test_a_foreign_head_with_a_jacobian_in_a_sum(rng):
    """A field of kernels of its own (as another package's) is one head of a sum: its
    data its packed vector, its Jacobian added to the others' (here softmax's own
    kernels as a foreign field, summed with an L2 head and itself)."""
    import dataclasses

    d, m = 3, 4
    soft, l2 = gp.Softmax.example(d, rng), gp.L2.example(d, rng)
    foreign = dataclasses.replace(soft.compiled_field(), heads=())
    field = cf.add([foreign, l2.compiled_field(), foreign])
    assert field.exact_jacobian and len(field.heads) == 3
    Z = np.column_stack([rng.standard_normal((d, d)) / 2, rng.standard_normal(d)])
    ws = np.zeros(field.ws_size)

    def f(Zp):
        out = np.empty(d * m)
        field.rhs(field.params, d, m, np.ascontiguousarray(Zp).ravel(), out, ws)
        return out.reshape(d, m)

    np.testing.assert_allclose(f(Z), 2 * _expected(soft, Z, d) + _expected(l2, Z, d),
                               rtol=1e-12, atol=1e-12)
    J = np.empty((d * m, d * m))
    assert field.jac(field.params, d, m, Z.ravel(), J, ws)
    ref = central_jacobian(f, Z)
    np.testing.assert_allclose(J, ref, rtol=1e-6, atol=1e-7 * np.abs(ref).max())


def test_specialised_needs_one_head_of_the_packages_kernels(rng):
    """A shape's kernel is compiled for one head of a head body; a sum of heads and a
    field of kernels of its own keep the generic kernel."""
    import dataclasses

    soft = gp.Softmax.example(3, rng).compiled_field()
    assert soft.specialised().rhs is not soft.rhs
    two = gp.MultiHead([gp.Softmax.example(3, rng)] * 2).compiled_field()
    assert two.rhs is not soft.rhs and two.specialised() is two
    foreign = dataclasses.replace(soft, heads=())
    assert foreign.specialised() is foreign


def test_a_compiled_field_pickles_to_the_same_kernels(rng):
    """A compiled field (one head, and a sum with a field of kernels of its own) goes
    through pickle: the same kernels, heads and packed weights."""
    import dataclasses
    import pickle

    soft = gp.Softmax.example(3, rng).compiled_field()
    foreign = dataclasses.replace(gp.L2.example(3, rng).compiled_field(), heads=())
    for field in (soft, cf.add([soft, foreign, soft])):
        back = pickle.loads(pickle.dumps(field))
        assert back.rhs is field.rhs and back.jac is field.jac
        assert all(a is b for a, b in zip(back.heads, field.heads))
        np.testing.assert_array_equal(back.params, field.params)


def _parts_like(data, k, d, m, Z, A, C, M, N, r):
    """A stand-in for a head's parts: returns from inside a loop and a branch."""
    for i in range(d):
        if data[i] < 0:
            return False
    if data[1] == 0:
        return
    A[0, 0] = data[0] * k
    return data[0] > 1


def test_a_spliced_kernel_runs_the_statements_after_its_prologue_each_return_rewritten():
    """:func:`cf._spliced`: the function's statements after the prologue, in a function of
    the kernel's arguments, each ``return v`` replaced by the given expression of ``v``
    (here: recorded), wherever it stands; the line numbers are the function's."""
    seen = []

    def finish(ok, A, *rest):
        seen.append((bool(ok), A[0, 0]))
        return ok

    jac = cf._spliced(_parts_like, "jac_t", "P, d, m, y, J, ws", cf._JAC_PROLOGUE,
                      cf._JAC_RESERVED, returns=cf._JAC_RETURN, _np=np, _finish=finish)
    assert jac.__code__.co_firstlineno == _parts_like.__code__.co_firstlineno
    J = np.ones((4, 4))
    P = np.array([1.0, 2.0, 3.0, 2.0, 5.0])             # alone, size 2, k = 3, data [2, 5]
    assert jac(P, 2, 2, np.arange(4.0), J, np.zeros(8))
    assert seen == [(True, 6.0)] and not J.any()       # J zeroed for a head alone
    P[3] = -1.0
    P[0] = 0.0                                         # a head of a sum: J kept
    assert not jac(P, 2, 2, np.arange(4.0), J + 1, np.zeros(8))
    assert seen[-1][0] is False
    P[3:] = 2.0, 0.0                                   # a bare return: None, declined
    assert not jac(P, 2, 2, np.arange(4.0), J + 1, np.zeros(8))
    assert len(seen) == 3 and seen[-1][0] is False


def test_a_head_function_that_assigns_a_name_of_its_kernel_is_refused():
    def body(data, k, d, m, y, out, ws):
        P = data                                       # noqa: F841 (the kernel's pack)
        out[0] = 1.0

    with pytest.raises(TypeError, match=r"assigns P, names its kernel reserves"):
        cf._spliced(body, "rhs_t", "P, d, m, y, out, ws", cf._RHS_PROLOGUE, cf._RHS_RESERVED)
    plain = eval("lambda data, k, d, m, y, out, ws: None")      # no source to read
    with pytest.raises(TypeError, match="source cannot be read"):
        cf._spliced(plain, "rhs_t", "P, d, m, y, out, ws", cf._RHS_PROLOGUE, cf._RHS_RESERVED)


_FINISH_SIGNATURES = """
import gaussian_pde as gp
from gaussian_pde.attention import _compiled_fields as cf
heads = {head for name in gp.ATTENTIONS for head in
         getattr(gp.ATTENTIONS[name].example(2, 0).compiled_field(), "heads", ())
         if isinstance(head, cf.HeadKernel) and head.exact}
for head in heads:
    head.kernels()
print(" ".join(str(len(cf._finish_kernel(head.assembly).signatures)) for head in heads))
"""


@pytest.mark.slow
def test_the_end_of_every_jacobian_kernel_is_compiled_once(tmp_path):
    """On a fresh machine (an empty cache) the Jacobian's end (:func:`cf._finish_jac`) is
    compiled for one signature per assembly, whether the parts return the constant True,
    the constant False or a computed answer (a constant would compile one copy each)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    out = subprocess.run([sys.executable, "-c", _FINISH_SIGNATURES], capture_output=True,
                         text=True, check=True, cwd=root,
                         env=dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))).stdout.split()
    assert out and set(out) == {"1"}, out

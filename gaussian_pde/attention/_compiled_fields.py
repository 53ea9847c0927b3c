r"""Compiled (Numba) factor fields: the shared machinery, which names no attention type.

A type's :meth:`~gaussian_pde.Attention.compiled_field` returns a :class:`CompiledField`:
two compiled kernels with fixed signatures and the type's weights packed into one
float64 vector. The integrator (:mod:`gaussian_pde.integrate._compiled_engine`) is
compiled once against those signatures (first-class function types, cached on disk),
so it serves every type that supplies kernels, without knowing which type it is.

``rhs(P, d, m, y, out, ws)``
    The flat state ``y`` is :math:`Z = [L \mid \alpha]` (``d x m``, row-major;
    ``m = d`` without the mean, ``d + 1`` with it); ``out`` receives
    :math:`Z' = [M(\Sigma)L \mid b + M\alpha]` (docs/math.md sections 3 and 10);
    ``ws`` is scratch of at least :attr:`CompiledField.ws_size` entries.
``jac(P, d, m, y, J, ws) -> bool``
    The exact Jacobian :math:`\partial Z'/\partial Z` (``n x n``, ``n = dm``) into ``J``;
    ``False`` where no closed form holds there (the integrator takes central
    differences of ``rhs`` instead).

**A type's field, written once.** A type of this package states its field in its
derivation (``derivations/<type>.py``), from which ``derivations/generate.py`` prints the
plain-Python head into ``gaussian_pde/_generated/<type>.py`` (``field_body``,
``field_parts``); the type's module wraps them in a :class:`HeadKernel`:

``body(data, k, d, m, y, out, ws)``
    one head's :math:`Z'` from its weights ``data`` (the type's own layout) and its
    inner size ``k``;
``parts(data, k, d, m, Z, A, C, M, N, r) -> bool`` (optional)
    the pieces of its closed-form Jacobian, where :math:`dM[d\Sigma] = A\,d\Sigma\,C`
    (assembled by :func:`assemble`, below) and, with the mean,
    :math:`\partial\alpha'/\partial\alpha = N`, ``r`` the vector of the mean rows below;
    False where the closed form does not hold. A head whose field matrix depends on
    the second moment :math:`P = ZZ^T = \Sigma + \alpha\alpha^T` (``second_moment``:
    :math:`Z' = M(P)Z`, no offset, :math:`dM[dP] = A\,dP\,C`) gives ``A, C, M`` alone.

The bodies, the parts and the functions they call (the shared numerics of
:mod:`gaussian_pde._common.kernels`) are marked by :func:`compiled_later` (plain Python
until a field is first compiled, so the tests also run them uncompiled). This module makes a
head's kernels from the body's and the parts' own statements, the kernel's arguments
unpacked in front (:func:`_spliced`: the code they would run inlined, compiled from their
source), and the sums' kernels from templates (copies of its functions calling the
heads' kernels, :func:`_instance`); it assembles the Jacobian from the parts once for
every type (:func:`assemble`):
:math:`J_{ij,ab} = M_{ia}\delta_{jb} + A_{ia}(L^TB)_{bj} + (AL)_{ib}B_{aj}`,
:math:`B = CL`, and for the mean rows
:math:`\partial\alpha'_i/\partial L_{ab} = A_{ia}(L^Tr)_b + (AL)_{ib}r_a`,
:math:`\partial\alpha'/\partial\alpha = N`; for a ``second_moment`` head, over the
whole state, :math:`J_{ij,ab} = M_{ia}\delta_{jb} + A_{ia}(Z^TCZ)_{bj} + (AZ)_{ib}(CZ)_{aj}`
(:func:`assemble_second_moment`).

**The packed vectors.** One head: ``[1, size, k, data...]`` (``size`` entries of
data; the first 0 for a head of a sum, whose Jacobian is added), its kernels the body
and the parts with the pack unpacked in front (one pair per head kernel,
:func:`_head_kernels`). A sum of heads
(:func:`add`): runs of adjacent heads of one kernel, in the heads' order,
``[R, (f, j, n, (size, pack...) * n) * R]`` (``R`` runs of ``n`` heads, each head its
own pack; ``f`` and ``j`` the addresses of the run's field and Jacobian-adding
kernels, held exactly in float64, this process's: :func:`_addresses`, again on
unpickling). Its kernels :func:`_sum_rhs` and :func:`_sum_jac` are compiled once for
every sum (:func:`_sum_kernels`) and call each run's kernels through their addresses
on each pack: a head's code is compiled once, in its own kernel, never again into a
sum. The field is summed
head by head in order, :math:`Z' = (\dots(Z'_1 + Z'_2) + \dots) + Z'_H`, and the
Jacobian likewise, each head added in place. A type of another package brings its own
``rhs`` and ``jac`` (:func:`signatures`); in a sum it is one head whose pack is its
own packed vector.

Numba is imported when a type first asks for its compiled field, not with the package.
The kernels are cached on disk under names that carry a digest of the sources of every
module they are compiled from, so an edit of a type's module compiles them again.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import math
import sys
import textwrap
import types

import numpy as np

from .._common.compiled import MARKED as _MARKED
from .._common.compiled import compiled_later, sources_stamp
from .._common.kernels import (  # noqa: F401 (the heads' shared numerics, also as cf.<name>)
    SPREAD_MAX,
    cholesky_solve,
    copy2,
    fill_nan,
    finite,
    gain,
    gain_qr,
    inverse_gram_qr,
    mm,
    spread_ok,
    upper_solve,
)

__all__ = ["CompiledField", "compiled_field_of", "HeadKernel", "compiled_later", "head_field", "add", "kernels",
           "signatures"]



@dataclasses.dataclass(frozen=True)
class CompiledField:
    """What :meth:`~gaussian_pde.Attention.compiled_field` returns.

    Attributes
    ----------
    rhs, jac : numba dispatchers
        The kernels (signatures in the module docstring).
    params : ndarray, shape (p,)
        The packed weights.
    d : int
        Token dimension.
    ws_size : int
        Scratch the kernels need, for ``m = d + 1`` (enough for ``m = d``).
    exact_jacobian : bool
        Whether ``jac`` can return a closed form (otherwise it always returns False).
    heads : tuple of HeadKernel
        The kernels of the runs of heads of ``params`` (a field made by this module);
        empty for a type's own kernels (another package's).
    """

    rhs: object
    jac: object
    params: np.ndarray
    d: int
    ws_size: int
    exact_jacobian: bool
    heads: tuple = ()

    def __reduce__(self):
        if self.rhs in _SUMS:           # a sum: the addresses in its pack are this process's
            return _summed, (self.heads, self.params, self.d, self.ws_size,
                             self.exact_jacobian)
        return CompiledField, (self.rhs, self.jac, self.params, self.d, self.ws_size,
                               self.exact_jacobian, self.heads)

    def specialised(self, compile=True):
        """The same field with ``rhs`` compiled for its one head's kernel, ``d`` and ``k``.

        The constants let the compiler unroll the small loops: at ``d = k = 3`` the
        softmax field costs a third of the generic kernel's time, with the same
        operations in the same order (the same bits). The kernel is compiled at the
        first request of a kernel and shape (cached on disk), so the integrator asks for
        it only where a batch is large enough to repay that. A sum of heads, a type's
        own kernels (another package's), and a body that allocates (the shape's kernel
        is compiled without reference counting) keep the generic kernels (returned as they are).
        ``compile`` False: only where Numba's disk cache holds that kernel already (loaded
        in milliseconds), else the field as it is.
        """
        if len(self.heads) != 1 or not isinstance(self.heads[0], HeadKernel):
            return self
        head = self.heads[0]
        if self.rhs is not head.kernels()[0] or head.counted:
            return self                         # a sum of heads, or a body that allocates
        k = int(self.params[2])
        if not compile and not _shape_cached(head, self.d, k):
            return self
        rhs = _shape_rhs(head, self.d, k)
        return dataclasses.replace(self, rhs=rhs)


# ----------------------------------------------------------------------------------------
# functions compiled at first use
# ----------------------------------------------------------------------------------------

#: plain function -> its dispatcher, once compiled
_DISPATCHERS = {}


def _compile_marked():
    """Replace every marked function in its module by its Numba dispatcher.

    Lazy: each is compiled at its first call from a kernel. Not cached on disk: the
    kernels that call them are, with the sources of their modules in their names
    (:func:`_digest`).
    """
    from numba import njit

    for fn in _MARKED:
        if fn in _DISPATCHERS:
            continue
        disp = njit(cache=False, error_model="numpy", **fn.compile_options)(fn)
        _DISPATCHERS[fn] = disp
        for module in (sys.modules.get(fn.__module__), sys.modules[__name__]):
            if module is not None and getattr(module, fn.__name__, None) is fn:
                setattr(module, fn.__name__, disp)      # also the names this module imports


def _dispatcher(fn):
    """The compiled ``fn`` (marked by :func:`compiled_later`), or ``fn`` if already one."""
    return _DISPATCHERS.get(fn, fn)


# ----------------------------------------------------------------------------------------
# the heads' kernels
# ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class HeadKernel:
    r"""The compiled field of one kind of head: its ``body``, and its Jacobian's ``parts``.

    Parameters
    ----------
    body : function
        ``body(data, k, d, m, y, out, ws)``, marked by :func:`compiled_later`.
    parts : function or None
        ``parts(data, k, d, m, Z, A, C, M, N, r) -> bool``, marked by
        :func:`compiled_later`; None: no closed-form Jacobian.
    second_moment : bool
        Whether the field is :math:`Z' = M(P)Z` with :math:`P = ZZ^T` (the mean's
        column included, no offset): its Jacobian is assembled over the whole state
        (:func:`assemble_second_moment`), not as :math:`[M(\Sigma)L \mid b + M\alpha]`
        (:func:`assemble`).

    A type of this package creates one at import; :func:`kernels` compiles those.
    """

    body: object
    parts: object = None
    second_moment: bool = False

    def __post_init__(self):
        _HEAD_KERNELS.append(self)

    def __reduce__(self):
        # by the name of its body: its functions are replaced by their dispatchers
        return _head_kernel, (self.body.__module__, self.body.__qualname__)

    @property
    def counted(self):
        """Whether the body allocates (then a shape's kernel keeps the generic one)."""
        return self.body.compile_options["_nrt"]

    @property
    def exact(self):
        return self.parts is not None

    @property
    def assembly(self):
        """The function that assembles the Jacobian from the parts (``assemble`` in :func:`_finish_jac`).

        Compiled, or plain Python while the marked functions are.
        """
        return assemble_second_moment if self.second_moment else assemble

    def name(self):
        return ",".join(f"{fn.__module__}.{fn.__qualname__}"
                        for fn in (self.body, self.parts) if fn is not None)

    def sources(self):
        return {inspect.getfile(fn) for fn in _MARKED}

    def kernels(self):
        """``(rhs, jac)`` of one head, its pack ``[1, size, k, data...]`` (:func:`_head_kernels`)."""
        return _head_kernels(self)

    def jac_add(self):
        """``add(P, d, m, y, J, ws) -> bool``: the head's Jacobian added to ``J``.

        Its own Jacobian kernel, given its pack with ``P[0] = 0`` (:data:`_JAC_PROLOGUE`).
        """
        return self.kernels()[1] if self.exact else None


#: every :class:`HeadKernel` created (the types of this package, at import)
_HEAD_KERNELS = []


def _head_kernel(module, qualname):
    """The :class:`HeadKernel` whose body is ``module.qualname`` (an unpickled one)."""
    importlib.import_module(module)
    for head in _HEAD_KERNELS:
        if (head.body.__module__, head.body.__qualname__) == (module, qualname):
            return head
    raise LookupError(f"no head kernel with the body {module}.{qualname}")


@dataclasses.dataclass(frozen=True, eq=False)
class _ForeignHead:
    """A type's own kernels (another package's) as one head of a sum.

    Its pack is its own packed vector; its Jacobian (where it has one) is added to the sum's.
    """

    rhs: object
    jac: object
    exact: bool

    def __reduce__(self):
        return _foreign, (self.rhs, self.jac, self.exact)

    def name(self):
        return ",".join(f"{f.py_func.__module__}.{f.py_func.__qualname__}"
                        for f in (self.rhs, self.jac))

    def sources(self):
        return {inspect.getfile(f.py_func) for f in (self.rhs, self.jac)}

    def kernels(self):
        return self.rhs, self.jac

    def jac_add(self):
        if not self.exact:
            return None
        return _foreign_jac_kernel(self)


@functools.cache
def _foreign_jac_kernel(head):
    """A type's own Jacobian (``head.jac``) added to ``J``, compiled (cached on disk)."""
    from numba import njit

    return njit(signatures()[1], **_OPTS)(
        _instance(_foreign_jac_add, "foreign_jac_add_" + _digest([head]), _jac=head.jac))


@functools.cache
def _foreign(rhs, jac, exact):
    return _ForeignHead(rhs, jac, exact)


def _digest(heads):
    """A digest of the heads' kernels' names and of their modules' sources (size, mtime).

    In the names of the compiled kernels: Numba's disk cache checks the source of the
    module that defines a function, not those of the functions it calls.
    """
    files = set()
    for head in heads:
        files |= head.sources()
    return sources_stamp(files, *(head.name() for head in heads))


def _instance(template, name, **bound):
    """A copy of the function ``template`` named ``name``, with the globals ``bound`` added.

    The kernels of a sequence of heads are such copies: the same code (of this module),
    calling the heads' compiled functions as globals, which Numba compiles in.
    """
    namespace = dict(template.__globals__)
    namespace.update(bound)
    fn = types.FunctionType(template.__code__, namespace, name)
    fn.__qualname__ = name
    return fn


# ----------------------------------------------------------------------------------------
# the Jacobian's assembly (plain Python here, compiled at first use; the shared numerics
# of the heads are gaussian_pde._common.kernels')
# ----------------------------------------------------------------------------------------

@compiled_later(counted=True)
def add_factor_rows(A, C, M, X, m, J):
    r"""Add :math:`M_{ia}\delta_{jb} + A_{ia}(X^TB)_{bj} + (AX)_{ib}B_{aj}`, :math:`B = CX`, to ``J``.

    ``X`` is ``d x q``: the rows ``i m + j`` and columns ``a m + b`` of ``J`` with
    ``j, b < q`` (state rows of ``m``). Returns :math:`AX`.
    """
    d, q = X.shape
    B = np.empty((d, q))
    XtB = np.empty((q, q))
    AX = np.empty((d, q))
    Xt = np.ascontiguousarray(X.T)
    mm(C, X, B)
    mm(Xt, B, XtB)
    mm(A, X, AX)
    for i in range(d):
        for j in range(q):
            row = i * m + j
            for a in range(d):
                for b in range(q):
                    J[row, a * m + b] += A[i, a] * XtB[b, j] + AX[i, b] * B[a, j]
                J[row, a * m + j] += M[i, a]
    return AX


@compiled_later(counted=True)
def assemble(A, C, M, N, r, Z, d, m, J):
    r"""Add the Jacobian of one head with parts ``A, C, M, N, r`` at ``Z`` to ``J``.

    :math:`J_{ij,ab} \mathrel{+}= M_{ia}\delta_{jb} + A_{ia}(L^TB)_{bj} + (AL)_{ib}B_{aj}`,
    :math:`B = CL` (:func:`add_factor_rows`); with the mean (``m = d + 1``)
    :math:`\partial\alpha'_i/\partial L_{ab} \mathrel{+}= A_{ia}(L^Tr)_b + (AL)_{ib}r_a` and
    :math:`\partial\alpha'/\partial\alpha \mathrel{+}= N`.
    """
    L = np.ascontiguousarray(Z[:, :d])
    AL = add_factor_rows(A, C, M, L, m, J)
    if m > d:
        Ltr = np.empty(d)
        for b in range(d):
            acc = 0.0
            for p in range(d):
                acc += L[p, b] * r[p]
            Ltr[b] = acc
        for i in range(d):
            row = i * m + d
            for a in range(d):
                for b in range(d):
                    J[row, a * m + b] += A[i, a] * Ltr[b] + AL[i, b] * r[a]
                J[row, a * m + d] += N[i, a]


@compiled_later(counted=True)
def assemble_second_moment(A, C, M, N, r, Z, d, m, J):
    r"""Add the Jacobian of one head with field :math:`Z' = M(P)Z`, :math:`P = ZZ^T`, to ``J``.

    With :math:`dM[dP] = A\,dP\,C` and :math:`dP = dZ\,Z^T + Z\,dZ^T`,
    :math:`dZ' = M\,dZ + A\,dZ\,(Z^TCZ) + (AZ)\,dZ^T(CZ)`, so over all ``m`` columns
    :math:`J_{ij,ab} \mathrel{+}= M_{ia}\delta_{jb} + A_{ia}(Z^TCZ)_{bj} + (AZ)_{ib}(CZ)_{aj}`
    (:func:`add_factor_rows` with ``X = Z``): the factor rows depend on the mean too.
    ``N`` and ``r`` are not read.
    """
    add_factor_rows(A, C, M, np.ascontiguousarray(Z), m, J)


def head_ws(k, d):
    """Scratch entries a head of inner size ``k`` may need at dimension ``d``."""
    m = d + 1
    return 8 * (d + 2 * k + m + 2) * (m + k + 2) + 4 * (d + k) * (d + k)


# ----------------------------------------------------------------------------------------
# templates: the kernels of a sequence of runs of heads are copies of these (_instance)
# ----------------------------------------------------------------------------------------

def _foreign_jac_add(P, d, m, y, J, ws):
    """Add a type's own Jacobian (``_jac``, pack ``P``) to ``J``; False where it has none there."""
    n = d * m
    Jh = np.empty((n, n))
    if not _jac(P, d, m, y, Jh, ws):             # noqa: F821
        return False
    for i in range(n):
        for j in range(n):
            J[i, j] += Jh[i, j]
    return True


def _no_jacobian(P, d, m, y, J, ws):
    """The Jacobian of a field with a head without a closed form: none (differences)."""
    return False


def _sum_rhs(P, d, m, y, out, ws):
    """``out = Z'``: the sum of the packed heads' fields at the flat state ``y``.

    Each run's field is called through its address (``_fn_at``), on each of its heads' packs.
    """
    n = d * m
    acc = ws[:n]
    tmp = ws[n:2 * n]
    rest = ws[2 * n:]
    o = 1
    h = 0
    for _ in range(int(P[0])):
        rhs = _fn_at(P[o], 0)                     # noqa: F821 (bound by _instance)
        count = int(P[o + 2])
        o += 3
        for _ in range(count):
            size = int(P[o])
            rhs(P[o + 1:o + 1 + size], d, m, y, tmp, rest)
            for i in range(n):
                acc[i] = tmp[i] if h == 0 else acc[i] + tmp[i]
            h += 1
            o += 1 + size
    for i in range(n):
        out[i] = acc[i]


def _sum_jac(P, d, m, y, J, ws):
    """The closed-form Jacobian of the packed heads into ``J``; False where none holds.

    Each run's Jacobian is added to ``J`` through its address (``_fn_at``), head by head.
    """
    n = d * m
    for i in range(n):
        for j in range(n):
            J[i, j] = 0.0
    o = 1
    for _ in range(int(P[0])):
        add = _fn_at(P[o + 1], 1)                 # noqa: F821 (bound by _instance)
        count = int(P[o + 2])
        o += 3
        for _ in range(count):
            size = int(P[o])
            if not add(P[o + 1:o + 1 + size], d, m, y, J, ws):
                return False
            o += 1 + size
    for i in range(n):
        for j in range(n):
            if not math.isfinite(J[i, j]):
                return False
    return True


# ----------------------------------------------------------------------------------------
# a head's kernels: its body and parts with the kernel's arguments unpacked in front
# ----------------------------------------------------------------------------------------

#: a head's field: its pack unpacked for its body (``ws`` past a sum's room)
_RHS_PROLOGUE = """
data = P[3:3 + int(P[1])]
k = int(P[2])
ws = ws[2 * d * m:]
"""

#: the same with the shape compiled in (``_D``, ``_K``, ``_M1`` bound)
_SHAPE_PROLOGUE = """
data = P[3:3 + int(P[1])]
ws = ws[2 * d * m:]
k = _K
m = _D if m == _D else _M1
d = _D
"""

#: a head's Jacobian: ``J`` zeroed for a head alone (``P[0] == 1``; a head of a sum adds
#: to it), the arrays of its parts, its pack unpacked; each ``return ok`` of the parts
#: becomes ``return _finish(bool(ok), ...)`` (:func:`_finish_jac`; ``bool``: a ``return
#: False`` and a ``return True`` reach one compiled ``_finish``, not one per constant)
_JAC_PROLOGUE = """
_alone = P[0] == 1.0
if _alone:
    for _i in range(d * m):
        for _j in range(d * m):
            J[_i, _j] = 0.0
_d0 = d
_m0 = m
Z = y.reshape((d, m))
A = _np.empty((d, d))
C = _np.empty((d, d))
M = _np.empty((d, d))
N = _np.empty((d, d))
r = _np.empty(d)
data = P[3:3 + int(P[1])]
k = int(P[2])
"""
_JAC_RETURN = "_finish(bool(_value), A, C, M, N, r, Z, _d0, _m0, J, _alone)"
#: the names a body (``P``) or parts (these) must not assign: the kernel's own
_RHS_RESERVED = ("P",)
_JAC_RESERVED = ("P", "y", "J", "ws", "_alone", "_i", "_j", "_d0", "_m0", "Z", "A", "C", "M",
                 "N", "r", "_np", "_finish")


def _spliced(fn, name, args, prologue, reserved, returns=None, **bound):
    """``fn``'s statements as the body of a new function ``name(args)``, after ``prologue``.

    The statements that ``fn`` would run inlined into a kernel, compiled from its source
    with the kernel's arguments unpacked in front (Numba's inliner would copy the
    callee's IR twice, which the compilation of every kernel paid). ``returns``: an
    expression in ``_value`` that takes the place of each ``return value``; ``bound``:
    globals added to a copy of ``fn``'s; the line numbers are ``fn``'s. Plain Python: the
    tests run it uncompiled.
    """
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError) as err:
        raise TypeError(f"the head function {fn.__module__}.{fn.__qualname__}: its source "
                        f"cannot be read ({err}), and its kernel is made from it") from None
    # (blank lines in front: the file's line numbers without a walk to shift them)
    fdef = ast.parse("\n" * (first - 1) + textwrap.dedent("".join(lines))).body[0]
    body = fdef.body[1:] if ast.get_docstring(fdef) is not None else fdef.body
    nodes = [n for stmt in body for n in ast.walk(stmt)]
    clash = sorted({n.id for n in nodes if isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Store) and n.id in reserved})
    nested = any(isinstance(n, (ast.FunctionDef, ast.Lambda, ast.ClassDef)) for n in nodes)
    if clash or nested:
        raise TypeError(f"the head function {fn.__module__}.{fn.__qualname__} "
                        + (f"assigns {', '.join(clash)}, names its kernel reserves"
                           if clash else "defines a function inside") + ": rename them")
    for n in nodes if returns is not None else ():
        if isinstance(n, ast.Return):
            n.value = _with_value(ast.parse(returns, mode="eval").body,
                                  n.value or ast.copy_location(ast.Constant(None), n))
    head = ast.parse("\n" * (fdef.lineno - 1) + textwrap.dedent(prologue).strip()).body
    new = ast.FunctionDef(name=name, args=ast.parse(f"def _({args}): pass").body[0].args,
                          body=head + body, decorator_list=[], returns=None, type_comment=None)
    module = ast.Module(body=[ast.copy_location(new, fdef)], type_ignores=[])
    namespace = dict(fn.__globals__)
    namespace.update(bound)
    exec(compile(module, inspect.getfile(fn), "exec"), namespace)
    made = namespace[name]
    made.__qualname__ = name
    return made


def _with_value(expr, value):
    """The expression ``expr`` with its name ``_value`` replaced by the expression ``value``."""
    class Put(ast.NodeTransformer):
        def visit_Name(self, node):
            return value if node.id == "_value" else node

    return Put().visit(expr)


def _finish_jac(ok, A, C, M, N, r, Z, d, m, J, alone):
    """The end of a head's Jacobian kernel: its parts' answer ``ok``, assembled into ``J``.

    False where the parts declined; else ``assemble`` (the head's assembly, bound by
    :func:`_instance`) adds the head's Jacobian to ``J``, and a head alone checks it.
    """
    if not ok:
        return False
    assemble(A, C, M, N, r, Z, d, m, J)             # noqa: F821 (bound by _instance)
    if alone:
        for i in range(d * m):
            for j in range(d * m):
                if not math.isfinite(J[i, j]):
                    return False
    return True


def _plain_kernels(head, key, finish=None):
    """``(rhs, jac)`` of one head as plain Python functions named with ``key``.

    ``rhs(P, d, m, y, out, ws)``: the head's body after :data:`_RHS_PROLOGUE`;
    ``jac(P, d, m, y, J, ws)``: its parts after :data:`_JAC_PROLOGUE`, each return through
    ``finish`` (:func:`_finish_jac` with the head's assembly; plain unless given), or
    None without parts.
    """
    rhs = _spliced(head.body, f"head_rhs_{key}", "P, d, m, y, out, ws", _RHS_PROLOGUE,
                   _RHS_RESERVED)
    if head.parts is None:
        return rhs, None
    if finish is None:
        finish = _instance(_finish_jac, "finish_jac", assemble=head.assembly)
    jac = _spliced(head.parts, f"head_jac_{key}", "P, d, m, y, J, ws", _JAC_PROLOGUE,
                   _JAC_RESERVED, returns=_JAC_RETURN, _np=np, _finish=finish)
    return rhs, jac


@functools.cache
def _finish_kernel(assembly):
    """:func:`_finish_jac` with ``assembly``, compiled once for every head it serves."""
    from numba import njit

    return njit(cache=False, error_model="numpy")(
        _instance(_finish_jac, f"finish_jac_{assembly.__name__}", assemble=assembly))


# ----------------------------------------------------------------------------------------
# compiling, packing, adding
# ----------------------------------------------------------------------------------------

@functools.cache
def signatures():
    """The Numba signatures of ``rhs`` and ``jac`` (the integrator's argument types; built once)."""
    from numba import types as T

    vec, mat = T.float64[::1], T.float64[:, ::1]
    return (T.void(vec, T.int64, T.int64, vec, vec, vec),
            T.boolean(vec, T.int64, T.int64, vec, mat, vec))


@functools.cache
def _numba():
    """Whether Numba is there (then the marked functions are compiled at first use)."""
    try:
        import numba  # noqa: F401
    except ImportError:         # pragma: no cover - numba is a dependency
        return False
    _compile_marked()
    return True


_OPTS = dict(cache=True, error_model="numpy", boundscheck=False)


@functools.cache
def _head_kernels(head):
    """``(rhs, jac)`` of one head of kernel ``head`` (a :class:`HeadKernel`).

    Its pack is ``[1, size, k, data...]``. The body and the parts with the pack unpacked
    in front (:func:`_plain_kernels`; the Jacobian's end, :func:`_finish_jac` with the
    head's :attr:`HeadKernel.assembly`, compiled once for all heads), compiled and cached
    on disk under names with :func:`_digest`.
    """
    from numba import njit

    _compile_marked()
    key = _digest([head])
    rhs_sig, jac_sig = signatures()
    rhs, jac = _plain_kernels(head, key, finish=_finish_kernel(head.assembly)
                              if head.exact else None)
    rhs = njit(rhs_sig, _nrt=head.counted, **_OPTS)(rhs)
    if not head.exact:
        return rhs, _no_jacobian_kernel()
    return rhs, njit(jac_sig, **_OPTS)(jac)


def _fn_at_intrinsic():
    """``_fn_at(address, kind)`` compiled (an intrinsic): the kernel at ``address``.

    The address is held in a float64 (exactly: below 2**53); the kernel has the signature
    ``signatures()[kind]`` and is called with Numba's calling convention.
    """
    from llvmlite import ir
    from numba import types as T
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def fn_at(typingctx, address, kind):
        if not isinstance(kind, T.IntegerLiteral) or address != T.float64:
            return None
        fnty = T.FunctionType(signatures()[kind.literal_value])

        def codegen(context, builder, sig, args):
            addr = builder.fptosi(args[0], ir.IntType(64))
            fn = cgutils.create_struct_proxy(fnty)(context, builder)
            fn.jit_addr = builder.inttoptr(addr, context.get_value_type(T.voidptr))
            return fn._getvalue()

        return fnty(address, kind), codegen

    return fn_at


@functools.cache
def _sum_kernels(exact):
    """``(rhs, jac)`` of every sum of heads: :func:`_sum_rhs` and :func:`_sum_jac` compiled.

    One pair for every sequence of heads, compiled once (cached on disk): the pack
    carries each run's kernels as their addresses (:func:`_addresses`). ``exact``
    False: the Jacobian is :func:`_no_jacobian` (a head without a closed form).
    """
    import warnings

    import numba
    from numba import njit

    _compile_marked()
    rhs_sig, jac_sig = signatures()
    at = _fn_at_intrinsic()
    with warnings.catch_warnings():   # first-class function types are "experimental"
        warnings.simplefilter("ignore", numba.NumbaExperimentalFeatureWarning)
        rhs = njit(rhs_sig, _nrt=False, **_OPTS)(_instance(_sum_rhs, "sum_rhs", _fn_at=at))
        jac = (njit(jac_sig, _nrt=False, **_OPTS)(_instance(_sum_jac, "sum_jac", _fn_at=at))
               if exact else _no_jacobian_kernel())
    _SUMS.add(rhs)
    return rhs, jac


#: the ``rhs`` kernels of sums (:func:`_sum_kernels`)
_SUMS = set()


def _address(kernel, which):
    """The address of the compiled ``kernel`` (Numba's calling convention) as a float64.

    ``which``: 0 for a field, 1 for a Jacobian (its signature in :func:`signatures`).
    """
    from numba.experimental.function_type import _get_jit_address

    sig = signatures()[which]
    if sig.args not in kernel.overloads:
        kernel.compile(sig)
    addr = _get_jit_address(kernel, sig)
    if not 0 < addr < 2 ** 53:      # a float64 holds it exactly
        raise RuntimeError(f"a kernel's address {addr:#x} does not fit a float64")
    return float(addr)


def _addresses(P, heads):
    """``P`` (a sum's pack) with each run's kernels' addresses, those of ``heads``, in place."""
    o = 1
    for head in heads:
        add = head.jac_add()
        P[o] = _address(head.kernels()[0], 0)
        P[o + 1] = _address(add, 1) if add is not None else 0.0
        count = int(P[o + 2])
        o += 3
        for _ in range(count):
            o += 1 + int(P[o])
    return P


def _summed(heads, params, d, ws_size, exact):
    """The :class:`CompiledField` of a sum of ``heads`` with the pack ``params``.

    The addresses in ``params`` are this process's (an unpickled field).
    """
    rhs, jac = _sum_kernels(exact)
    return CompiledField(rhs=rhs, jac=jac, params=_addresses(np.array(params), heads), d=d,
                         ws_size=ws_size, exact_jacobian=exact, heads=heads)


@functools.cache
def _no_jacobian_kernel():
    from numba import njit

    return njit(signatures()[1], cache=True, _nrt=False)(_no_jacobian)


def _shape_fn(head, d, k):
    """The plain function :func:`_shape_rhs` compiles (its name carries the shape)."""
    _compile_marked()
    return _spliced(head.body, f"shape_rhs_{_digest([head])}_{int(d)}_{int(k)}",
                    "P, d, m, y, out, ws", _SHAPE_PROLOGUE, _RHS_RESERVED,
                    _D=int(d), _K=int(k), _M1=int(d) + 1)


@functools.cache
def _shape_rhs(head, d, k):
    """The field of one head of kernel ``head`` with ``d`` and ``k`` compiled in.

    The body's statements with constant ``d`` and ``k``, and ``m`` one of the constants
    ``d``, ``d + 1`` (:data:`_SHAPE_PROLOGUE`), so the compiler sees its loop bounds; one
    copy of the body (one per ``m`` doubled the compilation, for a few nanoseconds per
    evaluation at ``d = 2``).
    The signature is :func:`signatures`' (the integrator takes it as it takes the
    generic one). Cached on disk per kernel and shape.
    """
    from numba import njit

    return njit(signatures()[0], _nrt=False, **_OPTS)(_shape_fn(head, d, k))


@functools.cache
def _shape_cached(head, d, k):
    """Whether Numba's disk cache holds :func:`_shape_rhs` ``(head, d, k)`` for these sources.

    Its cache index, read without compiling (an index written for other sources reads
    as empty); False where that cannot be read.
    """
    from numba import njit

    try:
        probe = njit(_nrt=False, **_OPTS)(_shape_fn(head, d, k))
        return bool(probe._cache._cache_file._load_index())
    except Exception:       # a Numba whose cache reads otherwise: as if not cached
        return False


def _heads_of(field):
    """``[(head, pack), ...]``: the heads of ``field`` in order, each with its own pack."""
    if not field.heads:                         # a type's own kernels: one head
        return [(_foreign(field.rhs, field.jac, field.exact_jacobian), field.params)]
    if len(field.heads) == 1 and field.rhs is field.heads[0].kernels()[0]:
        return [(field.heads[0], field.params)]
    P, o, out = field.params, 1, []
    for head in field.heads:
        count = int(P[o + 2])
        o += 3
        for _ in range(count):
            size = int(P[o])
            out.append((head, P[o + 1:o + 1 + size]))
            o += 1 + size
    return out


def head_field(head, k, d, data):
    """The :class:`CompiledField` of one head of kernel ``head`` (a :class:`HeadKernel`).

    ``data``: the head's weights, in the layout its body reads (flattened and joined);
    packed as ``[1, size, k, data...]``. None without Numba (the callers then take
    their NumPy paths).
    """
    if not _numba():
        return None
    params = np.concatenate([(1.0, 0.0, float(k)), *data], axis=None)
    params[1] = params.size - 3                 # the size of the data
    rhs, jac = head.kernels()
    return CompiledField(rhs=rhs, jac=jac, params=params, d=d,
                         ws_size=int(head_ws(k, d) + 2 * d * (d + 1)),
                         exact_jacobian=head.exact, heads=(head,))


def add(fields):
    """The :class:`CompiledField` of a sum of fields, or None (one of them is None).

    The heads keep their order, adjacent heads of one kernel in one run:
    ``[R, (n, (size, pack...) * n) * R]``, each head's pack that of its field alone. A
    field of a type's own kernels (another package's) is one head of the sum. The sum of
    a single head is that head's own field.
    """
    if not fields or any(f is None for f in fields) or not _numba():
        return None
    if len(fields) == 1 and len(_heads_of(fields[0])) == 1:
        return fields[0]                        # one head: its own field
    heads, runs = [], []
    for f in fields:
        for head, pack in _heads_of(f):
            if heads and heads[-1] is head:
                runs[-1].append(pack)
            else:
                heads.append(head)
                runs.append([pack])
    parts = [[float(len(runs))]]
    for head, packs in zip(heads, runs):
        parts.append([0.0, 0.0, float(len(packs))])     # the addresses: _addresses
        for pack in packs:
            if isinstance(head, HeadKernel):    # a head of a sum: its Jacobian is added
                pack = np.concatenate([[0.0], pack[1:]])
            parts += [[float(pack.size)], pack]
    d = fields[0].d
    return _summed(tuple(heads), np.concatenate(parts), d,
                   max(f.ws_size for f in fields) + 2 * d * d + 2 * d,
                   all(f.exact_jacobian for f in fields))


def compiled_field_of(obj):
    """``obj.compiled_field()`` where ``obj`` has that hook, else None.

    The one question every caller of the compiled path asks of an attention (or of any
    object handed in its place).
    """
    hook = getattr(obj, "compiled_field", None)
    return hook() if hook is not None else None


def kernels():
    """The generic kernels ``(rhs, jac)`` of every head kernel of this package, compiled now.

    Or loaded from the disk cache: a tuple of pairs; None without Numba. For a caller
    about to fork workers: the forked processes inherit them.
    """
    if not _numba():
        return None
    return tuple(head.kernels() for head in _HEAD_KERNELS)

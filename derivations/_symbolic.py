r"""Shared symbolic machinery for the derivations.

Everything here works on SymPy *matrix expressions* (``MatrixSymbol`` of a symbolic
size), so a derivation is done once for every dimension ``d`` and head size ``k``.

The core is :func:`quadratic_score_field`, which turns a score that is quadratic in the
key token ``y`` into the affine velocity field of docs/math.md section 3.2:

1. from the SymPy expression of the score, extract by differentiation

   .. math:: s(x, y) = -\tfrac12 y^T H y + y^T (A x + g) + r(x);

2. complete the square of :math:`\log\big(e^{s(x,y)}\,\mathcal N(y;\alpha,\Sigma)\big)`
   in ``y``: the precision is :math:`P = -\nabla_y^2 = \Sigma^{-1} + H` and the linear
   coefficient :math:`h = \nabla_y|_{y=0} = \Sigma^{-1}\alpha + Ax + g`, so the tilted
   Gaussian has mean :math:`P^{-1} h`;
3. multiply through by :math:`\Sigma` (a rewriting that SymPy checks) to get the form
   :math:`(I + \Sigma H)^{-1}(\alpha + \Sigma(Ax + g))`, which needs no inverse of
   :math:`\Sigma` and so holds for singular covariances;
4. the velocity :math:`\Gamma(x) = V\,\mathbb E[y]` is affine, :math:`b + Mx`, with
   :math:`M = \partial\Gamma/\partial x` and :math:`b = \Gamma(0)`.

:class:`Program` and :func:`numpy_code` print a straight-line program of matrix
assignments as batched NumPy code (leading axes broadcast; inverses become solves).
Matrix functions the printer knows (:class:`PsdSqrt`, :class:`PseudoInverse`,
:class:`RegularizedGain`, :math:`(I + B^TB)^{-1}B^T` through a solve or a QR, and
:class:`GramFunctionCross`, :math:`B f(B^TB)` through the SVD of ``B`` with the scalar
``f`` printed from its SymPy expression) are SymPy nodes, so a program is checked by
composing it back into one expression (:meth:`Program.composed`).

Nothing here imports ``gaussian_pde``: the derivations regenerate
``gaussian_pde/_generated`` from scratch; the numerical checks load the one helper module
they need by file path (:func:`load_linalg`).
"""

from __future__ import annotations

import dataclasses

import sympy as sp
from sympy.matrices.expressions import MatrixExpr

d, k = sp.symbols("d k", integer=True, positive=True)
scale = sp.Symbol("scale", positive=True)

x = sp.MatrixSymbol("x", d, 1)
y = sp.MatrixSymbol("y", d, 1)
Q = sp.MatrixSymbol("Q", k, d)
K = sp.MatrixSymbol("K", k, d)
V = sp.MatrixSymbol("V", d, d)
alpha = sp.MatrixSymbol("alpha", d, 1)
Sigma = sp.MatrixSymbol("Sigma", d, d)
L = sp.MatrixSymbol("L", d, d)
I = sp.Identity(d)  # noqa: E741 (the identity matrix)
zero_vec = sp.ZeroMatrix(d, 1)


def load_linalg():
    """``gaussian_pde/_common/linalg.py`` loaded by file path, without importing the package.

    The package imports its generated modules, so importing it here would make the
    derivations depend on the files they write.
    """
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "gaussian_pde" / "_common" / "linalg.py"
    spec = importlib.util.spec_from_file_location("_derivations_linalg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------- matrix function nodes


class MatrixCall(MatrixExpr):
    """A matrix function of one square matrix argument, printed as a call (``code``)."""

    code = "{}"
    latex_name = r"\operatorname{f}"

    @property
    def arg(self):
        return self.args[0]

    @property
    def shape(self):
        return self.arg.shape

    def _latex(self, printer):
        return f"{self.latex_name}\\left({printer._print(self.arg)}\\right)"


class PsdSqrt(MatrixCall):
    r"""Principal square root :math:`X^{1/2}` of a symmetric PSD ``X`` (symmetric itself)."""

    code = "_psd_sqrt({})"
    latex_name = r"\operatorname{sqrt}"

    def _eval_transpose(self):
        return self


class PseudoInverse(MatrixCall):
    r"""Moore-Penrose pseudo-inverse of a symmetric PSD ``X``; :math:`X^{-1}` when invertible."""

    code = "np.linalg.pinv({}, rcond=1e-12, hermitian=True)"
    latex_name = r"\operatorname{pinv}"

    def _eval_transpose(self):
        return self

    def as_inverse(self):
        return sp.Inverse(self.arg)


class RegularizedGain(MatrixCall):
    r""":math:`(I + B^TB)^{-1}B^T` of a ``k x d`` matrix ``B`` (shape ``d x k``).

    Printed as a call of ``gaussian_pde._common.linalg.l2_gain``, which forms it by a
    Cholesky solve with :math:`I_k + BB^T` while :math:`\|B\|_F^2 < 10^3` (condition
    number at most :math:`1 + \|B\|_F^2`) and beyond from the Householder QR
    :math:`[B;\ I_d] = QR`, :math:`R^{-1}Q_1^T`, backward stable column by column for
    every ``B`` (a solve is not, once :math:`s_{\max}^2` passes
    :math:`1/\sqrt{\varepsilon}`, and is singular in floating point once it swamps the
    identity). :meth:`expanded` is
    the definition, for the checks.
    """

    code = "_l2_gain({})"
    latex_name = r"\operatorname{gain}"

    @property
    def shape(self):
        rows, cols = self.arg.shape
        return (cols, rows)

    def expanded(self):
        B = self.arg
        return sp.Inverse(sp.Identity(B.shape[1]) + B.T * B) * B.T


class InverseGram(MatrixCall):
    r""":math:`(I_k + BB^T)^{-1}` of a ``k x d`` matrix ``B`` (``k x k``).

    Printed in a compiled head together with the :class:`RegularizedGain` of the same
    ``B`` (one call of the package's ``gain``). :meth:`expanded` is the definition.
    """

    latex_name = r"\operatorname{E}"

    @property
    def shape(self):
        rows = self.arg.shape[0]
        return (rows, rows)

    def _eval_transpose(self):
        return self

    def expanded(self):
        B = self.arg
        return sp.Inverse(sp.Identity(B.shape[0]) + B * B.T)


class MatrixFunction(MatrixExpr):
    r""":math:`f(G)` for a symmetric PSD ``G`` through the functional calculus.

    With :math:`G = W\Lambda W^T` (``W`` orthogonal), :math:`f(G) = W f(\Lambda) W^T`;
    ``f`` is a SymPy :class:`~sympy.Lambda` of one scalar. Symmetric, and it commutes
    with ``G``; :func:`reduce_orthogonal` applies the functional calculus.
    """

    def __new__(cls, f, G):
        return super().__new__(cls, f, G)

    @property
    def f(self):
        return self.args[0]

    @property
    def arg(self):
        return self.args[1]

    @property
    def shape(self):
        return self.arg.shape

    def _eval_transpose(self):
        return self

    def _latex(self, printer):
        return f"\\varphi\\left({printer._print(self.arg)}\\right)"


class GramFunctionCross(MatrixExpr):
    r""":math:`B f(B^TB)` for a square ``B``, printed as a call of a generated helper.

    The helper computes it from the SVD :math:`B = U\operatorname{diag}(s)W^T` as
    :math:`U\operatorname{diag}(s f(s^2))W^T` (the Gram matrix :math:`B^TB` would square
    the condition number), with ``s f(s^2)`` printed from the SymPy expression of ``f``
    (:func:`gram_cross_helper`). :meth:`expanded` is the definition, for the checks.
    """

    def __new__(cls, f, B, helper):
        return super().__new__(cls, f, B, helper if isinstance(helper, sp.Symbol) else sp.Symbol(helper))

    @property
    def f(self):
        return self.args[0]

    @property
    def arg(self):
        return self.args[1]

    @property
    def helper(self):
        return self.args[2].name

    @property
    def shape(self):
        return self.arg.shape

    def expanded(self):
        return self.arg * MatrixFunction(self.f, self.arg.T * self.arg)

    def _latex(self, printer):
        b = printer._print(self.arg)
        return f"{b}\\,\\varphi\\left({b}^{{T}} {b}\\right)"


def expand_nodes(expr):
    """Replace :class:`GramFunctionCross` by its definition and pseudo-inverses by inverses.

    This is the form the checks compare (for an invertible argument the pseudo-inverse
    is the inverse).
    """
    expr = expr.replace(lambda e: isinstance(e, GramFunctionCross), lambda e: e.expanded())
    expr = expr.replace(lambda e: isinstance(e, (RegularizedGain, InverseGram)),
                        lambda e: e.expanded())
    return expr.replace(lambda e: isinstance(e, PseudoInverse), lambda e: e.as_inverse())


def resolve_block_slices(expr):
    """Resolve row slices of column block matrices (and of their products) to the blocks.

    ``BlockMatrix([[K], [Q]]) * L`` collapses to ``BlockMatrix([[K L], [Q L]])``, and
    ``[:k, :]`` of it (with ``K`` of ``k`` rows) is ``K L``: SymPy does not take this
    step itself.
    """
    def resolve(e):
        parent = sp.block_collapse(e.parent.doit())
        if not isinstance(parent, sp.BlockMatrix) or parent.blockshape[1] != 1:
            raise NotImplementedError(f"cannot resolve the slice {e}")
        (r0, r1, step), (c0, c1, _) = e.rowslice, e.colslice
        if step != 1 or c0 != 0 or sp.simplify(c1 - parent.shape[1]) != 0:
            raise NotImplementedError(f"only row slices with all columns: {e}")
        start = 0
        for i in range(parent.blockshape[0]):
            block = parent.blocks[i, 0]
            stop = start + block.shape[0]
            if sp.simplify(start - r0) == 0 and sp.simplify(stop - r1) == 0:
                return block
            start = stop
        raise NotImplementedError(f"the slice {e} is not a block")

    return expr.replace(lambda e: isinstance(e, sp.MatrixSlice), resolve)


def is_zero_matrix(expr):
    """Whether a matrix expression simplifies to zero (expanded, symmetric ``Sigma``)."""
    expr = sp.expand(symmetric(sp.expand(expr).doit(), Sigma)).doit()
    return expr == 0 or isinstance(expr, sp.ZeroMatrix)


# -------------------------------------------- orthogonal reduction (functional calculus)


def _cancel_pairs(expr, orthogonal):
    """Drop adjacent ``U^T U`` and ``U U^T`` in products, for ``U`` in ``orthogonal``."""
    def cancel(e):
        coeff, mats = e.as_coeff_matrices()
        mats, changed = list(mats), True
        while changed:
            changed = False
            for i in range(len(mats) - 1):
                a, b = mats[i], mats[i + 1]
                if any((a == u.T and b == u) or (a == u and b == u.T) for u in orthogonal):
                    del mats[i:i + 2]
                    changed = True
                    break
        if not mats:
            return coeff * sp.Identity(e.shape[0])
        return sp.MatMul(coeff, *mats).doit() if coeff != 1 else (
            sp.MatMul(*mats).doit() if len(mats) > 1 else mats[0])

    return expr.replace(lambda e: isinstance(e, sp.MatMul), cancel)


def reduce_orthogonal(expr, orthogonal, diagonal):
    r"""Simplify with orthogonal ``U`` (:math:`U^TU = UU^T = I`) and diagonal matrices.

    Expands, cancels :math:`U^TU` and applies the functional calculus to every
    :class:`MatrixFunction`: :math:`f(W X W^T) = W f(X) W^T` for orthogonal ``W`` and a
    product ``X`` of diagonal matrices, whose ``f(X)`` is diagonal again.
    """
    def step(e):
        e = symmetric(sp.expand(e).doit(), *diagonal)
        return sp.expand(_cancel_pairs(e, orthogonal)).doit()

    def calculus(e):
        G = step(e.arg)
        if isinstance(G, sp.MatMul):
            _, mats = G.as_coeff_matrices()
            for u in orthogonal:
                if len(mats) >= 3 and mats[0] == u and mats[-1] == u.T:
                    core = sp.MatMul(*mats[1:-1]).doit() if len(mats) > 3 else mats[1]
                    core = core * (G.as_coeff_matrices()[0])
                    return u * MatrixFunction(e.f, core) * u.T
        return MatrixFunction(e.f, G)

    previous = None
    while previous != expr:
        previous = expr
        expr = step(expr)
        expr = expr.replace(lambda e: isinstance(e, MatrixFunction), calculus)
    return expr


def diagonal_scalar(expr, values):
    """The scalar of a polynomial in diagonal matrices at one diagonal entry.

    ``values`` maps each diagonal matrix symbol to its entry; the map is an algebra
    homomorphism on diagonal matrices (they commute), so the matrix identity holds
    entry-wise exactly when the scalar one holds for every entry.
    """
    def scalar(e):
        if isinstance(e, sp.MatrixSymbol):
            if e not in values:
                raise ValueError(f"{e} is not declared diagonal")
            return values[e]
        if isinstance(e, sp.Identity):
            return sp.Integer(1)
        if isinstance(e, sp.ZeroMatrix):
            return sp.Integer(0)
        if isinstance(e, sp.Transpose):
            return scalar(e.arg)
        if isinstance(e, sp.MatPow):
            return scalar(e.args[0]) ** e.args[1]
        if isinstance(e, sp.Inverse):
            return 1 / scalar(e.arg)
        if isinstance(e, MatrixFunction):
            return e.f(scalar(e.arg))
        if isinstance(e, sp.MatMul):
            return sp.Mul(*[scalar(a) if isinstance(a, MatrixExpr) else a for a in e.args])
        if isinstance(e, sp.MatAdd):
            return sp.Add(*[scalar(a) for a in e.args])
        if not isinstance(e, MatrixExpr):
            return e
        raise ValueError(f"not a polynomial in diagonal matrices: {e}")

    return scalar(expr)


def symmetric(expr, *mats):
    """Declare ``mats`` symmetric: replace ``X.T`` by ``X`` (and ``X.T**-1`` by ``X**-1``)."""
    for m in mats:
        expr = expr.xreplace({sp.Transpose(m): m, sp.Inverse(sp.Transpose(m)): sp.Inverse(m)})
        expr = expr.xreplace({sp.Transpose(sp.Inverse(m)): sp.Inverse(m)})
    return expr


def simplify_matrix(expr):
    """Expand and collect a matrix expression; ``Sigma Sigma^{-1}`` cancels."""
    expr = symmetric(sp.expand(expr).doit(), Sigma)
    return sp.expand(expr).doit()


def gradient(expr, v):
    """Gradient (column vector) of a scalar (1x1) matrix expression."""
    if v not in expr.free_symbols:
        return sp.ZeroMatrix(v.shape[0], 1)
    return sp.expand(expr.diff(v)).doit()


def jacobian(expr, v):
    r"""Jacobian :math:`\partial f_i/\partial v_j` of a column-vector expression.

    SymPy's matrix calculus returns the transposed layout; we fix it here once.
    """
    if v not in expr.free_symbols:
        return sp.ZeroMatrix(expr.shape[0], v.shape[0])
    return sp.Transpose(expr.diff(v)).doit()


@dataclasses.dataclass(frozen=True)
class QuadraticScore:
    r"""Decomposition :math:`s = -\frac12 y^T H y + y^T(Ax + g) + r(x)` of a score."""

    H: MatrixExpr
    A: MatrixExpr
    g: MatrixExpr


def decompose_quadratic_score(score):
    r"""Split a score quadratic in ``y`` into ``H``, ``A`` and ``g`` by differentiation.

    ``H = -\nabla_y^2 s``, ``A x + g = \nabla_y s |_{y=0}``, ``A = \partial/\partial x``
    of that, ``g`` its value at ``x = 0``. Raises ``ValueError`` when the score is not
    quadratic in ``y`` (the third derivative does not vanish) or the linear part is
    not affine in ``x``.
    """
    try:
        grad = gradient(score, y)
        H = symmetric(-jacobian(grad, y), Sigma)
    except (AttributeError, NotImplementedError, TypeError, ValueError) as exc:
        raise ValueError("the score is not quadratic in y (SymPy's matrix calculus could not "
                         f"reduce its second derivative: {exc})") from None
    if y in H.free_symbols:
        raise ValueError("the score is not quadratic in y (its Hessian in y depends on y)")
    lin = sp.expand(grad.subs(y, zero_vec)).doit()
    A = jacobian(lin, x)
    if y in A.free_symbols or x in A.free_symbols:
        raise ValueError("the y-linear part of the score is not affine in x")
    g = sp.expand(lin.subs(x, zero_vec)).doit()
    return QuadraticScore(H=sp.expand(H).doit(), A=sp.expand(A).doit(), g=g)


@dataclasses.dataclass(frozen=True)
class AffineField:
    r"""An affine velocity field :math:`\Gamma(x) = b + Mx` with its derivation steps."""

    M: MatrixExpr
    b: MatrixExpr
    tilted_mean: MatrixExpr
    parts: QuadraticScore


def quadratic_score_field(score):
    r"""Derive the affine field of a score quadratic in ``y`` against :math:`\mathcal N(\alpha,\Sigma)`.

    Returns
    -------
    AffineField
        ``M``, ``b`` and the tilted mean
        :math:`(I+\Sigma H)^{-1}(\alpha + \Sigma(Ax+g))`.
    """
    parts = decompose_quadratic_score(score)
    log_density = -sp.Rational(1, 2) * (y - alpha).T * Sigma.I * (y - alpha) + score
    grad = symmetric(gradient(log_density, y), Sigma)
    precision = symmetric(-jacobian(grad, y), Sigma)
    linear = sp.expand(grad.subs(y, zero_vec)).doit()
    # Check the completed square: precision = Sigma^{-1} + H, linear = Sigma^{-1} alpha + A x + g.
    expect_p = Sigma.I + parts.H
    expect_h = Sigma.I * alpha + parts.A * x + parts.g
    if simplify_matrix(precision - expect_p) != sp.ZeroMatrix(d, d) and \
            simplify_matrix(precision - expect_p) != 0:
        raise AssertionError(f"completing the square failed: {precision} != {expect_p}")
    if simplify_matrix(linear - expect_h) not in (0, sp.ZeroMatrix(d, 1)):
        raise AssertionError(f"completing the square failed: {linear} != {expect_h}")
    # Mean of the tilted Gaussian is P^{-1} h = (Sigma P)^{-1} (Sigma h): no Sigma^{-1} left.
    sigma_p = simplify_matrix(Sigma * precision)
    sigma_h = simplify_matrix(Sigma * linear)
    if Sigma.I in sigma_p.atoms(sp.Inverse) | sigma_h.atoms(sp.Inverse):
        raise AssertionError("Sigma^{-1} did not cancel")
    tilted_mean = sp.Inverse(sigma_p).doit() * sigma_h if sigma_p != I else sigma_h
    velocity = V * tilted_mean
    M = sp.expand(jacobian(velocity, x)).doit()
    b = sp.expand(velocity.subs(x, zero_vec)).doit()
    return AffineField(M=M, b=b, tilted_mean=tilted_mean, parts=parts)


def moment_equations(M, b):
    r"""The Gaussian moment ODEs of an affine field (docs/math.md section 3.1).

    Returns ``(mean_rhs, cov_rhs, factor_rhs)`` as matrix expressions:
    :math:`\alpha' = b + M\alpha`, :math:`\Sigma' = M\Sigma + \Sigma M^T` and, with
    :math:`\Sigma = LL^T`, :math:`L' = ML` (the last with ``Sigma`` replaced by ``L L^T``).
    """
    mean_rhs = b + M * alpha
    cov_rhs = M * Sigma + Sigma * M.T
    factor_rhs = (M * L).xreplace({Sigma: L * L.T})
    return mean_rhs, cov_rhs, factor_rhs


# --------------------------------------------------------------------------- codegen


class NumpyMatrixPrinter:
    """Print a SymPy matrix expression as batched NumPy code.

    Matrices may carry leading batch axes: products print as ``@``, transposes as
    ``_T(X)`` (swap of the last two axes), ``Inverse(X) * Y`` as ``_solve(X, Y)``.
    """

    def __init__(self, names=None, dims=None):
        self.names = dict(names or {})
        self.dims = dict(dims or {})

    def __call__(self, expr):
        return self._print(expr)

    def _print(self, e):
        if isinstance(e, MatrixCall):
            return e.code.format(self._print(e.arg))
        if isinstance(e, GramFunctionCross):
            return f"{e.helper}({self._print(e.arg)})"
        if isinstance(e, sp.MatrixSlice):
            return _print_slice(e, self._print(e.parent), self.dims, batched=True)
        if isinstance(e, sp.BlockMatrix):
            return _print_block_column(e, self._print)
        if isinstance(e, sp.MatrixSymbol):
            return self.names.get(e.name, e.name)
        if isinstance(e, sp.Identity):
            return "_eye"
        if isinstance(e, sp.ZeroMatrix):
            return "0.0"
        if isinstance(e, sp.Transpose):
            return f"_T({self._print(e.arg)})"
        if isinstance(e, sp.Inverse):
            return f"_inv({self._print(e.arg)})"
        if isinstance(e, sp.MatAdd):
            neg = [a for a in e.args if isinstance(a, sp.MatMul) and a.as_coeff_matrices()[0] == -1]
            pos = [a for a in e.args if a not in neg]
            if not pos:
                return "(" + " + ".join(self._print(a) for a in e.args) + ")"
            return ("(" + " + ".join(self._print(a) for a in pos)
                    + "".join(f" - {self._print(-a)}" for a in neg) + ")")
        if isinstance(e, sp.MatMul):
            coeff, mats = e.as_coeff_matrices()
            body = self._print_product(list(mats))
            if coeff == 1:
                return body
            if coeff == -1:
                return f"(-{body})"
            return f"({self._print_scalar(coeff)} * {body})"
        if isinstance(e, sp.MatPow):
            base, exp = e.args
            if exp == -1:
                return f"_inv({self._print(base)})"
            raise NotImplementedError(f"cannot print power {e}")
        if not isinstance(e, MatrixExpr):
            return self._print_scalar(e)
        raise NotImplementedError(f"cannot print {type(e).__name__}: {e}")

    def _print_product(self, mats):
        for i, m in enumerate(mats):
            inv = m.arg if isinstance(m, sp.Inverse) else (
                m.args[0] if isinstance(m, sp.MatPow) and m.args[1] == -1 else None)
            if inv is not None and i < len(mats) - 1:
                head = [self._print(a) for a in mats[:i]]
                rest = self._print_product(mats[i + 1:])
                solved = f"_solve({self._print(inv)}, {rest})"
                return "(" + " @ ".join(head + [solved]) + ")" if head else solved
        if len(mats) == 1:
            return self._print(mats[0])
        return "(" + " @ ".join(self._print(m) for m in mats) + ")"

    @staticmethod
    def _print_scalar(e):
        return print_scalar(e)


def print_scalar(e):
    """NumPy code of a scalar expression, functions as ``np.<name>`` (elementwise)."""
    from sympy.printing.numpy import NumPyPrinter

    class _NpPrinter(NumPyPrinter):
        _module = "np"

    return _NpPrinter({"fully_qualified_modules": True}).doprint(e)


def _print_bound(b, dims):
    """A slice bound: its dimension symbols replaced by their code names in ``dims``."""
    if isinstance(b, sp.Symbol):
        return dims.get(b, str(b))
    return str(b.xreplace({s: sp.Symbol(code) for s, code in dims.items()}))


def _print_slice(e, parent, dims, batched):
    """``P[a:b]`` (2-D) or ``P[..., a:b, :]`` (stacks) for a row slice with all columns."""
    (r0, r1, step), (c0, c1, _) = e.rowslice, e.colslice
    if step != 1 or c0 != 0 or sp.simplify(c1 - e.parent.shape[1]) != 0:
        raise NotImplementedError(f"only row slices with all columns: {e}")
    lo = "" if r0 == 0 else _print_bound(r0, dims)
    hi = "" if sp.simplify(r1 - e.parent.shape[0]) == 0 else _print_bound(r1, dims)
    return f"{parent}[..., {lo}:{hi}, :]" if batched else f"{parent}[{lo}:{hi}]"


def _print_block_column(e, print_):
    """A column of blocks stacked along the rows: ``np.concatenate([...], axis=-2)``."""
    if e.blockshape[1] != 1:
        raise NotImplementedError(f"only a column of blocks: {e}")
    blocks = ", ".join(print_(e.blocks[i, 0]) for i in range(e.blockshape[0]))
    return f"np.concatenate([{blocks}], axis=-2)"


class KernelPrinter:
    r"""Print a matrix expression in one state matrix with the weight products hoisted.

    Every factor that does not involve the state (a scaled value matrix :math:`cV`, a
    transposed key matrix, a state-free subexpression inside a sum or an inverse) is
    *hoisted*: computed once, from the weights, and bound to a name ``_w0, _w1, ...``; the
    identity stays ``_eye``. What is
    left is printed either for one 2-D state (``batched=False``: ``_dot`` = ``np.dot``,
    ``.T``, ``_solve2`` = ``np.linalg.solve``) or for stacks with leading axes
    (``batched=True``: ``@``, ``_T``, ``_solve``), in ``factor_rhs``'s order of products
    (see ``_product``). Both modes hoist the same subexpressions in the same order.
    """

    def __init__(self, state, batched=False, local=(), definitions=None, dims=None):
        self.state = state
        self.batched = batched
        self.hoisted = []       # (name, code) in order of first use
        self._names = {}
        self._weights = NumpyMatrixPrinter()
        self._varying = {state, *local}     # the state and what a program computes from it
        self.definitions = dict(definitions or {})   # weight-only names: hoisted by value
        self.dims = dict(dims or {})

    def _hoist(self, e):
        if e not in self._names:
            name = f"_w{len(self.hoisted)}"
            self._names[e] = name
            self.hoisted.append((name, self._weights(e.xreplace(self.definitions))))
        return self._names[e]

    hoist = _hoist

    def _free(self, e):
        return not (self._varying & e.atoms(sp.MatrixSymbol))

    def __call__(self, e):
        if isinstance(e, sp.Identity):
            return "_eye"
        if isinstance(e, MatrixExpr) and not self._free(e):
            if isinstance(e, MatrixCall):
                return e.code.format(self(e.arg))
            if isinstance(e, GramFunctionCross):
                return f"{e.helper}({self(e.arg)})"
            if isinstance(e, sp.MatrixSlice):
                return _print_slice(e, self(e.parent), self.dims, self.batched)
        if not isinstance(e, MatrixExpr):
            return self._hoist(e) if not isinstance(e, sp.Number) else self._weights(e)
        if self._free(e):
            return self._hoist(e)
        if isinstance(e, sp.MatrixSymbol):
            return e.name
        if isinstance(e, sp.Transpose):
            return f"_T({self(e.arg)})" if self.batched else f"{self(e.arg)}.T"
        if isinstance(e, sp.MatAdd):
            return "(" + " + ".join(self(a) for a in e.args) + ")"
        if isinstance(e, (sp.Inverse, sp.MatPow)):
            base = e.arg if isinstance(e, sp.Inverse) else e.args[0]
            if isinstance(e, sp.MatPow) and e.args[1] != -1:
                raise NotImplementedError(f"cannot print power {e}")
            return f"np.linalg.inv({self(base)})" if self.batched else f"_inv2({self(base)})"
        if isinstance(e, sp.MatMul):
            coeff, mats = e.as_coeff_matrices()
            mats = list(mats)
            if coeff != 1:          # fold the scalar into the first state-free factor
                for i, m in enumerate(mats):
                    if self._free(m) and not isinstance(m, sp.Identity):
                        mats[i] = coeff * m
                        break
                else:
                    return f"({self(coeff)} * {self._product(mats)})"
            return self._product(mats)
        raise NotImplementedError(f"cannot print {type(e).__name__}: {e}")

    def _product(self, mats):
        """Left to right, as ``factor_rhs``: weights are hoisted one factor at a time.

        Multiplying weights together first (``K^T Q``) changes which products cancel:
        near a steady state, where ``QL -> 0``, ``(K^T Q) L`` loses what ``((L L^T) K^T) Q``
        keeps, and the field's rounding noise rose from 1e-18 to 1e-15 (relative to a
        field of 1e-9), enough to double the work of a stiff solver.
        """
        for i, m in enumerate(mats[:-1]):
            inv = m.arg if isinstance(m, sp.Inverse) else (
                m.args[0] if isinstance(m, sp.MatPow) and m.args[1] == -1 else None)
            if inv is not None and not self._free(inv):
                rest = self._product(mats[i + 1:])
                solved = (f"_solve({self(inv)}, {rest})" if self.batched
                          else f"_solve2({self(inv)}, {rest})")
                return self._chain([self(x) for x in mats[:i]] + [solved])
        return self._chain([self(m) for m in mats])

    def _chain(self, codes):
        out = codes[0]
        for c in codes[1:]:
            out = f"({out} @ {c})" if self.batched else f"_dot({out}, {c})"
        return out


@dataclasses.dataclass
class Kernel:
    """Generated hoisted right-hand side: three functions of one expression.

    ``factor_weights(Q, K, V, scale)`` computes the hoisted weight products (leading axes
    broadcast); ``factor_apply(weights, L)`` evaluates ``L'`` for stacks of ``L``;
    ``factor_kernel(Q, K, V, scale)`` returns a closure ``kernel(L)`` for one 2-D ``L``.
    """

    title: str
    latex: str
    hoisted: list          # (target, code): computed once from the weights
    body: list             # (target, code) per evaluation, one 2-D state
    returns: str
    batched_body: list     # the same for stacks
    batched_returns: str
    state: str = "L"
    setup: tuple = ()      # (target, code) computed once in factor_kernel's closure

    @property
    def names(self):
        return ("factor_weights", "factor_apply", "factor_kernel")


def factor_kernel(expr, title, state=None):
    r""":class:`Kernel` of the factor form ``L' = expr(L)`` (all three functions)."""
    state = state if state is not None else L
    flat, stacked = KernelPrinter(state), KernelPrinter(state, batched=True)
    ret, ret_b = flat(expr), stacked(expr)
    assert flat.hoisted == stacked.hoisted
    return Kernel(title, latex_matrix(expr), flat.hoisted, [], ret, [], ret_b, state.name)


@dataclasses.dataclass
class Program:
    """A straight-line program: assignments ``target = expr`` then the returned expressions.

    Targets are matrix symbols, so later steps refer to earlier ones by name;
    :meth:`composed` substitutes them back (the one expression a check compares with
    the derivation) and :meth:`code` prints every step with one printer.
    """

    steps: list      # (MatrixSymbol, expression)
    returns: tuple   # expressions

    def composed(self):
        """The returned expressions in the inputs only."""
        subs = {}
        for target, expr in self.steps:
            if isinstance(target, tuple):       # one call with several results
                subs.update({t: e.xreplace(subs) for t, e in zip(target, expr)})
            else:
                subs[target] = expr.xreplace(subs)
        return tuple(r.xreplace(subs) for r in self.returns)

    def code(self, printer=None):
        """``(assignments, returns)`` as code strings."""
        printer = printer or NumpyMatrixPrinter()
        return ([(t.name, printer(e)) for t, e in self.steps],
                tuple(printer(r) for r in self.returns))

    def check(self, *expected):
        """Whether the composed program equals ``expected`` (after :func:`expand_nodes`)."""
        got = self.composed()
        return len(got) == len(expected) and all(
            is_zero_matrix(resolve_block_slices(expand_nodes(g))
                           - resolve_block_slices(expand_nodes(e)))
            for g, e in zip(got, expected))


def program_kernel(program, title, latex, state=None, hoist=(), dims=(None, None),
                   extra_batched=(), setup=()):
    r""":class:`Kernel` of the factor form ``L' = program(L)`` printed from its expressions.

    Steps whose target is in ``hoist`` depend on the weights only: they are printed, by
    value, into ``factor_weights``; the other entries of ``hoist`` (expressions) are hoisted
    first, in that order. ``dims`` maps dimension symbols to code for the one-state and
    the batched body (slice bounds); ``extra_batched`` are shape steps of the batched body
    and ``setup`` those of ``factor_kernel``'s closure.
    """
    state = state if state is not None else L
    definitions = {t: e for t, e in program.steps if t in hoist}
    steps = [(t, e) for t, e in program.steps if t not in hoist]
    local = [t for t, _ in steps]
    printers = [KernelPrinter(state, batched=b, local=local, definitions=definitions,
                              dims=dm) for b, dm in zip((False, True), dims)]
    out = []
    for printer in printers:
        for h in hoist:
            printer.hoist(h)
        body = [(t.name, printer(e)) for t, e in steps]
        (ret,) = [printer(r) for r in program.returns]
        out.append((body, ret))
    assert printers[0].hoisted == printers[1].hoisted
    (body, ret), (body_b, ret_b) = out
    return Kernel(title, latex, printers[0].hoisted, body, ret, body_b + list(extra_batched),
                  ret_b, state.name, tuple(setup))


def gram_cross_helper(node):
    r"""The generated helper of a :class:`GramFunctionCross` node, from its scalar ``f``.

    :math:`B f(B^TB) = U\operatorname{diag}(s f(s^2)) W^T` for :math:`B = U\operatorname{diag}(s)
    W^T` (the reduction is checked by :func:`check_gram_cross_svd`).
    """
    s = sp.Symbol("s", nonnegative=True)
    scalar = sp.simplify(s * node.f(s**2))
    doc = (r"Cross term :math:`B\varphi(B^TB) = U\operatorname{diag}(s\varphi(s^2))W^T` from "
           r"the SVD" "\n" r":math:`B = U\operatorname{diag}(s)W^T`, with "
           rf":math:`s\varphi(s^2) = {sp.latex(scalar)}` (derived; printed from SymPy)." "\n"
           "Leading axes broadcast.\n")
    return Function(node.helper, ("B",), doc,
                    [("U, s, Wt", "np.linalg.svd(B)"), ("f", print_scalar(scalar))],
                    ("(U * f[..., None, :]) @ Wt",))


def check_gram_cross_svd(node):
    r"""SymPy: with :math:`B = USW^T`, :math:`B f(B^TB) = U\,(S f(S^2))\,W^T`, the helper's form.

    Returns whether :math:`U^T (B f(B^TB)) W` reduces to the diagonal whose entry is the
    printed scalar ``s f(s^2)`` of :func:`gram_cross_helper`.
    """
    n = sp.Symbol("n", integer=True, positive=True)
    U, W, Sd = (sp.MatrixSymbol(c, n, n) for c in ("U", "W", "S"))
    s = sp.Symbol("s", nonnegative=True)
    expr = GramFunctionCross(node.f, U * Sd * W.T, node.helper).expanded()
    reduced = reduce_orthogonal(U.T * expr * W, (U, W), (Sd,))
    printed = sp.sympify(gram_cross_helper(node).body[1][1].replace("np.", ""),
                         locals={"s": s})
    return sp.simplify(diagonal_scalar(reduced, {Sd: s}) - printed) == 0


@dataclasses.dataclass
class Function:
    """A generated function: name, arguments, docstring, assignments and return values."""

    name: str
    args: tuple
    doc: str
    body: list  # list of (target, code string)
    returns: tuple  # code strings


def numpy_code(expr, names=None):
    """Code string for one matrix expression."""
    return NumpyMatrixPrinter(names)(expr)


HEADER = '''\
# ----------------------------------------------------------------------------------
# GENERATED FILE - DO NOT EDIT.
# Written by derivations/{script} through derivations/generate.py.
# Regenerate with:  python derivations/generate.py
# A test (tests/test_generated.py) regenerates this file and fails on any difference.
# ----------------------------------------------------------------------------------
'''

PRELUDE = '''\
import numpy as np

from .._common.linalg import T as _T
from .._common.linalg import l2_gain as _l2_gain
from .._common.linalg import psd_sqrt as _psd_sqrt
from .._common.linalg import sinkhorn_cross as _sinkhorn_cross
from .._common.linalg import sinkhorn_phi as _sinkhorn_phi
from .._common.linalg import solve as _solve

__all__ = [{names}]
'''


COMPILED_PRELUDE = '''
# The compiled head (field_body, field_parts): plain Python printed from the derivation's
# programs by derivations._symbolic.LoopPrinter, compiled by Numba at first use
# (gaussian_pde.attention._compiled_fields).
from .._common import kernels as _kernels
from .._common.compiled import compiled_later as _compiled_later
'''


def render_module(script, doc, functions):
    """Render a generated module (a string) from :class:`Function` and :class:`Kernel` items."""
    names = [n for f in functions for n in (f.names if isinstance(f, Kernel) else (f.name,))
             if not n.startswith("_")]
    out = [HEADER.format(script=script), f'"""{doc}"""\n', "\n",
           PRELUDE.format(names=", ".join(f'"{n}"' for n in names))]
    if any(isinstance(f, LoopFunction) for f in functions):
        out.append(COMPILED_PRELUDE)
    for f in functions:
        out.append(_render_kernel(f) if isinstance(f, Kernel) else "\n\n" + (
            f.source() if isinstance(f, LoopFunction) else function_source(f)))
    return "".join(out).replace("\n    \n", "\n\n")


def function_source(f):
    """Source of one generated :class:`Function`."""
    out = [f"def {f.name}({', '.join(f.args)}):\n",
           '    r"""' + f.doc.strip().replace("\n", "\n    ") + '\n    """\n']
    out += [f"    {target} = {code}\n" for target, code in f.body]
    out.append(f"    return {', '.join(f.returns)}\n")
    return "".join(out)


def _docstring(text, indent="    "):
    return indent + 'r"""' + text.strip().replace("\n", "\n" + indent) + "\n" + indent + '"""\n'


def _render_kernel(f):
    names = [t for t, _ in f.hoisted]
    unpack = (", ".join(names) + ("," if len(names) == 1 else "")) if names else "_"
    weights_doc = (f"{f.title}: the weight-only products of :math:`L' = {f.latex}`.\n\n"
                   "Computed once per set of weights (leading axes broadcast) and passed to\n"
                   f"``factor_apply``.\n{STATE_DOC}")
    apply_doc = (f"{f.title}: :math:`L' = {f.latex}` from the products of "
                 "``factor_weights``.\n\nSame numbers as ``factor_rhs`` up to rounding "
                 "(the order of the products differs).\n\nParameters\n----------\n"
                 "weights : tuple of ndarray\n    ``factor_weights(Q, K, V, scale)``.\n"
                 "L : ndarray, shape (..., d, d)\n    Factor of the covariance.\n")
    kernel_doc = (f"{f.title}: fast closure ``kernel(L) -> L'`` for one unbatched ``L``.\n\n"
                  "The weight-only products are computed once here; the closure maps a "
                  "``(d, d)``\nfactor to ``L'`` with 2-D products only.\n" + STATE_DOC)
    out = ["\n\ndef factor_weights(Q, K, V, scale):\n", _docstring(weights_doc)]
    out += [f"    {t} = {c}\n" for t, c in f.hoisted]
    out.append(f"    return ({unpack})\n" if names else "    return ()\n")
    out += ["\n\ndef factor_apply(weights, L):\n", _docstring(apply_doc),
            f"    {unpack} = weights\n"]
    text_b = " ".join([c for _, c in f.batched_body] + [f.batched_returns])
    if "_eye" in text_b:
        out.append(f"    _eye = np.eye({f.state}.shape[-1])\n")
    out += [f"    {t} = {c}\n" for t, c in f.batched_body]
    out.append(f"    return {f.batched_returns}\n")
    out += ["\n\ndef factor_kernel(Q, K, V, scale):\n", _docstring(kernel_doc),
            f"    {unpack} = factor_weights(Q, K, V, scale)\n"]
    text = " ".join([c for _, c in f.body] + [f.returns])
    if "_eye" in text:
        out.append("    _eye = np.eye(V.shape[-1])\n")
    out += [f"    {t} = {c}\n" for t, c in f.setup]
    out += [f"    {name} = {fn}\n" for name, fn in (
        ("_dot", "np.dot"), ("_solve2", "np.linalg.solve"), ("_inv2", "np.linalg.inv"))
        if name in text]
    out += ["\n", f"    def kernel({f.state}):\n"]
    out += [f"        {t} = {c}\n" for t, c in f.body]
    out += [f"        return {f.returns}\n", "\n", "    return kernel\n"]
    return "".join(out)


def latex_matrix(expr):
    """LaTeX of a matrix expression with the package's symbol names."""
    return sp.latex(expr, symbol_names={Sigma: r"\Sigma", alpha: r"\alpha", scale: r"c"})


# ------------------------------------------------------- generated-function builders

M_sym = sp.MatrixSymbol("M", d, d)
b_sym = sp.MatrixSymbol("b", d, 1)
SIGNATURE = ("Q", "K", "V", "scale")
STATE_DOC = """
Parameters
----------
Q, K : ndarray, shape (k, d)
    Query and key matrices.
V : ndarray, shape (d, d)
    Value matrix.
scale : float
    Score scale.
"""


def _uses_eye(*codes):
    return any("_eye" in c for c in codes)


def _eye_line(ref):
    return ("_eye", f"np.eye({ref}.shape[-1])")


def affine_functions(field, title, signature=SIGNATURE, weights_doc="", kernel=True, forms=None):
    """The generated functions for an affine field whose ``M`` and ``b`` are known.

    ``field_matrix``, ``field_offset``, ``moment_rhs``, ``cov_rhs`` (covariance only) and
    ``factor_rhs`` (:math:`L' = M(LL^T) L`). Every function broadcasts over leading axes of
    ``alpha`` (``(..., d)``), ``Sigma`` and ``L`` (``(..., d, d)``). ``signature``: the
    weights every function takes first (default ``Q, K, V, scale``; a type with more
    weights, e.g. biases, lists them, and ``weights_doc`` documents the extra ones);
    ``kernel``: also the hoisted ``factor_weights``/``factor_apply``/``factor_kernel``
    (for the default signature only); ``forms``: ``{"M": expr, "b": expr}``, the same
    matrices grouped in the order ``field_matrix`` and ``field_offset`` evaluate them
    (e.g. the thin products first), each checked equal to the derived one by
    :func:`check_forms` among the type's checks.
    """
    SIGNATURE = signature
    mean_rhs, cov_rhs, factor_rhs = moment_equations(M_sym, b_sym)
    forms = forms or {}
    M_code = numpy_code(field.M)
    b_code = numpy_code(field.b)
    M_form = numpy_code(forms["M"]) if "M" in forms else M_code
    b_form = numpy_code(forms["b"]) if "b" in forms else b_code
    M_of_L = numpy_code(field.M.xreplace({Sigma: L * L.T}))
    eq_M, eq_b = latex_matrix(field.M), latex_matrix(field.b)
    common = STATE_DOC + weights_doc

    def with_eye(body, ref):
        codes = [c for _, c in body]
        return ([_eye_line(ref)] if _uses_eye(*codes) else []) + body

    funcs = [
        Function(
            "field_matrix", SIGNATURE + ("Sigma",),
            f"{title}: linear part of the affine field, :math:`M = {eq_M}`.\n{common}"
            "Sigma : ndarray, shape (..., d, d)\n    Covariance.\n",
            with_eye([("M", M_form)], "Sigma"), ("M",)),
        Function(
            "field_offset", SIGNATURE + ("alpha", "Sigma"),
            f"{title}: constant part of the affine field, :math:`b = {eq_b}`.\n{common}"
            "alpha : ndarray, shape (..., d)\n    Mean.\n"
            "Sigma : ndarray, shape (..., d, d)\n    Covariance.\n",
            with_eye([("alpha", "alpha[..., None]"), ("b", b_form)], "Sigma"),
            ("b[..., 0]",)),
        Function(
            "moment_rhs", SIGNATURE + ("alpha", "Sigma"),
            f"{title}: :math:`\\alpha' = {latex_matrix(mean_rhs)}`, "
            f":math:`\\Sigma' = {latex_matrix(cov_rhs)}`.\n{common}"
            "alpha : ndarray, shape (..., d)\n    Mean.\n"
            "Sigma : ndarray, shape (..., d, d)\n    Covariance.\n",
            with_eye([("alpha", "alpha[..., None]"), ("M", M_code), ("b", b_code)], "Sigma")
            + [("dalpha", numpy_code(mean_rhs)), ("dSigma", numpy_code(cov_rhs))],
            ("dalpha[..., 0]", "dSigma")),
        Function(
            "cov_rhs", SIGNATURE + ("Sigma",),
            f"{title}: covariance equation :math:`\\Sigma' = {latex_matrix(cov_rhs)}`.\n"
            f"{common}Sigma : ndarray, shape (..., d, d)\n    Covariance.\n",
            with_eye([("M", M_code)], "Sigma") + [("dSigma", numpy_code(cov_rhs))],
            ("dSigma",)),
        Function(
            "factor_rhs", SIGNATURE + ("L",),
            f"{title}: factor form :math:`L' = {latex_matrix(factor_rhs)}` with "
            ":math:`\\Sigma = LL^T`;\nit keeps :math:`\\Sigma` symmetric PSD and its rank.\n"
            f"{common}L : ndarray, shape (..., d, d)\n    Factor of the covariance.\n",
            with_eye([("M", M_of_L)], "L"), ("M @ L",)),
    ]
    if kernel:
        funcs.append(factor_kernel(field.M.xreplace({Sigma: L * L.T}) * L, title))
    return funcs


def check_forms(derive, forms):
    """Whether each of ``forms`` (:func:`affine_functions`) equals the derived ``M`` or ``b``."""
    field = derive()
    derived = {"M": field.M, "b": field.b}
    return all(Program([], (expr,)).check(derived[name]) for name, expr in forms.items())


# ------------------------------------------------- independent check by integration


def explicit(expr, subs):
    """Substitute explicit matrices for matrix symbols and return an explicit Matrix."""
    kq, dq = subs[Q].shape if Q in subs else (None, None)
    if dq is not None:
        expr = expr.subs({d: dq, k: kq})
        subs = {(m.subs({d: dq, k: kq}) if isinstance(m, sp.MatrixSymbol) else m): v
                for m, v in subs.items()}
    out = expr.xreplace(subs).doit()
    return sp.Matrix(out.as_explicit() if hasattr(out, "as_explicit") else out)


def check_by_integration(score, field, subs, dim, points=None):
    r"""Integrate the attention-weighted Gaussian directly and compare with ``b + M x``.

    Computes :math:`\Gamma(x) = V\int y\,e^{s(x,y)}\,\mathcal N(y;\alpha,\Sigma)\,dy \big/
    \int e^{s(x,y)}\,\mathcal N(y;\alpha,\Sigma)\,dy` with :func:`sympy.integrate` for the
    explicit matrices in ``subs`` (one coordinate at a time), independently of the
    completing-the-square derivation, and returns the simplified difference with the
    derived field (zero when the derivation is right). With ``points`` (a list of
    explicit query tokens) the check is done at those tokens; ``dim + 1`` affinely
    independent points determine an affine field, so this still checks ``b`` and ``M``.
    """
    xs = sp.Matrix(sp.symbols(f"x1:{dim + 1}", real=True))
    ys = sp.Matrix(sp.symbols(f"y1:{dim + 1}", real=True))
    subs = dict(subs)
    Sig, al = subs[Sigma], subs[alpha]
    quad = -sp.Rational(1, 2) * ((ys - al).T * Sig.inv() * (ys - al))[0, 0]

    def integrate_all(f):
        for yi in ys:
            f = sp.integrate(f, (yi, -sp.oo, sp.oo), conds="none")
        return f

    diffs = []
    for point in (points or [xs]):
        point = sp.Matrix(point)
        s_explicit = explicit(score, {**subs, x: point, y: ys})[0, 0]
        weight = sp.exp(sp.expand(s_explicit + quad))
        Z = integrate_all(weight)
        mean_y = sp.Matrix([integrate_all(yi * weight) / Z for yi in ys])
        velocity = explicit(V, subs) * mean_y
        derived = explicit(field.b + field.M * x, {**subs, x: point})
        diffs.append(sp.simplify(velocity - derived))
    return sp.Matrix.hstack(*diffs)


def integration_checks(score, derive, extra_1d=None, extra_2d=None):
    """The standard independent checks of a quadratic-score derivation.

    d = 1 fully symbolic, and d = 2 with explicit rational weights, ``k = 1`` (singular
    interaction matrix) and a correlated covariance, at three query tokens. ``extra_1d``
    and ``extra_2d`` give values of the score's further symbols (biases: ``k x 1``
    matrices, ``k = 1``).
    """
    def check_1d():
        q, kk, v, a = sp.symbols("q k_1 v a", real=True)
        c, sig = sp.symbols("c sigma", positive=True)
        subs = {Q: sp.Matrix([[q]]), K: sp.Matrix([[kk]]), V: sp.Matrix([[v]]),
                alpha: sp.Matrix([a]), Sigma: sp.Matrix([[sig**2]]), scale: c,
                **(extra_1d or {})}
        return check_by_integration(score, derive(), subs, 1).is_zero_matrix

    def check_2d():
        R = sp.Rational
        subs = {Q: sp.Matrix([[1, R(1, 2)]]), K: sp.Matrix([[R(-1, 3), 1]]),
                V: sp.Matrix([[1, R(1, 4)], [0, 2]]), alpha: sp.Matrix([R(1, 2), -1]),
                Sigma: sp.Matrix([[2, R(1, 2)], [R(1, 2), 1]]), scale: R(1, 2),
                **(extra_2d or {})}
        points = [[0, 0], [1, 0], [R(-1, 2), 2]]
        return check_by_integration(score, derive(), subs, 2, points).is_zero_matrix

    return {"direct integration, d = 1": check_1d, "direct integration, d = 2": check_2d}


def run_checks(checks):
    """Run a dict of named checks, print each result and return whether all passed."""
    ok = True
    for label, check in checks.items():
        passed = bool(check())
        ok &= passed
        print(f"  {label}: {'ok' if passed else 'FAILED'}")
    return ok


def print_field(field):
    """Print the steps of a quadratic-score derivation."""
    print("  H =", field.parts.H, "  A =", field.parts.A, "  g =", field.parts.g)
    print("  tilted mean =", field.tilted_mean)
    print("  M =", field.M)
    print("  b =", field.b)


def derive_module(score, name, title):
    r"""Source of a generated module for a user-given score quadratic in ``y``.

    This is how a new Gaussian-preserving attention type is added in an afternoon: write
    the score with the symbols of this module (``x`` query, ``y`` key, ``Q``, ``K``,
    ``scale``), e.g. ::

        score = scale * (Q * x).T * (K * y) - scale / 2 * (K * y).T * (K * y)
        text = derive_module(score, "tempered", "Tempered attention")

    and write ``text`` to ``gaussian_pde/_generated/<name>.py``; the module has the same
    functions as the built-in types (``field_matrix``, ``field_offset``, ``moment_rhs``,
    ``cov_rhs``, ``factor_rhs`` and the fast ``factor_kernel``), so a ``SingleHeadAttention`` subclass
    with ``_generated`` set to it works with ``solve`` at once.
    """
    field = quadratic_score_field(score)
    doc = (f"{title}: Gaussian moment equations derived from the score "
           f"{score} (derivations._symbolic.derive_module).\n")
    return render_module(f"_symbolic.py (derive_module, {name})", doc,
                         affine_functions(field, title))


# ------------------------------------------------------- loop printer (compiled heads)
#
# The compiled field of a head (gaussian_pde.attention._compiled_fields) is a plain-Python
# function of fixed arguments over flat buffers, compiled by Numba: ``body(data, k, d, m,
# y, out, ws)`` gives Z' for the state Z = [L | alpha] (d x m, row-major in ``y``), and
# ``parts(data, k, d, m, Z, A, C, M, N, r)`` the pieces of its Jacobian. The printer below
# prints a derivation's :class:`Program` as such loops: every product entry is one sum
# over ``p`` in increasing order from 0.0, sums of two terms add the second to the first.


def _code(e):
    """Code of a dimension expression (``d + 2 * k``)."""
    return str(sp.sympify(e)).replace("*", " * ")


def _paren(a):
    return f"({a})" if (" + " in a or " - " in a) else a


def _plus(*terms):
    """``a + b + ...`` without zeros, the integer literals added (first)."""
    const = sum(int(t) for t in terms if t.isdigit())
    terms = [t for t in terms if not t.isdigit()]
    terms = ([str(const)] if const else []) + terms
    return " + ".join(terms) if terms else "0"


def _times(a, b):
    if "0" in (a, b):
        return "0"
    if a == "1":
        return b
    if b == "1":
        return a
    return f"{_paren(a)} * {_paren(b)}"


def _coeff_code(coeff, scalars):
    """Code of a scalar coefficient: a number, then the scalars it multiplies, then those it divides.

    ``2*c/s`` prints ``2.0 * c / s``, evaluated left to right as written.
    """
    num, up, down = sp.Integer(1), [], []
    for f in sp.Mul.make_args(coeff):
        if f.is_Number:
            num *= f
        elif f in scalars:
            up.append(scalars[f])
        elif f.is_Pow and f.exp == -1 and f.base in scalars:
            down.append(scalars[f.base])
        else:
            raise NotImplementedError(f"cannot print the coefficient {coeff}")
    code = " * ".join(([repr(float(num))] if num != 1 or not up else []) + up)
    return code + "".join(f" / {n}" for n in down)


@dataclasses.dataclass(frozen=True)
class Buffer:
    """Where a matrix lives in the kernel's arguments, as code.

    Flat (``flat``): entry ``(i, j)`` at ``name[off + i * rs + j * cs]``; otherwise a 2-D
    array, entry ``(i, j)`` at ``name[r0 + i, c0 + j]`` (``transposed``: at ``(j, i)``).
    ``rows`` and ``cols`` are code.
    """

    name: str
    rows: str
    cols: str
    off: str = "0"
    rs: str = "1"
    cs: str = "1"
    flat: bool = True
    r0: str = "0"
    c0: str = "0"
    transposed: bool = False

    @property
    def T(self):
        if self.flat:
            return dataclasses.replace(self, rows=self.cols, cols=self.rows, rs=self.cs, cs=self.rs)
        return dataclasses.replace(self, rows=self.cols, cols=self.rows,
                                   transposed=not self.transposed)

    def rows_from(self, start, stop):
        """The rows ``start:stop`` (code)."""
        rows = _code(sp.sympify(stop) - sp.sympify(start))
        if self.flat:
            return dataclasses.replace(self, off=_plus(self.off, _times(_code(start), self.rs)),
                                       rows=rows)
        if self.transposed:
            raise NotImplementedError("row slices of a transposed 2-D buffer")
        return dataclasses.replace(self, r0=_plus(self.r0, _code(start)), rows=rows)

    def at(self, i, j):
        if self.flat:
            return f"{self.name}[{_plus(self.off, _times(i, self.rs), _times(j, self.cs))}]"
        if self.transposed:
            i, j = j, i
        return f"{self.name}[{_plus(self.r0, i)}, {_plus(self.c0, j)}]"


class LoopPrinter:
    r"""Print the steps of a :class:`Program` as loops over :class:`Buffer` entries.

    ``refs`` maps the inputs (matrix expressions: weights, state blocks) to buffers and
    ``scalars`` scalar expressions to code. A step's target is a new temporary: in the
    scratch vector ``ws`` (``flat``: its offset a local ``o_<name>`` computed from ``d, k,
    m``) or a 2-D array of its own (``np.empty``). Printed forms:

    - a product :math:`XY`: each entry ``acc = 0.0; acc += X[i, p] * Y[p, j]`` for
      ``p = 0, 1, ...``; into a column (``cols == 1``) with ``p`` in the outer loop (one
      accumulator per row, the same sums);
      with ``calls``, a product of row-major scratch or weight buffers as a call of
      ``_kernels.product`` (the same sums);
    - a sum of two terms: the first into the target, the second added entry by entry;
    - a factor :math:`c^{-1}` as a division by ``c``, a number as a multiplication;
    - a product of more factors, left to right, each partial product a temporary.
    """

    def __init__(self, refs, scalars, flat=True, widths=None, failure=("return False",),
                 calls=False):
        self.failure = list(failure)        # what a failed call does (a field: NaN, return)
        self.calls = calls and flat         # row-major products as calls of _kernels.product
        self.refs = dict(refs)
        self.scalars = dict(scalars)
        self.flat = flat
        self.widths = dict(widths or {})    # symbolic sizes printed as a name (d + 1 -> m)
        self.lines = []
        self.offsets = []           # (local name, code): the scratch offsets, in order
        self.bases = {}             # code -> local name: the compound sizes and offsets
        self._end = "0"
        self._count = 0

    # --- buffers -----------------------------------------------------------------
    def _base(self, code, keep=("0",)):
        """A local name for the size or offset ``code``: itself when a name or in ``keep``."""
        if code.isidentifier() or code in keep:
            return code
        if code not in self.bases:
            self.bases[code] = f"b{len(self.bases)}"
        return self.bases[code]

    def named(self, buf):
        """``buf`` with its offsets and compound sizes read from locals (:meth:`prologue`)."""
        if buf is None:
            return None
        return dataclasses.replace(
            buf, off=self._base(buf.off), r0=self._base(buf.r0), c0=self._base(buf.c0),
            rows=self._base(buf.rows, ("0", "1")), cols=self._base(buf.cols, ("0", "1")),
            rs=self._base(buf.rs, ("0", "1")), cs=self._base(buf.cs, ("0", "1")))

    def prologue(self, sizes=("k", "d", "m")):
        r"""The scratch offsets, :meth:`named`'s locals and ``sizes`` as unsigned integers.

        Every index the loops print is then a sum of products of unsigned integers (the
        loop counters too, ranges of unsigned bounds), which Numba uses without its
        negative-index wrap (a compare and a select at every access of a signed index).
        """
        return ([f"{o} = np.uint64({code})" for o, code in self.offsets]
                + [f"{name} = np.uint64({code})" for code, name in self.bases.items()]
                + [f"{', '.join(sizes)} = {', '.join(f'np.uint64({n})' for n in sizes)}"])

    def shape(self, e):
        """The code of ``e``'s rows and columns."""
        return tuple(_code(sp.sympify(n).xreplace(self.widths)) for n in e.shape)

    def ref(self, e):
        """The buffer of an input, temporary, transpose or row slice; None otherwise."""
        return self.named(self._ref(e))

    def _ref(self, e):
        if e in self.refs:
            return self.refs[e]
        if isinstance(e, sp.Transpose):
            inner = self._ref(e.arg)
            return None if inner is None else inner.T
        if isinstance(e, sp.MatrixSlice):
            parent = self._ref(e.parent)
            (r0, r1, step), (c0, c1, _) = e.rowslice, e.colslice
            if parent is None or step != 1 or c0 != 0 or sp.simplify(c1 - e.parent.shape[1]) != 0:
                return None
            return parent.rows_from(r0, r1)
        return None

    def temporary(self, rows, cols, name=None):
        """A new temporary of ``rows x cols`` (code)."""
        if name is None:
            name = f"t{self._count}"
            self._count += 1
        if not self.flat:
            T = self.named(Buffer(name, rows, cols, flat=False))
            self.lines.append(f"{name} = np.empty(({T.rows}, {T.cols}))")
            return T
        off = f"o_{name}"
        self.offsets.append((off, self._end))
        self._end = _plus(off, _times(rows, cols))
        return self.named(Buffer("ws", rows, cols, off=off, rs=cols))

    # --- printing ----------------------------------------------------------------
    def _loops(self, T, body):
        """``body(i, j)`` for every entry of ``T``: one loop for a column."""
        if T.cols == "1":
            return [f"for i in range({T.rows}):", f"    {body('i', '0')}"]
        return [f"for i in range({T.rows}):", f"    for j in range({T.cols}):",
                f"        {body('i', 'j')}"]

    def _scaled(self, e):
        """``(buffer, sign, suffix)`` of a term ``coeff * X`` (``X`` a buffer).

        ``sign`` is ``"-"`` for a negative coefficient (its magnitude in ``suffix``);
        ``suffix`` is `` / c`` for a coefficient ``1/c``, `` / (2.0 * c)`` for
        ``1/(2c)``, `` * s`` otherwise; all None for another term.
        """
        coeff, mats = (e.as_coeff_matrices() if isinstance(e, sp.MatMul) else (1, [e]))
        ref = self.ref(mats[0]) if len(mats) == 1 else None
        if ref is None:
            return None, None, None
        sign = ""
        if coeff != 1 and sp.sympify(coeff).could_extract_minus_sign():
            sign, coeff = "-", -coeff
        if coeff == 1:
            return ref, sign, ""
        inv = 1 / coeff
        if all(not (f.is_Pow and f.exp < 0) for f in sp.Mul.make_args(inv)):
            code = _coeff_code(inv, self.scalars)
            return ref, sign, f" / ({code})" if " " in code else f" / {code}"
        code = _coeff_code(coeff, self.scalars)
        return ref, sign, f" * ({code})" if " " in code else f" * {code}"

    def operand(self, e):
        """The buffer of a product's factor, computed into a temporary when needed."""
        ref = self.ref(e)
        if ref is not None:
            return ref
        T = self.temporary(*self.shape(e))
        self.assign(T, e)
        return T

    def product(self, T, X, Y, tail=None):
        """``T = X Y``, every entry summed over ``p`` in increasing order.

        ``tail(i, j)``: code applied to the sum as it is stored (`` * (2.0 * c)``,
        `` + X[i, j]``); for a column, in a loop of its own after the sums.
        """
        if self.calls and tail is None and T.cols != "1" and X.cs == Y.cs == T.cs == "1":
            args = [f"{B.name}, {self._base(B.off, ())}, {B.rs}" for B in (X, Y, T)]
            self.lines.append(f"_kernels.product({', '.join(args)}, {T.rows}, {T.cols}, {X.cols})")
            return
        if T.cols == "1":
            self.lines += [f"for i in range({T.rows}):", f"    {T.at('i', '0')} = 0.0",
                           f"for p in range({X.cols}):", f"    yp = {Y.at('p', '0')}",
                           f"    for i in range({T.rows}):",
                           f"        {T.at('i', '0')} += {X.at('i', 'p')} * yp"]
            if tail is not None:
                self.lines += self._loops(T, lambda i, j: f"{T.at(i, j)} = {T.at(i, j)}{tail(i, j)}")
            return
        self.lines += [f"for i in range({T.rows}):", f"    for j in range({T.cols}):",
                       "        acc = 0.0", f"        for p in range({X.cols}):",
                       f"            acc += {X.at('i', 'p')} * {Y.at('p', 'j')}",
                       f"        {T.at('i', 'j')} = acc{tail('i', 'j') if tail else ''}"]

    def _entry(self, e):
        """``entry(i, j)``: the code of an entry of ``e`` (identity or scaled buffer), or None."""
        if isinstance(e, sp.Identity):
            return lambda i, j: "(1.0 if i == j else 0.0)"
        ref, sign, suffix = self._scaled(e)
        if ref is None:
            return None
        return lambda i, j: f"{sign}{ref.at(i, j)}{suffix}"

    def _two_factors(self, e):
        """``(X, Y)``: the buffers of a product of two factors (coefficient 1), or None."""
        if not isinstance(e, sp.MatMul) or len(e.args) != 2 or e.as_coeff_matrices()[0] != 1:
            return None
        return self.operand(e.args[0]), self.operand(e.args[1])

    def assign(self, T, e):
        """Print ``T = e``."""
        if isinstance(e, sp.Identity):
            self.lines += self._loops(T, lambda i, j: f"{T.at(i, j)} = 1.0 if i == j else 0.0")
            return
        if isinstance(e, GramFunctionCross):
            self.gram_cross(T, e)
            return
        if isinstance(e, sp.MatAdd):
            terms = sorted(e.args, key=lambda a: (not isinstance(a, sp.Identity),
                                                  self._scaled(a)[0] is not None))
            if len(terms) != 2:
                raise NotImplementedError(f"only sums of two terms: {e}")
            ref, sign, suffix = self._scaled(terms[1])
            if ref is None:
                ref, sign, suffix = self.operand(terms[1]), "", ""

            def second(i, j):
                return f" {sign or '+'} {ref.at(i, j)}{suffix}"

            first = self._entry(terms[0])
            if first is not None:           # entry by entry, in one loop
                self.lines += self._loops(T, lambda i, j: f"{T.at(i, j)} = {first(i, j)}{second(i, j)}")
                return
            factors = self._two_factors(terms[0])
            if factors is not None:         # the product, the second term added as it is stored
                self.product(T, *factors, tail=second)
                return
            self.assign(T, terms[0])
            self.lines += self._loops(T, lambda i, j: f"{T.at(i, j)} = {T.at(i, j)}{second(i, j)}")
            return
        ref, sign, suffix = self._scaled(e)
        if ref is not None:
            self.lines += self._loops(T, lambda i, j: f"{T.at(i, j)} = {sign}{ref.at(i, j)}{suffix}")
            return
        if isinstance(e, sp.MatMul):
            coeff, mats = e.as_coeff_matrices()
            if coeff != 1:          # the product, each entry times the coefficient as stored
                code = _coeff_code(coeff, self.scalars)
                inner = sp.MatMul(*mats) if len(mats) > 1 else mats[0]
                factors = self._two_factors(inner)
                if factors is not None:
                    self.product(T, *factors, tail=lambda i, j: f" * ({code})")
                else:
                    self.assign(T, inner)
                    self.lines += self._loops(T, lambda i, j: f"{T.at(i, j)} *= {code}")
                return
            mats = list(e.args)
            left = self.operand(mats[0])
            for i, right in enumerate(mats[1:]):
                right = self.operand(right)
                last = i == len(mats) - 2
                out = T if last else self.temporary(left.rows, right.cols)
                self.product(out, left, right)
                left = out
            return
        raise NotImplementedError(f"cannot print {type(e).__name__}: {e}")

    def view(self, T):
        """A buffer as a 2-D array (a contiguous slice of ``ws`` reshaped, or the array)."""
        if not T.flat:
            return T.name
        size = _times(T.rows, T.cols)
        return f"{T.name}[{T.off}:{_plus(T.off, size)}].reshape(({T.rows}, {T.cols}))"

    def gram_cross(self, T, e):
        r""":math:`T = B f(B^TB) = U\operatorname{diag}(s f(s^2))W^T` from the SVD of ``B``.

        The scalar :math:`s f(s^2)` is printed from its SymPy expression (as the NumPy
        helper's, :func:`gram_cross_helper`); where ``B`` is not finite the printer's
        ``failure`` runs.
        """
        B = self.operand(e.arg)
        n = B.rows
        sv = sp.Symbol("sv_j", nonnegative=True)
        scalar = print_scalar(sp.simplify(sv * e.f(sv ** 2))).replace("sv_j", "sv[j]")
        self.lines += [f"if not _kernels.finite({self.view(B)}):"]
        self.lines += [f"    {line}" for line in self.failure]
        self.lines += [f"U, sv, Wt = np.linalg.svd({self.view(B)})", f"for j in range({n}):",
                       f"    f = {scalar}", f"    for i in range({n}):", "        U[i, j] *= f"]
        self.product(T, Buffer("U", n, n, flat=False), Buffer("Wt", n, n, flat=False))

    def call(self, targets, exprs):
        r"""A call with several results: :math:`G` (and :math:`E`) of ``_kernels.gain``.

        ``exprs``: ``(RegularizedGain(B),)`` or ``(RegularizedGain(B), InverseGram(B))``;
        where the gain does not exist (``B`` not finite) the printer's ``failure`` runs.
        """
        gain, *rest = exprs
        if not isinstance(gain, RegularizedGain) or any(
                not isinstance(x, InverseGram) or x.arg != gain.arg for x in rest):
            raise NotImplementedError(f"cannot print the call {exprs}")
        B = self.operand(gain.arg)
        k_, d_ = B.rows, B.cols
        G = self.temporary(d_, k_, targets[0].name)
        self.refs[targets[0]] = G
        H = self.temporary(k_, k_)
        if rest:
            E = self.temporary(k_, k_, targets[1].name)
            self.refs[targets[1]] = E
            args = [B, G, H, H, E]
        else:
            args = [B, G, H, self.temporary(k_, d_), H]
        self.lines.append(f"if not _kernels.gain({', '.join(self.view(a) for a in args)}, "
                          f"{bool(rest)}):")
        self.lines += [f"    {line}" for line in self.failure]

    def steps(self, program, outputs):
        """Print ``program``: its steps into new temporaries, its returns into ``outputs``.

        A step whose target has a buffer already (an output bound in ``refs``) writes there.
        """
        for target, e in program.steps:
            if isinstance(target, tuple):
                self.call(target, e)
                continue
            T = self.named(self.refs.get(target))   # an output bound beforehand, or a temporary
            if T is None:
                T = self.temporary(*self.shape(target), target.name)
                self.refs[target] = T
            self.assign(T, e)
        for out, e in zip(outputs, program.returns):
            self.assign(self.named(out), e)


@dataclasses.dataclass
class LoopFunction:
    """A generated plain-Python kernel function (its source lines), marked for Numba."""

    name: str
    args: tuple
    doc: str
    lines: list
    mark: str = "_compiled_later()"

    def source(self):
        out = [f"@{self.mark}\n", f"def {self.name}({', '.join(self.args)}):\n",
               '    r"""' + self.doc.strip().replace("\n", "\n    ") + '\n    """\n']
        out += [f"    {line}\n" for line in self.lines]
        return "".join(out)


def _data_layout(inputs):
    """Buffers of the weights packed one after another into ``data`` (row-major).

    ``inputs``: ``(expr, rows, cols)`` with code sizes, ``rows`` None for a scalar.
    Returns ``(refs, scalars, lines)``: scalars are read into locals first.
    """
    refs, scalars, lines, off = {}, {}, [], "0"
    for expr, name, rows, cols in inputs:
        if rows is None:
            scalars[expr] = name
            lines.append(f"{name} = data[{off}]")
            off = _plus(off, "1")
        else:
            refs[expr] = Buffer("data", rows, cols, off=off, rs=cols)
            off = _plus(off, _times(rows, cols))
    return refs, scalars, lines


def _used(lines, body):
    """The assignments ``name = ...`` of ``lines`` whose name the ``body`` reads."""
    import re

    text = "\n".join(body)
    return [line for line in lines if re.search(rf"\b{line.split(' = ')[0]}\b", text)]


def head_body(name, doc, inputs, factor, mean=None, state=None, second_moment=False,
              calls=False):
    r"""The :class:`LoopFunction` ``name(data, k, d, m, y, out, ws)`` of one head's :math:`Z'`.

    ``inputs``: the weights in ``data``, in order, ``(expr, code name, rows, cols)``
    (``rows`` None for a scalar). ``factor``: a :class:`Program` in :data:`L` (and
    ``state`` symbols) whose one return is :math:`L' = M L` (``out[:, :d]``); ``mean``: one
    in :data:`L` and :data:`alpha` whose one return is :math:`\alpha'` (``out[:, d]``,
    printed under ``if m > d``). ``second_moment``: ``factor`` is in the whole state
    ``state`` (``d x m``) and returns all of :math:`Z'`. ``calls``: the products of
    row-major buffers as calls of the shared compiled ``_kernels.product`` (the same
    sums; fewer loops for Numba to compile, a call per product at run time).
    """
    refs, scalars, lines = _data_layout(inputs)
    y = Buffer("y", "d", "m", rs="m")
    out = Buffer("out", "d", "m", rs="m")
    if second_moment:
        refs[state] = y
        outputs = [out]
    else:
        refs[L] = Buffer("y", "d", "d", rs="m")
        refs[alpha] = Buffer("y", "d", "1", off="d", rs="m")
        outputs = [Buffer("out", "d", "d", rs="m")]
    printer = LoopPrinter(refs, scalars, widths={d + 1: sp.Symbol("m")},
                          failure=("for i in range(d * m):", "    out[i] = np.nan", "return"),
                          calls=calls)
    printer.steps(factor, outputs)
    body = printer.lines
    printer.lines = []
    if mean is not None:
        printer.steps(mean, [Buffer("out", "d", "1", off="d", rs="m")])
        body = body + ["if m > d:"] + [f"    {line}" for line in printer.lines]
    counted = any("_kernels." in line for line in body)    # a call that allocates
    return LoopFunction(name, ("data", "k", "d", "m", "y", "out", "ws"), doc,
                        _used(lines, body) + printer.prologue() + body,
                        mark="_compiled_later(counted=True)" if counted else "_compiled_later()")


#: the parts of a head's Jacobian, as the targets of the steps that compute them
#: (:func:`head_parts`): :math:`dM[d\Sigma] = A\,d\Sigma\,C`, the field matrix ``M``,
#: :math:`\partial\alpha'/\partial\alpha = N` and :math:`d\alpha'[d\Sigma] = A\,d\Sigma\,r`
PART_A, PART_C, PART_M, PART_N = (sp.MatrixSymbol(n, d, d) for n in "ACMN")
PART_r = sp.MatrixSymbol("r", d, 1)


def head_parts(name, doc, inputs, parts, mean_parts=None, state=None, guards=()):
    r"""The :class:`LoopFunction` ``name(data, k, d, m, Z, A, C, M, N, r) -> bool``.

    ``parts``: a :class:`Program` in :data:`L` whose steps compute :data:`PART_A`,
    :data:`PART_C` and :data:`PART_M` (into the arguments ``A``, ``C``, ``M``);
    ``mean_parts`` (in :data:`L` and :data:`alpha`, printed under ``if m > d``):
    :data:`PART_N` and :data:`PART_r`. ``Z`` and the parts are arrays (``r`` 1-D);
    temporaries are arrays of their own. ``state``: the whole state's symbol (a
    ``second_moment`` head, whose ``parts`` are in it). ``guards``: code of conditions
    (of ``Z``, ``d``) without which the closed form does not hold: False first.
    """
    refs, scalars, lines = _data_layout(inputs)
    checks = [line for g in guards for line in (f"if not {g}:", "    return False")]
    if state is not None:
        refs[state] = Buffer("Z", "d", "m", flat=False)
    refs[L] = Buffer("Z", "d", "d", flat=False)
    refs[alpha] = Buffer("Z", "d", "1", flat=False, c0="d")
    refs.update({s: Buffer(s.name, "d", "d", flat=False) for s in (PART_A, PART_C, PART_M, PART_N)})
    refs[PART_r] = Buffer("r", "d", "1")
    printer = LoopPrinter(refs, scalars, flat=False, widths={d + 1: sp.Symbol("m")})
    printer.steps(parts, [])
    body = printer.lines
    if mean_parts is not None:
        printer.lines = []
        printer.steps(mean_parts, [])
        body = body + ["if m > d:"] + [f"    {line}" for line in printer.lines]
    return LoopFunction(name, ("data", "k", "d", "m", "Z", "A", "C", "M", "N", "r"), doc,
                        checks + _used(lines, body) + printer.prologue() + body + ["return True"],
                        mark="_compiled_later(counted=True)")


def check_parts(field, parts, mean_parts=None):
    r"""Whether printed Jacobian parts (:func:`head_parts`) are those of the affine field ``b + Mx``.

    Composed back from the programs: :math:`M(\Sigma) = A\Sigma C` for every
    :math:`\Sigma` (so :math:`dM[d\Sigma] = A\,d\Sigma\,C`) and the printed ``M`` is
    :math:`M(LL^T)`; with ``mean_parts``, for :math:`\alpha' = b + M\alpha`,
    :math:`\alpha'(\alpha) - \alpha'(0) = N\alpha` at :math:`\Sigma = LL^T` and
    :math:`\alpha'(\Sigma) - \alpha'(0) = A\Sigma r` (``alpha'`` is affine in each).
    """
    targets = (PART_A, PART_C, PART_M) + ((PART_N, PART_r) if mean_parts is not None else ())
    steps = list(parts.steps) + (list(mean_parts.steps) if mean_parts is not None else [])
    got = dict(zip(targets, (resolve_block_slices(expand_nodes(e))
                             for e in Program(steps, targets).composed())))
    at_L = {Sigma: L * L.T}
    A, C = got[PART_A], got[PART_C]
    ok = (is_zero_matrix(field.M - A * Sigma * C)
          and is_zero_matrix(got[PART_M] - field.M.xreplace(at_L)))
    if mean_parts is not None:
        mean = field.b + field.M * alpha
        ok = ok and is_zero_matrix((mean - mean.xreplace({alpha: zero_vec})).xreplace(at_L)
                                   - got[PART_N] * alpha)
        ok = ok and is_zero_matrix(mean - mean.xreplace({Sigma: sp.ZeroMatrix(d, d)})
                                   - A * Sigma * got[PART_r])
    return ok

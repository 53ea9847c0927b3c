r"""The stacked factor-form field ``L' = M(Sigma) L`` and its exact Jacobian.

One :class:`Field` evaluates the covariance equation in factor form (docs/math.md
section 10) for a stack of trajectories whose attentions may differ: trajectories with the
same structure (type, number of heads, ``k``, ``d``) share one vectorised call of the
generated functions in :mod:`gaussian_pde._generated`, which broadcast over leading axes
of the state and of stacked weights ``Q, K, V`` of shape ``(B, k, d)`` (a softmax stack
runs the same products in a loop compiled by Numba, :mod:`._compiled`). The same object,
with one row, is the right-hand side of :func:`gaussian_pde.solve`'s exact Jacobian.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .._common.linalg import l2_gain_parts
from .._common.validation import validate_array
from ..attention._base import Attention, SingleHeadAttention
from ..attention._multihead import MultiHead
from ..attention._registry import get_attention
from ._compiled import kernel as compiled_kernel

__all__ = ["Field", "build_field", "analytic_jacobian", "cov_rate"]

#: generated modules whose factor field has an exact Jacobian (:func:`analytic_jacobian`)
_HOLOMORPHIC = ("softmax", "l2")

#: generated modules whose ``factor_apply`` on a stack of factors has a compiled loop
#: (:mod:`._compiled`): NumPy's matmul on stacks of small matrices costs about 0.15 us per
#: matrix and product
_COMPILED_APPLY = {"softmax": "softmax_apply_stack"}


def cov_rate(L, dL):
    """``(Sigma, Sigma')`` from the factor and its rate: ``Sigma' = dL L^T + L dL^T``."""
    cov = L @ np.swapaxes(L, -1, -2)
    dcov = dL @ np.swapaxes(L, -1, -2)
    return cov, dcov + np.swapaxes(dcov, -1, -2)


def _signature(att):
    if isinstance(att, MultiHead):
        return ("multihead",) + tuple(_signature(h) for h in att.heads)
    if isinstance(att, SingleHeadAttention) and att._generated is not None:
        return (type(att), att.k, att.d)
    raise TypeError(f"`attentions_or_weights` holds an attention type that cannot be batched: "
                    f"{att!r} (softmax, L2, Sinkhorn and MultiHead of those can).")


def _heads(att):
    return att.heads if isinstance(att, MultiHead) else (att,)


class Field:
    """Stacked weights grouped by structure; evaluates ``L'`` for any subset of rows."""

    def __init__(self, groups, n):
        # groups: list of (global indices or None for all, [(gen, Q, K, V, scale), ...]);
        # each head also keeps the generated weight products (factor_weights), computed
        # once here, so that an evaluation multiplies the state only
        self.groups = [(idx, [(gen, Q, K, V, s, _weight_products(gen, Q, K, V, s))
                              for gen, Q, K, V, s in heads]) for idx, heads in groups]
        self.n = n
        self.group_of = np.empty(n, dtype=int)
        self.local = np.empty(n, dtype=int)
        for g, (idx, _) in enumerate(groups):
            idx = np.arange(n) if idx is None else idx
            self.group_of[idx] = g
            self.local[idx] = np.arange(idx.size)
        self.calls = 0
        self._cache_key = None
        #: whether :func:`analytic_jacobian` applies (every head softmax or L2)
        gens = {gen: gen.__name__.rsplit(".", 1)[-1] for _, heads in self.groups
                for gen, *_ in heads}
        kinds = set(gens.values())
        #: generated module -> the name of its compiled stacked ``factor_apply``, loaded at
        #: the first evaluation (``solve`` builds a field it may never evaluate)
        self._compiled = {gen: _COMPILED_APPLY[kind] for gen, kind in gens.items()
                          if kind in _COMPILED_APPLY}
        self.analytic_jacobian = kinds <= set(_HOLOMORPHIC)
        #: whether an L2 head is present, whose closed-form Jacobian holds only while the
        #: factor's columns stay within gaussian_pde.integrate._differences's spread
        self.has_l2 = "l2" in kinds

    def _plan(self, idx, stacked=False):
        """Rows and weights of each group for trajectories ``idx``.

        ``stacked``: the states will carry one more leading axis (``(m, P, d, d)``, ``P``
        states per trajectory), so per-row weights get a broadcasting axis.
        """
        def take(w, loc):
            if w.shape[0] == 1:
                return w
            return w[loc][:, None] if stacked else w[loc]

        plan = []
        for g, (_, heads) in enumerate(self.groups):
            rows = np.flatnonzero(self.group_of[idx] == g)
            if rows.size == 0:
                continue
            loc = self.local[idx[rows]]
            params = [(gen, take(Q, loc), take(K, loc), take(V, loc), take(s, loc),
                       None if W is None else tuple(take(w, loc) for w in W))
                      for gen, Q, K, V, s, W in heads]
            plan.append((None if rows.size == idx.size else rows, params))
        return plan

    def set_active(self, idx):
        self._active = self._plan(idx)

    def _eval(self, params, L):
        out = None
        for gen, Q, K, V, s, W in params:
            name = self._compiled.get(gen)
            if W is None:
                term = gen.factor_rhs(Q, K, V, s, L)
            elif (name is not None and L.ndim == 3 and L.dtype == np.float64
                  and W[0].shape[0] in (1, L.shape[0])
                  and (fast := compiled_kernel(name)) is not None):
                # real stacks of one state per trajectory; complex steps and the stacks
                # of the finite-difference Jacobian take the generated products
                term = np.empty_like(L)
                fast(W[0], L, term)
            else:
                term = gen.factor_apply(W, L)
            out = term if out is None else out + term
        return out

    def __call__(self, L, plan=None):
        """``L'`` for a stack aligned with the active rows (or with ``plan``'s rows)."""
        self.calls += 1
        plan = self._active if plan is None else plan
        if len(plan) == 1 and plan[0][0] is None:
            return self._eval(plan[0][1], L)
        out = np.empty_like(L)
        for rows, params in plan:
            out[rows] = self._eval(params, L[rows])
        return out

    def at(self, idx, L):
        """``L'`` at rows ``idx`` (global trajectory indices)."""
        return self(L, self._plan(idx))

    def at_stack(self, idx, L):
        """``L'`` for ``P`` states per trajectory: ``L`` of shape ``(len(idx), P, d, d)``.

        One vectorised call per structure group (the generated functions broadcast), used
        for the finite-difference Jacobian.
        """
        return self(L, self._plan(idx, stacked=True))


def _weight_products(gen, Q, K, V, s):
    """The generated module's hoisted weight products, or None if it has none."""
    make = getattr(gen, "factor_weights", None)
    if make is None:
        return None
    weights = tuple(make(Q, K, V, s))
    # stacked inputs (and scale of shape (B, 1, 1)) give stacked products: one per row,
    # or one for all, which Field._plan can subset like the weights themselves
    assert all(np.ndim(w) == 3 for w in weights)
    return weights


def _stack_heads(atts):
    """[(gen, Q, K, V, scale)] with leading batch axes for attentions of one signature."""
    per_head = list(zip(*[_heads(a) for a in atts]))
    out = []
    for heads in per_head:
        gen = heads[0]._generated
        Q = np.stack([h.Q for h in heads])
        K = np.stack([h.K for h in heads])
        V = np.stack([h.V for h in heads])
        s = np.array([h.scale for h in heads])[:, None, None]
        if len(heads) > 1 and all(h is heads[0] for h in heads):
            Q, K, V, s = Q[:1], K[:1], V[:1], s[:1]
        out.append((gen, Q, K, V, s))
    return out


def build_field(attentions_or_weights, n):
    """A :class:`Field` from one attention, a sequence of them, or stacked weights."""
    obj = attentions_or_weights
    if isinstance(obj, Attention):
        _signature(obj)
        return Field([(None, _stack_heads([obj]))], n), obj.d
    if isinstance(obj, Mapping):
        return _field_from_weights(obj, n)
    if isinstance(obj, (str, bytes)) or not isinstance(obj, Sequence):
        raise TypeError("`attentions_or_weights` must be an attention, a sequence of "
                        "attentions or a mapping of stacked weights, got "
                        f"{type(obj).__name__}.")
    atts = list(obj)
    if len(atts) != n:
        raise ValueError(f"`attentions_or_weights` has {len(atts)} attentions but `cov0s` "
                         f"has {n} covariances; they must match.")
    for i, a in enumerate(atts):
        if not isinstance(a, Attention):
            raise TypeError(f"`attentions_or_weights[{i}]` must be an attention, "
                            f"got {type(a).__name__}.")
    dims = {a.d for a in atts}
    if len(dims) != 1:
        raise ValueError(f"all `attentions_or_weights` must have the same dimension d, got "
                         f"{sorted(dims)}.")
    by_sig = {}
    for i, a in enumerate(atts):
        by_sig.setdefault(_signature(a), []).append(i)
    groups = []
    for idxs in by_sig.values():
        idxs = np.asarray(idxs)
        groups.append((idxs, _stack_heads([atts[i] for i in idxs])))
    return Field(groups, n), dims.pop()


def _field_from_weights(w, n):
    unknown = set(w) - {"kind", "Q", "K", "V", "scale"}
    if unknown or not {"kind", "Q", "K", "V"} <= set(w):
        raise ValueError("`attentions_or_weights` (stacked weights) must be a mapping with "
                         "keys 'kind', 'Q', 'K', 'V' and optionally 'scale', got keys "
                         f"{sorted(w)}.")
    try:
        cls = get_attention(w["kind"])
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"`attentions_or_weights['kind']`: {exc}") from None
    if not (issubclass(cls, SingleHeadAttention) and cls._generated is not None):
        raise ValueError("`attentions_or_weights['kind']` must be a single-head kind with "
                         f"exact moment equations, got {w['kind']!r}.")
    Q = validate_array(w["Q"], "Q", ndim=(2, 3))
    Q = Q[None] if Q.ndim == 2 else Q
    k, d = Q.shape[-2:]
    if k == 0 or d == 0:
        # as the attention classes: a head needs at least one query row (the default
        # scale 1/sqrt(k) is infinite at k = 0) and one dimension
        raise ValueError(f"stacked weights `Q` must have shape (B, k, d) with k >= 1 and "
                         f"d >= 1, got {Q.shape}.")
    K = validate_array(w["K"], "K", ndim=(2, 3))
    V = validate_array(w["V"], "V", ndim=(2, 3))
    K, V = (K[None] if K.ndim == 2 else K), (V[None] if V.ndim == 2 else V)
    if K.shape[-2:] != (k, d) or V.shape[-2:] != (d, d):
        raise ValueError(f"stacked weights must have Q, K of shape (B, {k}, {d}) and V of "
                         f"shape (B, {d}, {d}), got K {K.shape}, V {V.shape}.")
    scale = w.get("scale")
    scale = np.full(1, 1.0 / np.sqrt(k)) if scale is None else validate_array(
        scale, "scale", ndim=(0, 1)).reshape(-1)
    if not np.all((scale > 0) & np.isfinite(scale)):
        raise ValueError(f"`scale` must be positive and finite, got {scale}.")
    for name, arr in (("Q", Q), ("K", K), ("V", V), ("scale", scale)):
        if arr.shape[0] not in (1, n):
            raise ValueError(f"stacked `{name}` must have 1 or {n} (= len(cov0s)) entries "
                             f"along its first axis, got {arr.shape[0]}.")
    return Field([(None, [(cls._generated, Q, K, V, scale[:, None, None])])], n), d




def _head_jacobian(kind, Q, K, V, s, L):
    r"""Jacobian of one softmax or L2 head's ``L' = M(\Sigma) L`` at stacked ``L``.

    Both fields have :math:`dM[d\Sigma] = A\,d\Sigma\,C`: softmax
    :math:`M = sV\Sigma K^TQ`, :math:`A = sV`, :math:`C = K^TQ`; L2
    :math:`M = 2sVX^{-1}\Sigma K^TQ`, :math:`X = 2s\Sigma K^TK + I`,
    :math:`A = 2sVX^{-1}`, :math:`C = K^TQ - 2sK^TKX^{-1}\Sigma K^TQ = K^T(I_k + 2sK\Sigma
    K^T)^{-1}Q`, all from the SVD of :math:`\sqrt{2s}\,KL`
    (:func:`~gaussian_pde._common.linalg.l2_gain_parts`). With
    :math:`d\Sigma = EL^T + LE^T` and :math:`B = CL`,
    :math:`dF[E] = ME + AEL^TB + ALE^TB`, so for :math:`E = e_ae_b^T`
    :math:`J_{ij,ab} = M_{ia}\delta_{jb} + A_{ia}(L^TB)_{bj} + (AL)_{ib}B_{aj}`.
    """
    r, d = L.shape[0], L.shape[-1]
    Lt = np.swapaxes(L, -1, -2)
    Kt = np.swapaxes(K, -1, -2)
    KtQ = Kt @ Q
    S = L @ Lt
    if kind == "softmax":
        A = np.broadcast_to(s * V, (r, d, d))
        C = KtQ
        M = A @ S @ KtQ
    else:
        # from the gain G = (I + B^T B)^{-1} B^T of B = sqrt(2s) K L and
        # E = (I_k + B B^T)^{-1} (one SVD, no inverse of X): X^{-1} = I - sqrt(2s) L G K,
        # X^{-1} Sigma K^T Q = L G Q / sqrt(2s), C = K^T E Q (the difference
        # K^T Q - 2s K^T K X^{-1} Sigma K^T Q would bury C's small entries in rounding)
        r2 = np.sqrt(2 * s)
        G, E = l2_gain_parts(r2 * (K @ L))
        LG = L @ G
        Xi = np.eye(d) - r2 * (LG @ K)
        P = (LG @ Q) / r2
        A = (2 * s) * (V @ Xi)
        M = (2 * s) * (V @ P)
        C = Kt @ (E @ Q)
    B = C @ L
    J = np.empty((r, d, d, d, d))
    J[...] = np.einsum("ria,rbj->rijab", A, Lt @ B)
    J += np.einsum("rib,raj->rijab", A @ L, B)
    J += np.einsum("ria,jb->rijab", M, np.eye(d))
    return J.reshape(r, d * d, d * d)


def analytic_jacobian(field, idx, L):
    """Jacobian of the field at rows ``idx`` (all heads softmax or L2), ``(r, n, n)``."""
    r, d = L.shape[0], L.shape[-1]
    out = None
    for rows, params in field._plan(idx):
        Lr = L if rows is None else L[rows]
        Jg = None
        for gen, Q, K, V, s, _ in params:
            term = _head_jacobian(gen.__name__.rsplit(".", 1)[-1], Q, K, V, s, Lr)
            Jg = term if Jg is None else Jg + term
        if rows is None:
            return Jg
        if out is None:
            out = np.empty((r, d * d, d * d))
        out[rows] = Jg
    return out

r"""The stacked factor-form field ``L' = M(Sigma) L`` and its exact Jacobian.

One :class:`Field` evaluates the covariance equation in factor form (docs/math.md
section 10) for a stack of trajectories whose attentions may differ: trajectories with the
same structure (type, number of heads, ``k``, ``d``) share one vectorised call of the
generated functions of the type (``Attention.generated``), which broadcast over leading
axes of the state and of stacked weights (``Attention.weights()``, e.g. ``Q, K, V`` of
shape ``(B, k, d)``; a type with a compiled stacked loop, ``Attention.stack_kernel()``,
runs the same products there). The same object, with one row, is the right-hand side of
:func:`gaussian_pde.solve`'s exact Jacobian.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .._common.validation import validate_array
from ..attention import Attention, get_attention, has_hook

__all__ = ["Field", "build_field", "analytic_jacobian", "cov_rate"]


def cov_rate(L, dL):
    """``(Sigma, Sigma')`` from the factor and its rate: ``Sigma' = dL L^T + L dL^T``."""
    cov = L @ np.swapaxes(L, -1, -2)
    dcov = dL @ np.swapaxes(L, -1, -2)
    return cov, dcov + np.swapaxes(dcov, -1, -2)


def _signature(att):
    """Type and weight shapes of every head: trajectories with the same one share a call."""
    sig = []
    for h in att.heads:
        if getattr(h, "generated", None) is None:
            raise TypeError(f"`attentions_or_weights` holds an attention type that cannot be "
                            f"batched: {att!r} (a batched type has a generated module and "
                            "weights: softmax, L2, Sinkhorn and MultiHead of those can).")
        sig.append((type(h),) + tuple(np.shape(w) for w in h.weights()))
    return tuple(sig)


class Field:
    """Stacked weights grouped by structure; evaluates ``L'`` for any subset of rows."""

    def __init__(self, groups, n):
        # groups: list of (global indices or None for all, [(cls, weights), ...]);
        # each head also keeps the generated weight products (factor_weights), computed
        # once here, so that an evaluation multiplies the state only
        self.groups = [(idx, [(cls, ws, _weight_products(cls.generated, ws))
                              for cls, ws in heads]) for idx, heads in groups]
        self.n = n
        self.group_of = np.empty(n, dtype=int)
        self.local = np.empty(n, dtype=int)
        for g, (idx, _) in enumerate(groups):
            idx = np.arange(n) if idx is None else idx
            self.group_of[idx] = g
            self.local[idx] = np.arange(idx.size)
        self.calls = 0
        self._cache_key = None
        classes = []
        for _, heads in self.groups:
            classes += [cls for cls, *_ in heads if cls not in classes]
        #: whether :func:`analytic_jacobian` applies (every head implements jacobian_parts)
        self.analytic_jacobian = all(cls.exact_jacobian for cls in classes)
        #: the head classes whose closed-form Jacobian holds only in part of the state
        #: space (``jacobian_holds``: L2, within gaussian_pde.integrate._differences's spread)
        self.limited = [cls for cls in classes if has_hook(cls, "jacobian_holds")]
        #: class -> its compiled stacked ``factor_apply`` (``stack_kernel``), looked up at
        #: the first evaluation (``solve`` builds a field it may never evaluate)
        self._compiled = {cls: None for cls in classes if has_hook(cls, "stack_kernel")}

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
            params = [(cls, tuple(take(w, loc) for w in ws),
                       None if W is None else tuple(take(w, loc) for w in W))
                      for cls, ws, W in heads]
            plan.append((None if rows.size == idx.size else rows, params))
        return plan

    def set_active(self, idx):
        self._active = self._plan(idx)

    def _eval(self, params, L):
        out = None
        for cls, ws, W in params:
            if W is None:
                term = cls.generated.factor_rhs(*ws, L)
            elif (cls in self._compiled and L.ndim == 3 and L.dtype == np.float64
                  and W[0].shape[0] in (1, L.shape[0])
                  and (fast := self._stack_kernel(cls)) is not None):
                # real stacks of one state per trajectory; complex steps and the stacks
                # of the finite-difference Jacobian take the generated products
                term = np.empty_like(L)
                fast(W[0], L, term)
            else:
                term = cls.generated.factor_apply(W, L)
            out = term if out is None else out + term
        return out

    def _stack_kernel(self, cls):
        fast = self._compiled[cls]
        if fast is None:
            fast = self._compiled[cls] = cls.stack_kernel()
        return fast

    def jacobian_holds(self, L):
        """Where every limited head class's closed form keeps its digits (per factor)."""
        holds = np.ones(L.shape[0], dtype=bool)
        for cls in self.limited:
            holds &= cls.jacobian_holds(L)
        return holds

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


def _weight_products(gen, ws):
    """The generated module's hoisted weight products, or None if it has none."""
    make = getattr(gen, "factor_weights", None)
    if make is None:
        return None
    weights = tuple(make(*ws))
    # stacked inputs (and scale of shape (B, 1, 1)) give stacked products: one per row,
    # or one for all, which Field._plan can subset like the weights themselves
    assert all(np.ndim(w) == 3 for w in weights)
    return weights


def _stack_heads(atts):
    """[(cls, weights)] with leading batch axes for attentions of one signature.

    Each weight gains a leading axis; a scalar (the scale) becomes ``(B, 1, 1)`` so that
    it broadcasts against stacked matrices.
    """
    per_head = list(zip(*[a.heads for a in atts]))
    out = []
    for heads in per_head:
        cols = list(zip(*[h.weights() for h in heads]))
        ws = []
        for col in cols:
            w = np.stack([np.asarray(x, dtype=float) for x in col])
            ws.append(w[:, None, None] if w.ndim == 1 else w)
        if len(heads) > 1 and all(h is heads[0] for h in heads):
            ws = [w[:1] for w in ws]
        out.append((type(heads[0]), tuple(ws)))
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


#: the weights of a head that stacked weights (a mapping) can describe
_QKV = ("Q", "K", "V", "scale")


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
    if getattr(cls, "generated", None) is None or getattr(cls, "weight_names", None) != _QKV:
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
    return Field([(None, [(cls, (Q, K, V, scale[:, None, None]))])], n), d


def _head_jacobian(cls, ws, L):
    r"""Jacobian of one head's ``L' = M(\Sigma) L`` at stacked ``L`` (``jacobian_parts``).

    With :math:`dM[d\Sigma] = A\,d\Sigma\,C`, :math:`d\Sigma = EL^T + LE^T` and
    :math:`B = CL`, :math:`dF[E] = ME + AEL^TB + ALE^TB`, so for :math:`E = e_ae_b^T`
    :math:`J_{ij,ab} = M_{ia}\delta_{jb} + A_{ia}(L^TB)_{bj} + (AL)_{ib}B_{aj}`.
    """
    r, d = L.shape[0], L.shape[-1]
    Lt = np.swapaxes(L, -1, -2)
    M, A, C, _, _ = cls.jacobian_parts(ws, L)
    A = np.broadcast_to(A, (r, d, d))
    B = C @ L
    J = np.empty((r, d, d, d, d))
    J[...] = np.einsum("ria,rbj->rijab", A, Lt @ B)
    J += np.einsum("rib,raj->rijab", A @ L, B)
    J += np.einsum("ria,jb->rijab", M, np.eye(d))
    return J.reshape(r, d * d, d * d)


def analytic_jacobian(field, idx, L):
    """Jacobian of the field at rows ``idx`` (every head has ``jacobian_parts``), ``(r, n, n)``."""
    r, d = L.shape[0], L.shape[-1]
    out = None
    for rows, params in field._plan(idx):
        Lr = L if rows is None else L[rows]
        Jg = None
        for cls, ws, _ in params:
            term = _head_jacobian(cls, ws, Lr)
            Jg = term if Jg is None else Jg + term
        if rows is None:
            return Jg
        if out is None:
            out = np.empty((r, d * d, d * d))
        out[rows] = Jg
    return out

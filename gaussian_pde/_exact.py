r"""Closed-form solutions of the moment equations (docs/math.md section 4).

Softmax with :math:`V = I` (one head or several, all with :math:`V_h = I`):
:math:`\Sigma' = \Sigma(A + A^T)\Sigma`, so :math:`(\Sigma^{-1})' = -(A + A^T)` and

.. math::

    \Sigma(t) = \Sigma_0^{1/2}\big(I - t\,\Sigma_0^{1/2} S \Sigma_0^{1/2}\big)^{-1}
    \Sigma_0^{1/2},\qquad S = \textstyle\sum_h (A_h + A_h^T),

which is :math:`(\Sigma_0^{-1} - tS)^{-1}` when :math:`\Sigma_0` is invertible and stays
valid when it is not. It blows up at
:math:`t^* = 1/\lambda_{\max}(\Sigma_0^{1/2} S\Sigma_0^{1/2})` when that eigenvalue is
positive.

Sinkhorn (and sums of Sinkhorn heads): the mean's equation :math:`\alpha' = N\alpha`
does not involve the covariance (:meth:`~gaussian_pde.Attention.mean_generator`),
so :math:`\alpha(t) = e^{tN}\alpha_0` (:func:`linear_mean`).

In ``d = 1`` every Gaussian-preserving type is a scalar ODE for the variance
:math:`s = \sigma^2` with an explicit solution (:func:`scalar_solution`).
"""

from __future__ import annotations

import numpy as np

from ._common.linalg import psd_sqrt
from ._common.validation import validate_array, validate_covariance, validate_positive
from .attention import validate_attention

__all__ = ["exact_covariance", "blowup_time", "scalar_solution", "linear_mean", "expm_stack"]


def _riccati_S(attention):
    r""":math:`S` of :math:`\Sigma' = \Sigma S\Sigma` (``Attention.riccati_matrix``), else error."""
    S = attention.riccati_matrix()
    if S is None:
        raise ValueError(
            "`attention` has no closed-form covariance: the exact solution is known for "
            "a type whose covariance obeys Sigma' = Sigma S Sigma (softmax attention with "
            f"V = I, one head or a MultiHead of such heads; none with V != I), got {attention!r}.")
    return S


def blowup_time(attention, cov0):
    r"""Exact finite-time blow-up time of softmax attention with :math:`V = I`.

    .. math:: t^* = 1/\lambda_{\max}(\Sigma_0^{1/2}(A + A^T)\Sigma_0^{1/2})

    Returns ``numpy.inf`` when that eigenvalue is not positive (global existence).
    Raises ``ValueError`` for attention types without a closed form.
    """
    validate_attention(attention)
    S = _riccati_S(attention)
    cov0 = validate_covariance(cov0, "cov0", d=attention.d)
    R = psd_sqrt(cov0)
    lam = np.linalg.eigvalsh(R @ S @ R)[-1]
    return 1.0 / lam if lam > 0 else np.inf


def _validate_times(t):
    """Real times: a number or 1-D array; complex (even ``0.5 + 0j``) and booleans refused."""
    raw = t if isinstance(t, np.ndarray) else None
    if raw is None and not isinstance(t, (str, bytes)) and t is not None:
        try:
            raw = np.asarray(t)
        except (TypeError, ValueError):
            raw = None
    if raw is not None and raw.dtype.kind in "cb":
        kind = "complex" if raw.dtype.kind == "c" else "boolean"
        raise TypeError(f"`t` must be real times, got {kind} values {t!r}.")
    return validate_array(t, "t", ndim=(0, 1))


def exact_covariance(attention, cov0, t):
    r"""Exact covariance of softmax attention with :math:`V = I` at time(s) ``t``.

    Parameters
    ----------
    attention : Softmax or MultiHead
        Softmax head(s) with identity value matrix.
    cov0 : array_like, shape (d, d)
        Initial covariance (any rank).
    t : float or array_like, shape (T,)
        Times in ``[0, t*)``.

    Returns
    -------
    ndarray, shape (d, d) or (T, d, d)
        :math:`\Sigma_0^{1/2}(I - t\,\Sigma_0^{1/2} S\Sigma_0^{1/2})^{-1}\Sigma_0^{1/2}`.
    """
    validate_attention(attention)
    S = _riccati_S(attention)
    cov0 = validate_covariance(cov0, "cov0", d=attention.d)
    t_arr = _validate_times(t)
    if np.any(t_arr < 0):
        raise ValueError("`t` must be non-negative.")
    t_star = blowup_time(attention, cov0)
    if np.any(t_arr >= t_star):
        raise ValueError(f"`t` must be smaller than the blow-up time t* = {t_star:.12g}.")
    R = psd_sqrt(cov0)
    C = R @ S @ R
    eye = np.eye(attention.d)
    mats = eye - t_arr[..., None, None] * C
    out = R @ np.linalg.solve(mats, np.broadcast_to(R, mats.shape))
    return 0.5 * (out + np.swapaxes(out, -1, -2))


def scalar_solution(attention, mean0, var0, t):
    r"""Explicit solution of the moment ODEs in dimension ``d = 1``.

    With :math:`a = c\,K^TQ`, :math:`\kappa = c\,K^TK`, :math:`v = V` (scalars) and
    :math:`s = \sigma^2`:

    * softmax: :math:`s' = 2vas^2`, :math:`s(t) = s_0/(1 - 2vas_0t)`,
      :math:`\alpha(t) = \alpha_0 e^{vt}(1 - 2vas_0t)^{-1/2}`;
    * L2: :math:`s' = 4vas^2/(1 + 2\kappa s)`; with :math:`h = 2\kappa` and
      :math:`m = 4va`, :math:`-1/s + h\ln s = -1/s_0 + h\ln s_0 + mt`, solved by the
      Lambert W function, :math:`s = 1/(h\,W(e^{-R/h}/h))`; the mean follows from
      :math:`d\ln\alpha = v(1 + 2as)/(1 + hs)\,dt`, i.e.
      :math:`\ln(\alpha/\alpha_0) = \tfrac{v}{m}\big[-1/s + 2a\ln s\big]_{s_0}^{s}`;
    * Sinkhorn: :math:`s' = 2vas^2\varphi(a^2s^2)`,
      :math:`\varphi(g) = 2/(1+\sqrt{1+4g})`, which integrates to
      :math:`F(s) = -1/s - \sqrt{1 + 4a^2s^2}/s + 2|a|\operatorname{asinh}(2|a|s)`,
      :math:`F(s) = F(s_0) + 4vat` (inverted by a bracketing root finder to machine
      precision, ``F`` being monotone); :math:`\alpha(t) = \alpha_0e^{vt}`;
    * multi-head of softmax heads: as softmax with :math:`va = \sum_h v_ha_h` and
      :math:`v = \sum_h v_h`.

    Returns ``(mean, var)`` at the times ``t`` (arrays of the shape of ``t``).
    """
    validate_attention(attention)
    if attention.d != 1:
        raise ValueError(f"`attention` must have d = 1 for the scalar solution, got d = {attention.d}.")
    s0 = validate_positive(var0, "var0")
    m0 = validate_array(mean0, "mean0", ndim=(0, 1))
    if m0.size != 1:
        raise ValueError(f"`mean0` must be one number (d = 1), got shape {m0.shape}.")
    m0 = float(m0.reshape(-1)[0])
    t = _validate_times(t)
    sol = attention.scalar_solution(m0, s0, t)
    if sol is None:
        raise ValueError(f"no scalar closed form for {attention!r}.")
    return sol


def linear_mean(generator, mean0, times):
    r"""The mean :math:`\alpha(t) = e^{tN}\alpha_0` of :math:`\alpha' = N\alpha` at ``times``.

    The mean of a type whose mean's equation does not involve the covariance
    (:meth:`~gaussian_pde.Attention.mean_generator`; Sinkhorn: :math:`N = V`).
    Each time gets its own matrix exponential (:func:`expm_stack`, no error carried
    from one time to the next).

    Parameters
    ----------
    generator : ndarray, shape (d, d)
        :math:`N`.
    mean0 : ndarray, shape (d,)
        :math:`\alpha_0`.
    times : array_like, shape (T,)
        Times since the start, :math:`t \ge 0`.

    Returns
    -------
    ndarray, shape (T, d)
        The means; a mean past the floating-point range (it grows like
        :math:`e^{t\max\operatorname{Re}\lambda(N)}`) has entries inf or NaN, without
        a NumPy warning (the caller says where).
    """
    times = np.asarray(times, dtype=float)
    with np.errstate(all="ignore"):
        return expm_stack(times[:, None, None] * generator) @ mean0


#: degree of the Taylor polynomial of :func:`expm_stack`: its remainder on
#: :math:`\|Y\|_1 \le 1` is below :math:`e/19! \approx 2\times 10^{-17}`
_TAYLOR_DEGREE = 18
_INVERSES = 1.0 / np.arange(1, _TAYLOR_DEGREE + 1)


def expm_stack(X):
    r""":math:`e^{X_k}` for a stack ``X`` of shape ``(T, d, d)``, by NumPy alone.

    Scaling and squaring: :math:`e^X = (e^{Y})^{2^s}` with :math:`Y = X/2^s`,
    :math:`s = \max(0, \lceil\log_2\|X\|_1\rceil)` per matrix (so
    :math:`\|Y\|_1 \le 1`), and :math:`e^Y` by its Taylor polynomial of degree 18 in
    Horner's form, :math:`I + Y(I + \tfrac{Y}{2}(I + \dots(I + \tfrac{Y}{18})))`.
    :func:`scipy.linalg.expm` gives the same to rounding (tested), but runs in SciPy's
    bundled OpenBLAS, whose worker thread then spins for milliseconds: it doubled the CPU
    time of a short Sinkhorn solve with a mean. A few matrices are taken one by one (the
    products of single small matrices cost half those of a stack), more as one stack.
    Overflow gives inf or NaN entries (NumPy warns unless the caller silences it).
    """
    X = np.asarray(X, dtype=float)
    if X.shape[0] > _ONE_BY_ONE:
        return _expm(X)
    out = np.empty_like(X)
    for k in range(X.shape[0]):
        out[k] = _expm(X[k])
    return out


#: stacks up to this many matrices are exponentiated one matrix at a time
_ONE_BY_ONE = 8


def _expm(X):
    """:func:`expm_stack` of one matrix ``(d, d)`` or of a stack ``(T, d, d)``."""
    with np.errstate(divide="ignore"):
        s = np.ceil(np.log2(np.abs(X).sum(axis=-2).max(axis=-1)))
    # a zero matrix (log2 0 = -inf) needs no squaring; an inf or NaN one gets the most
    s = np.where(np.isnan(s), 2100, np.clip(s, 0, 2100)).astype(int)
    Y = np.ldexp(X, -s[..., None, None])
    eye = np.eye(X.shape[-1])
    Yk = Y[None] * _INVERSES.reshape((-1,) + (1,) * X.ndim)     # Y / k, k = 1..18
    E = Yk[-1] + eye
    for k in range(_TAYLOR_DEGREE - 2, -1, -1):
        E = np.matmul(Yk[k], E)
        E += eye
    if X.ndim == 2:
        for _ in range(int(s)):
            E = E @ E
        return E
    for j in range(int(s.max(initial=0))):
        more = s > j
        E[more] = E[more] @ E[more]
    return E

r"""The bridge: a trained model's layers handed to the package's Gaussian solvers (docs/math.md 11.4).

Head :math:`h` of layer :math:`\ell` is :class:`gaussian_pde.Softmax`
:math:`(Q_{\ell h}, K_{\ell h}, W_{O,\ell h}W_{V,\ell h})` with the model's score scale, the
layer's attention the :class:`gaussian_pde.MultiHead` of its heads and its feed-forward
map the :class:`gaussian_pde.MLP` :math:`(W_1, b_1, W_2, b_2)`. A model without
LayerNorm is then a :class:`gaussian_pde.Stack`:

* residual blocks (``no_ln``): sub-layers ``[Attn_1, FFN_1, Attn_2, ...]``, ``h = 1``,
  mode ``"residual"``; without residuals (``neither``) the same in mode ``"none"``;
* Euler simulator: layers ``Attn_l + FFN_l`` (:class:`gaussian_pde.FieldSum`),
  ``h = T/L``, mode ``"residual"`` (the Euler step is the residual map);
* RK4 simulator: the same layers in mode ``"continuous"``, the ODE that its RK4 steps
  integrate (the model's RK4 error, :math:`O(h^4)` per unit depth, is part of the
  measured difference).

:func:`gaussian_prediction` propagates :math:`\mathcal N(\alpha_0, \Sigma_0)` with
:func:`gaussian_pde.propagate_gaussian`: exact for attention-only layers (the field is
affine), the Gaussian closure with a feed-forward map. :func:`model_on_gaussian_tokens`
runs the model itself on :math:`n` tokens drawn from the same Gaussian, and
:func:`bridge` compares the two per layer for several :math:`n`: a Monte Carlo error
shrinks like :math:`n^{-1/2}`, a closure bias or a finite-:math:`n` bias does not.

The attention weights' effective sample size over :math:`n` is measured, and so is what
it converges to: for keys :math:`y \sim \mathcal N(\alpha, \Sigma)` and a query whose
score is :math:`a^Ty` (:math:`a = Ax + g`), the weights :math:`e^{a^Ty}` have
:math:`(\mathbb Ew)^2/\mathbb Ew^2 = e^{-a^T\Sigma a}`. A small ESS/n is therefore a property
of the mean-field limit itself, not a breakdown at finite :math:`n`; what makes finite
:math:`n` converge slowly is a heavy tail of the importance weights, a large
:math:`e^{a^T\Sigma a}` (the second moment of the normalised weights), reported by its
median and 90th percentile over the queries.
"""

from __future__ import annotations

import math

import numpy as np

import gaussian_pde as gp
from gaussian_pde.attention import dot_product_head, sum_of_heads

from ._measure import gaussian_fit

__all__ = ["layer_attention", "layer_ffn", "gaussian_stack", "gaussian_prediction",
           "model_on_gaussian_tokens", "bridge", "bridge_summary", "without_ffn"]


def _block(params, spec, layer):
    if not 0 <= layer < spec.depth:
        raise ValueError(f"`layer` must be in 0..{spec.depth - 1}, got {layer}.")
    s = 0 if spec.tied else layer
    return {k: np.asarray(v[s], float) for k, v in params["blocks"].items()}


def layer_attention(params, spec, layer):
    r"""The attention of ``layer`` as :class:`gaussian_pde.MultiHead` of softmax heads.

    Head :math:`h` is the softmax head
    ``dot_product_head(Q[h], K[h], Wo[h] @ Wv[h], scale=spec.score_scale)``.
    """
    b = _block(params, spec, layer)
    return sum_of_heads([dot_product_head(b["Q"][h], b["K"][h], b["Wo"][h] @ b["Wv"][h],
                                          scale=spec.score_scale) for h in range(spec.heads)])


def layer_ffn(params, spec, layer):
    """The feed-forward map of ``layer`` as :class:`gaussian_pde.MLP` (``None`` without FFN)."""
    if not spec.ffn_width:
        return None
    b = _block(params, spec, layer)
    return gp.MLP(b["W1"], b["b1"], b["W2"], b["b2"], activation=spec.activation)


def without_ffn(params, spec):
    """``(params, spec)`` of the attention-only model: the same weights, no feed-forward map."""
    blocks = {k: v for k, v in params["blocks"].items() if k not in ("W1", "b1", "W2", "b2")}
    return {**params, "blocks": blocks}, spec.replace(ffn_width=0, name=spec.name + "_attn")


def _check_bridgeable(spec):
    if spec.has_layernorm:
        raise ValueError(f"`spec` ({spec.name}) has LayerNorm: the bridge to the Gaussian "
                         "solvers is for models without normalisation.")


def gaussian_stack(params, spec):
    """The :class:`gaussian_pde.Stack` of a model without LayerNorm, and sub-layers per layer."""
    _check_bridgeable(spec)
    layers, per = [], 1
    for layer in range(spec.depth):
        att, ff = layer_attention(params, spec, layer), layer_ffn(params, spec, layer)
        if spec.simulator is None:
            layers.extend([att] if ff is None else [att, ff])
            per = 1 if ff is None else 2
        else:
            layers.append(att if ff is None else gp.FieldSum([att, ff]))
    if spec.simulator is None:
        mode = "residual" if spec.residual else "none"
    else:
        mode = "residual" if spec.simulator == "euler" else "continuous"
    return gp.Stack(layers, h=spec.step, mode=mode), per


def gaussian_prediction(params, spec, mean0, cov0, *, n_per_dim=3, blowup_threshold=1e12):
    r"""Per-layer Gaussian moments predicted from the model's weights.

    Returns ``(mean (K, d), cov (K, d, d), exact, status)``, ``K <= depth + 1`` layers
    (fewer when the prediction blew up), ``exact`` whether every map was exact.
    """
    stack, per = gaussian_stack(params, spec)
    sol = gp.propagate_gaussian(stack, mean0, cov0, n_per_dim=n_per_dim,
                                blowup_threshold=blowup_threshold)
    # whether every layer's map is exact is a property of the layers (affine against every
    # Gaussian), whether or not the propagation reached them before a blow-up
    exact = all(F.always_affine for F in stack.layers)
    return sol.mean[::per], sol.cov[::per], exact, str(sol.status)


def _pde_field(att, ff, x):
    v, diag = att.particle_velocity(x, want_ess=True)
    return (v if ff is None else v + ff.particle(x)), diag.ess


def model_on_gaussian_tokens(params, spec, x):
    r"""The model's own layers on tokens ``x`` (n, d), through the handed-over objects.

    Each layer applies the model's update (residual or not, Euler or RK4 at ``h = T/L``)
    with the particle velocities of :func:`layer_attention` and :func:`layer_ffn`; this
    equals the JAX model to rounding (``tests/training/test_bridge.py``). Returns the tokens
    ``(depth + 1, n, d)`` and the median effective sample size of the attention weights
    at each layer's input, over ``n`` (``(depth,)``).
    """
    _check_bridgeable(spec)
    out, ess = [np.asarray(x, float)], []
    for layer in range(spec.depth):
        att, ff = layer_attention(params, spec, layer), layer_ffn(params, spec, layer)
        z = out[-1]
        if not np.all(np.isfinite(z)) or np.abs(z).max() > 1e100:
            out.append(np.full_like(z, np.nan))
            ess.append(np.nan)
            continue
        with np.errstate(all="ignore"):
            if spec.simulator is None:
                v, e = att.particle_velocity(z, want_ess=True)
                z = z + v if spec.residual else v
                if ff is not None and np.all(np.isfinite(z)):
                    z = z + ff.particle(z) if spec.residual else ff.particle(z)
                e = e.ess
            else:
                h = spec.step
                k1, e = _pde_field(att, ff, z)
                if spec.simulator == "euler":
                    z = z + h * k1
                else:
                    k2 = _pde_field(att, ff, z + 0.5 * h * k1)[0]
                    k3 = _pde_field(att, ff, z + 0.5 * h * k2)[0]
                    k4 = _pde_field(att, ff, z + h * k3)[0]
                    z = z + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        out.append(z)
        ess.append(float(np.median(e)) / z.shape[0])
    return np.stack(out), np.array(ess)


#: below this fraction of the input's trace a covariance has collapsed: relative errors
#: between two collapsed covariances are rounding, not reported
COLLAPSED = 1e-12


def weight_tails(att, x, cov):
    r""":math:`\log_{10}e^{a^T\Sigma a}` for every query in ``x`` and every head of ``att``.

    :math:`a = Ax + g` is the query's score vector (:meth:`~gaussian_pde.Attention.quadratic_score`;
    heads whose score is quadratic in the key are left out), :math:`\Sigma` the keys'
    covariance. :math:`e^{-a^T\Sigma a}` is the mean-field effective sample size over
    :math:`n`; :math:`e^{a^T\Sigma a}` the second moment of the normalised weights.
    """
    vals = []
    for h in att.heads:
        qs = h.quadratic_score()
        if qs is None or qs.H is not None:
            continue
        a = x @ np.asarray(qs.A).T + (0.0 if qs.g is None else qs.g)
        vals.append(np.einsum("nd,de,ne->n", a, cov, a) / np.log(10.0))
    return np.concatenate(vals) if vals else np.full(1, np.nan)


def _errors(m_hat, c_hat, m, c):
    """Relative covariance error, mean error over sqrt(tr), and W2 over sqrt(tr), per layer.

    NaN where either covariance is not finite or has collapsed (trace below
    :data:`COLLAPSED` times the input's).
    """
    K = m.shape[0]
    out = np.full((3, K), np.nan)
    tr0 = max(float(np.trace(c[0])), 1e-300)
    for i in range(K):
        if not (np.all(np.isfinite(c_hat[i])) and np.all(np.isfinite(c[i]))):
            continue
        if min(np.trace(c[i]), np.trace(c_hat[i])) < COLLAPSED * tr0:
            continue
        tr = np.trace(c[i])
        out[0, i] = np.linalg.norm(c_hat[i] - c[i]) / np.linalg.norm(c[i])
        out[1, i] = np.linalg.norm(m_hat[i] - m[i]) / np.sqrt(tr)
        out[2, i] = float(gp.bures_wasserstein(m_hat[i], c_hat[i], m[i], c[i])) / np.sqrt(tr)
    return out


def bridge(params, spec, mean0, cov0, *, n_tokens=(64, 256, 1024), n_sequences=6, seed=0,
           n_per_dim=3):
    r"""Model against Gaussian prediction, per layer, for every sequence length in ``n_tokens``.

    For each :math:`n`, ``n_sequences`` independent sequences of :math:`n` tokens from
    :math:`\mathcal N(\alpha_0, \Sigma_0)` go through the model; each sequence's per-layer
    empirical moments are compared with :func:`gaussian_prediction`.

    Returns
    -------
    dict
        ``pred_trace`` (K,), ``exact`` (every layer's Gaussian map exact), ``status``,
        ``layers_reached`` (the layers the prediction completed: ``depth`` unless it blew
        up or failed); and per ``n`` (lists in the order of ``n_tokens``) ``cov_err``,
        ``mean_err``, ``w2_rel`` (medians over sequences, (depth + 1,) each, NaN where the
        prediction stopped or a covariance collapsed), ``model_trace`` and ``ess_frac``
        (effective sample size over :math:`n`, per layer); ``slope``, the least-squares
        slope of :math:`\log` ``cov_err`` against :math:`\log n` per layer (about
        :math:`-1/2` where the error is Monte Carlo); ``tail_median`` and ``tail_p90``
        (depth,), the median and 90th percentile over queries and heads of
        :math:`e^{a^T\Sigma a}` (:func:`weight_tails`) at each layer's input, with the
        tokens of the first sequence of the largest :math:`n` and their covariance; and
        ``ess_mean_field`` (depth,), the median of :math:`e^{-a^T\Sigma a}`, the limit of
        ``ess_frac``.
    """
    mean0, cov0 = np.asarray(mean0, float), np.asarray(cov0, float)
    m, c, exact, status = gaussian_prediction(params, spec, mean0, cov0, n_per_dim=n_per_dim)
    K, L1 = m.shape[0], spec.depth + 1
    pad = lambda a: np.concatenate([a, np.full((L1 - K,) + a.shape[1:], np.nan)])  # noqa: E731
    m, c = pad(m), pad(c)
    res = {"n_tokens": list(n_tokens), "pred_trace": np.trace(c, axis1=1, axis2=2),
           "exact": exact, "status": status, "layers_reached": K - 1, "cov_err": [],
           "mean_err": [], "w2_rel": [], "model_trace": [], "ess_frac": []}
    last_tokens = None
    rng = np.random.default_rng(seed)
    chol = np.linalg.cholesky(cov0 + 1e-12 * np.trace(cov0) * np.eye(cov0.shape[0]))
    for n in n_tokens:
        errs, traces, esss = [], [], []
        for _ in range(n_sequences):
            x = mean0 + rng.standard_normal((n, mean0.size)) @ chol.T
            toks, ess = model_on_gaussian_tokens(params, spec, x)
            if last_tokens is None and n == max(n_tokens):
                last_tokens = toks
            fits = [gaussian_fit(t) for t in toks]
            mh = np.array([f[0] for f in fits])
            ch = np.array([f[1] for f in fits])
            errs.append(_errors(mh, ch, m, c))
            traces.append(np.trace(ch, axis1=1, axis2=2))
            esss.append(ess)
        e = np.median(np.array(errs), axis=0)
        for key, row in zip(("cov_err", "mean_err", "w2_rel"), e):
            res[key].append(row)
        res["model_trace"].append(np.median(np.array(traces), axis=0))
        res["ess_frac"].append(np.median(np.array(esss), axis=0))
    ce = np.log(np.array(res["cov_err"]))
    ln = np.log(np.asarray(n_tokens, float))
    slope = np.full(L1, np.nan)
    for i in range(1, L1):
        if np.all(np.isfinite(ce[:, i])) and len(n_tokens) > 1:
            slope[i] = np.polyfit(ln, ce[:, i], 1)[0]
    res["slope"] = slope
    med, p90, emf = (np.full(spec.depth, np.nan) for _ in range(3))
    for layer in range(spec.depth):
        z = last_tokens[layer]
        if not np.all(np.isfinite(z)):
            continue
        with np.errstate(over="ignore"):
            t = weight_tails(layer_attention(params, spec, layer), z, gaussian_fit(z)[1])
        med[layer], p90[layer] = 10.0 ** np.median(t), 10.0 ** np.quantile(t, 0.9)
        emf[layer] = 10.0 ** -np.median(t)
    res.update(tail_median=med, tail_p90=p90, ess_mean_field=emf)
    return res



def bridge_summary(res):
    r"""The few numbers of one :func:`bridge` that a table over seeds and rates needs.

    Returns
    -------
    dict
        ``status``, ``exact``, ``layers_reached``; ``cov_err`` and ``slope`` per layer at
        the largest :math:`n` (lists, NaN where not measured); ``cov_err_last``, the
        relative covariance error at the last layer the prediction reached (NaN when it
        reached none); ``trace_ratio``, the model's trace over the Gaussian's there.
    """
    reached = int(res["layers_reached"])
    err = np.asarray(res["cov_err"][-1], float)
    pred = np.asarray(res["pred_trace"], float)
    with np.errstate(all="ignore"):
        ratio = float(np.asarray(res["model_trace"][-1], float)[reached] / pred[reached])
    return dict(status=res["status"], exact=bool(res["exact"]), layers_reached=reached,
                cov_err=[float(x) for x in err],
                slope=[float(x) for x in np.asarray(res["slope"], float)],
                cov_err_last=float(err[reached]) if reached > 0 else math.nan,
                trace_ratio=ratio if reached > 0 else math.nan)

r"""The models of :mod:`gaussian_pde.training._spec` in JAX: parameters, forward map, loss.

Parameters are a dict of arrays (a JAX pytree)::

    {"embed":   {"W": (d, p), "b": (d,)},
     "blocks":  {"Q", "K", "Wv": (S, H, k, d), "Wo": (S, H, d, k),
                 "W1": (S, f, d), "b1": (S, f), "W2": (S, d, f), "b2": (S, d),
                 "ln1_g", "ln1_b", "ln2_g", "ln2_b": (S, d)   (LayerNorm or DyT before
                                                               the branch; post-LN after it),
                 "lo1_g", "lo1_b", "lo2_g", "lo2_b": (S, d)   (peri-LN: on the branch output),
                 "dyt1_a", "dyt2_a": (S,)                     (DyT's scalar, initially 1/2),
                 "gate1", "gate2": (S,)                       (ReZero's gates, initially 0),
                 "alpha1", "alpha2": (S, d)                   (nGPT's step sizes, 1/L)},
     "readout": {"W": (o, d), "b": (o,)}}

with ``S`` weight sets (``depth``, or 1 when tied). Head ``h`` of layer ``l`` is the
softmax head :math:`(Q, K, V) = (Q_{lh}, K_{lh}, W_{O,lh} W_{V,lh})` with score scale
:math:`c` (:attr:`ModelSpec.score_scale`), the convention of :class:`gaussian_pde.Softmax`.

Initialisation (the same draws for every variant of the same sizes, from the same key):
entries :math:`\mathcal N(0, 1/\text{fan-in})` for :math:`Q, K, W_V, W_1`, the embedding
and the readout; :math:`\mathcal N(0, 1/d)` for :math:`W_O` (so that a head sum has the
scale of one head); :math:`\mathcal N(0, 1/f)` for :math:`W_2`; biases zero; LayerNorm
and DyT gains one and shifts zero, DyT's :math:`a = 1/2`; ReZero's gates 0; nGPT's step
sizes :math:`1/L`. No branch is scaled at initialisation beyond :math:`\beta`
(:attr:`ModelSpec.branch_factor`): with :math:`\beta = 1` and no normalisation each
layer adds a branch of the scale of its input, so the activations of ``no_ln`` grow
geometrically with depth before any training.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._compile import compiled

__all__ = ["init_params", "initial_params", "layer_tokens", "apply", "loss_fn", "attention", "ffn",
           "layer_norm", "sphere", "dyt", "block_weights", "x64"]

_LN_EPS = 1e-5


def x64():
    """A context in which JAX computes in float64 (the global setting is left alone)."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # JAX before 0.7

    return enable_x64()


def init_params(spec, task, key):
    """Initial parameters of ``spec`` for ``task`` from the JAX PRNG ``key``."""
    d, H, k, f, S = spec.width, spec.heads, spec.head_dim, spec.ffn_width, spec.n_weight_sets
    p, o = task.input_dim, task.n_outputs
    keys = jax.random.split(key, 8)

    def normal(kk, shape, var):
        return jax.random.normal(kk, shape) * jnp.sqrt(var)

    blocks = {
        "Q": normal(keys[0], (S, H, k, d), 1.0 / d),
        "K": normal(keys[1], (S, H, k, d), 1.0 / d),
        "Wv": normal(keys[2], (S, H, k, d), 1.0 / d),
        "Wo": normal(keys[3], (S, H, d, k), 1.0 / d),
    }
    if f:
        blocks.update(W1=normal(keys[4], (S, f, d), 1.0 / d), b1=jnp.zeros((S, f)),
                      W2=normal(keys[5], (S, d, f), 1.0 / f), b2=jnp.zeros((S, d)))
    subs = ("1", "2") if f else ("1",)
    if spec.norm in ("pre", "post", "peri", "dyt"):
        for i in subs:
            blocks[f"ln{i}_g"] = jnp.ones((S, d))
            blocks[f"ln{i}_b"] = jnp.zeros((S, d))
    for i in subs:
        if spec.norm == "peri":
            blocks[f"lo{i}_g"] = jnp.ones((S, d))
            blocks[f"lo{i}_b"] = jnp.zeros((S, d))
        if spec.norm == "dyt":
            blocks[f"dyt{i}_a"] = jnp.full((S,), 0.5)
        if spec.norm == "ngpt":
            blocks[f"alpha{i}"] = jnp.full((S, d), 1.0 / spec.depth)
        if spec.rezero:
            blocks[f"gate{i}"] = jnp.zeros((S,))
    return {"embed": {"W": normal(keys[6], (d, p), 1.0 / p), "b": jnp.zeros(d)},
            "blocks": blocks,
            "readout": {"W": normal(keys[7], (o, d), 1.0 / d), "b": jnp.zeros(o)}}


def initial_params(spec, task, seed):
    """:func:`init_params` for ``PRNGKey(seed)`` as NumPy arrays, from one kept executable.

    The executable depends only on the parameter shapes, so variants of the same sizes
    share it (drawing eagerly would compile each random draw on its own).
    """
    shapes = (spec.width, spec.heads, spec.ffn_width, spec.n_weight_sets, spec.norm,
              spec.rezero, spec.depth, task.input_dim, task.n_outputs)
    exe = compiled(("init", shapes), lambda key: init_params(spec, task, key),
                   jax.random.PRNGKey(0), optimize=False)
    return jax.tree_util.tree_map(np.asarray, exe(jax.random.PRNGKey(seed)))


def block_weights(params, spec, layer):
    """The weights of ``layer`` (0-based): a dict of arrays without the set axis."""
    s = 0 if spec.tied else layer
    return {name: value[s] for name, value in params["blocks"].items()}


def attention(blk, x, scale):
    r"""Multi-head softmax attention of one sequence ``x`` (n, d).

    .. math:: \mathrm{Attn}(x_i) = \sum_h V_h \sum_j w^h_{ij} x_j,\quad
              w^h_{ij} = \operatorname{softmax}_j\big(c\,\langle Q_h x_i, K_h x_j\rangle\big),
              \quad V_h = W_{O,h}W_{V,h}
    """
    q = jnp.einsum("hkd,nd->hnk", blk["Q"], x)
    kx = jnp.einsum("hkd,nd->hnk", blk["K"], x)
    w = jax.nn.softmax(scale * jnp.einsum("hik,hjk->hij", q, kx), axis=-1)
    avg = jnp.einsum("hij,jd->hid", w, x)
    V = jnp.einsum("hdk,hke->hde", blk["Wo"], blk["Wv"])
    return jnp.einsum("hid,hed->ie", avg, V)


def ffn(blk, x, activation):
    r"""Feed-forward map :math:`W_2\,\phi(W_1x + b_1) + b_2` of tokens ``x`` (n, d)."""
    u = x @ blk["W1"].T + blk["b1"]
    if activation == "relu":
        a = jax.nn.relu(u)
    else:
        a = jax.nn.gelu(u, approximate=activation == "gelu_tanh")
    return a @ blk["W2"].T + blk["b2"]


def layer_norm(x, g, b):
    r"""Per-token LayerNorm :math:`g\odot(x - \bar x)/\sqrt{\operatorname{var}x + \epsilon} + b`."""
    m = jnp.mean(x, axis=-1, keepdims=True)
    v = jnp.mean((x - m) ** 2, axis=-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + _LN_EPS) * g + b


def _field(spec, blk, x):
    """The simulator's vector field Attn(x) + FFN(x) (or Attn alone)."""
    v = attention(blk, x, spec.score_scale)
    return v + ffn(blk, x, spec.activation) if spec.ffn_width else v


def sphere(x):
    r"""Projection of each token on the sphere of radius :math:`\sqrt d`: :math:`\sqrt d\,x/|x|`."""
    d = x.shape[-1]
    return x * jnp.sqrt(d / (jnp.sum(x * x, axis=-1, keepdims=True) + _LN_EPS))


def dyt(x, a, g, b):
    r"""Dynamic Tanh :math:`g\odot\tanh(a x) + b` (a scalar :math:`a`)."""
    return g * jnp.tanh(a * x) + b


def _sublayer(spec, blk, i, sub, x):
    """Sub-layer ``i`` (1: attention, 2: FFN) applied to ``x`` as the variant says."""
    beta = spec.branch_factor
    if spec.norm == "ngpt":
        a = blk[f"alpha{i}"]
        return sphere(x + a * (sphere(sub(x)) - x))
    if spec.norm == "post":
        z = x + beta * sub(x) if spec.residual else sub(x)
        return layer_norm(z, blk[f"ln{i}_g"], blk[f"ln{i}_b"])
    z = x
    if spec.norm in ("pre", "peri"):
        z = layer_norm(z, blk[f"ln{i}_g"], blk[f"ln{i}_b"])
    elif spec.norm == "dyt":
        z = dyt(z, blk[f"dyt{i}_a"], blk[f"ln{i}_g"], blk[f"ln{i}_b"])
    z = sub(z)
    if spec.norm == "peri":
        z = layer_norm(z, blk[f"lo{i}_g"], blk[f"lo{i}_b"])
    if spec.rezero:
        z = blk[f"gate{i}"] * z
    return x + beta * z if spec.residual else z


def _block(spec, blk, x):
    """One layer of a block stack (sub-layers as in the module table of ``_spec``)."""
    c = spec.score_scale
    subs = [lambda z: attention(blk, z, c)]
    if spec.ffn_width:
        subs.append(lambda z: ffn(blk, z, spec.activation))
    for i, sub in enumerate(subs):
        x = _sublayer(spec, blk, i + 1, sub, x)
    return x


def _step(spec, blk, x):
    """One layer: a block, or one Euler / RK4 step of the simulator with ``h = T/L``."""
    if spec.simulator is None:
        return _block(spec, blk, x)
    h = spec.step
    if spec.simulator == "euler":
        return x + h * _field(spec, blk, x)
    k1 = _field(spec, blk, x)
    k2 = _field(spec, blk, x + 0.5 * h * k1)
    k3 = _field(spec, blk, x + 0.5 * h * k2)
    k4 = _field(spec, blk, x + h * k3)
    return x + h / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


def stack_tokens(params, spec, x):
    """Tokens ``x`` (n, d) after each layer: array (depth + 1, n, d), index 0 is ``x``.

    A ``jax.lax.scan`` over the layers (one compiled layer whatever the depth).
    """
    blocks = params["blocks"]

    def body(z, blk):
        z = _step(spec, blk, z)
        return z, z

    if spec.tied:
        one = {name: value[0] for name, value in blocks.items()}
        _, ys = jax.lax.scan(lambda z, _: body(z, one), x, None, length=spec.depth)
    else:
        _, ys = jax.lax.scan(body, x, blocks)
    return jnp.concatenate([x[None], ys], axis=0)


def layer_tokens(params, spec, tokens):
    """Embedded tokens after each layer for a batch ``tokens`` (B, n, p): (depth + 1, B, n, d).

    Layer 0 is the embedding (projected on the sphere for ``ngpt``).
    """
    x0 = tokens @ params["embed"]["W"].T + params["embed"]["b"]
    if spec.norm == "ngpt":
        x0 = sphere(x0)
    per = jax.vmap(lambda x: stack_tokens(params, spec, x))(x0)
    return jnp.swapaxes(per, 0, 1)


def apply(params, spec, task, tokens):
    """Model outputs (B, o) for a batch of raw tokens (B, n, p)."""
    last = layer_tokens(params, spec, tokens)[-1]
    z = last.mean(axis=1) if task.readout == "mean" else last[:, -1]
    return z @ params["readout"]["W"].T + params["readout"]["b"]


def loss_fn(params, spec, task, tokens, targets):
    """Training loss: cross-entropy (mixture, text) or MSE over var(y) (regression)."""
    out = apply(params, spec, task, tokens)
    if task.loss == "cross_entropy":
        logp = jax.nn.log_softmax(out, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, targets[:, None].astype(jnp.int32),
                                             axis=1))
    return jnp.mean((out[:, 0] - targets) ** 2) / task.target_var


def accuracy(params, spec, task, tokens, targets):
    """Classification accuracy (mixture) or None."""
    if task.loss != "cross_entropy":
        return None
    out = apply(params, spec, task, tokens)
    return float(np.mean(np.argmax(np.asarray(out), axis=1) == np.asarray(targets)))

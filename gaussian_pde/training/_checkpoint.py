r"""A GPT-2-shaped checkpoint as the package's attention heads and depth stack (NumPy only).

GPT-2 stores its linear maps as ``Conv1D`` weights of shape ``(in, out)``, applied as
:math:`y = xW + b`. Layer ``i`` of a state dict (keys optionally prefixed ``transformer.``):

=============================  ==============  ===================================
``h.{i}.attn.c_attn.weight``   ``(d, 3d)``     query, key, value columns in that order
``h.{i}.attn.c_attn.bias``     ``(3d,)``       :math:`b_q, b_k, b_v`
``h.{i}.attn.c_proj.weight``   ``(d, d)``      output map :math:`W_O^T`
``h.{i}.attn.c_proj.bias``     ``(d,)``
``h.{i}.ln_1.weight / .bias``  ``(d,)``        LayerNorm before attention
``h.{i}.ln_2.weight / .bias``  ``(d,)``        LayerNorm before the MLP
``h.{i}.mlp.c_fc.weight``      ``(d, f)``      and ``.bias`` ``(f,)``
``h.{i}.mlp.c_proj.weight``    ``(f, d)``      and ``.bias`` ``(d,)``
=============================  ==============  ===================================

With :math:`H` heads of size :math:`k = d/H`, head :math:`h` takes the rows
:math:`hk..(h+1)k` of :math:`Q = W_q^T`, :math:`K = W_k^T`, :math:`W_V = W_v^T` and of the
biases, and the columns :math:`hk..(h+1)k` of :math:`W_O`, so that (scale
:math:`1/\sqrt k`, GPT-2's)

.. math::

    \mathrm{Attn}(x_i) = \sum_h V_h\sum_j w^h_{ij}x_j + c,\qquad
    w^h_{ij} \propto e^{c_s (Q_h x_i + b_{q,h})^T(K_h x_j + b_{k,h})},\qquad
    V_h = W_{O,h}W_{V,h},\qquad c = W_O b_v + b_O .

Each head is a softmax head with both biases (:func:`gaussian_pde.attention.dot_product_head`,
the ``biased_softmax`` type: the key bias cancels in the softmax, the query bias tilts the
weights by a linear function of the key), and :math:`b_v` adds :math:`W_O b_v` to every output (the weights
sum to one), hence the constant :math:`c`. The loader is exact for GPT-2's bidirectional
map, with two differences from GPT-2 itself that the caller must keep in mind:

* GPT-2 is **causal**: token :math:`i` attends to :math:`j \le i` only. The Gaussian map
  and the heads here are the mean-field, permutation-invariant (unmasked) attention:
  every token attends to all. The package's masked type
  (:class:`gaussian_pde.Masked`) models a causal mask; this loader does not
  apply one, so its layers are GPT-2's weights in the bidirectional map.
* Position embeddings (``wpe``) and the token embedding are not read: tokens are points
  of :math:`\mathbb R^d` without position.

GPT-2's MLP uses the tanh approximation of GELU; its layers are :class:`gaussian_pde.MLP`
with ``activation="gelu_tanh"`` (the same map).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

import numpy as np

import gaussian_pde as gp
from gaussian_pde.attention import dot_product_head, sum_of_heads

__all__ = ["GPT2Checkpoint", "load_gpt2", "random_gpt2_state_dict", "gpt2_forward"]

_INSTALL = 'pip install -e ".[train]"'


def _read(source):
    if isinstance(source, dict):
        return {str(k): np.asarray(v) for k, v in source.items()}
    path = pathlib.Path(source)
    if not path.is_file():
        raise ValueError(f"`source` is not a file: {path}.")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    if path.suffix == ".safetensors":
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise ImportError(f"reading .safetensors needs the `safetensors` package: "
                              f"{_INSTALL}") from None
        return dict(load_file(str(path)))
    raise ValueError(f"`source` must be a .npz or .safetensors file, got {path.name!r}.")


@dataclasses.dataclass
class GPT2Checkpoint:
    r"""The layers of a GPT-2-shaped checkpoint in the package's terms.

    Attributes
    ----------
    d, n_head, n_layer : int
    attention : list of gaussian_pde.MultiHead
        One per layer, of ``biased_softmax`` heads (scale :math:`1/\sqrt k`).
    value_offset : list of ndarray (d,)
        :math:`c = W_O b_v + b_O` of each layer.
    query_bias_norm : list of float
        :math:`|b_q|` of each layer (zero: the heads are plain softmax in disguise).
    ln_1, ln_2 : list of (gamma, beta)
    mlp : list of gaussian_pde.MLP
        Tanh-GELU feed-forward maps.
    """

    d: int
    n_head: int
    n_layer: int
    attention: list
    value_offset: list
    query_bias_norm: list
    ln_1: list
    ln_2: list
    mlp: list

    def stack(self, *, layernorm=False, ffn=False, offsets=True, h=1.0, n_per_dim=3,
              mehler_order=None):
        r"""The residual :class:`gaussian_pde.Stack` of the checkpoint.

        Attention sub-layers :math:`x + h(\mathrm{Attn}(x) + c)`; with ``layernorm`` the
        field is in pre-norm position (``PreNorm(LayerNorm(ln_1))``); with ``ffn`` an MLP
        sub-layer follows each attention (``PreNorm(LayerNorm(ln_2), MLP)`` with
        ``layernorm``). ``offsets=False`` drops :math:`c` (attention-only, Gaussian-exact
        without LayerNorm). ``n_per_dim``: Gauss-Hermite nodes per dimension of the
        LayerNorm's pushed Gaussian (its tensor rule has ``n_per_dim ** d`` nodes).
        """
        layers = []
        for i in range(self.n_layer):
            att = self.attention[i]
            if offsets:
                att = gp.FieldSum([att, gp.Affine(np.zeros((self.d, self.d)),
                                                  self.value_offset[i])])
            if layernorm:
                att = gp.PreNorm(gp.LayerNorm(self.d, *self.ln_1[i]), att, n_per_dim=n_per_dim)
            layers.append(att)
            if ffn:
                f = self.mlp[i]
                if mehler_order is not None:
                    f = gp.MLP(f.W1, f.b1, f.W2, f.b2, activation=f.activation,
                               mehler_order=mehler_order)
                layers.append(gp.PreNorm(gp.LayerNorm(self.d, *self.ln_2[i]), f,
                                         n_per_dim=n_per_dim) if layernorm else f)
        return gp.Stack(layers, h=h, mode="residual")


def _get(sd, key, shape):
    if key not in sd:
        raise ValueError(f"the state dict has no `{key}`.")
    a = np.asarray(sd[key], float)
    if a.shape != shape:
        raise ValueError(f"`{key}` must have shape {shape}, got {a.shape}.")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"`{key}` contains NaN or infinite values.")
    return a


def load_gpt2(source, n_head):
    r"""Load a GPT-2-shaped state dict into a :class:`GPT2Checkpoint`.

    Parameters
    ----------
    source : path or dict
        A ``.npz`` file (NumPy only), a ``.safetensors`` file (needs ``safetensors``), or a
        dict of arrays; keys as in the module docstring, optionally prefixed
        ``transformer.``.
    n_head : int
        Number of heads (not stored in a state dict); must divide :math:`d`.
    """
    if isinstance(n_head, bool) or not isinstance(n_head, (int, np.integer)) or n_head < 1:
        raise ValueError(f"`n_head` must be a positive integer, got {n_head!r}.")
    sd = {re.sub(r"^transformer\.", "", k): v for k, v in _read(source).items()}
    layers = sorted({int(m.group(1)) for k in sd if (m := re.match(r"h\.(\d+)\.", k))})
    if not layers or layers != list(range(len(layers))):
        raise ValueError("`source` holds no GPT-2 layers `h.0.*`, `h.1.*`, ... "
                         f"(found layer indices {layers}).")
    if "h.0.attn.c_attn.weight" not in sd:
        raise ValueError("the state dict has no `h.0.attn.c_attn.weight`.")
    d = np.shape(sd["h.0.attn.c_attn.weight"])[0]
    if d % n_head:
        raise ValueError(f"`n_head` = {n_head} does not divide the width d = {d}.")
    k = d // n_head
    out = {f: [] for f in ("attention", "value_offset", "query_bias_norm", "ln_1", "ln_2",
                           "mlp")}
    for i in layers:
        p = f"h.{i}."
        W = _get(sd, p + "attn.c_attn.weight", (d, 3 * d))
        b = _get(sd, p + "attn.c_attn.bias", (3 * d,))
        Wp = _get(sd, p + "attn.c_proj.weight", (d, d))
        bp = _get(sd, p + "attn.c_proj.bias", (d,))
        Q, K, Wv = W[:, :d].T, W[:, d:2 * d].T, W[:, 2 * d:].T
        Wo = Wp.T
        bq, bk = b[:d], b[d:2 * d]
        heads = [dot_product_head(Q[h * k:(h + 1) * k], K[h * k:(h + 1) * k],
                                  Wo[:, h * k:(h + 1) * k] @ Wv[h * k:(h + 1) * k],
                                  q=bq[h * k:(h + 1) * k], k_b=bk[h * k:(h + 1) * k],
                                  scale=1.0 / np.sqrt(k)) for h in range(n_head)]
        out["attention"].append(sum_of_heads(heads))
        out["value_offset"].append(Wo @ b[2 * d:] + bp)
        out["query_bias_norm"].append(float(np.linalg.norm(bq)))
        for ln in ("ln_1", "ln_2"):
            out[ln].append((_get(sd, p + ln + ".weight", (d,)), _get(sd, p + ln + ".bias", (d,))))
        f = np.shape(sd.get(p + "mlp.c_fc.weight", np.zeros((d, 0))))[1]
        W1 = _get(sd, p + "mlp.c_fc.weight", (d, f))
        out["mlp"].append(gp.MLP(W1.T, _get(sd, p + "mlp.c_fc.bias", (f,)),
                                 _get(sd, p + "mlp.c_proj.weight", (f, d)).T,
                                 _get(sd, p + "mlp.c_proj.bias", (d,)),
                                 activation="gelu_tanh"))
    return GPT2Checkpoint(d=d, n_head=n_head, n_layer=len(layers), **out)


def random_gpt2_state_dict(d, n_layer, n_head, *, ffn=None, scale=0.02, bias_scale=0.02,
                           ln_scale=0.1, rng=None):
    r"""A GPT-2-shaped state dict with random weights at GPT-2's initial scale.

    GPT-2 initialises every weight :math:`\mathcal N(0, 0.02^2)` and the two residual
    projections (``attn.c_proj``, ``mlp.c_proj``) with ``0.02 / sqrt(2 n_layer)``; here the
    biases are :math:`\mathcal N(0, \text{bias\_scale}^2)` and the LayerNorm gains and shifts
    :math:`1 + \mathcal N(0, \text{ln\_scale}^2)` and :math:`\mathcal N(0, \text{ln\_scale}^2)`
    (GPT-2 starts them at zero and one; non-zero values exercise every term). Float32, as
    GPT-2 stores them.

    Parameters
    ----------
    d, n_layer, n_head : int
        Width, layers and heads (``n_head`` divides ``d``).
    ffn : int, optional
        Feed-forward width, default ``4 d``.
    scale, bias_scale, ln_scale : float
        Standard deviations of the weights, biases and LayerNorm parameters.
    rng : numpy.random.Generator or int, optional
        Random generator or seed.
    """
    for name, v in (("d", d), ("n_layer", n_layer), ("n_head", n_head)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"`{name}` must be a positive integer, got {v!r}.")
    if d % n_head:
        raise ValueError(f"`n_head` = {n_head} does not divide `d` = {d}.")
    f = 4 * d if ffn is None else int(ffn)
    rng = np.random.default_rng(rng)
    proj = scale / np.sqrt(2 * n_layer)
    sd = {}
    for i in range(n_layer):
        p = f"h.{i}."
        sd.update({
            p + "attn.c_attn.weight": scale * rng.standard_normal((d, 3 * d)),
            p + "attn.c_attn.bias": bias_scale * rng.standard_normal(3 * d),
            p + "attn.c_proj.weight": proj * rng.standard_normal((d, d)),
            p + "attn.c_proj.bias": bias_scale * rng.standard_normal(d),
            p + "ln_1.weight": 1 + ln_scale * rng.standard_normal(d),
            p + "ln_1.bias": ln_scale * rng.standard_normal(d),
            p + "ln_2.weight": 1 + ln_scale * rng.standard_normal(d),
            p + "ln_2.bias": ln_scale * rng.standard_normal(d),
            p + "mlp.c_fc.weight": scale * rng.standard_normal((d, f)),
            p + "mlp.c_fc.bias": bias_scale * rng.standard_normal(f),
            p + "mlp.c_proj.weight": proj * rng.standard_normal((f, d)),
            p + "mlp.c_proj.bias": bias_scale * rng.standard_normal(d),
        })
    return {k: v.astype(np.float32) for k, v in sd.items()}


def gpt2_forward(source, x, n_head, *, eps=1e-5):
    r"""GPT-2's blocks on tokens ``x`` (n, d), full (non-causal) attention, in NumPy.

    Written from GPT-2's definition, independently of the package's fields: per layer
    :math:`x \mapsto x + \mathrm{Attn}(\mathrm{LN}_1(x))`, then
    :math:`x \mapsto x + \mathrm{MLP}(\mathrm{LN}_2(x))` (tanh-GELU), every token attending
    to all ``n`` tokens. Returns the tokens after every sub-layer, input first,
    shape ``(2 L + 1, n, d)``: the states :func:`gaussian_pde.propagate_gaussian` reports
    for ``stack(layernorm=True, ffn=True)``.
    """
    sd = {re.sub(r"^transformer\.", "", k): np.asarray(v, float) for k, v in _read(source).items()}
    x = np.asarray(x, float)
    n_layer = len({int(m.group(1)) for k in sd if (m := re.match(r"h\.(\d+)\.", k))})
    d = x.shape[1]
    hd = d // n_head

    def ln(z, g, b):
        zc = z - z.mean(axis=1, keepdims=True)
        return zc / np.sqrt((zc * zc).mean(axis=1, keepdims=True) + eps) * g + b

    out = [x]
    for i in range(n_layer):
        p = f"h.{i}."
        z = ln(x, sd[p + "ln_1.weight"], sd[p + "ln_1.bias"])
        q, k, v = np.split(z @ sd[p + "attn.c_attn.weight"] + sd[p + "attn.c_attn.bias"], 3,
                           axis=1)
        heads = []
        for h in range(n_head):
            sl = slice(h * hd, (h + 1) * hd)
            s = q[:, sl] @ k[:, sl].T / np.sqrt(hd)
            w = np.exp(s - s.max(axis=1, keepdims=True))
            heads.append((w / w.sum(axis=1, keepdims=True)) @ v[:, sl])
        x = x + (np.concatenate(heads, axis=1) @ sd[p + "attn.c_proj.weight"]
                 + sd[p + "attn.c_proj.bias"])
        out.append(x)
        z = ln(x, sd[p + "ln_2.weight"], sd[p + "ln_2.bias"])
        u = z @ sd[p + "mlp.c_fc.weight"] + sd[p + "mlp.c_fc.bias"]
        a = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))
        x = x + a @ sd[p + "mlp.c_proj.weight"] + sd[p + "mlp.c_proj.bias"]
        out.append(x)
    return np.stack(out)

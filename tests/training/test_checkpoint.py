"""GPT-2-shaped checkpoints: the loader against an independent NumPy GPT-2 forward (no JAX)."""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.training import gpt2_forward, load_gpt2, random_gpt2_state_dict

D, H, F, NL = 6, 2, 10, 2


def _state_dict(rng, query_bias=1.0):
    sd = {}
    for i in range(NL):
        p = f"transformer.h.{i}."
        b = rng.standard_normal(3 * D)
        b[:D] *= query_bias
        sd.update({
            p + "attn.c_attn.weight": rng.standard_normal((D, 3 * D)) / np.sqrt(D),
            p + "attn.c_attn.bias": b,
            p + "attn.c_proj.weight": rng.standard_normal((D, D)) / np.sqrt(D),
            p + "attn.c_proj.bias": rng.standard_normal(D),
            p + "attn.bias": np.tril(np.ones((1, 1, 4, 4))),    # GPT-2's mask buffer: ignored
            p + "ln_1.weight": 1 + 0.1 * rng.standard_normal(D),
            p + "ln_1.bias": 0.1 * rng.standard_normal(D),
            p + "ln_2.weight": 1 + 0.1 * rng.standard_normal(D),
            p + "ln_2.bias": 0.1 * rng.standard_normal(D),
            p + "mlp.c_fc.weight": rng.standard_normal((D, F)) / np.sqrt(D),
            p + "mlp.c_fc.bias": 0.1 * rng.standard_normal(F),
            p + "mlp.c_proj.weight": rng.standard_normal((F, D)) / np.sqrt(F),
            p + "mlp.c_proj.bias": 0.1 * rng.standard_normal(D),
        })
    return {k: v.astype(np.float32) for k, v in sd.items()}


def _gpt2_attention(sd, i, x):
    """GPT-2's attention written from its definition (Conv1D x @ W + b, no causal mask)."""
    p = f"transformer.h.{i}.attn."
    qkv = x @ sd[p + "c_attn.weight"].astype(float) + sd[p + "c_attn.bias"]
    q, k, v = np.split(qkv, 3, axis=1)
    n, hd = x.shape[0], D // H
    heads = []
    for h in range(H):
        sl = slice(h * hd, (h + 1) * hd)
        s = q[:, sl] @ k[:, sl].T / np.sqrt(hd)
        w = np.exp(s - s.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        heads.append(w @ v[:, sl])
    a = np.concatenate(heads, axis=1)
    assert a.shape == (n, D)
    return a @ sd[p + "c_proj.weight"].astype(float) + sd[p + "c_proj.bias"]


def _ln(x, g, b):
    xc = x - x.mean(axis=1, keepdims=True)
    return xc / np.sqrt((xc ** 2).mean(axis=1, keepdims=True) + 1e-5) * g + b


def _gpt2_mlp(sd, i, x):
    """GPT-2's MLP with its tanh-GELU, written from the definition."""
    p = f"transformer.h.{i}.mlp."
    u = x @ sd[p + "c_fc.weight"].astype(float) + sd[p + "c_fc.bias"]
    a = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u**3)))
    return a @ sd[p + "c_proj.weight"].astype(float) + sd[p + "c_proj.bias"]


@pytest.fixture(params=["npz", "safetensors", "dict"])
def checkpoint(request, tmp_path):
    sd = _state_dict(np.random.default_rng(3))
    if request.param == "npz":
        path = tmp_path / "ckpt.npz"
        np.savez(path, **sd)
        return load_gpt2(path, n_head=H), sd
    if request.param == "safetensors":
        st = pytest.importorskip("safetensors.numpy")
        path = tmp_path / "ckpt.safetensors"
        st.save_file({k: np.ascontiguousarray(v) for k, v in sd.items()}, str(path))
        return load_gpt2(path, n_head=H), sd
    return load_gpt2(sd, n_head=H), sd


def test_layers_match_gpt2_attention(checkpoint):
    ck, sd = checkpoint
    assert (ck.d, ck.n_head, ck.n_layer) == (D, H, NL)
    x = np.random.default_rng(0).standard_normal((25, D))
    for i in range(NL):
        want = _gpt2_attention(sd, i, x)
        got = ck.attention[i].particle_velocity(x)[0] + ck.value_offset[i]
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
        assert all(isinstance(h, gp.get_attention("biased_softmax"))
                   for h in ck.attention[i].heads)
    assert min(ck.query_bias_norm) > 0 and all(m.activation == "gelu_tanh" for m in ck.mlp)


def test_stack_matches_gpt2_blocks(checkpoint):
    ck, sd = checkpoint
    x = np.random.default_rng(1).standard_normal((20, D))
    want = x.copy()
    for i in range(NL):
        p = f"transformer.h.{i}."
        want = want + _gpt2_attention(sd, i, _ln(want, sd[p + "ln_1.weight"], sd[p + "ln_1.bias"]))
        want = want + _gpt2_mlp(sd, i, _ln(want, sd[p + "ln_2.weight"], sd[p + "ln_2.bias"]))
    stack = ck.stack(layernorm=True, ffn=True)
    assert stack.n_layers == 2 * NL
    got = gp.propagate_particles(stack, x).x_final
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    # attention only, no offsets: a Gaussian-exact stack
    sol = gp.propagate_gaussian(ck.stack(offsets=False, h=0.1), np.zeros(D), np.eye(D),
                                n_per_dim=3)
    assert np.all(sol.exact)


def test_query_bias_matters_and_is_kept():
    """Without the query bias the heads would be another map: the loader keeps it exactly."""
    sd = _state_dict(np.random.default_rng(4))
    ck = load_gpt2(sd, n_head=H)
    x = np.random.default_rng(6).standard_normal((25, D))
    got = ck.attention[0].particle_velocity(x)[0] + ck.value_offset[0]
    plain = gp.MultiHead([gp.Softmax(h.Q, h.K, h.V, scale=h.scale)
                          for h in ck.attention[0].heads])
    without = plain.particle_velocity(x)[0] + ck.value_offset[0]
    want = _gpt2_attention(sd, 0, x)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    assert np.abs(without - want).max() > 1e-3
    # zero query bias: the biased heads are plain softmax heads (the key bias cancels)
    sd0 = _state_dict(np.random.default_rng(4), query_bias=0.0)
    ck0 = load_gpt2(sd0, n_head=H)
    plain0 = gp.MultiHead([gp.Softmax(h.Q, h.K, h.V, scale=h.scale)
                           for h in ck0.attention[0].heads])
    np.testing.assert_allclose(ck0.attention[0].particle_velocity(x)[0],
                               plain0.particle_velocity(x)[0], rtol=1e-12, atol=1e-12)
    assert max(ck0.query_bias_norm) == 0


def test_bad_checkpoints(tmp_path):
    sd = _state_dict(np.random.default_rng(5))
    with pytest.raises(ValueError, match="n_head"):
        load_gpt2(sd, n_head=4)
    with pytest.raises(ValueError, match="n_head"):
        load_gpt2(sd, n_head=0)
    bad = dict(sd)
    bad["transformer.h.1.attn.c_proj.weight"] = np.zeros((D, D + 1))
    with pytest.raises(ValueError, match="h.1.attn.c_proj.weight"):
        load_gpt2(bad, n_head=H)
    bad = {k: v for k, v in sd.items() if k != "transformer.h.0.ln_2.bias"}
    with pytest.raises(ValueError, match="h.0.ln_2.bias"):
        load_gpt2(bad, n_head=H)
    with pytest.raises(ValueError, match="GPT-2 layers"):
        load_gpt2({"wte.weight": np.zeros((3, D))}, n_head=H)
    (tmp_path / "x.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=".npz or .safetensors"):
        load_gpt2(tmp_path / "x.pt", n_head=H)
    with pytest.raises(ValueError, match="not a file"):
        load_gpt2(tmp_path / "missing.npz", n_head=H)


def test_gpt2_forward_is_gpt2s_blocks():
    """The library's NumPy forward pass equals the blocks written out in this module."""
    sd = _state_dict(np.random.default_rng(7))
    x = np.random.default_rng(8).standard_normal((15, D))
    want = [x]
    for i in range(NL):
        p = f"transformer.h.{i}."
        z = want[-1]
        z = z + _gpt2_attention(sd, i, _ln(z, sd[p + "ln_1.weight"], sd[p + "ln_1.bias"]))
        want.append(z)
        want.append(z + _gpt2_mlp(sd, i, _ln(z, sd[p + "ln_2.weight"], sd[p + "ln_2.bias"])))
    np.testing.assert_allclose(gpt2_forward(sd, x, H), np.stack(want), rtol=1e-12, atol=1e-12)


def _mc_level(S, n):
    r"""Expected relative Frobenius error of a sample covariance of n Gaussian draws.

    :math:`\mathbb E\|\hat S - S\|_F^2 = ((\operatorname{tr}S)^2 + \|S\|_F^2)/n` for
    independent draws (Wishart second moments).
    """
    return np.sqrt((np.trace(S) ** 2 + np.sum(S * S)) / n) / np.linalg.norm(S)


FC, PROJ = 2.0, 8.0   # fc and proj weights scaled up: the MLP's closure terms must show


def test_gpt2_shaped_stack_matches_its_tokens_at_d64():
    """A GPT-2-shaped checkpoint (d = 64, 2 layers, 4 heads, FFN 256, LayerNorm, offsets):
    the Gaussian states after every sub-layer against the model's own tokens (full attention
    on n tokens from N(mean0, cov0)). The covariance error is the Monte Carlo error of
    n draws (its ratio to the Wishart level stays near 1, and it halves from n = 256 to
    1024), the mean's error is its standard error, while the layers move the mean by
    many standard errors."""
    d, n_head, n_layer = 64, 4, 2
    rng = np.random.default_rng(11)
    sd = random_gpt2_state_dict(d, n_layer, n_head, scale=0.1, bias_scale=0.2, rng=rng)
    for i in range(n_layer):      # a strong, non-linear MLP: its closure terms are visible
        sd[f"h.{i}.mlp.c_fc.weight"] *= FC
        sd[f"h.{i}.mlp.c_proj.weight"] *= PROJ
    mean0 = 0.5 * rng.standard_normal(d)
    A = rng.standard_normal((d, d)) / np.sqrt(d)
    cov0 = A @ A.T + 0.5 * np.eye(d)
    ck = load_gpt2(sd, n_head)
    sol = gp.propagate_gaussian(ck.stack(layernorm=True, ffn=True, offsets=True), mean0, cov0)
    assert sol.status == "finished" and sol.mean.shape == (2 * n_layer + 1, d)
    assert not np.any(sol.exact)
    chol = np.linalg.cholesky(cov0)
    ratio, mean_z, err = {}, {}, {}
    for n in (256, 1024):
        r, z, e = [], [], []
        for _ in range(3):
            toks = gpt2_forward(sd, mean0 + rng.standard_normal((n, d)) @ chol.T, n_head)
            ek = np.array([np.linalg.norm(np.cov(t.T, bias=True) - S) / np.linalg.norm(S)
                           for t, S in zip(toks, sol.cov)])
            e.append(ek)
            r.append(ek / np.array([_mc_level(S, n) for S in sol.cov]))
            z.append([np.linalg.norm(t.mean(axis=0) - m) / np.sqrt(np.trace(S) / n)
                      for t, m, S in zip(toks, sol.mean, sol.cov)])
        ratio[n], mean_z[n], err[n] = np.mean(r, axis=0), np.mean(z, axis=0), np.mean(e, axis=0)
    for n in ratio:
        assert np.all((ratio[n] > 0.8) & (ratio[n] < 1.25)), (n, ratio[n])
        # |mean error| / its standard error: about 1 in d = 64 (a chi over sqrt(d))
        assert np.all(mean_z[n] < 1.4), (n, mean_z[n])
    slope = np.log(err[1024] / err[256]) / np.log(4.0)
    assert np.all((slope > -0.65) & (slope < -0.35)), slope
    # the layers matter: the mean moves by many of its standard errors at n = 1024
    move = np.linalg.norm(sol.mean[-1] - sol.mean[0]) / np.sqrt(np.trace(sol.cov[-1]) / 1024)
    assert move > 5, move

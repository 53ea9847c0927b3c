"""Shared, compile-once fixtures of the training tests.

XLA takes about a second to build even a tiny program (seconds without the fast build
options), so each variant's float64 checks come from ONE compiled probe, and the training
runs from one call of :func:`gaussian_pde.training.train` per model, all kept for the
session. JAX is imported only inside the fixtures: the modules that need no JAX run
without the extra.
"""

import numpy as np
import pytest

#: the tiny model of the default tier
TINY = dict(width=4, heads=2, depth=2, ffn_width=6)
#: central-difference step of the gradient checks (float64)
FD_EPS = 1e-5
#: tokens (already in model width) on which the probes evaluate the layers
N_PROBE_TOKENS = 30


def _probe_program(spec, task):
    """``params -> ((loss, layer outputs on z), gradient)`` of the tiny model, one program."""
    import jax
    import jax.numpy as jnp

    from gaussian_pde.training import loss_fn, stack_tokens
    from gaussian_pde.training._model import attention, block_weights, ffn

    def loss_and_layers(p, x, y, z):
        blocks = [block_weights(p, spec, layer) for layer in range(spec.depth)]
        aux = {"tokens": stack_tokens(p, spec, z),
               "attention": jnp.stack([attention(b, z, spec.score_scale) for b in blocks])}
        if spec.ffn_width:
            aux["ffn"] = jnp.stack([ffn(b, z, spec.activation) for b in blocks])
        return loss_fn(p, spec, task, x, y), aux

    return jax.value_and_grad(loss_and_layers, has_aux=True)


def _dot(a, b):
    import jax

    return sum(float(np.vdot(u, v)) for u, v in zip(jax.tree_util.tree_leaves(a),
                                                     jax.tree_util.tree_leaves(b)))


@pytest.fixture(scope="session")
def probe():
    """``probe(variant)``: float64 results of one compiled program of the tiny model.

    The program returns the training loss, its gradient and each layer's outputs; it runs
    at the parameters and at the four points ``params +- eps u`` (two random unit
    directions ``u``) of the central differences. Keys: ``spec``, ``task``, ``params``
    (NumPy; the query maps doubled so that the softmax weights are far from uniform),
    ``loss``, ``dir_grad`` and ``fd`` (the directional derivatives: autodiff, central
    differences), ``z`` (input tokens), ``tokens`` (the stack's tokens per layer on
    ``z``), ``attention`` and ``ffn`` (each layer's sub-layers on ``z``).
    """
    jax = pytest.importorskip("jax")
    pytest.importorskip("optax")

    from gaussian_pde.training import get_task, model_spec
    from gaussian_pde.training._compile import compiled
    from gaussian_pde.training._model import initial_params, x64

    task = get_task("mixture", n_tokens=5)
    x, y = task.sample(np.random.default_rng(7), 3)
    z = 2.0 * np.random.default_rng(1).standard_normal((N_PROBE_TOKENS, TINY["width"]))
    done = {}

    def get(variant):
        if variant in done:
            return done[variant]
        spec = model_spec(variant, **TINY)
        tree = jax.tree_util.tree_map
        with x64():
            p = initial_params(spec, task, 4)
            p["blocks"]["Q"] = 2.0 * p["blocks"]["Q"]
            exe = compiled(("test-probe", spec, task), _probe_program(spec, task),
                           p, x, y, z, optimize=False)
            (loss, aux), g = exe(p, x, y, z)
            rng = np.random.default_rng(3)
            dir_grad, fd = [], []
            for _ in range(2):
                u = tree(lambda a: rng.standard_normal(a.shape), p)
                norm = np.sqrt(_dot(u, u))
                u = tree(lambda a, n=norm: a / n, u)
                f = [float(exe(tree(lambda a, b, s=s: a + s * FD_EPS * b, p, u), x, y, z)[0][0])
                     for s in (1.0, -1.0)]
                dir_grad.append(_dot(g, u))
                fd.append((f[0] - f[1]) / (2 * FD_EPS))
        res = {k: np.asarray(v) for k, v in aux.items()}
        done[variant] = {**res, "params": p, "loss": float(loss), "dir_grad": np.array(dir_grad),
                         "fd": np.array(fd), "spec": spec, "task": task, "z": z}
        return done[variant]

    return get


@pytest.fixture(scope="session")
def trained():
    """``trained(model, task)``: one short training grid per model, kept for the session.

    Seeds (0, 1) at learning rates 1e-3 (calm), 3e-2 (learns) and 50 (diverges), 40
    steps of 16 sequences of 8 tokens, the fast build. Returns ``(result, kwargs)``: the kwargs
    reproduce the call.
    """
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    from gaussian_pde.training import train

    done = {}

    def get(model, task):
        kw = dict(seeds=(0, 1), learning_rates=(1e-3, 3e-2, 50.0), n_steps=40, batch=16,
                  n_tokens=8, optimize=False, **TINY)
        if (model, task) not in done:
            done[model, task] = train(model, task, **kw)
        return done[model, task], kw

    return get

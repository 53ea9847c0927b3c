r"""Synthetic tasks: small, seeded, and learnable on a CPU in seconds (docs/math.md 11.2).

``mixture`` (classification of token sets)
    Class :math:`c \in \{0, \dots, C-1\}` has a direction :math:`m_c` (fixed by the task,
    :math:`|m_c| = 1.5`); a sequence of class :math:`c` has ``n_tokens`` i.i.d. tokens from
    the Gaussian mixture :math:`\tfrac12\mathcal N(m_c, I) + \tfrac12\mathcal N(-m_c, I)`
    in :math:`\mathbb R^{p}`. Every class has mean zero, so the label is in the second
    moment of the set: a single token does not give it away, the set does. The readout
    averages the last layer's tokens; the loss is the cross-entropy (its start is
    :math:`\log C`).

``regression`` (in-context linear regression)
    Each sequence draws its own :math:`w \sim \mathcal N(0, I_p / p)`; tokens
    :math:`(x_i, y_i, 0)` with :math:`x_i \sim \mathcal N(0, I_p)`,
    :math:`y_i = \langle w, x_i\rangle + 0.1\,\varepsilon_i` for :math:`i < n`, and the
    query token :math:`(x_n, 0, 1)`. The readout of the query's last-layer token predicts
    :math:`y_n`; the loss is the mean squared error over :math:`\operatorname{var}(y_n)`
    (about 1 for the zero predictor; least squares on the context reaches about
    :math:`0.01 + p/(n - p - 2)` of it).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._spec import _check_int

__all__ = ["Task", "TASKS", "get_task"]


@dataclasses.dataclass(frozen=True)
class Task:
    r"""A synthetic task: how its batches are drawn and what the readout predicts.

    Attributes
    ----------
    name : {"mixture", "regression"}
    input_dim : int
        Token dimension of the raw inputs (embedded to the model width by a linear map).
    n_tokens : int
        Tokens per sequence.
    n_outputs : int
        Readout size (classes, or 1).
    readout : {"mean", "last"}
        Which last-layer token(s) the readout reads: their average, or the query token.
    loss : {"cross_entropy", "mse"}
    """

    name: str
    input_dim: int
    n_tokens: int
    n_outputs: int
    readout: str
    loss: str
    n_classes: int = 0
    task_seed: int = 2408

    def sample(self, rng, batch):
        """A batch ``(x, y)``: tokens ``(batch, n_tokens, input_dim)`` and targets ``(batch,)``."""
        if self.name == "mixture":
            return _sample_mixture(self, rng, batch)
        return _sample_regression(self, rng, batch)

    def batches(self, seed, n_steps, batch):
        """``n_steps`` training batches drawn with ``seed``: arrays with a leading step axis."""
        rng = np.random.default_rng(seed)
        xs, ys = zip(*(self.sample(rng, batch) for _ in range(n_steps)))
        return np.stack(xs), np.stack(ys)

    def centres(self):
        """The class directions :math:`m_c` (mixture task), shape ``(C, p)``."""
        rng = np.random.default_rng(self.task_seed)
        m = rng.standard_normal((self.n_classes, self.input_dim))
        return 1.5 * m / np.linalg.norm(m, axis=1, keepdims=True)


def _sample_mixture(task, rng, batch):
    n, p = task.n_tokens, task.input_dim
    labels = rng.integers(task.n_classes, size=batch)
    signs = rng.choice([-1.0, 1.0], size=(batch, n, 1))
    x = signs * task.centres()[labels][:, None, :] + rng.standard_normal((batch, n, p))
    return x, labels.astype(np.int32)


def _sample_regression(task, rng, batch):
    n, p = task.n_tokens, task.input_dim - 2
    w = rng.standard_normal((batch, p)) / np.sqrt(p)
    xs = rng.standard_normal((batch, n, p))
    ys = np.einsum("bnp,bp->bn", xs, w) + 0.1 * rng.standard_normal((batch, n))
    tokens = np.zeros((batch, n, p + 2))
    tokens[:, :, :p] = xs
    tokens[:, :-1, p] = ys[:, :-1]
    tokens[:, -1, p + 1] = 1.0
    return tokens, ys[:, -1]


#: the tasks by name, with their default sizes
TASKS = {
    "mixture": Task("mixture", input_dim=4, n_tokens=16, n_outputs=3, readout="mean",
                    loss="cross_entropy", n_classes=3),
    "regression": Task("regression", input_dim=5, n_tokens=16, n_outputs=1, readout="last",
                       loss="mse"),
}


def get_task(task, *, n_tokens=None):
    """A :class:`Task` by name (:data:`TASKS`) or as given; ``n_tokens`` overrides its length."""
    if isinstance(task, Task):
        out = task
    elif isinstance(task, str):
        if task not in TASKS:
            raise ValueError(f"`task` must be one of {sorted(TASKS)}, got {task!r}.")
        out = TASKS[task]
    else:
        raise TypeError(f"`task` must be a task name or a Task, got {type(task).__name__}.")
    if n_tokens is not None:
        out = dataclasses.replace(out, n_tokens=_check_int(n_tokens, "n_tokens", 2))
    return out

r"""Tasks: two synthetic ones and real text, seeded and small (docs/math.md 11.2).

Each task states its **chance** level, the loss of the best predictor that ignores the
input (a run whose final loss is at chance or worse has learned nothing), and where it is
known its **Bayes risk**, the loss of the best predictor that sees the input.

``mixture`` (classification of token sets)
    Class :math:`c \in \{0, \dots, C-1\}` has a direction :math:`m_c` (fixed by the task,
    :math:`|m_c| = 1.5`); a sequence of class :math:`c` has ``n_tokens`` i.i.d. tokens from
    the Gaussian mixture :math:`\tfrac12\mathcal N(m_c, I) + \tfrac12\mathcal N(-m_c, I)`
    in :math:`\mathbb R^{p}`. Every class has mean zero, so the label is in the second
    moment of the set. The readout averages the last layer's tokens; the loss is the
    cross-entropy. Chance: :math:`\log C`. Bayes risk:
    :math:`\mathbb E[-\log P(c\mid X)]` with the exact posterior
    :math:`P(c\mid X)\propto\prod_i\cosh\langle m_c, x_i\rangle e^{-|m_c|^2/2}`
    (equal norms: :math:`\propto\prod_i\cosh\langle m_c, x_i\rangle`), by Monte Carlo
    (:meth:`Task.bayes_risk`).

``regression`` (in-context linear regression)
    Each sequence draws its own :math:`w \sim \mathcal N(0, I_p / p)`; ``n_tokens - 1``
    context tokens :math:`(x_i, y_i, 0)` with :math:`x_i \sim \mathcal N(0, I_p)`,
    :math:`y_i = \langle w, x_i\rangle + \sigma\varepsilon_i`, and the query token
    :math:`(x_q, 0, 1)`. The readout of the query's last-layer token predicts :math:`y_q`;
    the loss is the mean squared error over :math:`\operatorname{var}(y_q) = 1 + \sigma^2`,
    so chance (the zero predictor, the best constant) is 1. With :math:`m` context tokens,
    least squares :math:`\hat w = (X^TX)^{-1}X^Ty` has
    :math:`\mathbb E(y_q - \langle\hat w, x_q\rangle)^2 = \sigma^2(1 +
    \mathbb E\,x_q^T(X^TX)^{-1}x_q) = \sigma^2\big(1 + p/(m - p - 1)\big)` (the inverse
    Wishart mean :math:`\mathbb E(X^TX)^{-1} = I/(m - p - 1)`), so its normalised risk is
    :math:`\sigma^2(1 + p/(m-p-1))/(1+\sigma^2)`. The Bayes predictor is the posterior
    mean :math:`(X^TX + \sigma^2 p I)^{-1}X^Ty` (ridge), of risk
    :math:`\sigma^2(1 + \mathbb E\,\operatorname{tr}(X^TX + \sigma^2pI)^{-1})/(1+\sigma^2)`,
    at most the least-squares risk (:meth:`Task.bayes_risk` by Monte Carlo over
    :math:`X`). Defaults :math:`p = 1`, :math:`\sigma = 0.5`, :math:`m = 15`: least
    squares :math:`0.25\cdot(1 + 1/13)/1.25 = 0.2154`, small enough below chance to
    tell learning from guessing and large enough that a small model trained for a few
    hundred steps can come within a factor 2 of it.

``text`` (character-level language model on real text)
    The Python standard library's own source: the ``*.py`` files directly in
    ``os.path.dirname(os.__file__)``, sorted by name, read at run time and joined; the
    first 90 % of the characters train, the last 10 % test (a fixed split; the text
    is whatever this Python ships). Characters are newline, tab and the printable ASCII
    range, every other character one extra class. A sequence is ``n_tokens`` consecutive
    characters (8 by default), each token the one-hot character joined to the one-hot
    position (the attention itself does not see order); the query (last) token's readout
    predicts the next character; the loss is the cross-entropy. Every sequence gives one
    target, so the characters a run sees grow with the sequence length while its targets
    do not: at a fixed budget of token evaluations, 8 characters of context learn more
    than 16 (``benchmarks/bench_text_task.py --settings full,custom --n-tokens 16``
    measures both). Chance: the unigram cross-entropy
    of the test split under the training frequencies; the reference a model must beat
    is the bigram model (the last character alone, add-one smoothed counts of the training
    split), :meth:`Task.bigram_loss`.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import math
import os

import numpy as np

from ._spec import _check_int

__all__ = ["Task", "TASKS", "get_task", "text_corpus", "TEXT_CHARS"]

#: the characters of the text task (one class each, plus one class for any other)
TEXT_CHARS = "\n\t" + "".join(chr(c) for c in range(32, 127))
#: share of the text corpus that trains (the rest tests)
TEXT_TRAIN_SHARE = 0.9


@functools.lru_cache(maxsize=1)
def text_corpus():
    """The text task's corpus as class indices: ``(train, test)`` int arrays.

    The ``*.py`` files directly in the standard library's folder, sorted by name, read as
    UTF-8 (undecodable bytes replaced), joined by newlines; split at 90 %.
    """
    folder = os.path.dirname(os.__file__)
    parts = []
    for path in sorted(glob.glob(os.path.join(folder, "*.py"))):
        with open(path, encoding="utf-8", errors="replace") as fh:
            parts.append(fh.read())
    text = "\n".join(parts)
    lut = np.full(0x110000 if len(text) else 1, len(TEXT_CHARS), np.int32)
    lut[[ord(c) for c in TEXT_CHARS]] = np.arange(len(TEXT_CHARS))
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    ids = lut[codes]
    cut = int(TEXT_TRAIN_SHARE * ids.size)
    return ids[:cut], ids[cut:]


@dataclasses.dataclass(frozen=True)
class Task:
    r"""A task: how its batches are drawn, what the readout predicts, its reference losses.

    Attributes
    ----------
    name : {"mixture", "regression", "text"}
    input_dim : int
        Token dimension of the raw inputs (embedded to the model width by a linear map).
    n_tokens : int
        Tokens per sequence.
    n_outputs : int
        Readout size (classes, or 1).
    readout : {"mean", "last"}
        Which last-layer token(s) the readout reads: their average, or the query token.
    loss : {"cross_entropy", "mse"}
    n_classes : int
        Classes of ``mixture``.
    noise : float
        Regression noise :math:`\sigma`.
    task_seed : int
        Fixes the mixture's class directions.
    """

    name: str
    input_dim: int
    n_tokens: int
    n_outputs: int
    readout: str
    loss: str
    n_classes: int = 0
    task_seed: int = 2408
    noise: float = 0.5

    def sample(self, rng, batch, split="train"):
        """A batch ``(x, y)``: tokens ``(batch, n_tokens, input_dim)`` and targets ``(batch,)``.

        ``split`` (``"train"`` or ``"test"``) matters for ``text`` only; the synthetic
        tasks draw held-out data from another seed.
        """
        if split not in ("train", "test"):
            raise ValueError(f"`split` must be 'train' or 'test', got {split!r}.")
        if self.name == "mixture":
            return _sample_mixture(self, rng, batch)
        if self.name == "regression":
            return _sample_regression(self, rng, batch)
        return _sample_text(self, rng, batch, split)

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

    @property
    def target_var(self) -> float:
        r"""Variance of a regression target, :math:`1 + \sigma^2` (1 for the other tasks)."""
        return 1.0 + self.noise ** 2 if self.name == "regression" else 1.0

    @property
    def chance(self) -> float:
        """Loss of the best predictor that ignores the input (see the module docstring)."""
        if self.name == "mixture":
            return math.log(self.n_classes)
        if self.name == "regression":
            return 1.0
        train, test = text_corpus()
        freq = (np.bincount(train, minlength=self.n_outputs) + 1.0)
        freq /= freq.sum()
        return float(-np.mean(np.log(freq[test])))

    def least_squares_risk(self) -> float:
        r"""Regression: normalised risk of least squares, :math:`\sigma^2(1+p/(m-p-1))/(1+\sigma^2)`."""
        if self.name != "regression":
            raise ValueError(f"`least_squares_risk` is for the regression task, not {self.name!r}.")
        p, m = self.input_dim - 2, self.n_tokens - 1
        if m - p - 1 <= 0:
            return math.inf
        return self.noise ** 2 * (1.0 + p / (m - p - 1)) / self.target_var

    def bayes_risk(self, n_samples=20_000, seed=0):
        r"""Bayes risk by Monte Carlo: ``(estimate, standard error)``; ``None`` for text.

        Mixture: the mean of :math:`-\log P(c\mid X)` under the exact posterior.
        Regression: the posterior-mean (ridge) risk, averaged over context draws.
        """
        n_samples = _check_int(n_samples, "n_samples", 2)
        rng = np.random.default_rng(seed)
        if self.name == "mixture":
            x, y = _sample_mixture(self, rng, n_samples)
            # log P(c | X) = sum_i log cosh <m_c, x_i> - logsumexp over c (|m_c| all equal)
            s = np.einsum("bnp,cp->bnc", x, self.centres())
            ll = np.sum(np.logaddexp(s, -s), axis=1)
            ll -= ll.max(axis=1, keepdims=True)
            logp = ll - np.log(np.sum(np.exp(ll), axis=1, keepdims=True))
            v = -logp[np.arange(n_samples), y]
        elif self.name == "regression":
            p, m, s2 = self.input_dim - 2, self.n_tokens - 1, self.noise ** 2
            X = rng.standard_normal((n_samples, m, p))
            P = np.einsum("bmi,bmj->bij", X, X) + s2 * p * np.eye(p)
            v = s2 * (1.0 + np.trace(np.linalg.inv(P), axis1=1, axis2=2)) / self.target_var
        else:
            return None
        return float(v.mean()), float(v.std(ddof=1) / math.sqrt(n_samples))

    def bigram_loss(self) -> float:
        """Text: test cross-entropy of the add-one smoothed bigram model of the training split."""
        if self.name != "text":
            raise ValueError(f"`bigram_loss` is for the text task, not {self.name!r}.")
        train, test = text_corpus()
        V = self.n_outputs
        counts = np.ones((V, V))
        np.add.at(counts, (train[:-1], train[1:]), 1.0)
        logp = np.log(counts / counts.sum(axis=1, keepdims=True))
        return float(-np.mean(logp[test[:-1], test[1:]]))


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
    ys = np.einsum("bnp,bp->bn", xs, w) + task.noise * rng.standard_normal((batch, n))
    tokens = np.zeros((batch, n, p + 2))
    tokens[:, :, :p] = xs
    tokens[:, :-1, p] = ys[:, :-1]
    tokens[:, -1, p + 1] = 1.0
    return tokens, ys[:, -1]


def _sample_text(task, rng, batch, split):
    ids = text_corpus()[0 if split == "train" else 1]
    n, V = task.n_tokens, task.n_outputs
    start = rng.integers(0, ids.size - n - 1, size=batch)
    idx = start[:, None] + np.arange(n + 1)
    chars = ids[idx]
    tokens = np.zeros((batch, n, V + n))
    b, i = np.meshgrid(np.arange(batch), np.arange(n), indexing="ij")
    tokens[b, i, chars[:, :n]] = 1.0
    tokens[b, i, V + i] = 1.0
    return tokens, chars[:, n].astype(np.int32)


_TEXT_V = len(TEXT_CHARS) + 1

#: the tasks by name, with their default sizes
TASKS = {
    "mixture": Task("mixture", input_dim=4, n_tokens=16, n_outputs=3, readout="mean",
                    loss="cross_entropy", n_classes=3),
    "regression": Task("regression", input_dim=3, n_tokens=16, n_outputs=1, readout="last",
                       loss="mse", noise=0.5),
    "text": Task("text", input_dim=_TEXT_V + 8, n_tokens=8, n_outputs=_TEXT_V,
                 readout="last", loss="cross_entropy"),
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
        n = _check_int(n_tokens, "n_tokens", 2)
        out = dataclasses.replace(out, n_tokens=n)
        if out.name == "text":
            out = dataclasses.replace(out, input_dim=out.n_outputs + n)
    return out

r"""Training the models of the second source paper, and the bridge to the Gaussian solvers.

A family of small Transformer encoders (pre-, post- and peri-LN, DyT, nGPT, ReZero,
without LayerNorm with branch scales 1, 1/sqrt(L) and 1/L, without residuals, without
either) and the PDE simulator (the attention + feed-forward field integrated through depth
with explicit Euler or RK4, per-layer or tied weights, horizon 1 or L), all with the same
width, depth, heads, initialisation, data and optimiser (docs/math.md section 11).

This subpackage needs the optional extra ``train`` (``pip install -e ".[train]"``: JAX and
optax; ``safetensors`` for the checkpoint loader's ``.safetensors`` files). Importing
:mod:`gaussian_pde` never imports it; importing this subpackage imports JAX only when a
name that needs it is first used (the specifications, tasks, the checkpoint loader and the
verdict criteria work without JAX).

Models and tasks
    :class:`ModelSpec`, :data:`VARIANTS` and :func:`model_spec`; :class:`Task`,
    :data:`TASKS` and :func:`get_task`.
Training (JAX)
    :func:`train` returns a :class:`TrainResult` of :class:`Run` histories (loss, global
    and per-layer gradient norms, the non-finite and relative-criterion steps; Adam with
    optional warmup and clipping); :func:`run_failed` is the failure criterion;
    :func:`layer_tokens` and :func:`loss_fn` are the model itself.
Measurements
    :func:`drift_metrics` (drift from the input and between layers, centred change,
    :math:`W_2` of the Gaussian fits, activation growth), :func:`information_metrics`
    (linear CKA with the input, held-out linear probes of the target and of the input),
    :func:`predicted_blowup_depth` (the Gaussian theory's blow-up depth).
The bridge
    :func:`layer_attention` (a trained layer as :class:`gaussian_pde.MultiHead`),
    :func:`layer_ffn`, :func:`gaussian_stack`, :func:`gaussian_prediction`,
    :func:`model_on_gaussian_tokens` and :func:`bridge`.
Checkpoints
    :func:`load_gpt2` reads a GPT-2-shaped state dict (``.npz`` or ``.safetensors``) into
    per-layer :class:`gaussian_pde.MultiHead` attention and a :class:`gaussian_pde.Stack`.
The study
    :func:`run_training_study`, :func:`verdicts` and :func:`write_training_study`
    (``gaussian-pde train``).
"""

from __future__ import annotations

import importlib

from ._checkpoint import GPT2Checkpoint, gpt2_forward, load_gpt2, random_gpt2_state_dict
from ._spec import VARIANTS, ModelSpec, model_spec
from ._tasks import TASKS, Task, get_task

#: names that import JAX, by module (loaded on first use)
_LAZY = {
    "train": "_train", "Run": "_train", "TrainResult": "_train",
    "init_params": "_model", "layer_tokens": "_model", "loss_fn": "_model",
    "apply": "_model", "stack_tokens": "_model",
    "drift_metrics": "_measure", "gaussian_fit": "_measure",
    "layer_attention": "_bridge", "layer_ffn": "_bridge", "gaussian_stack": "_bridge",
    "gaussian_prediction": "_bridge", "model_on_gaussian_tokens": "_bridge",
    "bridge": "_bridge", "without_ffn": "_bridge", "bridge_summary": "_bridge",
    "check_study_workers": "_study", "default_workers": "_study",
    "run_training_study": "_study", "check_study_memory": "_study", "verdicts": "_verdicts",
    "write_training_study": "_report",
    "STUDY_TASKS": "_study", "predicted_blowup_depth": "_study",
    "information_metrics": "_measure", "linear_cka": "_measure", "ridge_probe": "_measure",
    "run_failed": "_train", "DEFAULT_LEARNING_RATES": "_train", "learning_rate_grid": "_train",
}

__all__ = ["GPT2Checkpoint", "gpt2_forward", "random_gpt2_state_dict",
           "ModelSpec", "TASKS", "Task", "VARIANTS", "get_task", "load_gpt2",
           "model_spec", "train", "Run", "TrainResult", "init_params", "layer_tokens", "loss_fn",
           "apply", "stack_tokens", "drift_metrics", "gaussian_fit", "layer_attention",
           "layer_ffn", "gaussian_stack", "gaussian_prediction", "model_on_gaussian_tokens",
           "bridge", "without_ffn", "run_training_study", "check_study_memory", "verdicts",
           "write_training_study", "STUDY_TASKS", "predicted_blowup_depth", "information_metrics", "linear_cka",
           "ridge_probe", "run_failed", "DEFAULT_LEARNING_RATES", "learning_rate_grid",
           "bridge_summary", "check_study_workers", "default_workers"]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__

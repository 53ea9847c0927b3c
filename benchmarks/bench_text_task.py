"""Text task benchmark: what the training study's text part costs and how far below the bigram it gets.

For each setting (Adam steps, width, sequence length, learning rates) and each variant, one
group is trained and measured as :func:`gaussian_pde.training.run_training_study` does it
(``_train_and_measure``: every (seed, rate) lane in one compiled program, then the float64
held-out measurements and, for the models without LayerNorm, the Gaussian theory), timed
in CPU seconds of this process (``time.process_time``, all threads: the machine is shared,
so wall time says less). Outside the timing, every run's test loss is evaluated on
``--n-eval`` sequences of the test split (one fixed draw, the same for every run), with
its standard error; the reference is :meth:`Task.bigram_loss` on the whole test split.

Settings: ``before`` (800 steps, width 16, 16 characters, the full x2 grid of 12 rates),
``full`` (the text entries of ``gaussian_pde.cli._train.FULL`` and the task's default
length), or ``custom`` from ``--steps``, ``--width``, ``--n-tokens`` and ``--rates``.
Depth, batch and optimiser (plain Adam) are the study's.

    PYTHONPATH=$PWD python benchmarks/bench_text_task.py [--settings full,before]
        [--variants core] [--before-variants pre_ln] [--seeds 3] [--n-eval 4096]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _record import write_record  # noqa: E402

from gaussian_pde.cli._train import CORE, FULL  # noqa: E402
from gaussian_pde.training import DEFAULT_LEARNING_RATES, get_task, model_spec  # noqa: E402
from gaussian_pde.training._model import apply  # noqa: E402
from gaussian_pde.training._study import OPTIMS, _train_and_measure  # noqa: E402

#: the text part of the study before its sizes were chosen
BEFORE = dict(n_steps=800, width=16, n_tokens=16, rates=DEFAULT_LEARNING_RATES)


def full_setting():
    """The text entries of the full study (``FULL``) and the task's default length."""
    return dict(n_steps=FULL["task_steps"]["text"], width=FULL["task_width"]["text"],
                n_tokens=get_task("text").n_tokens,
                rates=tuple(FULL.get("task_rates", {}).get("text", DEFAULT_LEARNING_RATES)))


def test_losses(params, spec, task, x, y):
    """Per-sequence cross-entropy of one trained model on ``(x, y)``."""
    logits = apply(params, spec, task, x)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]


def run_setting(name, setting, variants, seeds, n_eval):
    """Train and measure every variant at ``setting``: one dict per variant."""
    task = get_task("text", n_tokens=setting["n_tokens"])
    x, y = task.sample(np.random.default_rng(12_345), n_eval, "test")
    x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y)
    # the study's held-out batches (seed 10_000 + seed, the test split)
    evals = {s: task.sample(np.random.default_rng(10_000 + s), FULL["eval_batch"], "test")
             for s in seeds}
    rows = []
    for v in variants:
        spec = model_spec(v, depth=FULL["depth"], width=setting["width"])
        t0 = time.process_time()
        res, _, _ = _train_and_measure(spec, task, seeds, tuple(setting["rates"]),
                                       setting["n_steps"], FULL["batch"],
                                       OPTIMS(setting["n_steps"])["plain"], evals, True,
                                       not spec.has_layernorm)
        cpu = time.process_time() - t0
        f = jax.jit(lambda p, spec=spec: test_losses(p, spec, task, x, y))
        loss = {}
        for run in res.runs:
            nll = np.asarray(f(run.params), float)
            ok = run.divergence_step is None and np.all(np.isfinite(nll))
            loss.setdefault(run.learning_rate, {})[run.seed] = (
                (float(nll.mean()), float(nll.std(ddof=1) / math.sqrt(nll.size)))
                if ok else (math.nan, math.nan))
        means = {lr: np.mean([m for m, _ in by.values()]) for lr, by in loss.items()}
        finite = [lr for lr in means if np.isfinite(means[lr])]
        best = min(finite, key=means.get) if finite else None
        at_best = [loss[best][s] for s in seeds] if best is not None else []
        rows.append(dict(
            setting=name, variant=v, cpu_s=cpu, lanes=len(res.runs),
            best_rate=best, best_mean=float(means[best]) if best is not None else math.nan,
            best_by_seed=[m for m, _ in at_best],
            seed_spread=float(np.ptp([m for m, _ in at_best])) if at_best else math.nan,
            eval_se=float(np.max([se for _, se in at_best])) if at_best else math.nan,
            losses={f"{lr:g}": {str(s): list(ms) for s, ms in by.items()}
                    for lr, by in loss.items()}))
        print(f"{name:7s} {v:14s} cpu {cpu:6.1f} s  best lr {best}  mean {rows[-1]['best_mean']:.4f}"
              f"  seeds {[round(m, 3) for m, _ in at_best]}", flush=True)
    return dict(n_steps=setting["n_steps"], width=setting["width"],
                n_tokens=setting["n_tokens"], rates=list(setting["rates"]),
                batch=FULL["batch"], depth=FULL["depth"], rows=rows,
                cpu_s_total=float(sum(r["cpu_s"] for r in rows)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default="full,before",
                    help="comma-separated: full, before, custom")
    ap.add_argument("--variants", default="core", help="comma-separated, or 'core'")
    ap.add_argument("--before-variants", default="pre_ln",
                    help="the variants of the `before` setting (comma-separated, or 'core')")
    ap.add_argument("--seeds", type=int, default=FULL["seeds"])
    ap.add_argument("--n-eval", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--n-tokens", type=int, default=None)
    ap.add_argument("--rates", default=None, help="comma-separated learning rates")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    def names(arg):
        return CORE if arg == "core" else tuple(arg.split(","))

    seeds = tuple(range(args.seeds))
    settings = {"full": full_setting(), "before": BEFORE}
    if "custom" in args.settings.split(","):
        base = full_setting()
        settings["custom"] = dict(
            n_steps=args.steps or base["n_steps"], width=args.width or base["width"],
            n_tokens=args.n_tokens or base["n_tokens"],
            rates=tuple(float(r) for r in args.rates.split(",")) if args.rates
            else base["rates"])
    task = get_task("text")
    payload = {"bigram": task.bigram_loss(), "chance": task.chance, "n_eval": args.n_eval,
               "seeds": list(seeds), "clock": "time.process_time (CPU s, all threads)",
               "settings": {}}
    for name in args.settings.split(","):
        if name not in settings:
            raise SystemExit(f"--settings: unknown setting {name!r} (full, before, custom)")
        variants = names(args.before_variants if name == "before" else args.variants)
        payload["settings"][name] = run_setting(name, settings[name], variants, seeds,
                                                args.n_eval)
    payload["tables"] = _tables(payload)
    write_record("bench_text_task", payload, args.json)


def _tables(payload):
    """One row per (setting, variant): sizes, CPU seconds, best rate and test loss."""
    rows = []
    for name, s in payload["settings"].items():
        for r in s["rows"]:
            rows.append([name, r["variant"], str(s["n_steps"]), str(s["width"]),
                         str(s["n_tokens"]), str(len(s["rates"])), f"{r['cpu_s']:.1f}",
                         f"{r['best_rate']:g}" if r["best_rate"] else "-",
                         f"{r['best_mean']:.3f}", f"{r['seed_spread']:.3f}",
                         f"{r['eval_se']:.3f}", f"{payload['bigram']:.3f}"])
        if len(s["rows"]) > 1:
            rows.append([name, f"all {len(s['rows'])}", "", "", "", "",
                         f"{s['cpu_s_total']:.1f}", "", "", "", "", ""])
    return [{"title": (f"Text task per variant group ({len(payload['seeds'])} seeds, CPU "
                       f"seconds of train + measure), test loss on {payload['n_eval']} "
                       "test sequences (mean over seeds at the best rate)"),
             "columns": ["setting", "variant", "steps", "width", "characters", "rates",
                         "CPU s", "best rate", "test loss", "seed range", "s.e.", "bigram"],
             "rows": rows}]


if __name__ == "__main__":
    main()

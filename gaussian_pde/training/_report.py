"""Figures and ``report.md`` of the training study (:func:`write_training_study`)."""

from __future__ import annotations

import numpy as np

from .._common.io import ensure_output_dir, save_figure, write_json, write_text
from ._study import DRIFT_RATIO, GROWTH_RATIO, verdicts

__all__ = ["write_training_study"]

_COLORS = {"pre_ln": "C0", "post_ln": "C1", "no_ln": "C3", "no_residual": "C2",
           "neither": "C5", "pde_euler": "C4", "pde_rk4": "C6", "pde_euler_tied": "C7",
           "pde_rk4_tied": "C8"}


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _plot_training(results, out):
    plt = _plt()
    cfg = results["config"]
    tasks, rates = cfg["tasks"], cfg["learning_rates"]
    fig, axes = plt.subplots(2 * len(tasks), len(rates), figsize=(4.2 * len(rates),
                             3.0 * 2 * len(tasks)), squeeze=False)
    for ti, t in enumerate(tasks):
        for ri, lr in enumerate(rates):
            for row, key, lab in ((2 * ti, "loss", "loss"), (2 * ti + 1, "grad_norm",
                                                            "global grad norm")):
                ax = axes[row, ri]
                for v, runs in results["runs"][t].items():
                    for k, r in enumerate(x for x in runs if np.isclose(x["learning_rate"], lr)):
                        y = np.asarray(r[key], float)
                        ax.plot(y, color=_COLORS.get(v, "k"), lw=0.8, alpha=0.7,
                                label=v if k == 0 else None)
                        if r["divergence_step"] is not None:
                            s = r["divergence_step"]
                            ax.plot([s], [y[s] if np.isfinite(y[s]) else np.nanmax(y)], "x",
                                    color=_COLORS.get(v, "k"), ms=5)
                ax.set_yscale("log")
                ax.set_title(f"{t}, lr = {lr:g}: {lab}", fontsize=9)
                ax.set_xlabel("step")
    axes[0, 0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    path = save_figure(fig, out / "training.png", dpi=80)
    plt.close(fig)
    return path


def _plot_drift(results, out):
    plt = _plt()
    cfg = results["config"]
    tasks = cfg["tasks"]
    lr = cfg["bridge_learning_rate"]
    panels = (("rel_step", "step drift |X_l - X_l-1| / |X_l-1|"),
              ("rel_from_input", "drift from input |X_l - X_0| / |X_0|"),
              ("w2_step_rel", "W2(fit_l-1, fit_l) / sqrt tr S_l-1"),
              ("trace", "tr S_l / tr S_0"))
    fig, axes = plt.subplots(len(tasks), len(panels), figsize=(16, 3.4 * len(tasks)),
                             squeeze=False)
    for ti, t in enumerate(tasks):
        for pi, (key, lab) in enumerate(panels):
            ax = axes[ti, pi]
            for v, runs in results["runs"][t].items():
                sel = [r for r in runs if np.isclose(r["learning_rate"], lr)]
                for when, ls in (("init", ":"), ("final", "-")):
                    ys = np.array([r[f"drift_{when}"][key] for r in sel], float)
                    if key == "trace":
                        ys = ys / ys[:, :1]
                    x0 = 0 if key in ("rel_from_input", "trace") else 1
                    ys = ys[:, 1:] if key == "rel_from_input" else ys
                    x0 = 1 if key == "rel_from_input" else x0
                    with np.errstate(all="ignore"):
                        y = np.nanmedian(ys, axis=0)
                    ax.plot(np.arange(x0, x0 + y.size), y, ls, color=_COLORS.get(v, "k"),
                            label=v if when == "final" else None, lw=1.2)
            ax.set_yscale("log")
            ax.set_xlabel("layer")
            ax.set_title(f"{t}: {lab}", fontsize=8)
    axes[0, 0].legend(fontsize=6, ncol=2)
    fig.suptitle(f"median over seeds at lr = {lr:g}; solid: trained, dotted: at init",
                 fontsize=9)
    fig.tight_layout()
    path = save_figure(fig, out / "drift.png", dpi=80)
    plt.close(fig)
    return path


def _plot_bridge(results, out):
    plt = _plt()
    rows = [(t, v) for t, byv in results["bridge"].items() for v in byv]
    if not rows:
        return None
    fig, axes = plt.subplots(len(rows), 4, figsize=(16, 2.8 * len(rows)), squeeze=False)
    for i, (t, v) in enumerate(rows):
        b = results["bridge"][t][v]
        for kind, ls in (("attention", "-"), ("full", "--")):
            r = b[kind]
            ns = r["n_tokens"]
            for j, n in enumerate(ns):
                c = f"C{j}"
                L1 = len(r["cov_err"][j])
                axes[i, 0].plot(range(L1), r["cov_err"][j], ls, color=c,
                                label=f"n={n} ({kind})" if i == 0 else None)
                axes[i, 1].plot(range(L1), r["model_trace"][j], ls, color=c)
                axes[i, 3].plot(range(1, L1), r["ess_frac"][j], ls, color=c)
            axes[i, 1].plot(range(len(r["pred_trace"])), r["pred_trace"], ls, color="k",
                            lw=2, label=f"Gaussian ({kind})")
            ce = np.array(r["cov_err"])
            for layer in range(ce.shape[1]):
                axes[i, 2].plot(ns, ce[:, layer], ls + "o", color=f"C{layer}", ms=3,
                                label=f"layer {layer}" if kind == "attention" else None)
        ns = np.asarray(b["attention"]["n_tokens"], float)
        axes[i, 2].plot(ns, 0.5 * (ns / ns[0]) ** -0.5, "k:", label="n^-1/2")
        axes[i, 0].set_title(f"{t}/{v}: rel. cov error vs layer", fontsize=8)
        axes[i, 1].set_title("tr S: model (colours, by n) vs Gaussian (black)", fontsize=8)
        axes[i, 2].set_title("rel. cov error vs n (solid: attention only)", fontsize=8)
        axes[i, 3].set_title("ESS / n of the attention, by layer", fontsize=8)
        for j in (0, 1, 2, 3):
            axes[i, j].set_yscale("log")
        axes[i, 2].set_xscale("log")
        axes[i, 1].legend(fontsize=6)
        axes[i, 2].legend(fontsize=6, ncol=2)
    axes[0, 0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    path = save_figure(fig, out / "bridge.png", dpi=75)
    plt.close(fig)
    return path


def _f(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _tables(results):
    cfg = results["config"]
    lines = []
    for t, byv in results["runs"].items():
        lines += [f"### Task `{t}`", "",
                  "| variant | " + " | ".join(f"lr {lr:g}: diverged / final loss"
                                              for lr in cfg["learning_rates"]) +
                  " | max grad norm / start (lr " + f"{cfg['bridge_learning_rate']:g}) |",
                  "|---|" + "---|" * (len(cfg["learning_rates"]) + 1)]
        for v, runs in byv.items():
            cells = []
            for lr in cfg["learning_rates"]:
                sel = [r for r in runs if np.isclose(r["learning_rate"], lr)]
                nd = sum(r["divergence_step"] is not None for r in sel)
                fl = [r["eval_loss_final"] for r in sel if r["divergence_step"] is None]
                cells.append(f"{nd}/{len(sel)} / {_f(float(np.median(fl))) if fl else '-'}")
            sel = [r for r in runs if np.isclose(r["learning_rate"], cfg["bridge_learning_rate"])]
            g = np.median([np.nanmax(r["grad_norm"]) / r["grad_norm"][0] for r in sel])
            lines.append(f"| {v} | " + " | ".join(cells) + f" | {_f(float(g))} |")
        lines.append("")
    return lines


def _bridge_lines(results):
    lines = ["| task / variant | blocks | Gaussian map | status | rel. cov error per layer "
             "(largest n) | slope in n per layer | ESS/n per layer (largest n) | "
             "tr S_L model / Gaussian |", "|---|---|---|---|---|---|---|---|"]
    for t, byv in results["bridge"].items():
        for v, b in byv.items():
            for kind in ("attention", "full"):
                r = b[kind]
                fmt = lambda a: ", ".join(_f(float(x)) for x in a)  # noqa: E731
                tr_m, tr_g = r["model_trace"][-1][-1], r["pred_trace"][-1]
                lines.append(f"| {t}/{v} | {kind} | {'exact' if r['exact'] else 'closure'} "
                             f"| {r['status']} | {fmt(r['cov_err'][-1])} | {fmt(r['slope'][1:])} "
                             f"| {fmt(r['ess_frac'][-1])} | {_f(float(tr_m))} / "
                             f"{_f(float(tr_g))} |")
    return lines


def write_training_study(results, out):
    """Write ``summary.json``, ``training.png``, ``drift.png``, ``bridge.png`` and ``report.md``.

    Returns the verdicts (:func:`verdicts`).
    """
    out = ensure_output_dir(out)
    v = verdicts(results)
    cfg = results["config"]
    write_json(out / "summary.json", {"config": cfg, "verdicts": v, "runs": results["runs"],
                                      "bridge": results["bridge"]})
    figs = [p for p in (_plot_training(results, out), _plot_drift(results, out),
                        _plot_bridge(results, out)) if p is not None]
    lines = ["# Training study: residuals, LayerNorm and the PDE simulator", "",
             f"Variants {', '.join(cfg['variants'])}; width {cfg['width']}, depth "
             f"{cfg['depth']}, {cfg['heads']} heads; tasks {', '.join(cfg['tasks'])}; Adam, "
             f"{cfg['n_steps']} steps of {cfg['batch']} sequences, learning rates "
             f"{cfg['learning_rates']}, seeds {cfg['seeds']}. Divergence: a non-finite loss "
             f"or gradient, or a loss above {cfg['divergence_factor']:g} x its step-0 value. "
             f"Measurements on {cfg['eval_batch']} held-out sequences per seed "
             "(docs/math.md section 11).", "",
             "## Verdicts", "", "| claim | criterion | holds in |", "|---|---|---|"]
    for claim, c in v.items():
        extra = (f" ({c['both_diverged']} left out: both diverged)"
                 if "both_diverged" in c else "")
        lines.append(f"| {claim} | {c['criterion']} | {c['holds']} of {c['total']}{extra} |")
    lines += ["", f"Drift ratio threshold {DRIFT_RATIO:g}; explosive runs (diverged, or "
              f"gradient norm >= {GROWTH_RATIO:g} x its start), per task and variant: "
              + "; ".join(f"{t}: " + ", ".join(f"{k} {n}" for k, n in e.items())
                          for t, e in v["explosion"]["explosive_runs"].items()), "",
              "## Runs (diverged runs / median held-out loss of the others)", ""]
    lines += _tables(results)
    lines += ["## The bridge: trained model against the Gaussian prediction", "",
              f"Seed {cfg['seeds'][0]}, lr {cfg['bridge_learning_rate']:g}; Gaussian tokens "
              "with the mean and covariance of the model's embedded held-out tokens; "
              f"n = {cfg['bridge_tokens']} tokens, {cfg['bridge_sequences']} sequences "
              "each (medians). `attention`: the trained attention alone (Gaussian map "
              "exact); `full`: with the FFN (the package's closure).", ""]
    lines += _bridge_lines(results)
    lines += ["", "Figures: " + ", ".join(p.name for p in figs), ""]
    write_text(out / "report.md", "\n".join(lines))
    return v

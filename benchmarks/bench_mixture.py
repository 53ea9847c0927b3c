"""Speed of the Gaussian-mixture closure: 8 components in d = 3 to t = 20, against particles.

The closure is timed; particles are timed at sizes n whose W2 accuracy (the exact-assignment
W2 between n particles and n samples of the reference mixture, minus nothing: both are
Monte Carlo) reaches the level asked. The reference is the closure itself; where the
closure is exact (weak attention) particles can do no better than their Monte Carlo floor,
so the particle size of a given W2 accuracy is the size whose floor is that accuracy.

Run: ``python benchmarks/bench_mixture.py [--quick]``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import gaussian_pde as gp
from gaussian_pde.studies import _clusters as C


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="t = 5 and smaller particle sizes")
    args = ap.parse_args(argv)
    t_end = 5.0 if args.quick else 20.0
    att = C.cluster_attention("l2", 3, q=0.3, seed=0)   # a contraction: the state stays O(1)
    mix = C.cluster_mixture(8, 3, config="random", radius=4.0, spread=0.3, seed=0)
    t_eval = np.linspace(0, t_end, 11)
    for npd in (4,):
        t0 = time.perf_counter()
        sol = gp.solve_mixture(att, mix, (0, t_end), t_eval=t_eval, n_per_dim=npd)
        dt = time.perf_counter() - t0
        print(f"closure n_per_dim={npd}: {dt:.3f} s, status {sol.status}, nfev {sol.nfev}")
    t_closure = dt
    final = sol.mixture(-1)
    for n in ((100, 200) if args.quick else (200, 400, 800)):
        x0, _ = mix.sample(n, seed=1)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p = gp.simulate_particles(att, x0, (0, t_end), t_eval=t_eval[[0, -1]],
                                      keep_positions=False)
        tp = time.perf_counter() - t0
        w2, floor = C.w2_to_mixture(p.x_final, final, seed=2)
        print(f"particles n={n}: {tp:.3f} s, W2 to closure {w2:.4f} (Monte Carlo floor "
              f"{floor:.4f}), time ratio particles/closure {tp / t_closure:.1f}")


if __name__ == "__main__":
    main()

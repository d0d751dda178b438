"""The law of a scaling ladder, L(C) = E + A·C^-α, and its band (docs/ladder.md, "The law and its
band"). Pure numpy/scipy, no torch.

The fit (LADDER.md §3.1 pitfalls, Open-Athena's VPNLS, OLMo's Huber on log
residuals):

- *Variable projection.* For a fixed exponent α the model is linear in (E, A). They are solved
  by non-negative least squares, Gauss-Newton on the log residual r = log L_pred − log L_obs with
  Huber weights (IRLS): each iteration is one 2-column NNLS, solved exactly in closed form so a
  whole bootstrap and a whole α grid run as one numpy array. α itself is found on a log grid,
  then refined in 1-D (`scipy.optimize.minimize_scalar`, bounded) around the best grid point.
  No start values, so no start-value sensitivity.
- *Normalized compute.* C is divided by C_ref, the geometric mean of the fitted rungs' compute, so
  C_ref^-α is near 1 and (E, A_ref) are of the same size; `A` (per FLOP, as Marin writes it) is
  A_ref·C_ref^α.
- *The floor* E is free (E ≥ 0) or pinned to a given value.
- *Convergence* is checked, never assumed: the refine must succeed, α must not sit at a bound of
  its range, A must be positive and every parameter finite. Otherwise `converged` is False with a
  reason, and `fit_report` refuses it.

The band (what makes it calibrated is in the docs):

- The noise on a rung is measured twice: by the seeds of each rung (their spread in log space)
  and by the fit's residuals (with n − p degrees of freedom). Both are pooled into one σ per run
  on ν = (n − p) + Σ(seeds − 1) degrees of freedom; a given `seed_noise` is taken as known.
- *Residual bootstrap.* A pool of standardized noise (the fit's residuals scaled by √(n/(n−p)),
  the seeds' deviations by √(k/(k−1))), centred and scaled to σ, is resampled onto the fitted
  curve and the law refitted, `n_boot` times — never a resampling of the points, which with 4–5
  points is degenerate (duplicated rungs, singular fits).
- The spread of the refitted predictions (the parameters' uncertainty) plus a draw of the
  target's own noise (σ/√seeds), reflected about the fit (the basic bootstrap, which removes the
  extrapolation's bias as the bootstrap sees it) gives the interval; its half-widths are then
  scaled by t_ν/z, the small-sample correction for σ measured on few degrees of freedom.
- Deterministic: one `numpy.random.Generator(PCG64(seed))`, so a rerun writes the same bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy import optimize, stats

LAW = "L(C) = E + A*C^-alpha"
ALPHA_BOUNDS = (0.01, 2.0)  # OLMo-core's range for its exponents
GRID = 48  # α grid points, log-spaced over ALPHA_BOUNDS
HUBER_DELTA = 1e-2  # on log residuals; see docs: rung noise is ~0.1-0.5%, so this is robust, not L1
_GN_STEPS = 60  # Gauss-Newton/IRLS steps at most per α; it stops once no residual moves (3-5 steps
# when every residual is in the quadratic arm, where it is Newton-like; linear convergence otherwise)
_BOOT_GN_STEPS = 8  # the cap on grids and bootstrap refits: a far-off α needs no exact objective
_BOOT_GRID = 20  # the bootstrap refits' coarser α grid (neighbours 1.3× apart)
_GOLDEN_STEPS = 24  # their golden-section refine: the bracket shrinks by 0.618^24 ≈ 1e-5


class FitError(ValueError):
    """A ladder that cannot be fitted, in one line naming the problem."""


@dataclass(frozen=True)
class LadderPoint:
    """One rung's result: its training FLOPs and final held-out loss (mean over seeds)."""

    name: str
    compute: float
    loss: float
    seed_losses: tuple[float, ...] = ()


# --------------------------------------------------------------------------------------------
# The vectorized core: for α (shape G) and log losses (shape B×n), the best (E, A) and objective.


def _huber(r: np.ndarray, delta: float) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def nnls2(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """min ‖a·E + b·A − t‖² over E, A ≥ 0, exactly, for each column: the rows (points) are the
    FIRST axis, any further axes are independent problems.

    A convex quadratic over the quadrant: the unconstrained optimum if it is feasible, else the
    better of the two edges' optima (each clipped at 0). Equal to `scipy.optimize.nnls` on the
    2-column matrix [a b] (tests check it), and vectorized over a whole bootstrap × α grid.
    """
    saa, sab, sbb = (a * a).sum(0), (a * b).sum(0), (b * b).sum(0)
    sat, sbt = (a * t).sum(0), (b * t).sum(0)
    det = saa * sbb - sab * sab
    ok = det > 1e-12 * saa * sbb
    with np.errstate(divide="ignore", invalid="ignore"):
        e_u = (sbb * sat - sab * sbt) / det
        a_u = (saa * sbt - sab * sat) / det
        e_1 = np.maximum(sat / saa, 0.0)  # the edge A = 0
        a_2 = np.maximum(sbt / sbb, 0.0)  # the edge E = 0
    e_1 = np.where(np.isfinite(e_1), e_1, 0.0)
    a_2 = np.where(np.isfinite(a_2), a_2, 0.0)
    # ‖t‖² less: on the edge A = 0 at its optimum, −sat²/saa; on E = 0, −sbt²/sbb
    edge_e = e_1 * e_1 * saa - 2 * e_1 * sat <= a_2 * a_2 * sbb - 2 * a_2 * sbt
    inside = ok & (e_u >= 0) & (a_u >= 0)
    e = np.where(inside, e_u, np.where(edge_e, e_1, 0.0))
    amp = np.where(inside, a_u, np.where(edge_e, 0.0, a_2))
    return e, amp


def _coeffs(z: np.ndarray, logy: np.ndarray, floor: float | None, delta: float, steps: int):
    """For z = x^-α and log y, points on the first axis, broadcast together: (E, A, objective,
    residuals) at the Huber optimum over E, A ≥ 0 (E = floor if pinned), by Gauss-Newton on the
    log residual with IRLS weights; stops early once no residual moves by 1e-13."""
    z, logy = np.broadcast_arrays(z, logy)
    y = np.exp(logy)
    f0 = y  # start as if every residual were 0: the relative-error least squares
    r = np.zeros(y.shape)
    for _ in range(steps):
        a = np.abs(r)
        if a.max() <= delta:  # the usual case: every residual in the quadratic arm
            s = 1.0 / f0
        else:
            s = np.where(a <= delta, 1.0, np.sqrt(delta / np.maximum(a, 1e-300))) / f0
        t = f0 * (1.0 - r)  # log f ≈ log f0 + (f − f0)/f0, so r ≈ (f − t)/f0
        if floor is None:
            e, amp = nnls2(s, s * z, s * t)
        else:
            sz = s * z
            with np.errstate(divide="ignore", invalid="ignore"):
                amp = np.maximum((sz * s * (t - floor)).sum(0) / (sz * sz).sum(0), 0.0)
            amp = np.where(np.isfinite(amp), amp, 0.0)
            e = np.full(amp.shape, floor)
        f0 = np.maximum(e + amp * z, 1e-300)
        r_new = np.log(f0) - logy
        done = np.abs(r_new - r).max() < 1e-13
        r = r_new
        if done:
            break
    return e, amp, _huber(r, delta).sum(0), r


def _profile(logx, logy, floor, delta, alphas, steps=_GN_STEPS):
    """Objective at each α: logx (n), logy (n, ...), alphas broadcast against logy[0]."""
    z = np.exp(-np.multiply.outer(logx, alphas))
    return _coeffs(z, logy, floor, delta, steps)


def _golden(logx, logy, floor, delta, lo, hi):
    """Vectorized golden-section search of the profile over [lo, hi], per column of logy."""
    g = (math.sqrt(5) - 1) / 2

    def f(al):
        return _profile(logx, logy, floor, delta, al, _BOOT_GN_STEPS)[2]

    c, d = hi - g * (hi - lo), lo + g * (hi - lo)
    fc, fd = f(c), f(d)
    for _ in range(_GOLDEN_STEPS):
        left = fc < fd  # the minimum lies in [lo, d]: the old c becomes the new d
        lo, hi = np.where(left, lo, c), np.where(left, d, hi)
        c, d = (
            np.where(left, hi - g * (hi - lo), d),
            np.where(left, c, lo + g * (hi - lo)),
        )
        fx = f(np.where(left, c, d))  # one fresh evaluation per step
        fc, fd = np.where(left, fx, fd), np.where(left, fc, fx)
    return (lo + hi) / 2


def _alpha_grid() -> np.ndarray:
    return np.geomspace(ALPHA_BOUNDS[0], ALPHA_BOUNDS[1], GRID)


def _fit_many(logx, logy, floor, delta):
    """Best (E, A_ref, α) for each column of logy (n×B): a coarse α grid, then golden section
    between the best grid point's neighbours."""
    alphas = np.geomspace(ALPHA_BOUNDS[0], ALPHA_BOUNDS[1], _BOOT_GRID)
    obj = _profile(logx, logy[:, :, None], floor, delta, alphas[None, :], _BOOT_GN_STEPS)[2]
    i = obj.argmin(-1)
    lo = alphas[np.maximum(i - 1, 0)]
    hi = alphas[np.minimum(i + 1, _BOOT_GRID - 1)]
    al = _golden(logx, logy, floor, delta, lo, hi)
    e, amp, _, _ = _profile(logx, logy, floor, delta, al)
    return e, amp, al


# --------------------------------------------------------------------------------------------
# Input checks


def _as_point(p: Any, i: int) -> LadderPoint:
    if isinstance(p, LadderPoint):
        return p
    if isinstance(p, Mapping):
        try:
            return LadderPoint(
                name=str(p.get("name", f"rung-{i + 1}")),
                compute=p["compute"],
                loss=p.get("loss"),
                seed_losses=tuple(p.get("seed_losses", ()) or ()),
            )
        except KeyError as e:
            raise FitError(f"rung {i + 1}: no {e.args[0]!r}") from None
    raise FitError(f"rung {i + 1}: expected a LadderPoint, got {type(p).__name__}")


def _finite_positive(v: Any) -> bool:
    try:
        return v is not None and math.isfinite(float(v)) and float(v) > 0
    except (TypeError, ValueError):
        return False


def check_points(points: Iterable[Any]) -> list[LadderPoint]:
    """The points as LadderPoints, or FitError naming the first problem: fewer than 3 rungs,
    compute not strictly growing, a missing or non-finite loss or seed loss."""
    pts = [_as_point(p, i) for i, p in enumerate(points)]
    if len(pts) < 3:
        raise FitError(f"a law needs at least 3 rungs, got {len(pts)}")
    for p in pts:
        if not _finite_positive(p.compute):
            raise FitError(f"{p.name}: compute {p.compute!r} is not a finite positive number")
        if p.loss is None:
            raise FitError(f"{p.name}: its loss is missing")
        if not _finite_positive(p.loss):
            raise FitError(f"{p.name}: loss {p.loss!r} is not a finite positive number")
        for s in p.seed_losses:
            if not _finite_positive(s):
                raise FitError(f"{p.name}: a seed's loss {s!r} is not a finite positive number")
        if p.seed_losses and not (
            min(p.seed_losses) * (1 - 1e-9) <= float(p.loss) <= max(p.seed_losses) * (1 + 1e-9)
        ):
            raise FitError(
                f"{p.name}: loss {float(p.loss):.6g} is outside its seeds' range "
                f"[{min(p.seed_losses):.6g}, {max(p.seed_losses):.6g}] (it is their mean)"
            )
    for p, q in zip(pts, pts[1:]):
        if not float(q.compute) > float(p.compute):
            raise FitError(
                f"compute must grow from rung to rung: {q.name} has {float(q.compute):.4g} FLOPs "
                f"after {p.name}'s {float(p.compute):.4g}"
            )
    return pts


# --------------------------------------------------------------------------------------------
# The fit


@dataclass(frozen=True)
class LawFit:
    """A fitted L(C) = E + A·C^-α with its bootstrap, ready to predict and band any compute."""

    E: float
    A: float  # per FLOP: L = E + A·C^-α with C in FLOPs
    alpha: float
    floor_pinned: bool
    converged: bool
    huber_delta: float
    c_ref: float  # the geometric mean of the fitted compute
    a_ref: float  # A·c_ref^-α: the reducible loss at c_ref
    reason: str = ""  # why not converged ("" if converged)
    objective: float = 0.0
    points: tuple[LadderPoint, ...] = ()
    residuals: tuple[float, ...] = ()  # log L_pred − log L_obs per point
    sigma: float = float("nan")  # pooled noise of one run, in log loss
    sigma_seeds: float = float("nan")  # from the seeds alone (nan if no rung has 2)
    sigma_source: str = ""
    dof: float = 0.0  # degrees of freedom of sigma (inf if given)
    target_seeds: int = 1  # seeds averaged in the result a band is for
    level: float = 0.9
    # (E, a_ref, α) per bootstrap replicate, and a standardized noise draw (unit σ) for each
    boot: tuple[tuple[float, float, float], ...] = field(default=(), repr=False)
    boot_noise: tuple[float, ...] = field(default=(), repr=False)
    boot_at_bound: int = 0  # replicates whose α sits at a bound of its range
    _arrays: dict = field(default_factory=dict, repr=False, compare=False)

    def predict(self, compute: float) -> float:
        """The law's loss at `compute` FLOPs."""
        return float(self.E + self.a_ref * (float(compute) / self.c_ref) ** -self.alpha)

    def _boot_arrays(self):
        if not self._arrays:
            b = np.asarray(self.boot, dtype=float).reshape(-1, 3)
            self._arrays.update(b=b, u=np.asarray(self.boot_noise, dtype=float))
        return self._arrays["b"], self._arrays["u"]

    def _deviations(self, compute: float, with_noise: bool) -> np.ndarray:
        b, u = self._boot_arrays()
        x = float(compute) / self.c_ref
        pred = b[:, 0] + b[:, 1] * x ** -b[:, 2]
        dev = -(np.log(pred) - math.log(self.predict(compute)))  # the basic bootstrap
        if with_noise:
            dev = dev + u * self.sigma / math.sqrt(self.target_seeds)
        return dev

    def _interval(self, compute: float, level: float, with_noise: bool) -> tuple[float, float]:
        if not (0 < level < 1):
            raise FitError(f"a band's level must lie in (0, 1), got {level}")
        if not self.boot or not math.isfinite(self.sigma) or self.dof <= 0:
            return (float("nan"), float("nan"))
        dev = self._deviations(compute, with_noise)
        q = (1 - level) / 2
        lo, hi = np.quantile(dev, [q, 1 - q])
        c = _small_sample(level, self.dof)
        centre = math.log(self.predict(compute))
        low = math.exp(centre + c * lo)
        if self.floor_pinned:  # the reflection and the t factor know nothing of a floor
            low = max(low, self.E)
        return (float(low), float(math.exp(centre + c * hi)))

    def band(self, compute: float, level: float = 0.9) -> tuple[float, float]:
        """Where a run at `compute` (the mean of `target_seeds` seeds) lands, with probability
        `level`: the parameters' uncertainty and the run's own noise. (nan, nan) if the noise
        could not be measured (no seeds and no residual degrees of freedom)."""
        return self._interval(compute, level, with_noise=True)

    def law_band(self, compute: float, level: float = 0.9) -> tuple[float, float]:
        """Where the law itself lies at `compute`: the parameters' uncertainty alone."""
        return self._interval(compute, level, with_noise=False)

    def intervals(self, level: float | None = None) -> dict[str, list[float]]:
        """Bootstrap intervals of E, A (per FLOP) and α (basic bootstrap, t-scaled)."""
        level = self.level if level is None else level
        b, _ = self._boot_arrays()
        if not len(b) or self.dof <= 0:
            nan = [float("nan"), float("nan")]
            return {"E": nan, "A": nan, "alpha": nan}
        q = (1 - level) / 2
        c = _small_sample(level, self.dof)
        a_flop = b[:, 1] * self.c_ref ** b[:, 2]
        out = {}
        for key, est, col, logscale in (
            ("E", self.E, b[:, 0], False),
            ("A", self.A, a_flop, True),
            ("alpha", self.alpha, b[:, 2], False),
        ):
            if self.floor_pinned and key == "E":
                out[key] = [self.E, self.E]
                continue
            v = np.log(np.maximum(col, 1e-300)) if logscale else col
            e = math.log(est) if logscale else est
            lo, hi = np.quantile(e - v, [q, 1 - q])
            pair = [e + c * lo, e + c * hi]
            pair = [math.exp(p) for p in pair] if logscale else [max(p, 0.0) for p in pair]
            out[key] = [float(pair[0]), float(pair[1])]
        return out

    def to_json(self) -> dict:
        """The record: parameters with intervals, points, residuals, noise and convergence."""
        iv = self.intervals() if self.converged else {}
        return {
            "law": LAW,
            "floor": "pinned" if self.floor_pinned else "free",
            "parameters": {
                k: {"value": _finite_or_none(v), "interval": iv.get(k)}
                for k, v in (("E", self.E), ("A", self.A), ("alpha", self.alpha))
            },
            "c_ref": self.c_ref,
            "a_ref": _finite_or_none(self.a_ref),
            "level": self.level,
            "points": [
                {
                    "name": p.name,
                    "compute": float(p.compute),
                    "loss": float(p.loss),
                    "seed_losses": [float(s) for s in p.seed_losses],
                    "fitted": _finite_or_none(self.predict(p.compute)) if self.converged else None,
                    "residual_log": _finite_or_none(r),
                    "residual_pct": _finite_or_none(100 * math.expm1(r)),
                }
                for p, r in zip(self.points, self.residuals)
            ],
            "noise": {
                "sigma_log": _finite_or_none(self.sigma),
                "sigma_seeds_log": _finite_or_none(self.sigma_seeds),
                "source": self.sigma_source,
                "dof": None if math.isinf(self.dof) else self.dof,
                "target_seeds": self.target_seeds,
            },
            "method": {
                "objective": "Huber on log residuals, variable projection (NNLS for E, A)",
                "huber_delta": self.huber_delta,
                "alpha_bounds": list(ALPHA_BOUNDS),
                "alpha_grid": GRID,
                "band": "residual bootstrap + seed noise, basic interval, t-scaled",
                "n_boot": len(self.boot),
            },
            "convergence": {
                "converged": self.converged,
                "reason": self.reason,
                "objective": _finite_or_none(self.objective),
                "boot_at_bound": self.boot_at_bound,
            },
        }


def _finite_or_none(v: float) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def _small_sample(level: float, dof: float) -> float:
    """t_ν / z at the interval's upper quantile: σ was measured on ν degrees of freedom."""
    if math.isinf(dof):
        return 1.0
    p = (1 + level) / 2
    return float(stats.t.ppf(p, dof) / stats.norm.ppf(p))


def _noise(pts: Sequence[LadderPoint], resid: np.ndarray, n_params: int, seed_noise):
    """(σ per run, σ from seeds, source, ν, standardized pool) in log loss."""
    n = len(pts)
    k = np.array([max(1, len(p.seed_losses)) for p in pts], dtype=float)
    dev, seed_ss, seed_dof = [], 0.0, 0
    for p, kj in zip(pts, k):
        if kj >= 2:
            ls = np.log(np.asarray(p.seed_losses, dtype=float))
            d = ls - ls.mean()
            seed_ss += float((d * d).sum())
            seed_dof += int(kj) - 1
            dev.extend(d * math.sqrt(kj / (kj - 1)))
    sigma_seeds = math.sqrt(seed_ss / seed_dof) if seed_dof else float("nan")
    res_dof = n - n_params
    pool = list(dev)
    if res_dof > 0:
        pool.extend(resid * np.sqrt(k) * math.sqrt(n / res_dof))
    if seed_noise is not None:
        sigma, dof, source = float(seed_noise), math.inf, "given"
    else:
        ss = float((k * resid * resid).sum()) + seed_ss
        dof = res_dof + seed_dof
        sigma = math.sqrt(ss / dof) if dof > 0 else float("nan")
        source = "seeds+residuals" if seed_dof else "residuals"
    pool = np.asarray(pool, dtype=float)
    if len(pool) >= 2 and pool.std() > 0:
        pool = (pool - pool.mean()) / pool.std()  # the shape of the noise; σ sets its size
    else:
        pool = np.empty(0)
    return sigma, sigma_seeds, source, float(dof), pool


def fit_law(
    points: Iterable[Any],
    *,
    floor: float | None = None,
    seed_noise: float | None = None,
    level: float = 0.9,
    n_boot: int = 400,
    seed: int = 0,
    huber_delta: float = HUBER_DELTA,
    target_seeds: int | None = None,
) -> LawFit:
    """Fit L(C) = E + A·C^-α to the ladder's points (see the module docstring).

    `floor` pins E; `seed_noise` is σ of one run in log loss when the seeds were not kept;
    `target_seeds` is how many seeds the result a band is for averages (default: the rungs' most
    common count). Raises FitError for bad input; an unconverged fit comes back with
    `converged=False` and its reason (fit_report refuses it).
    """
    pts = check_points(points)
    if floor is not None and not (math.isfinite(float(floor)) and float(floor) >= 0):
        raise FitError(f"the floor must be a finite number ≥ 0, got {floor!r}")
    if seed_noise is not None and not (
        math.isfinite(float(seed_noise)) and float(seed_noise) >= 0
    ):
        raise FitError(f"seed_noise must be a finite number ≥ 0, got {seed_noise!r}")
    if not (huber_delta > 0 and math.isfinite(huber_delta)):
        raise FitError(f"huber_delta must be a finite number > 0, got {huber_delta!r}")
    if n_boot < 0:
        raise FitError(f"n_boot must be ≥ 0, got {n_boot}")
    floor = None if floor is None else float(floor)
    if floor is not None and floor > 0:  # floor=0 is the power law without a floor
        low = min(pts, key=lambda p: float(p.loss))
        if not floor < float(low.loss):
            raise FitError(
                f"the floor {floor:.6g} is not below {low.name}'s loss {float(low.loss):.6g}: "
                f"the law never goes below its floor"
            )
    compute = np.array([float(p.compute) for p in pts])
    logy = np.log(np.array([float(p.loss) for p in pts]))
    c_ref = float(np.exp(np.log(compute).mean()))
    logx = np.log(compute / c_ref)

    def profile(al: float) -> float:
        return float(_profile(logx, logy, floor, huber_delta, al)[2])

    alphas = _alpha_grid()
    grid = _profile(logx, logy[:, None], floor, huber_delta, alphas, _BOOT_GN_STEPS)[2]
    i = int(grid.argmin())
    lo, hi = alphas[max(i - 1, 0)], alphas[min(i + 1, GRID - 1)]
    res = optimize.minimize_scalar(
        profile, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10, "maxiter": 500}
    )
    alpha = float(res.x)
    e, amp, obj, r = _profile(logx, logy, floor, huber_delta, alpha)
    e, amp, obj = float(e), float(amp), float(obj)
    reason = ""
    span = math.log(ALPHA_BOUNDS[1] / ALPHA_BOUNDS[0])
    if not res.success:
        reason = f"the exponent's refine failed: {res.message}"
    elif not all(math.isfinite(v) for v in (e, amp, alpha, obj)):
        reason = "a parameter is not finite"
    elif amp <= 0:
        reason = "A = 0: the loss does not fall with compute"
    elif math.log(alpha / ALPHA_BOUNDS[0]) < 1e-4 * span:
        reason = f"alpha = {alpha:.4g} sits at the lower bound of {list(ALPHA_BOUNDS)}"
    elif math.log(ALPHA_BOUNDS[1] / alpha) < 1e-4 * span:
        reason = f"alpha = {alpha:.4g} sits at the upper bound of {list(ALPHA_BOUNDS)}"
    converged = not reason
    n_params = 3 if floor is None else 2
    sigma, sigma_seeds, source, dof, pool = _noise(pts, r, n_params, seed_noise)
    if target_seeds is None:
        ks = [max(1, len(p.seed_losses)) for p in pts]
        target_seeds = max(set(ks), key=lambda v: (ks.count(v), v))
    if target_seeds < 1:
        raise FitError(f"target_seeds must be ≥ 1, got {target_seeds}")

    boot: tuple = ()
    noise: tuple = ()
    at_bound = 0
    if converged and n_boot > 0 and math.isfinite(sigma) and dof > 0:
        rng = np.random.Generator(np.random.PCG64(seed))
        k = np.array([max(1, len(p.seed_losses)) for p in pts], dtype=float)
        n = len(pts)
        if len(pool):
            u = pool[rng.integers(0, len(pool), size=(n_boot, n + 1))]
        else:  # no shape to resample (a given σ, no residual dof): Gaussian
            u = rng.standard_normal((n_boot, n + 1))
        fitted = np.log(e + amp * np.exp(-alpha * logx))
        ly = fitted[:, None] + u[:, :n].T * (sigma / np.sqrt(k))[:, None]  # n×B
        be, ba, bal = _fit_many(logx, ly, floor, huber_delta)
        keep = np.isfinite(be) & np.isfinite(ba) & np.isfinite(bal)
        at_bound = int(
            ((bal <= ALPHA_BOUNDS[0] * 1.0001) | (bal >= ALPHA_BOUNDS[1] / 1.0001))[keep].sum()
        )
        boot = tuple(
            (float(a), float(b), float(c)) for a, b, c in zip(be[keep], ba[keep], bal[keep])
        )
        noise = tuple(float(v) for v in u[keep, n])

    return LawFit(
        E=e,
        A=amp * c_ref**alpha,
        alpha=alpha,
        floor_pinned=floor is not None,
        converged=converged,
        huber_delta=float(huber_delta),
        c_ref=c_ref,
        a_ref=amp,
        reason=reason,
        objective=obj,
        points=tuple(pts),
        residuals=tuple(float(v) for v in r),
        sigma=sigma,
        sigma_seeds=sigma_seeds,
        sigma_source=source,
        dof=dof,
        target_seeds=int(target_seeds),
        level=float(level),
        boot=boot,
        boot_noise=noise,
        boot_at_bound=at_bound,
    )


# --------------------------------------------------------------------------------------------
# Baselines, leave-future-out, the record


def baselines(points: Iterable[Any], compute: float) -> dict:
    """Two simpler predictions from the same points at `compute`: (a) a power law without a
    floor, L = A·C^-α (the same Huber fit with E pinned at 0), and (b) the straight line in
    log-log through the last two points."""
    pts = check_points(points)
    pw = fit_law(pts, floor=0.0, n_boot=0)
    c1, c2 = float(pts[-2].compute), float(pts[-1].compute)
    l1, l2 = float(pts[-2].loss), float(pts[-1].loss)
    slope = math.log(l2 / l1) / math.log(c2 / c1)
    two = l2 * (float(compute) / c2) ** slope
    return {
        "power_law": {
            "A": pw.A,
            "alpha": pw.alpha,
            "converged": pw.converged,
            "predicted": pw.predict(compute) if pw.converged else None,
        },
        "two_point": {"slope": slope, "predicted": two},
    }


def _pct(pred: float | None, actual: float) -> float | None:
    return None if pred is None else 100.0 * (actual - pred) / pred


def leave_future_out(
    points: Iterable[Any],
    *,
    floor: float | None = None,
    seed_noise: float | None = None,
    level: float = 0.9,
    n_boot: int = 400,
    seed: int = 0,
    huber_delta: float = HUBER_DELTA,
) -> list[dict]:
    """Fit on the first k rungs (k ≥ 3) and predict each later rung: one row per (k, rung), with
    the law's prediction, its band, the actual loss, the error (actual − predicted)/predicted in
    %, and the baselines' predictions from the same k rungs. A fit that does not converge is a
    row with its reason and no prediction."""
    pts = check_points(points)
    rows = []
    for k in range(3, len(pts)):
        head = pts[:k]
        fit = fit_law(
            head, floor=floor, seed_noise=seed_noise, level=level, n_boot=n_boot, seed=seed,
            huber_delta=huber_delta,
        )
        for p in pts[k:]:
            base = baselines(head, p.compute)
            pred = fit.predict(p.compute) if fit.converged else None
            band = fit.band(p.compute, level) if fit.converged else (math.nan, math.nan)
            band = [_finite_or_none(v) for v in band]
            actual = float(p.loss)
            rows.append({
                "fit_on": k,
                "rung": p.name,
                "compute": float(p.compute),
                "actual": actual,
                "predicted": pred,
                "band": band,
                "in_band": None if None in band else band[0] <= actual <= band[1],
                "error_pct": _pct(pred, actual),
                "converged": fit.converged,
                "reason": fit.reason,
                "power_law": base["power_law"]["predicted"],
                "power_law_error_pct": _pct(base["power_law"]["predicted"], actual),
                "two_point": base["two_point"]["predicted"],
                "two_point_error_pct": _pct(base["two_point"]["predicted"], actual),
            })
    return rows


def _mean_abs(rows: list[dict], key: str) -> float | None:
    v = [abs(r[key]) for r in rows if r[key] is not None]
    return sum(v) / len(v) if v else None


def fit_report(
    points: Iterable[Any],
    *,
    target_compute: float,
    floor: float | None = None,
    seed_noise: float | None = None,
    level: float = 0.9,
    n_boot: int = 400,
    seed: int = 0,
    huber_delta: float = HUBER_DELTA,
    target_seeds: int | None = None,
) -> dict:
    """The fit step's JSON record: the free-floor fit and, if `floor` is given, the pinned one
    (which is then the fit the prediction uses), the prediction and band at `target_compute`,
    the leave-future-out table, the baselines and whether the law beats them (mean absolute
    error over the table's rows). Raises FitError if the fit used did not converge."""
    pts = check_points(points)
    if not _finite_positive(target_compute):
        raise FitError(f"target compute {target_compute!r} is not a finite positive number")
    kw = dict(seed_noise=seed_noise, level=level, n_boot=n_boot, seed=seed,
              huber_delta=huber_delta, target_seeds=target_seeds)
    free = fit_law(pts, **kw)
    pinned = fit_law(pts, floor=floor, **kw) if floor is not None else None
    used = pinned if pinned is not None else free
    if not used.converged:
        raise FitError(f"the {'pinned' if pinned else 'free'}-floor fit did not converge: {used.reason}")
    band = used.band(target_compute, level)
    predicted = used.predict(target_compute)
    lfo = leave_future_out(
        pts, floor=floor, seed_noise=seed_noise, level=level, n_boot=n_boot, seed=seed,
        huber_delta=huber_delta,
    )
    law_mae = _mean_abs(lfo, "error_pct")
    beats = {}
    for b in ("power_law", "two_point"):
        mae = _mean_abs(lfo, f"{b}_error_pct")
        beats[b] = {
            "law_mean_abs_error_pct": law_mae,
            "baseline_mean_abs_error_pct": mae,
            "law_beats": None if law_mae is None or mae is None else law_mae < mae,
        }
    base = baselines(pts, target_compute)
    return {
        "law": LAW,
        "fit_used": "pinned" if pinned is not None else "free",
        "floor": floor,
        "points": [
            {"name": p.name, "compute": float(p.compute), "loss": float(p.loss),
             "seed_losses": [float(s) for s in p.seed_losses]}
            for p in pts
        ],
        "free": free.to_json(),
        "pinned": pinned.to_json() if pinned is not None else None,
        "target": {
            "compute": float(target_compute),
            "predicted": predicted,
            "level": level,
            "band": [_finite_or_none(v) for v in band],
            "band_pct": [_finite_or_none(_pct(predicted, v)) for v in band],
            "law_band": [_finite_or_none(v) for v in used.law_band(target_compute, level)],
            "seeds": used.target_seeds,
            "extrapolation": float(target_compute) / float(pts[-1].compute),
        },
        "leave_future_out": lfo,
        "baselines": {
            "at_target": {k: v["predicted"] for k, v in base.items()},
            "power_law": base["power_law"],
            "two_point": base["two_point"],
            "on_leave_future_out": beats,
        },
        "converged": True,
    }

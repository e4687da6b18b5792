"""A model's batch latency curve: measured, fitted, refined online.

`CostModel` predicts how long one batch of `b` samples takes on one interpreter. It
starts from measured points (`warmup` runs a ladder 1, 2, 4, ..., max with generated
inputs) and keeps learning from every batch the batcher runs (`observe`).

Three curves: an affine latency a + c b (the default), piecewise-linear interpolation
of the points, and LBCI's four-parameter logistic per-sample time. Timing noise on a
shared machine is larger than any bend the bundled models' curves show, and under it
the two-parameter affine fit predicts sizes between the measured ones best; choose
`form="interp"` or `form="logistic"` for a model whose curve does bend.

Online refinement moves the neighbouring points toward each observed batch time, with
the residual clipped to a few times its running mean (Huber-like): one stalled batch
moves the curve by a bounded step, a lasting shift (another tenant on the machine) is
followed within tens of batches.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..engine import ModelInfo, Pool
from ..runtime.datatypes import DATATYPES, element_count, encode_bytes
from ..tensor import Tensor, concat_inputs, split_outputs

# One batch's run time over its prediction counts within these bounds (a stalled batch
# moves the slowdown by a bounded step).
SLOWDOWN_RANGE = (0.5, 4.0)

FORMS = ("interp", "affine", "logistic")
# Smallest residual scale, relative to the prediction: timings on a shared machine
# jitter by a few percent, and a zero scale would freeze the curve.
MIN_SCALE = 0.05
# An observed batch moves the points next to its size by the update's full step, and
# every other point by this share of it: a lasting change of speed (a busier machine)
# scales the whole curve even when only a few batch sizes run, while a curve whose shape
# was mismeasured is still corrected where batches run.
GLOBAL_SHARE = 0.5
# A logistic refit is a grid search: redo it after this many observations, not each.
LOGISTIC_REFIT_EVERY = 32


def ladder(max_batch_size: int) -> list[int]:
    """Batch sizes 1, 2, 4, ... up to and including `max_batch_size` (at least [1])."""
    top = max(1, max_batch_size)
    out = []
    b = 1
    while b < top:
        out.append(b)
        b *= 2
    out.append(top)
    return out


# ---- fits: each takes (batch size, seconds) points and returns latency(b) -----------


def monotone(points: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """Points sorted by batch size with latencies made non-decreasing (pool adjacent violators).

    Repeated batch sizes are averaged first."""
    by_size: dict[int, list[float]] = {}
    for b, t in points:
        by_size.setdefault(int(b), []).append(float(t))
    sizes = sorted(by_size)
    # blocks of [sum, count, first index]; merge while a block is below its left neighbour
    blocks: list[list[float]] = []
    for b in sizes:
        ts = by_size[b]
        blocks.append([sum(ts), float(len(ts)), 1.0])
        while len(blocks) > 1 and blocks[-1][0] / blocks[-1][1] < blocks[-2][0] / blocks[-2][1]:
            s, n, k = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
            blocks[-1][2] += k
    out: list[tuple[int, float]] = []
    i = 0
    for s, n, k in blocks:
        for _ in range(int(k)):
            out.append((sizes[i], s / n))
            i += 1
    return out


def interpolate(knots: Sequence[tuple[int, float]], b: float) -> float:
    """Piecewise-linear latency through sorted `knots`; linear beyond the last two."""
    xs = [k[0] for k in knots]
    if len(knots) == 1:
        b0, t0 = knots[0]
        return t0 * b / b0 if b > b0 else t0
    i = bisect.bisect_left(xs, b)
    if i < len(xs) and xs[i] == b:
        return knots[i][1]
    i = min(max(i, 1), len(xs) - 1)
    (b0, t0), (b1, t1) = knots[i - 1], knots[i]
    t = t0 + (t1 - t0) * (b - b0) / (b1 - b0)
    return max(t, 0.0)


def fit_affine(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(a, c) of latency = a + c*b, least squares on relative error; a, c >= 0."""
    # minimise sum ((a + c*b - t) / t)^2: weighted least squares with w = 1/t^2
    sw = swb = swbb = swt = swbt = 0.0
    for b, t in points:
        w = 1.0 / (t * t)
        sw += w
        swb += w * b
        swbb += w * b * b
        swt += w * t
        swbt += w * b * t
    det = sw * swbb - swb * swb
    if det <= 0.0:  # one distinct batch size: all of it is per-sample time
        b0, t0 = points[0]
        return 0.0, t0 / b0
    a = (swt * swbb - swb * swbt) / det
    c = (sw * swbt - swb * swt) / det
    if c < 0.0:
        return swt / sw, 0.0
    if a < 0.0:
        return 0.0, swbt / swbb
    return a, c


def logistic_latency(params: tuple[float, float, float, float], b: float) -> float:
    a, d, c, m = params
    return float(b * (d + (a - d) / (1.0 + (b / c) ** m)))


def _logistic_solve(
    pts: Sequence[tuple[float, float]], c: float, m: float
) -> tuple[float, tuple[float, float, float, float]] | None:
    """For fixed (c, m): weighted least squares (a, d) and the relative squared error."""
    s_gg = s_gh = s_hh = s_gp = s_hp = 0.0
    rows = []
    for b, t in pts:
        p = t / b
        g = 1.0 / (1.0 + (b / c) ** m)
        h = 1.0 - g
        w = 1.0 / (p * p)  # residual relative to p = relative error of latency
        s_gg += w * g * g
        s_gh += w * g * h
        s_hh += w * h * h
        s_gp += w * g * p
        s_hp += w * h * p
        rows.append((g, h, p))
    det = s_gg * s_hh - s_gh * s_gh
    if abs(det) < 1e-300:
        return None
    a = (s_gp * s_hh - s_gh * s_hp) / det
    d = (s_gg * s_hp - s_gh * s_gp) / det
    if a <= 0.0 or d <= 0.0:
        return None
    err = sum(((a * g + d * h) - p) ** 2 / (p * p) for g, h, p in rows)
    return err, (a, d, c, m)


def fit_logistic(points: Sequence[tuple[int, float]]) -> tuple[float, float, float, float]:
    """(a, d, c, m) of LBCI's per-sample logistic p(b) = d + (a - d) / (1 + (b/c)^m).

    For fixed (c, m) the model is linear in (a, d): a grid over c (geometric) and m,
    then a shrinking pattern search around the best, each step solving (a, d) by
    weighted least squares on relative error."""
    pts = [(float(b), float(t)) for b, t in points]
    top = max(b for b, _ in pts)
    best: tuple[float, tuple[float, float, float, float]] | None = None
    for i in range(24):
        c = 0.25 * (4.0 * top / 0.25) ** (i / 23)
        for j in range(1, 13):
            found = _logistic_solve(pts, c, 0.33 * j)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
    if best is None:  # degenerate points: a flat per-sample time
        per = statistics.fmean(t / b for b, t in pts)
        return per, per, 1.0, 1.0
    step_c, step_m = 1.3, 0.17
    while step_c > 1.001:
        _, (_, _, c, m) = best
        improved = False
        for nc, nm in ((c * step_c, m), (c / step_c, m), (c, m + step_m), (c, max(0.05, m - step_m))):
            found = _logistic_solve(pts, nc, nm)
            if found is not None and found[0] < best[0]:
                best, improved = found, True
        if not improved:
            step_c, step_m = step_c ** 0.5, step_m / 2
    return best[1]


# ---- the model -------------------------------------------------------------------------


class CostModel:
    """Predicted latency of one batch of `b` samples on one interpreter.

    points: measured (batch size, seconds), at least one; repeated sizes are averaged.
    form: "affine" (default), "interp" or "logistic" (see the module doc).
    alpha: weight of one observed batch in the online update (0 disables refinement).
    clip: residuals are clipped to `clip` times the running mean absolute residual.
    """

    def __init__(
        self,
        points: Iterable[tuple[int, float]],
        /,
        *,
        max_batch_size: int,
        form: str = "affine",
        alpha: float = 0.1,
        clip: float = 3.0,
    ) -> None:
        if form not in FORMS:
            raise ValueError(f"cost model form {form!r}: expected one of {', '.join(FORMS)}")
        pts = [(int(b), float(t)) for b, t in points]
        if not pts:
            raise ValueError("a cost model needs at least one measured (batch size, seconds) point")
        for b, t in pts:
            if b < 1 or not t > 0.0 or not math.isfinite(t):
                raise ValueError(f"cost model point ({b}, {t}): batch size must be >= 1, seconds > 0")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha {alpha}: expected 0..1")
        self.max_batch_size = max(1, max_batch_size)
        self.form = form
        self.alpha = alpha
        self.clip = clip
        self.observations = 0
        self._knots = monotone(pts)
        self._xs = [b for b, _ in self._knots]  # the sizes (fixed: refinement moves only the seconds)
        self._scale = 0.0  # running mean absolute (clipped) residual, seconds
        self._since_refit = 0
        self._affine = (0.0, 0.0)
        self._logistic = (0.0, 0.0, 1.0, 1.0)
        self._best: int | None = None
        self._refit()

    @classmethod
    def fit(cls, points: Iterable[tuple[int, float]], /, *, max_batch_size: int, **options: Any) -> CostModel:
        """Alias of the constructor that reads better at call sites."""
        return cls(points, max_batch_size=max_batch_size, **options)

    # ---- prediction ----

    @property
    def points(self) -> list[tuple[int, float]]:
        """The current (refined) curve points: batch size, seconds."""
        return list(self._knots)

    def predict(self, samples: int) -> float:
        """Seconds one batch of `samples` samples takes on one interpreter."""
        b = max(1, samples)
        if self.form == "affine":
            a, c = self._affine
            return a + c * b
        if self.form == "logistic":
            return logistic_latency(self._logistic, b)
        return interpolate(self._knots, b)

    @property
    def affine(self) -> tuple[float, float] | None:
        """(a, c) of the fitted line a + c b where the form is affine, else None."""
        return self._affine if self.form == "affine" else None

    def throughput(self, samples: int) -> float:
        """Samples per second one interpreter serves in batches of `samples`."""
        b = max(1, samples)
        return b / self.predict(b)

    def throughput_optimal_batch(self) -> int:
        """The batch size (1..max_batch_size) with the highest predicted throughput.

        Ties go to the smaller size. With interpolation the optimum lies on a measured
        point or at max_batch_size (b / (u + v*b) is monotone on each segment)."""
        if self._best is None:
            if self.form == "interp":
                candidates = sorted({b for b, _ in self._knots if b <= self.max_batch_size} | {self.max_batch_size})
            elif self.form == "affine" and self._affine[0] > 0.0:
                candidates = [self.max_batch_size]  # b / (a + c*b) rises with b when a > 0
            else:
                candidates = list(range(1, self.max_batch_size + 1))
            best, rate = 1, 0.0
            for b in candidates:
                r = self.throughput(b)
                if r > rate * (1.0 + 1e-9):
                    best, rate = b, r
            self._best = best
        return self._best

    def efficient_batch(self, tolerance: float = 0.05) -> int:
        """The smallest batch size within `tolerance` of the best throughput: beyond it,
        larger batches cost latency and buy (almost) nothing."""
        best = self.throughput_optimal_batch()
        b = self.smallest_batch_for((1.0 - tolerance) * self.throughput(best))
        return best if b is None else b

    def largest_batch_within(self, seconds: float) -> int:
        """Largest batch size (1..max_batch_size) predicted to take at most `seconds`;
        1 when even a single sample takes longer."""
        lo, hi = 1, self.max_batch_size
        a, c = self._affine
        if self.form == "affine" and c > 0.0:  # solve a + c b <= seconds, then settle rounding
            b = min(hi, max(lo, math.floor((seconds - a) / c)))
            while b < hi and self.predict(b + 1) <= seconds:
                b += 1
            while b > lo and self.predict(b) > seconds:
                b -= 1
            return b
        # latency never falls as the batch grows (the points are made monotone): bisect
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.predict(mid) <= seconds:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def smallest_batch_for(self, rate: float) -> int | None:
        """Smallest batch size at which one interpreter serves `rate` samples/s, or None."""
        if rate <= 0.0:
            return 1
        top = self.throughput_optimal_batch()
        if self.throughput(top) < rate:
            return None
        lo, hi = 1, top
        a, c = self._affine
        if self.form == "affine" and rate * c < 1.0:  # solve b / (a + c b) >= rate, then settle rounding
            b = min(hi, max(lo, math.ceil(rate * a / (1.0 - rate * c))))
            while b > lo and self.throughput(b - 1) >= rate:
                b -= 1
            while b < hi and self.throughput(b) < rate:
                b += 1
            return b
        # throughput rises up to the optimum for every form used here: bisect
        while lo < hi:
            mid = (lo + hi) // 2
            if self.throughput(mid) >= rate:
                hi = mid
            else:
                lo = mid + 1
        return lo

    # ---- refinement ----

    def observe(self, samples: int, seconds: float) -> None:
        """Fold in one executed batch: robust exponentially weighted update."""
        if samples < 1 or not seconds > 0.0 or not math.isfinite(seconds) or self.alpha == 0.0:
            return
        self.observations += 1
        predicted = self.predict(samples)
        residual = seconds - predicted
        scale = max(self._scale, MIN_SCALE * predicted)
        limit = self.clip * scale
        r = max(-limit, min(limit, residual))
        self._scale += self.alpha * (abs(r) - self._scale)
        knots = self._knots
        xs = self._xs
        i = bisect.bisect_left(xs, samples)
        # the points next to the batch's size and their shares of the step
        if i < len(xs) and xs[i] == samples or i == 0:
            lo_i, hi_i, w_hi = i, i, 1.0
        elif i == len(xs):
            lo_i, hi_i, w_hi = i - 1, i - 1, 1.0
        else:
            lo_i, hi_i, w_hi = i - 1, i, (samples - xs[i - 1]) / (xs[i] - xs[i - 1])
        # every point moves by the same relative step, the neighbours by their share of it
        # and the others by GLOBAL_SHARE: relative to its own size, so both ends scale
        step = self.alpha * r / predicted
        rest = 1.0 + step * GLOBAL_SHARE
        ordered = True
        previous = 0.0
        for j, (b, t) in enumerate(knots):
            if j == hi_i:
                t *= 1.0 + step * (w_hi + GLOBAL_SHARE * (1.0 - w_hi))
            elif j == lo_i:
                t *= 1.0 + step * (1.0 - w_hi + GLOBAL_SHARE * w_hi)
            else:
                t *= rest
            t = max(t, 1e-9)
            knots[j] = (b, t)
            ordered = ordered and t >= previous
            previous = t
        if not ordered:
            self._knots = monotone(knots)
        self._since_refit += 1
        if self.form != "logistic" or self._since_refit >= LOGISTIC_REFIT_EVERY:
            self._refit()
        else:
            self._best = None

    def _refit(self) -> None:
        self._since_refit = 0
        self._best = None
        if self.form == "affine":
            self._affine = fit_affine(self._knots)
        elif self.form == "logistic":
            self._logistic = fit_logistic(self._knots)

    # ---- summary ----

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary for model metadata and metrics."""
        best = self.throughput_optimal_batch()
        out: dict[str, Any] = {
            "form": self.form,
            "max_batch_size": self.max_batch_size,
            "points": [[b, t] for b, t in self._knots],
            "throughput_optimal_batch": best,
            "throughput_optimal_samples_per_s": self.throughput(best),
            "batch1_seconds": self.predict(1),
            "observations": self.observations,
        }
        if self.form == "affine":
            out["params"] = {"a": self._affine[0], "c": self._affine[1]}
        elif self.form == "logistic":
            a, d, c, m = self._logistic
            out["params"] = {"a": a, "d": d, "c": c, "m": m}
        return out

    def __repr__(self) -> str:
        return f"CostModel(form={self.form!r}, max_batch_size={self.max_batch_size}, points={self._knots!r})"


# ---- measuring a loaded model --------------------------------------------------------


def sample_inputs(model_info: ModelInfo, batch: int, *, batched: bool = True) -> dict[str, Tensor]:
    """Inputs for `batch` samples. From the model's example request when it declares one
    (`Model.example_inputs`): its samples over and over (or the example as it is, when
    not `batched`). Otherwise generated: zeros of each declared datatype and shape
    (BYTES: short strings); with `batched` the leading dimension is the batch one, other
    variable dimensions become 1."""
    if model_info.example:
        return _from_example(model_info.example, batch) if batched else dict(model_info.example)
    out: dict[str, Tensor] = {}
    for spec in model_info.inputs:
        dims = list(spec.shape)
        if batched:
            dims = [batch] + [d if d >= 0 else 1 for d in dims[1:]]
        else:
            dims = [d if d >= 0 else 1 for d in dims]
        shape = tuple(dims)
        count = element_count(shape)
        dt = DATATYPES[spec.datatype]
        data = encode_bytes([b"warmup"] * count) if spec.datatype == "BYTES" else bytes(count * dt.itemsize)
        out[spec.name] = Tensor(spec.datatype, shape, data)
    return out


def _from_example(example: dict[str, Tensor], batch: int) -> dict[str, Tensor]:
    """A batch of `batch` samples cycling through the example request's samples."""
    have = next(iter(example.values())).shape[0]
    if have < 1:
        raise ValueError("the example request holds no sample")
    names = list(example)
    samples = split_outputs(example, [1] * have, "example")
    joined = concat_inputs([[samples[i % have][n] for n in names] for i in range(batch)], batch)
    return dict(zip(names, joined))


async def measure(
    pool: Pool, model_info: ModelInfo, sizes: Sequence[int], *, repeats: int = 5, batched: bool = True
) -> list[tuple[int, float]]:
    """Median seconds per batch size over `repeats` rounds, each round timing every size
    once (interleaved, so a burst of other load on the machine skews one round of all
    sizes, not all rounds of one size); one untimed call per size first."""
    inputs = {b: sample_inputs(model_info, b, batched=batched) for b in sizes}
    for b in sizes:
        await pool.infer(model_info.name, inputs[b])
    times: dict[int, list[float]] = {b: [] for b in sizes}
    for _ in range(max(1, repeats)):
        for b in sizes:
            start = time.perf_counter()
            await pool.infer(model_info.name, inputs[b])
            times[b].append(time.perf_counter() - start)
    return [(b, statistics.median(times[b])) for b in sizes]


async def contention(pool: Pool, model_info: ModelInfo, cost: CostModel, max_batch_size: int, *,
                     repeats: int = 3) -> float:
    """How much longer a batch takes while every interpreter of the model runs one at once
    than `cost` predicts for it alone: the median over `repeats` rounds of the batches'
    seconds over the prediction, within SLOWDOWN_RANGE and at least 1 (1.0 with one
    interpreter). The batch is the ladder's middle size (size 1 for a model that does not
    batch). A burst of requests meets every interpreter busy before any batch under load has
    been timed: admission plans with this until one has (`AdaptivePolicy(contention=)`)."""
    n = model_info.interpreters
    if n < 2:
        return 1.0
    sizes = ladder(max_batch_size)  # [1] for a model that does not batch
    size = sizes[len(sizes) // 2]
    inputs = sample_inputs(model_info, size, batched=max_batch_size > 0)

    async def timed() -> float:
        start = time.perf_counter()
        await pool.infer(model_info.name, inputs)
        return time.perf_counter() - start

    ratios = []
    for _ in range(max(1, repeats)):
        times = await asyncio.gather(*(timed() for _ in range(n)))
        ratios.append(statistics.median(times) / cost.predict(size))
    return min(SLOWDOWN_RANGE[1], max(1.0, statistics.median(ratios)))


async def warmup(
    pool: Pool, model_info: ModelInfo, max_batch_size: int, *, repeats: int = 5, form: str = "affine"
) -> CostModel:
    """Measure the ladder 1, 2, 4, ..., max_batch_size on `pool` and fit a CostModel.

    A model that does not batch (max_batch_size 0) is measured once at its declared
    shape and gets a one-point model for batch size 1."""
    batched = max_batch_size > 0
    points = await measure(pool, model_info, ladder(max_batch_size), repeats=repeats, batched=batched)
    return CostModel(points, max_batch_size=max(1, max_batch_size), form=form)

"""Hypothesis strategies for the laws of docs/conformance.md.

Every strategy draws inputs in rfrs-ref's conventions, so that a third-party
implementation can be exercised through an adapter
(:mod:`rfrs_ref.testing.adapters`):

- :func:`byzantine_rounds`: a round's detection features with up to f
  Byzantine rows that are arbitrary: NaN, ±inf, 1e38, huge or tiny scalings,
  copies of an honest row, tight clusters, one poisoned coordinate, points just
  outside the honest cloud. Honest rows are in general position (drawn from a
  seeded normal distribution), so ties between different rows have probability
  zero; Byzantine copies tie on purpose.
- :func:`optimizers`, :func:`optimizer_states`, :func:`pair_cases`,
  :func:`gradient_sequences`: optimiser hyperparameters, server states
  (second moments ≥ a drawn floor), honest and arbitrary gradients, and
  multi-round runs with ‖g‖ ≤ g_max and convex aggregation weights.
- :func:`federated_scenarios`: tiny federations (users, items, Byzantine
  set, optimiser, rule, attack) that run in milliseconds.

The strategies import Hypothesis, a test dependency (extra ``test``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

#: the values a Byzantine client may put in a row or a coordinate
HOSTILE_VALUES = (math.nan, math.inf, -math.inf, 1e38, -1e38, 3.4e38, -3.4e38)

#: how a Byzantine row is built (see :func:`byzantine_rounds`)
BYZANTINE_KINDS = ("constant", "scaled", "copy", "cluster", "coordinate", "near")
#: the kinds whose rows stay finite
FINITE_KINDS = ("copy", "cluster", "near", "scaled-finite")


@dataclasses.dataclass(frozen=True)
class RoundCase:
    """One round of an aggregation rule with Byzantine rows.

    Attributes:
        features: (n, D) float32 or float64 detection features.
        honest: (n,) bool, the honest rows (at least n − f of them).
        f: the number of Byzantine rows assumed (the number present is at most f).
        n_samples: (n,) int64 training-set sizes nᵢ ≥ 1.
        perm: (n,) a permutation of the rows (for the permutation law).
        shift: (D,) float64 translation (for the translation law).
        kinds: how each Byzantine row was built, in row order (for reports).
        source: for a fixed example, a Python expression that rebuilds it (a report
            of a round with more than :data:`DESCRIBED_VALUES` feature values names it
            instead of listing every value); empty for a drawn one.
    """

    features: np.ndarray
    honest: np.ndarray
    f: int
    n_samples: np.ndarray
    perm: np.ndarray
    shift: np.ndarray
    kinds: tuple[str, ...] = ()
    source: str = ""

    @property
    def n(self) -> int:
        return int(self.features.shape[0])

    @property
    def D(self) -> int:
        return int(self.features.shape[1])

    def describe(self) -> dict:
        """A JSON-friendly description (for counterexample reports). A fixed example of
        more than :data:`DESCRIBED_VALUES` feature values names the expression that
        rebuilds it (``source``) and the SHA-256 of its features' bytes instead of listing
        them (a 40 × 257 round is 10,280 numbers)."""
        if self.source and self.features.size > DESCRIBED_VALUES:
            import hashlib

            features = {"omitted": f"{self.n} × {self.D} {self.features.dtype} values",
                        "rebuild": self.source,
                        "sha256": hashlib.sha256(np.ascontiguousarray(self.features).tobytes()).hexdigest()}
        else:
            features = self.features.tolist()
        return {
            "n": self.n, "D": self.D, "f": self.f, "dtype": str(self.features.dtype),
            "features": features, "honest": self.honest.tolist(),
            "n_samples": self.n_samples.tolist(), "byzantine_kinds": list(self.kinds),
        }


#: the most feature values a counterexample report lists; a larger fixed example is named
#: by the expression that rebuilds it (:attr:`RoundCase.source`)
DESCRIBED_VALUES = 2048


def _f_bound(rule_bound: Callable[[int], int] | None):
    return rule_bound or (lambda n: (n - 1) // 2)


def _arrange(rng, n: int, honest_n: int, trusted, equal_weights: bool):
    """(order, honest, nᵢ) of a round whose first ``honest_n`` rows are honest: a random
    order of the rows (Byzantine rows anywhere, not only at the end) with an honest row at
    position ``trusted`` when one is asked for (honest_n ≥ 1 since f < n), the honest flags
    in the original order, and each client's nᵢ (7 for all with ``equal_weights``)."""
    order = rng.permutation(n)
    if trusted is not None and trusted < n and order[trusted] >= honest_n:
        j = int(np.flatnonzero(order < honest_n)[0])
        order[[trusted, j]] = order[[j, trusted]]
    honest = np.zeros(n, dtype=bool)
    honest[:honest_n] = True
    ns = np.full(n, 7, dtype=np.int64) if equal_weights else rng.integers(1, 30, size=n)
    return order, honest, ns


@st.composite
def byzantine_rounds(draw, *, min_n: int = 1, max_n: int = 13,
                     max_f: Callable[[int], int] | None = None, max_D: int = 12,
                     dtypes=(np.float32, np.float64), hostile: bool = True,
                     byzantine: bool = True, equal_weights: bool = False,
                     distinct: bool = False, trusted: int | None = None,
                     ties: bool = False) -> RoundCase:
    """A round: n clients, of which at most f Byzantine rows, anywhere.

    Args:
        min_n, max_n: the range of n.
        max_f: the largest f for a given n (the rule's precondition), default
            ⌊(n − 1)/2⌋; f is drawn in [0, max_f(n)].
        max_D: the largest feature dimension.
        dtypes: the feature dtypes to draw from.
        hostile: allow non-finite and huge values (False: Byzantine rows are
            finite and moderate: copies, clusters, points just outside).
        byzantine: False draws honest rounds only (f is still drawn: the rule
            assumes it, none is present).
        equal_weights: every nᵢ equal (otherwise 1..29).
        distinct: move every finite Byzantine row by its own tiny offset
            (1e-3 of the spread), so that no two rows are equal: copies and
            clusters stay close to what they copy but no longer tie. Laws
            that only hold without ties (permutation invariance of rules that
            break ties by index) use it.
        trusted: a row position that is always honest (when n > it), e.g. the
            pivot of MoNNA, whose guarantee needs a trusted pivot.
        ties: in about half the rounds, put the rows on a coarse grid (an integer
            centre plus integer multiples of a step of 0.25, 1 or 8, so that every
            value, difference and squared distance is exact in float32 and float64)
            and copy whole rows onto others: equal values, equal distances and equal
            scores, which the rules break by index (docs/aggregation.md). Whatever
            the order a correct implementation sums in, a tie stays exact.
    """
    n = draw(st.integers(min_n, max_n), label="n")
    fmax = max(0, _f_bound(max_f)(n))
    f = draw(st.integers(0, fmax), label="f")
    D = draw(st.integers(1, max_D), label="D")
    dtype = np.dtype(draw(st.sampled_from(list(dtypes)), label="dtype"))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    centre = rng.normal(size=D) * draw(st.sampled_from([0.0, 1.0, 1e3]), label="centre scale")
    spread = draw(st.sampled_from([1e-3, 1.0, 10.0]), label="spread")
    X = (centre + rng.normal(size=(n, D)) * spread).astype(dtype)
    if ties and draw(st.booleans(), label="ties"):
        spread = draw(st.sampled_from([0.25, 1.0, 8.0]), label="grid step")
        X = (np.round(centre) + rng.integers(-2, 3, size=(n, D)) * spread).astype(dtype)
        for _ in range(draw(st.integers(0, n // 2), label="copied rows")):
            X[rng.integers(n)] = X[rng.integers(n)]
    n_byz = draw(st.integers(0, f), label="Byzantine rows") if byzantine else 0
    kinds = []
    allowed = BYZANTINE_KINDS if hostile else ("copy", "cluster", "near")
    honest_n = n - n_byz
    with np.errstate(all="ignore"):
        for i in range(honest_n, n):
            kind = draw(st.sampled_from(allowed), label="kind")
            kinds.append(kind)
            if kind == "constant":
                X[i] = draw(st.sampled_from(HOSTILE_VALUES), label="value")
            elif kind == "scaled":
                X[i] = X[i] * draw(st.sampled_from([1e30, -1e20, 1e-30]), label="scale")
            elif kind == "copy":
                X[i] = X[rng.integers(honest_n)]
            elif kind == "cluster":
                X[i] = X[honest_n - 1] + 5.0 * spread
            elif kind == "coordinate":
                X[i, rng.integers(D)] = draw(st.sampled_from(HOSTILE_VALUES), label="value")
            else:  # just outside the honest cloud
                X[i] = X[:honest_n].max(axis=0) + 0.1 * spread
            if distinct and np.isfinite(X[i]).all():
                X[i] = X[i] + (rng.normal(size=D) * 1e-3 * spread).astype(dtype)
    order, honest, ns = _arrange(rng, n, honest_n, trusted, equal_weights)
    shift = rng.normal(size=D) * draw(st.sampled_from([1.0, 100.0]), label="shift scale")
    return RoundCase(X[order], honest[order], f, ns.astype(np.int64), rng.permutation(n),
                     shift, tuple(kinds))


def hostile_examples(*, min_n: int = 1, max_n: int = 13,
                     max_f: Callable[[int], int] | None = None, max_D: int = 12,
                     dtypes=(np.float32, np.float64), hostile: bool = True,
                     byzantine: bool = True, equal_weights: bool = False,
                     distinct: bool = False, trusted: int | None = None,
                     ties: bool = False) -> list[RoundCase]:
    """Rounds that every law over :func:`byzantine_rounds` (with the same arguments) tries
    first, whatever the number of examples asked for: one Byzantine row that is NaN,
    +inf, −inf or 1e38 in every coordinate, or in one coordinate only, in each dtype; that
    row last, then the same rounds with it first (every row moved down one, its nᵢ with
    it). Where ``trusted`` is the last row the hostile one is first only, where it is row 0
    last only.

    A handful of random examples may draw none of these (``--max-examples 5``), and a rule
    that mishandles NaN (``numpy.argmin`` of NaN scores) would then pass. The row sits at
    both ends because an implementation may be wrong at one end only: with it last only, a
    median of every row but the last held ``finite_output`` on them, and so did a Krum
    that picks with Python's ``min``, and an NNM that orders neighbours with ``sorted``
    held ``nnm_honest_bound`` (nothing compares below NaN: a NaN key first stays first).
    Empty when the arguments allow no hostile Byzantine row (``hostile`` or ``byzantine``
    False, or no n in range admits f ≥ 1)."""
    if not (hostile and byzantine):
        return []
    bound = _f_bound(max_f)
    n = next((m for m in range(max(min_n, 5), max(max_n, min_n) + 1) if bound(m) >= 1), None)
    if n is None:
        return []
    D = max(1, min(3, max_D))
    rng = np.random.default_rng(20201)
    base = rng.normal(size=(n, D)) + np.arange(n)[:, None] * 0.25
    # the Byzantine row anywhere but at ``trusted``: the last row, or the first
    bad = n - 1 if trusted != n - 1 else 0
    honest = np.ones(n, dtype=bool)
    honest[bad] = False
    ns = np.full(n, 7, dtype=np.int64) if equal_weights else np.arange(1, n + 1, dtype=np.int64)
    out = []
    for dtype in dtypes:
        for value in (math.nan, math.inf, -math.inf, 1e38):
            for kind in ("constant", "coordinate"):
                X = base.astype(dtype)
                if kind == "constant":
                    X[bad] = value
                else:
                    X[bad, D // 2] = value
                out.append(RoundCase(X, honest.copy(), min(bound(n), 2), ns.copy(),
                                     rng.permutation(n), rng.normal(size=D), (kind,)))
    if bad == n - 1 and trusted != 0:
        out += [dataclasses.replace(c, features=np.roll(c.features, 1, axis=0),
                                    honest=np.roll(c.honest, 1), n_samples=np.roll(c.n_samples, 1))
                for c in out]
    return out


def tie_examples(*, min_n: int = 1, max_n: int = 13,
                 max_f: Callable[[int], int] | None = None, max_D: int = 12,
                 dtypes=(np.float32, np.float64), trusted: int | None = None, **_) -> list[RoundCase]:
    """Rounds of exact ties that the reference law tries first: every row equal (every
    distance, score and value ties, so the index alone decides), and rows on an integer
    grid with two pairs of copies, at the smallest n the rule allows and at the smallest
    n ≥ 5 with f ≥ 1, nᵢ = 1, 2, …, n (unequal), in each dtype."""
    bound = _f_bound(max_f)
    top = max(max_n, min_n)
    sizes = [min_n] + [next((m for m in range(max(min_n, 5), top + 1) if bound(m) >= 1), min_n)]
    D = max(1, min(3, max_D))
    rng = np.random.default_rng(20202)
    out = []
    for n in dict.fromkeys(sizes):
        f = max(0, bound(n))
        ns = np.arange(1, n + 1, dtype=np.int64)
        grid = 3.0 + rng.integers(-2, 3, size=(n, D)).astype(np.float64)
        for a, b in ((1, 0), (n - 1, n - 2)):
            if n > max(a, b):
                grid[a] = grid[b]
        for dtype in dtypes:
            for X in (np.tile(grid[:1], (n, 1)), grid):
                out.append(RoundCase(X.astype(dtype), np.ones(n, dtype=bool), f, ns.copy(),
                                     rng.permutation(n), rng.normal(size=D), ()))
    return out


#: the fixed large rounds every law of a rule, pre-aggregator or attack tries first: (n, D,
#: dtype, how the Byzantine rows are built). The drawn rounds have n ≤ 13 and D ≤ 12 (rules,
#: pre-aggregators), k ≤ 9 and D ≤ 8 (attacks), and the other fixed ones D ≤ 5: a rule that
#: is right only on small rounds (a sorting network of 16 inputs, a kernel whose SIMD tail
#: is wrong) would pass them all. n = 40 is past any such network, 33 sits at the edge of
#: networks and vector widths of 32, and D = 257 and 1031 leave an odd tail after every
#: power-of-two block
LARGE_ROUNDS = ((40, 257, "float64", "hostile"), (33, 1031, "float32", "finite"))

#: how the Byzantine rows of a large round are built, in turn: hostile ones (NaN, ±inf,
#: 1e38, scaled, one poisoned coordinate, the last one where a vector kernel's tail runs)
#: between finite ones that stay near the honest cloud
_LARGE_HOSTILE = (("constant", math.nan), ("near", None), ("coordinate-tail", math.inf),
                  ("copy", None), ("constant", -math.inf), ("cluster", None), ("constant", 1e38),
                  ("scaled", 1e30), ("coordinate", math.nan), ("near", None), ("constant", -3.4e38))
_LARGE_FINITE = (("near", None), ("copy", None), ("cluster", None))

#: the seed of the large rounds (each adds its position in :data:`LARGE_ROUNDS`)
LARGE_SEED = 20204


def large_round(index: int, *, n: int, D: int, dtype: str, f: int, byzantine: str = "hostile",
                equal_weights: bool = False, distinct: bool = False, trusted: int | None = None,
                ties: bool = False) -> RoundCase:
    """One fixed large round, a function of its arguments alone (seed LARGE_SEED + index).

    Honest rows: centre·10 + N(0, 1) per coordinate (in ``dtype``; ``ties``: an integer
    centre plus integer offsets in [−2, 2], with every third row copied from the row before,
    so that values, distances and scores tie exactly); f Byzantine rows (f at the rule's
    limit, all present), anywhere but at ``trusted``, built in turn as
    :data:`_LARGE_HOSTILE` (``byzantine="hostile"``) or :data:`_LARGE_FINITE` (``"finite"``)
    says, or none (``"none"``); ``distinct`` moves every finite Byzantine row by its own
    1e-3; nᵢ = 7 (``equal_weights``) or drawn in 1..29."""
    rng = np.random.default_rng(LARGE_SEED + index)
    dt = np.dtype(dtype)
    centre = rng.normal(size=D) * 10.0
    if ties:
        X = (np.round(centre) + rng.integers(-2, 3, size=(n, D))).astype(dt)
        X[2::3] = X[1::3][: X[2::3].shape[0]]
    else:
        X = (centre + rng.normal(size=(n, D))).astype(dt)
    n_byz = 0 if byzantine == "none" else f
    honest_n = n - n_byz
    cycle = _LARGE_HOSTILE if byzantine == "hostile" else _LARGE_FINITE
    kinds = []
    with np.errstate(all="ignore"):
        for j, i in enumerate(range(honest_n, n)):
            kind, value = cycle[j % len(cycle)]
            kinds.append(kind)
            if kind == "constant":
                X[i] = value
            elif kind == "scaled":
                X[i] = X[i] * value
            elif kind == "copy":
                X[i] = X[rng.integers(honest_n)]
            elif kind == "cluster":
                X[i] = X[honest_n - 1] + 5.0
            elif kind == "coordinate":
                X[i, rng.integers(D)] = value
            elif kind == "coordinate-tail":
                X[i, D - 1] = value
            else:  # just outside the honest cloud
                X[i] = X[:honest_n].max(axis=0) + 0.1
            if distinct and np.isfinite(X[i]).all():
                X[i] = X[i] + (rng.normal(size=D) * 1e-3).astype(dt)
    order, honest, ns = _arrange(rng, n, honest_n, trusted, equal_weights)
    source = (f"rfrs_ref.testing.strategies.large_round({index}, n={n}, D={D}, dtype={dt.name!r}, "
              f"f={f}, byzantine={byzantine!r}, equal_weights={equal_weights}, distinct={distinct}, "
              f"trusted={trusted}, ties={ties})")
    return RoundCase(X[order], honest[order], f, ns.astype(np.int64), rng.permutation(n),
                     rng.normal(size=D), tuple(kinds), source)


def large_examples(*, min_n: int = 1, max_n: int = 13,
                   max_f: Callable[[int], int] | None = None, max_D: int = 12,
                   dtypes=(np.float32, np.float64), hostile: bool = True,
                   byzantine: bool = True, equal_weights: bool = False,
                   distinct: bool = False, trusted: int | None = None,
                   ties: bool = False, sizes=LARGE_ROUNDS,
                   max_subsets: int | None = None) -> list[RoundCase]:
    """The fixed large rounds (:data:`LARGE_ROUNDS`, or ``sizes``) that every law over
    :func:`byzantine_rounds` with the same arguments tries first, far beyond the drawn
    sizes (``max_n`` and ``max_D`` do not bound them): f = max_f(n), the rule's limit,
    Byzantine rows present (hostile ones only where ``hostile``; none where not
    ``byzantine``), in a dtype of ``dtypes`` (the size's own when allowed).

    ``max_subsets`` (rules that search the C(n, f) subsets: MDA, SMEA) lowers f until
    C(n, f) ≤ max_subsets. A size below ``min_n``, or that cannot hold the ``trusted``
    row, is left out. ``ties`` (the reference law) adds the first size again with its
    rows on an integer grid and copied rows (exact ties)."""
    bound = _f_bound(max_f)
    allowed = [np.dtype(d) for d in dtypes]
    out = []
    plan = [(i, size, False) for i, size in enumerate(sizes)]
    if ties and sizes:
        plan.append((len(sizes), sizes[0], True))
    for index, (n, D, dtype, kinds), tied in plan:
        if n < min_n or (trusted is not None and trusted >= n):
            continue
        f = max(0, bound(n))
        while max_subsets is not None and f > 0 and math.comb(n, f) > max_subsets:
            f -= 1
        dt = np.dtype(dtype) if np.dtype(dtype) in allowed else allowed[index % len(allowed)]
        how = "none" if not byzantine else (kinds if hostile else "finite")
        out.append(large_round(index, n=n, D=D, dtype=dt.name, f=f, byzantine=how,
                               equal_weights=equal_weights, distinct=distinct, trusted=trusted,
                               ties=tied))
    return out


def unanimous(case: RoundCase) -> RoundCase:
    """The same round with every honest row replaced by the first honest one."""
    X = case.features.copy()
    h = np.flatnonzero(case.honest)
    X[h] = X[h[0]]
    source = f"rfrs_ref.testing.strategies.unanimous({case.source})" if case.source else ""
    return dataclasses.replace(case, features=X, source=source)


# -- optimisers ---------------------------------------------------------------------------------

def vectors(D: int, bound: float = 1e6, dtype=np.float64):
    """1-D arrays of length D with finite entries in [−bound, bound]."""
    return hnp.arrays(dtype, D, elements=st.floats(-bound, bound, allow_nan=False,
                                                   width=64 if dtype == np.float64 else 32))


#: a decay β: 0 or realistic (β₂ = 1e-300 would make β₂·v_min vanish and every bound vacuous)
_BETA = st.just(0.0) | st.floats(1e-3, 0.9999)


@st.composite
def optimizers(draw, kind: str):
    """An rfrs-ref optimiser of ``kind`` (sgd, momentum, adam, adagrad, rmsprop)
    with drawn hyperparameters."""
    from rfrs_ref.optim import OPTIMIZERS

    cls = OPTIMIZERS.get(kind)
    lr = draw(st.floats(1e-5, 1.0), label="lr")
    eps = draw(st.floats(1e-12, 1e-2), label="eps")
    if kind == "sgd":
        return cls(lr=lr)
    if kind == "momentum":
        return cls(lr=lr, beta3=min(draw(_BETA, label="beta3"), 0.999))
    if kind == "adam":
        return cls(lr=lr, beta1=min(draw(_BETA, label="beta1"), 0.999),
                   beta2=draw(_BETA, label="beta2"), eps=eps)
    if kind == "adagrad":
        return cls(lr=lr, eps=eps)
    return cls(lr=lr, beta4=draw(_BETA, label="beta4"), eps=eps)


#: the dtypes of the drawn states and gradients: rfrs-ref stores either
OPTIMIZER_DTYPES = (np.float64, np.float32)


def _floor_in(floor: float, dtype) -> float:
    """``floor`` as a value of ``dtype`` (float32 rounds 1e-8 down: the floor the
    laws use must be one the stored second moment respects)."""
    return float(np.asarray(floor, dtype=dtype))


@st.composite
def optimizer_states(draw, D: int, floor: float = 0.0, dtype=np.float64):
    """A server state with every array of every optimiser, stored in ``dtype`` (float64
    or float32): θ̄, m̄ ∈ [−1e6, 1e6], v̄ = r̄ ≥ ``floor`` (the same array, so one state
    serves every optimiser; with float32, ``floor`` must be a float32 value,
    :func:`_floor_in`)."""
    v = floor + np.abs(draw(vectors(D, 1e3, dtype), label="v_bar").astype(np.float64))
    state = {"theta": draw(vectors(D, dtype=dtype), label="theta_bar"),
             "m": draw(vectors(D, dtype=dtype), label="m_bar"),
             "v": np.maximum(v.astype(dtype), np.asarray(floor, dtype=dtype))}
    state["r"] = state["v"]
    return state


@dataclasses.dataclass(frozen=True)
class PairCase:
    """An optimiser, a state, an honest g and an arbitrary ĝ on that state.

    ``floor`` is the lower bound of the second moment's state (v_min or r_min;
    0 allowed), ``t`` the round.
    """

    optimizer: object
    state: dict
    g: np.ndarray
    g_hat: np.ndarray
    t: int
    floor: float
    #: for a fixed large case, the expression that rebuilds it (:func:`optimizer_large_cases`)
    source: str = ""

    def describe(self) -> dict:
        from rfrs_ref.params import values

        out = {"optimizer": getattr(self.optimizer, "name", type(self.optimizer).__name__),
               "hyperparameters": values(self.optimizer) if dataclasses.is_dataclass(self.optimizer) else {},
               "t": self.t, "floor": self.floor, "dtype": str(np.asarray(self.g).dtype)}
        if self.source and np.size(self.g) > 64:
            return {**out, "D": int(np.size(self.g)), "arrays": {
                "omitted": f"g, ĝ and the state: {int(np.size(self.g))} values each",
                "rebuild": self.source}}
        return {**out, "g": self.g.tolist(), "g_hat": self.g_hat.tolist(),
                "state": {k: v.tolist() for k, v in self.state.items()}}


@st.composite
def pair_cases(draw, kind: str, optimizer=None, max_D: int = 8):
    """A :class:`PairCase` for ``kind`` (``optimizer`` fixed, or drawn); state and
    gradients all float64 or all float32 (a float32 case is judged with float32's
    rounding wherever the object stores an array in float32; rfrs-ref's rule, the
    reference, computes in float64 from the float32 values)."""
    D = draw(st.integers(1, max_D), label="D")
    dtype = draw(st.sampled_from(OPTIMIZER_DTYPES), label="dtype")
    floor = _floor_in(draw(st.sampled_from([0.0]) | st.floats(1e-8, 1e3), label="floor"), dtype)
    state = draw(optimizer_states(D, floor, dtype))
    g = draw(vectors(D, 1e3, dtype), label="g")
    g_hat = draw(vectors(D, 1e3, dtype), label="g_hat")
    t = draw(st.integers(1, 10**5), label="t")
    opt = optimizer if optimizer is not None else draw(optimizers(kind))
    return PairCase(opt, state, g, g_hat, t, floor)


def _edge_hyperparameters(kind: str) -> list:
    """rfrs-ref's defaults, and the extremes :func:`optimizers` may draw: decays 0 with
    η = 1 and ε = 1e-12; decays near 1 with η = 1e-5 and ε = 1e-2."""
    from rfrs_ref.optim import OPTIMIZERS

    cls = OPTIMIZERS.get(kind)
    low = {"lr": 1.0, "eps": 1e-12, "beta1": 0.0, "beta2": 0.0, "beta3": 0.0, "beta4": 0.0}
    high = {"lr": 1e-5, "eps": 1e-2, "beta1": 0.999, "beta2": 0.9999, "beta3": 0.999, "beta4": 0.9999}
    names = {f.name for f in dataclasses.fields(cls)}
    return [cls()] + [cls(**{k: v for k, v in h.items() if k in names}) for h in (low, high)]


def optimizer_edge_cases(kind: str, optimizer=None) -> list[PairCase]:
    """Pair cases every optimiser law over :func:`pair_cases` tries first, whatever the
    number of examples asked for: the corners of the drawn domain.

    Each has D = 5 and g = (1e3, −1e3, 1e-30, the smallest subnormal, 0) (the largest
    drawn magnitude, a tiny and a subnormal coordinate, an exact zero) against ĝ = −g
    (gradient ascent), on three states: a first round (θ̄ = m̄ = v̄ = 0, t = 1), the
    largest state (|θ̄| = |m̄| = 1e6, v̄ = 1e3 + v_min, t = 10⁵) and the second moment
    at its floor (v̄ = v_min = 1e-8, m̄ ≠ 0, t = 2); each in float64 (subnormal 5e-324)
    and in float32 (subnormal 1e-45, v_min = float32(1e-8)): an Adam that moved ε inside
    the square root only for float32 inputs passed every law when only float64 was
    drawn. With ``optimizer`` fixed every case uses
    it; otherwise each state is tried with rfrs-ref's defaults and with the extreme
    hyperparameters :func:`optimizers` may draw. A few drawn examples (the first one a
    derandomized run draws is all zeros) may reach none of these: an Adam that clips
    each gradient coordinate to ±10 in its rule, or that flushes |g| < 1e-20 to zero in
    its recovery, passed with ``--max-examples 1`` before these cases came first.
    """
    out = []
    for dtype in OPTIMIZER_DTYPES:
        tiny = float(np.finfo(dtype).smallest_subnormal)
        g = np.array([1e3, -1e3, 1e-30, tiny, 0.0], dtype=dtype)
        D = g.size
        vmin = _floor_in(1e-8, dtype)

        def state(theta, m, v, dtype=dtype, D=D):
            s = {"theta": (np.full(D, theta) * np.array([1, -1, 1, -1, 1])).astype(dtype),
                 "m": (np.full(D, m) * np.array([-1, 1, 1, -1, 1])).astype(dtype),
                 "v": np.full(D, v, dtype=dtype)}
            s["r"] = s["v"]
            return s

        states = [(state(0.0, 0.0, 0.0), 1, 0.0), (state(1e6, 1e6, 1e3 + vmin), 10**5, vmin),
                  (state(0.5, 2.0, vmin), 2, vmin)]
        opts = [optimizer] if optimizer is not None else _edge_hyperparameters(kind)
        out += [PairCase(opt, s, g.copy(), -g, t, floor) for s, t, floor in states for opt in opts]
    return out


#: the fixed large optimiser cases (:func:`optimizer_large_cases`): (D, dtype, t); the drawn
#: cases have D ≤ 8 and the corner cases D = 5, and an update rule wrong from the 9th
#: parameter on (every real model has thousands) would pass them all
LARGE_PAIRS = ((257, "float64", 7), (1031, "float32", 1000))


def optimizer_large_case(kind: str, index: int, *, D: int, dtype: str, t: int,
                         optimizer=None) -> PairCase:
    """One fixed large pair case, a function of its arguments alone (seed LARGE_SEED +
    index): θ̄ ∈ 1e3·N(0, 1), m̄ ∈ N(0, 1), v̄ = r̄ = v_min + |N(0, 1)|·10 with v_min =
    1e-8 (in ``dtype``), g ∈ 100·N(0, 1) with one coordinate in ten 1e-30 and the last
    one (the tail of every vector block) −1e3, ĝ = −g + N(0, 1); ``optimizer`` or
    rfrs-ref's ``kind`` with its defaults."""
    from rfrs_ref.optim import OPTIMIZERS

    rng = np.random.default_rng(LARGE_SEED + 100 + index)
    dt = np.dtype(dtype)
    vmin = _floor_in(1e-8, dt)
    g = rng.normal(size=D) * 100.0
    g[::10] = 1e-30
    g[-1] = -1e3
    state = {"theta": (rng.normal(size=D) * 1e3).astype(dt), "m": rng.normal(size=D).astype(dt),
             "v": np.maximum((vmin + np.abs(rng.normal(size=D)) * 10.0).astype(dt),
                             np.asarray(vmin, dtype=dt))}
    state["r"] = state["v"]
    g_hat = (-g + rng.normal(size=D)).astype(dt)
    opt = optimizer if optimizer is not None else OPTIMIZERS.get(kind)()
    source = (f"rfrs_ref.testing.strategies.optimizer_large_case({kind!r}, {index}, D={D}, "
              f"dtype={dt.name!r}, t={t}" + (", optimizer=<the object under test>)"
                                              if optimizer is not None else ")"))
    return PairCase(opt, state, g.astype(dt), g_hat, t, vmin, source)


def optimizer_large_cases(kind: str, optimizer=None) -> list[PairCase]:
    """The fixed large pair cases (:data:`LARGE_PAIRS`) every optimiser law over
    :func:`pair_cases` tries after the corner cases: D = 257 in float64 and D = 1031 in
    float32, with ``optimizer`` (a fixed object) or rfrs-ref's defaults."""
    return [optimizer_large_case(kind, i, D=D, dtype=dtype, t=t, optimizer=optimizer)
            for i, (D, dtype, t) in enumerate(LARGE_PAIRS)]


def sequence_large_cases() -> list["GradientSequence"]:
    """A large gradient sequence the Lemma 2 law tries after :func:`sequence_edge_cases`:
    D = 257, n = 5, 12 rounds, every gradient on the sphere ‖g‖ = g_max = 10 and pointing
    the same way, all the weight on one client (the moment approaches g_max from below),
    seed LARGE_SEED."""
    rng = np.random.default_rng(LARGE_SEED + 200)
    u = rng.normal(size=257)
    u /= np.linalg.norm(u)
    w = np.zeros(5)
    w[0] = 1.0
    G = np.tile(u * 10.0, (5, 1))
    return [GradientSequence(10.0, tuple((G.copy(), w.copy()) for _ in range(12)))]


def sequence_edge_cases() -> list["GradientSequence"]:
    """Gradient sequences the Lemma 2 law tries first: every gradient on the sphere
    ‖g‖ = g_max, all pointing the same way with all the weight on one client (the
    moment approaches g_max from below, the tightest case), and the same with the
    direction flipping every round; at g_max = 1e3 and 1e-3, 25 rounds, n = 3, D = 3."""
    out = []
    u = np.array([2.0, -1.0, 2.0]) / 3.0
    w = np.array([1.0, 0.0, 0.0])
    for g_max in (1e3, 1e-3):
        for flip in (False, True):
            rounds = tuple((np.tile(u * g_max * (-1.0 if flip and k % 2 else 1.0), (3, 1)), w.copy())
                           for k in range(25))
            out.append(GradientSequence(g_max, rounds))
    return out


@dataclasses.dataclass(frozen=True)
class GradientSequence:
    """A multi-round run: per round, n client gradients with ‖g‖ ≤ g_max (some on
    the sphere) and convex aggregation weights over a non-empty subset."""

    g_max: float
    rounds: tuple  # of (G (n, D), w (n,))

    @property
    def D(self) -> int:
        return int(self.rounds[0][0].shape[1])

    def describe(self) -> dict:
        return {"g_max": self.g_max, "rounds": [{"grads": G.tolist(), "weights": w.tolist()}
                                                 for G, w in self.rounds]}


@st.composite
def gradient_sequences(draw, max_rounds: int = 25, max_n: int = 5, max_D: int = 8):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    T = draw(st.integers(1, max_rounds), label="rounds")
    n = draw(st.integers(1, max_n), label="n")
    D = draw(st.integers(1, max_D), label="D")
    g_max = draw(st.floats(1e-3, 1e3), label="g_max")
    rounds = []
    for _ in range(T):
        G = rng.standard_normal((n, D))
        G /= np.maximum(np.linalg.norm(G, axis=1, keepdims=True), 1e-300)
        radius = np.where(rng.random(n) < 0.5, 1.0, rng.random(n))
        G *= (g_max * radius)[:, None]
        keep = rng.random(n) < 0.7
        keep[rng.integers(n)] = True
        w = rng.dirichlet(np.ones(n)) * keep
        rounds.append((G, w / w.sum()))
    return GradientSequence(g_max, tuple(rounds))


# -- federations ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Scenario:
    """A tiny federation (docs/training.md) that runs a few rounds in milliseconds.

    Attributes:
        train: the clients' training sets (``rfrs_ref.data.Interactions``).
        model, optimizer, rule, attack: rfrs-ref family entries.
        detect: ``gradient`` or ``parameter``.
        byzantine: (n_users,) bool, the fixed Byzantine set.
        client_fraction: e; assumed_fraction: α_assumed.
        seed: trial seed; rounds: T; dtype: ``float32`` or ``float64``;
        init_scale: θ̄⁰ ~ N(0, init_scale²).
    """

    train: object
    model: object
    optimizer: object
    rule: object
    attack: object
    detect: str
    byzantine: np.ndarray
    client_fraction: float
    assumed_fraction: float
    seed: int
    rounds: int
    dtype: str
    init_scale: float = 0.1

    def describe(self) -> dict:
        from rfrs_ref.params import values

        return {"n_users": self.train.n_users, "n_items": self.train.n_items,
                "items": [self.train.items_of(u).tolist() for u in range(self.train.n_users)],
                "model": self.model.name, "model_params": values(self.model),
                "optimizer": self.optimizer.name, "optimizer_params": values(self.optimizer),
                "rule": self.rule.name, "rule_params": values(self.rule), "detect": self.detect,
                "attack": self.attack.name, "byzantine": self.byzantine.tolist(),
                "client_fraction": self.client_fraction, "assumed_fraction": self.assumed_fraction,
                "seed": self.seed, "rounds": self.rounds, "dtype": self.dtype}


#: (rule, its precondition as the largest f for n) used by the scenarios
_SCENARIO_RULES = {
    "mean": lambda n: n - 1,
    "krum": lambda n: (n - 3) // 2,
    "median": lambda n: (n - 1) // 2,
    "trmean": lambda n: (n - 1) // 2,
    "rfa": lambda n: (n - 1) // 2,
    "bulyan": lambda n: (n - 3) // 4,
}


@st.composite
def federated_scenarios(draw, *, optimizers_=("sgd", "momentum", "adam", "adagrad", "rmsprop"),
                        rules=tuple(_SCENARIO_RULES), attacks=("none", "ascent", "noise", "alie", "ipm"),
                        max_users: int = 24, max_items: int = 20, max_rounds: int = 3) -> Scenario:
    """A tiny federation whose assumed f satisfies the rule's precondition every round.

    Every user holds 1..min(8, n_items − 1) distinct items; the model is FISM or
    FMF with d ∈ {2, 3}; camouflage is only drawn with Adam.
    """
    from rfrs_ref.aggregate import RULES
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.data import Interactions
    from rfrs_ref.model import MODELS
    from rfrs_ref.optim import OPTIMIZERS

    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    n_users = draw(st.integers(4, max_users), label="users")
    n_items = draw(st.integers(3, max_items), label="items")
    lists = [rng.choice(n_items, size=int(rng.integers(1, min(8, n_items - 1) + 1)), replace=False)
             for _ in range(n_users)]
    train = Interactions.from_lists("scenario", n_items, lists, "rfrs_ref.testing.federated_scenarios")
    model = MODELS.get(draw(st.sampled_from(["fism", "fmf"]), label="model"))(
        n_items=n_items, dim=draw(st.sampled_from([2, 3]), label="dim"))
    opt_name = draw(st.sampled_from(list(optimizers_)), label="optimizer")
    optimizer = OPTIMIZERS.get(opt_name)(lr=draw(st.sampled_from([1e-3, 1e-2, 0.1]), label="lr"))
    rule_name = draw(st.sampled_from(list(rules)), label="rule")
    attack_choices = list(attacks) + (["camouflage"] if opt_name == "adam" else [])
    attack = ATTACKS.get(draw(st.sampled_from(attack_choices), label="attack"))()
    fraction = draw(st.sampled_from([0.5, 0.75, 1.0]), label="client fraction")
    n_round = max(1, math.floor(fraction * n_users))
    fmax = max(0, _SCENARIO_RULES[rule_name](n_round))
    alpha = draw(st.integers(0, fmax), label="assumed f") / n_round if n_round else 0.0
    alpha = min(alpha, 0.99)
    # the fixed Byzantine set: at most as many as assumed, so the rule's assumption holds
    n_byz = min(draw(st.integers(0, n_users), label="Byzantine clients"), math.floor(alpha * n_users))
    byz = np.zeros(n_users, dtype=bool)
    byz[rng.choice(n_users, size=n_byz, replace=False)] = True
    return Scenario(train=train, model=model, optimizer=optimizer, rule=RULES.get(rule_name)(),
                    attack=attack, detect=draw(st.sampled_from(["gradient", "parameter"]), label="detect"),
                    byzantine=byz, client_fraction=fraction, assumed_fraction=alpha,
                    seed=draw(st.integers(0, 1000), label="trial seed"),
                    rounds=draw(st.integers(1, max_rounds), label="rounds"),
                    dtype=draw(st.sampled_from(["float32", "float64"]), label="dtype"))


__all__ = [
    "BYZANTINE_KINDS",
    "HOSTILE_VALUES",
    "GradientSequence",
    "PairCase",
    "RoundCase",
    "Scenario",
    "byzantine_rounds",
    "federated_scenarios",
    "gradient_sequences",
    "hostile_examples",
    "large_examples",
    "large_round",
    "optimizer_edge_cases",
    "optimizer_large_case",
    "optimizer_large_cases",
    "optimizer_states",
    "optimizers",
    "pair_cases",
    "sequence_edge_cases",
    "sequence_large_cases",
    "tie_examples",
    "unanimous",
    "vectors",
]

"""Why a defence keeps or drops Byzantine clients: per-round measurements over a whole run.

After every round of one run (the run of a sweep, same configuration and
seed), from the round's uploads, as Fig. 1's capture run reads them:

- ĝᵢ, the gradient the server recovers from client i's upload and the server
  state before the round (an honest client's ĝᵢ is its gradient), and
  δᵢ = θᵢ − θ̄, its upload in parameter space (what Krum on parameters sees);
- ``honest_cos_*``: the cosine cos(ĝᵢ, ĝⱼ) over the pairs of honest clients
  of the round: mean, 10%, 50% and 90% quantiles;
- ``honest_to_mean_cos`` / ``byzantine_to_mean_cos``: the mean over honest
  (Byzantine) clients of cos(ĝᵢ, ḡ_H), ḡ_H the mean honest gradient of the
  round. An honest client's own gradient is part of ḡ_H, which with nearly
  orthogonal gradients makes most of its cosine (about 1/√|H|), so
  ``honest_to_others_cos`` gives the fair comparison with a Byzantine client:
  the mean over honest i of cos(ĝᵢ, mean of the other honest gradients). An
  ascent client sends −gᵢ, the negation of a gradient that is not in ḡ_H;
- ``spearman_gradient``, ``spearman_parameter``: Spearman's rank correlation
  between Krum's score (sum of the m = n − f − 2 smallest squared distances
  to the others, ``rfrs_ref.aggregate.krum.krum_scores``) and the norm, of
  ĝᵢ and of δᵢ: near 1, Krum ranks clients by their norm, keeping the
  smallest uploads whatever their direction;
- ``byzantine_share_sampled`` → ``byzantine_share_kept``, and the rule's f,
  from the round record.

Conventions: float64 throughout; rows that verification excluded are left
out (as the rule never saw them); a non-finite row (a hostile upload) has no
cosine and an infinite Krum score, and is left out of the cosines and the
correlations; a measure without enough rows (fewer than 2 honest clients, no
Byzantine client, constant ranks) is NaN (an empty cell of the CSV).
"""

from __future__ import annotations

import math
import pathlib
from typing import Callable, Sequence

import numpy as np

#: columns of the per-round table, in order
COLUMNS = ("round", "n", "n_byzantine", "f", "honest_cos_mean", "honest_cos_q10",
           "honest_cos_q50", "honest_cos_q90", "honest_to_mean_cos", "honest_to_others_cos",
           "byzantine_to_mean_cos",
           "spearman_gradient", "spearman_parameter", "byzantine_share_sampled",
           "byzantine_share_kept", "loss")


def cosines(X: np.ndarray) -> np.ndarray:
    """cos(xᵢ, xⱼ) for every pair of rows of X (n × n, float64); NaN for a zero or
    non-finite row."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", X, X))
    bad = ~np.isfinite(norms) | (norms == 0)
    safe = np.where(bad[:, None], 0.0, X) / np.where(bad, 1.0, norms)[:, None]
    C = safe @ safe.T
    C[bad, :] = np.nan
    C[:, bad] = np.nan
    return C


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties) of the finite pairs; NaN with
    fewer than 3 pairs or a constant side."""
    from scipy.stats import rankdata

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3:
        return math.nan
    ra, rb = rankdata(a[ok]), rankdata(b[ok])
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def squared_distances(X: np.ndarray) -> np.ndarray:
    """‖xᵢ − xⱼ‖² for every pair of rows (float64, by differences: exact for close rows);
    +inf where a row is non-finite."""
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    finite = np.isfinite(X).all(axis=1)
    D2 = np.full((n, n), np.inf)
    for i in range(n):
        if finite[i]:
            diff = X[finite] - X[i]
            D2[i, finite] = np.einsum("ij,ij->i", diff, diff)
    return D2


def round_measures(grads: np.ndarray, params: np.ndarray, byzantine: np.ndarray, f: int,
                   *, backend: str = "numpy") -> dict:
    """The measurements of one round (see the module docstring).

    Args:
        grads: (n, D) recovered gradients ĝᵢ of the clients the rule saw.
        params: (n, D) their uploads in parameter space, θᵢ − θ̄.
        byzantine: (n,) bool, which of them are Byzantine.
        f: the assumed number of Byzantine clients the rule used.
        backend: ``"numpy"``, the readable oracle below (the formulas as written,
            an (n, D) temporary per formula and a Python loop of (n, D)
            differences for the squared distances: minutes a round and several
            times the uploads' memory at CiteULike's D); ``"numba"``, the same
            measures with the squared distances from the blocked float64 kernel
            (:func:`rfrs_ref.kernels.distances.pairwise_sq_dists64`), the honest
            pairs' cosines from one Gram matrix (BLAS) and the cosines to the
            honest means from one sum vector, without an (n, D) temporary. The two
            agree to rounding (tests/experiments/test_mechanism.py): the distances
            within 1e-13 relative, the cosines within a few units of 1e-15 times
            the conditioning of the sums they divide.
    """
    from rfrs_ref.aggregate.krum import krum_scores

    G = np.asarray(grads, dtype=np.float64)
    P = np.asarray(params, dtype=np.float64)
    byz = np.asarray(byzantine, dtype=bool)
    if G.ndim != 2 or G.shape != P.shape or byz.shape != (G.shape[0],):
        raise ValueError(f"round_measures needs grads and params of one shape (n, D) and an "
                         f"(n,) mask; got {G.shape}, {P.shape}, {byz.shape}")
    if backend != "numpy":
        if backend != "numba":
            raise ValueError(f"backend must be 'numpy' or 'numba', got {backend!r}")
        return _round_measures_fast(G, P, byz, int(f))
    n = G.shape[0]
    out = {name: math.nan for name in COLUMNS}
    out.update(n=n, n_byzantine=int(byz.sum()), f=int(f))
    honest = np.flatnonzero(~byz & np.isfinite(G).all(axis=1))
    if honest.size >= 2:
        C = cosines(G[honest])
        pairs = C[np.triu_indices(honest.size, k=1)]
        pairs = pairs[np.isfinite(pairs)]
        if pairs.size:
            out["honest_cos_mean"] = float(pairs.mean())
            q = np.quantile(pairs, [0.1, 0.5, 0.9])
            out["honest_cos_q10"], out["honest_cos_q50"], out["honest_cos_q90"] = map(float, q)
    if honest.size >= 1:
        mean = G[honest].mean(axis=0)
        to_mean = cosines(np.vstack([mean[None, :], G]))[0, 1:]
        h = to_mean[~byz]
        b = to_mean[byz]
        if np.isfinite(h).any():
            out["honest_to_mean_cos"] = float(np.nanmean(h))
        if b.size and np.isfinite(b).any():
            out["byzantine_to_mean_cos"] = float(np.nanmean(b))
    if honest.size >= 2:
        H = G[honest]
        others = (H.sum(axis=0)[None, :] - H) / (honest.size - 1)
        loo = [cosines(np.vstack([H[i], others[i]]))[0, 1] for i in range(honest.size)]
        if np.isfinite(loo).any():
            out["honest_to_others_cos"] = float(np.nanmean(loo))
    if n >= 3:
        for name, X in (("spearman_gradient", G), ("spearman_parameter", P)):
            scores, _ = krum_scores(squared_distances(X), int(f))
            with np.errstate(over="ignore", invalid="ignore"):
                norms = np.sqrt(np.einsum("ij,ij->i", X, X))
            out[name] = spearman(scores, norms)
    return out


def _finite_rows(X: np.ndarray) -> np.ndarray:
    """Which rows of X hold only finite values, one row at a time (no (n, D) mask)."""
    return np.array([bool(np.isfinite(row).all()) for row in X], dtype=bool)


def _pair_quantities(X: np.ndarray, finite: np.ndarray) -> np.ndarray:
    """Squared distances as :func:`squared_distances` (+inf beside a non-finite row), by
    the blocked float64 kernel over the finite rows."""
    from rfrs_ref.kernels.distances import pairwise_sq_dists64

    n = X.shape[0]
    D2 = np.full((n, n), np.inf)
    rows = np.flatnonzero(finite)
    if rows.size:
        with np.errstate(over="ignore", invalid="ignore"):
            D2[np.ix_(rows, rows)] = pairwise_sq_dists64(X, rows)
    return D2


def _row_norms(X: np.ndarray, centre: np.ndarray | None) -> np.ndarray:
    """‖xᵢ − centre‖ in float64 (‖xᵢ‖ without a centre), one row at a time."""
    if centre is None:
        with np.errstate(over="ignore", invalid="ignore"):
            return np.sqrt(np.einsum("ij,ij->i", X, X))
    c = np.asarray(centre, dtype=np.float64)
    out = np.empty(X.shape[0])
    with np.errstate(over="ignore", invalid="ignore"):
        for i, row in enumerate(X):
            d = row - c  # float64: a float32 row is widened exactly
            out[i] = math.sqrt(float(d @ d)) if np.isfinite(d).all() else math.inf
    return out


def _round_measures_fast(G: np.ndarray, P: np.ndarray, byz: np.ndarray, f: int,
                         centre: np.ndarray | None = None) -> dict:
    """:func:`round_measures` without (n, D) temporaries (its ``backend="numba"``).

    With ``centre``, P holds the uploads θᵢ themselves (float32 as uploaded) and the
    parameter-space rows are θᵢ − centre, never formed: their squared distances are
    the θᵢ's own (a translation; the float64 differences of float32 values are exact
    unless their exponents differ by more than 28) and their norms are taken one row
    at a time.

    The same definitions, computed as: the Gram matrix G Gᵀ once (BLAS; a row that is
    not finite spoils only its own row and column, which are left out as the oracle
    leaves them out); the honest sum S = Σ_{i∈H} ĝᵢ row after row (numpy's own order
    for a sum over axis 0), the honest mean S/|H| and its inner products G·(S/|H|) (one
    pass); for each honest i the leave-one-out direction S − ĝᵢ (the scale 1/(|H|−1)
    cancels in a cosine), one D-vector at a time; the squared distances by differences
    (:func:`_pair_quantities`).
    """
    from rfrs_ref.aggregate.krum import krum_scores

    n = G.shape[0]
    out = {name: math.nan for name in COLUMNS}
    out.update(n=n, n_byzantine=int(byz.sum()), f=int(f))
    finite = _finite_rows(G)
    honest = np.flatnonzero(~byz & finite)
    with np.errstate(over="ignore", invalid="ignore"):
        gram = G @ G.T
        sq = np.diagonal(gram).copy()
        norms = np.sqrt(sq)
        usable = finite & np.isfinite(norms)  # the oracle's rows with a cosine
        if honest.size >= 2:
            h = honest[usable[honest]]
            C = gram[np.ix_(h, h)] / np.outer(norms[h], norms[h])
            pairs = C[np.triu_indices(h.size, k=1)]
            pairs = pairs[np.isfinite(pairs)]
            if pairs.size:
                out["honest_cos_mean"] = float(pairs.mean())
                q = np.quantile(pairs, [0.1, 0.5, 0.9])
                out["honest_cos_q10"], out["honest_cos_q50"], out["honest_cos_q90"] = map(
                    float, q)
        if honest.size >= 1:
            S = G[honest[0]].copy()
            for i in honest[1:]:
                S += G[i]
            mean = S / honest.size
            mnorm = math.sqrt(float(mean @ mean))
            to_mean = (G @ mean) / (norms * mnorm)
            to_mean[~usable] = math.nan
            if not (math.isfinite(mnorm) and mnorm > 0):
                to_mean[:] = math.nan
            hc, bc = to_mean[~byz], to_mean[byz]
            if np.isfinite(hc).any():
                out["honest_to_mean_cos"] = float(np.nanmean(hc))
            if bc.size and np.isfinite(bc).any():
                out["byzantine_to_mean_cos"] = float(np.nanmean(bc))
        if honest.size >= 2:
            loo = np.full(honest.size, math.nan)
            for a, i in enumerate(honest):
                if not usable[i]:
                    continue
                rest = S - G[i]
                rn = math.sqrt(float(rest @ rest))
                if math.isfinite(rn) and rn > 0:
                    loo[a] = float(G[i] @ rest) / (norms[i] * rn)
            if np.isfinite(loo).any():
                out["honest_to_others_cos"] = float(np.nanmean(loo))
        if n >= 3:
            pn = _row_norms(P, centre)
            for name, X, nx, fin in (("spearman_gradient", G, norms, finite),
                                     ("spearman_parameter", P, pn, _finite_rows(P))):
                scores, _ = krum_scores(_pair_quantities(X, fin), int(f))
                out[name] = spearman(scores, nx)
    return out


def measure_run(spec, *, every: int = 1, progress: Callable[[int, int], None] | None = None,
                data=None) -> list[dict]:
    """Train ``spec``'s run round by round and measure every ``every``-th round.

    The training is the trainer's (same configuration, seed, buffers and round
    function as a sweep run, so the run is the one the sweep ran); the
    measurement only reads the round's buffers afterwards.

    A run that diverges (its aggregated server state, or its private client
    state, holds NaN or ±inf after round t, checked after every round as the
    trainer checks it) is not measured past it: nothing of round t or later is
    measured (a non-finite state makes every measure of the rounds after it
    meaningless, and measuring on would turn the run's divergence into a table
    of empty cells that reads like a finished run). It raises
    :class:`rfrs_ref.federated.trainer.Diverged` (round, reason, what) with
    ``rows``: the rows measured before round t.
    """
    from rfrs_ref.federated.round import run_round
    from rfrs_ref.federated.trainer import Diverged, Trainer

    if every < 1:
        raise ValueError(f"every must be at least 1, got {every}")
    trainer = Trainer(spec.config, data=data)
    c = trainer.config
    opt = trainer.optimizer
    state, private = trainer.initial_state()
    buf = trainer.buffers(full=True)  # the uploads are read after each round
    rows = []
    for t in range(1, c.rounds + 1):
        prev = state
        state, record = run_round(trainer.federation, state, t, buf, private)
        try:
            trainer._check_finite(t, state, private, None, None,
                                  norms=record.get("state_norms"))
        except Diverged as exc:
            exc.rows = rows
            raise
        if t % every and t != c.rounds:
            if progress is not None:
                progress(t, c.rounds)
            continue
        excluded = {e["client"] for e in record["excluded"]}
        ok = np.array([cl not in excluded for cl in record["clients"]], dtype=bool)
        m = int(ok.sum())
        byz = np.asarray(record["byzantine"], dtype=bool)[ok]
        # rows that passed verification are the first m rows of the buffers after the round
        uploads = {k: buf.uploads[k][:m] for k in opt.arrays}
        grads = np.empty((m, prev["theta"].size), dtype=np.float64)
        opt.recover_batch(prev, uploads, t, grads,
                          backend="numpy" if c.backend == "numpy" else "numba")
        if c.backend == "numpy":
            params = uploads["theta"].astype(np.float64) - prev["theta"].astype(np.float64)
            row = round_measures(grads, params, byz, record["f"])
        else:  # the parameter-space rows θᵢ − θ̄ are never formed (_round_measures_fast)
            row = _round_measures_fast(grads, uploads["theta"], byz, int(record["f"]),
                                       centre=prev["theta"])
        row.update(round=t, byzantine_share_sampled=record["byzantine_share_sampled"],
                   byzantine_share_kept=record["byzantine_share_kept"],
                   loss=record.get("loss", math.nan))
        rows.append(row)
        if progress is not None:
            progress(t, c.rounds)
    return rows


def mechanism_frame(rows: Sequence[dict], labels: dict | None = None):
    """The per-round rows as a DataFrame (COLUMNS, then the labels as constant columns)."""
    import pandas as pd

    df = pd.DataFrame([{k: r.get(k, math.nan) for k in COLUMNS} for r in rows],
                      columns=list(COLUMNS))
    for k, v in (labels or {}).items():
        df[k] = v
    return df


def plot_mechanism(frames: dict, stem: pathlib.Path, title: str = "") -> list[pathlib.Path]:
    """Four panels against the round, one line per series (``frames``: series -> frame):
    honest pairwise cosine (mean), cosine to the mean of the other honest gradients
    (honest solid; Byzantine, to the honest mean, dashed), Spearman(Krum score, norm) in gradient space, Byzantine share kept (the
    sampled share dotted grey). Lines are smoothed over 25 rounds. Writes PNG only."""
    from rfrs_ref.experiments import plots

    plt = plots._pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
    panels = [("honest_cos_mean", "cos between honest gradients"),
              ("honest_to_others_cos", "cos(gradient, mean of the other honest)"),
              ("spearman_gradient", "Spearman(Krum score, ‖ĝ‖)"),
              ("byzantine_share_kept", "Byzantine share kept")]
    for i, (series, df) in enumerate(frames.items()):
        color, _ = plots._style(series, i)
        for ax, (col, _) in zip(axes, panels):
            ax.plot(df["round"], _smooth(df[col]), color=color, linewidth=1.2, label=series)
        axes[1].plot(df["round"], _smooth(df["byzantine_to_mean_cos"]), color=color,
                     linewidth=1.0, linestyle="--")
        if i == 0:
            axes[3].plot(df["round"], _smooth(df["byzantine_share_sampled"]), color="grey",
                         linestyle=":", linewidth=1.0, label="sampled")
    for ax, (_, name) in zip(axes, panels):
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("round", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[3].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    stem = pathlib.Path(stem)
    path = stem.parent / f"{stem.name}.png"  # the stem may hold dots (a0.4)
    # atomically, as plots.save (mechanism calls may write into one folder together), never
    # through a link nor over a PNG that is not mechanism's (drawn_here, or one beside
    # mechanism's summary of the same runs: drawn before figures said who drew them)
    return [plots.write_png(fig, path, ours=lambda p: plots.drawn_here(p) or is_summary(
        stem.parent / f"{stem.name}.md"))]


#: how the Markdown summary of ``rfrs-ref mechanism`` begins
SUMMARY_HEAD = "Means over the rounds: "


def is_summary(path) -> bool:
    """Whether the file at ``path`` begins as ``rfrs-ref mechanism``'s summary does."""
    from rfrs_ref.files import first_line

    return (first_line(path) or "").startswith(SUMMARY_HEAD)


def _smooth(s, window: int = 25):
    return s.astype(float).rolling(window, min_periods=1).mean()


#: the measures that may be missing in a round (NaN, an empty cell): too few rows for them
MAY_BE_MISSING = ("honest_cos_mean", "honest_cos_q10", "honest_cos_q50", "honest_cos_q90",
                  "honest_to_mean_cos", "honest_to_others_cos", "byzantine_to_mean_cos",
                  "spearman_gradient", "spearman_parameter", "loss")
#: how far a recorded cosine or correlation may stray outside [−1, 1] by rounding
ROUNDING = 1e-6


def _expected(col: str) -> tuple[float, float, str] | None:
    """(lo, hi, words) of a measure's range, or None for the loss (any number)."""
    if col in ("round", "n", "n_byzantine", "f"):
        return 0.0, math.inf, "a non-negative integer"
    if col.startswith("byzantine_share_"):
        return 0.0, 1.0, "a share in [0, 1]"
    if col.startswith("spearman_"):
        return -1.0 - ROUNDING, 1.0 + ROUNDING, "a rank correlation in [−1, 1]"
    if col.endswith("_cos") or col.startswith("honest_cos_"):
        return -1.0 - ROUNDING, 1.0 + ROUNDING, "a cosine in [−1, 1]"
    return None


def check_frame(df, path) -> None:
    """Refuse a per-round table (read from ``path``) whose cells are not measurements.

    A table in ``--out`` is input: it may have been edited, cut or written by
    something else, and a call that reads it instead of measuring would print
    its cells as results. Every column of :data:`COLUMNS` must be there; every
    cell must be a number in its measure's range: ``round``, ``n``,
    ``n_byzantine`` and ``f`` non-negative integers (``n_byzantine`` ≤ ``n``),
    the Byzantine shares in [0, 1], the cosines and Spearman correlations in
    [−1, 1] (give or take :data:`ROUNDING`). NaN (an empty cell) is what the
    measurement writes for a measure without enough rows in that round (fewer
    than 2 honest clients, no Byzantine client, fewer than 3 finite rows or
    constant ranks: the module docstring) and for a round that recorded no
    loss, so it is accepted in those columns (:data:`MAY_BE_MISSING`) and in no
    other: the shares, counts and f are measured in every round. ±inf is never
    a cosine, correlation, share or count. The loss may be any number (a
    training loss can overflow while the state stays finite).

    Raises:
        ValueError: naming ``path``, the line (the header is line 1), the column, the
            value and what was expected.
    """
    import pandas as pd

    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: no column(s) {', '.join(missing)}; not a per-round table "
                         "of rfrs-ref mechanism")
    for col in COLUMNS:
        raw = df[col]
        num = pd.to_numeric(raw, errors="coerce").astype(float)
        for i in range(len(df)):
            v, x = raw.iloc[i], float(num.iloc[i])
            where = f"{path}, line {i + 2}, column {col}"
            if math.isnan(x):
                if pd.isna(v):
                    if col in MAY_BE_MISSING:
                        continue
                    raise ValueError(f"{where}: empty (NaN); every round measures it "
                                     f"(expected {_expected(col)[2]})")
                raise ValueError(f"{where}: {v!r} is not a number")
            rng = _expected(col)
            if rng is None:  # the loss
                continue
            lo, hi, words = rng
            if not (math.isfinite(x) and lo <= x <= hi) or (
                    col in ("round", "n", "n_byzantine", "f") and not x.is_integer()):
                shown = repr(v) if isinstance(v, str) else repr(x)
                raise ValueError(f"{where}: {shown} is not {words}")
    over = (pd.to_numeric(df["n_byzantine"]) > pd.to_numeric(df["n"])).to_numpy()
    if over.any():
        i = int(over.argmax())
        raise ValueError(f"{path}, line {i + 2}, column n_byzantine: "
                         f"{int(df['n_byzantine'].iloc[i])} Byzantine clients of "
                         f"n = {int(df['n'].iloc[i])}; expected at most n")


def summary(df) -> dict:
    """Means over the run's rounds of every measure (NaN cells skipped: a measure a round
    had too few rows for, see :func:`check_frame`)."""
    return {c: float(df[c].astype(float).mean()) for c in COLUMNS
            if c not in ("round",) and df[c].notna().any()}

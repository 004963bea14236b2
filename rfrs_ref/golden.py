"""Golden vectors: deterministic, language-neutral test vectors of every family.

``export(directory)`` writes one folder per case with a ``case.json`` (what
the case is, its formula and conventions, its parameters, every input and
expected output by file name, dtype, shape and tolerance) and the arrays as
``.npy`` files (NumPy's format version 1.0, little-endian, never pickled);
``directory/index.json`` lists the cases. ``check(directory)`` recomputes
every case with the current code and compares each output with the
tolerance the case states. The layout, the naming and how to read the files
from PyTorch, JAX or C++ are in docs/golden-vectors.md.

Cases (families as folders):

- ``model/``: FISM evaluation scores; BPR loss and gradient of FISM and FMF,
  exact and with sampled negatives (the sampled item ids are inputs), a client
  with one item; float32 and float64.
- ``optim/``: every optimiser's client rule, the server's recovery from the
  honest upload, the step size, and the verification verdicts of the honest
  upload and of tampered ones (one per check of the optimiser).
- ``aggregate/``: every rule in both detection spaces (features, uploads, nᵢ, f
  → aggregated arrays, weights, kept fractions, Krum scores and selections),
  ties in Krum scores, non-finite and huge Byzantine rows.
- ``attack/``: every attack on a mid-run Adam state (inputs, the generator's
  seed and, for ``noise``, the standard normals it draws, so that no NumPy
  generator is needed to reproduce it).
- ``federated/``: complete three-round runs on a tiny dataset with Byzantine
  clients: per round the sampled clients, honest gradients, honest and attacked
  uploads, recovered gradients, verification, the features and nᵢ given to the
  rule, its weights and kept fractions, and the new server state.

Expected values are computed by the NumPy float64 oracles (``backend =
"numpy"``) from inputs stored in the case's dtype: a float32 case holds
float32 inputs and the exact (float64) result for them, with tolerances that
a float32 implementation meets. Tolerances are ``|got − expected| ≤ atol +
rtol·|expected|`` elementwise, derived per output from the dtype's unit
roundoff u and the magnitudes involved (the ``tolerance`` text of each case
says how); integers, booleans and names compare exactly; a NaN or infinite
value where the expected one is finite never matches, NaN matches NaN and an
infinity matches the same infinity (:mod:`rfrs_ref.agreement`). ``check``
reads the vectors as untrusted input: paths are confined to their folders,
arrays must be plain ``.npy`` files of the stated dtype and shape, and every
defect is a one-line message naming the file (docs/golden-vectors.md,
"Failure behaviour").
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import io
import json
import math
import os
import pathlib
import re
import shutil
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from rfrs_ref import agreement
from rfrs_ref.files import DirectoryLock, atomic_write
from rfrs_ref.seeding import generator
from rfrs_ref.untrusted import (UntrustedFileError, confined, depth_exceeds, describe_object,
                                read_json, read_npy)

FORMAT = "rfrs-golden"
VERSION = 1
#: the trial seed of every case's input generator (stream ``golden``, key crc32(case name))
SEED = 20200101

#: roundings a kernel may accumulate per output entry (times u and the output's scale)
C_ELEMENTWISE = 64
C_REDUCTION = 256
C_RUN = 1024
#: how deeply case.json may nest lists and objects (an export writes 5 levels)
MAX_DEPTH = 32
#: the most bytes an index.json or a case.json may hold, and the most data an array file's
#: header may claim: a golden case is small (the largest file an export writes is about
#: 23 KB, the index), and a sparse file of terabytes read whole would take all memory
MAX_FILE_BYTES = 1 << 24


#: a golden-vector file cannot be used (the one-line message names the file): the same
#: class as the untrusted-file errors of reading it, so one ``except`` catches both
GoldenFormatError = UntrustedFileError


# -- the case description ------------------------------------------------------------------

@dataclasses.dataclass
class Expected:
    """One expected output.

    Attributes:
        value: an array (written to ``<name>.npy``) or a JSON scalar, string or
            list (written into ``case.json``).
        rtol, atol: the tolerance of a float output.
        exact: compare exactly (integers, booleans, names, selections).
        role: ``required`` (an implementation must match it) or
            ``informational`` (depends on implementation choices the paper leaves
            open, e.g. an iteration count; checked exactly against rfrs-ref).
        note: why the output is what it is, when that is not obvious.
    """

    value: Any
    rtol: float = 0.0
    atol: float = 0.0
    exact: bool = False
    role: str = "required"
    note: str = ""


@dataclasses.dataclass
class Case:
    name: str
    kind: str
    description: str
    formula: str
    convention: str
    reference: str
    dtype: str
    params: dict
    inputs: dict[str, np.ndarray]
    outputs: dict[str, Expected]
    tolerance: str


# -- numbers -----------------------------------------------------------------------------------

def unit_roundoff(dtype) -> float:
    """u = eps/2 of a float dtype."""
    return float(np.finfo(np.dtype(dtype)).eps) / 2.0


def _scale(value) -> float:
    a = np.asarray(value, dtype=np.float64)
    fin = np.abs(a[np.isfinite(a)])
    return float(fin.max(initial=0.0))


def _close(value, dtype, c: float, scale: float | None = None, note: str = "",
           role: str = "required") -> Expected:
    """A float output with rtol = c·u and atol = c·u·scale (scale: max |value| by default)."""
    u = unit_roundoff(dtype)
    s = _scale(value) if scale is None else scale
    return Expected(value, rtol=c * u, atol=c * u * s, note=note, role=role)


def _exact(value, note: str = "", role: str = "required") -> Expected:
    return Expected(value, exact=True, note=note, role=role)


def _rng(name: str) -> np.random.Generator:
    return generator(SEED, "golden", zlib.crc32(name.encode()))


def _dt(dtype: str) -> np.dtype:
    return np.dtype(dtype)


def _suffix(dtype: str) -> str:
    return {"float32": "f32", "float64": "f64"}[dtype]


def _interactions(indptr, indices, n_items: int):
    from rfrs_ref.data import Interactions

    return Interactions("golden", int(len(indptr) - 1), int(n_items),
                        np.asarray(indptr, dtype=np.int64), np.asarray(indices, dtype=np.int32),
                        "golden vectors")


# ======================================================================================= model

def _model(params):
    from rfrs_ref.model import MODELS

    return MODELS.get(params["model"])(n_items=int(params["n_items"]), **params["hyperparameters"])


def compute_fism_scores(inp, params, backend):
    model = _model(params)
    train = _interactions(inp["indptr"], inp["indices"], params["n_items"])
    S = model.scores(inp["theta"], train, inp["users"], backend=backend)
    return {"scores": np.asarray(S, dtype=np.float64)}


def compute_bpr(inp, params, backend):
    model = _model(params)
    items = np.asarray(inp["items"], dtype=np.int64)
    negs = inp.get("negatives")
    priv = inp.get("private")
    out: dict[str, Any] = {}
    if backend == "numpy":
        res = model.loss_grad(inp["theta"], items, negs, priv)
        out["loss"], out["grad"] = res[0], res[1]
        if model.has_private:
            out["private_grad"] = res[2]
        return out
    train = _interactions(np.array([0, items.size]), items, params["n_items"])
    theta = inp["theta"]
    G = np.empty((1, theta.size), dtype=theta.dtype)
    kw = {}
    if model.has_private:
        kw = dict(private=priv[None, :], private_out=np.empty((1, model.dim), dtype=theta.dtype))
    losses = model.grads_batch(theta, train, np.array([0]), G,
                               negatives=None if negs is None else [negs], backend=backend, **kw)
    out["loss"], out["grad"] = float(losses[0]), G[0]
    if model.has_private:
        out["private_grad"] = kw["private_out"][0]
    return out


def _user_lists(rng, n_users, n_items, sizes):
    return [np.sort(rng.choice(n_items, size=s, replace=False)) for s in sizes[:n_users]]


def _csr(lists):
    indptr = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lists], out=indptr[1:])
    indices = np.concatenate(lists).astype(np.int32)
    return indptr, indices


_FISM_FORMULA = ("ŷ_j = p_j · |S \\ {j}|^(−γ) Σ_{k ∈ S \\ {j}} q_k; BPR ℓ = −Σ_{j∈S⁺} Σ_{k∈S⁻} "
                 "log σ(ŷ_j − ŷ_k) + λ‖θ‖²")
_FISM_CONV = ("θ = concat(P.ravel(), Q.ravel()), P and Q (n_items, d) row-major; a rated item's own "
              "q is excluded from its score, an unrated item uses all of S⁺; the score is 0 when "
              "S \\ {j} is empty; the regulariser is the squared norm (gradient 2λθ).")
_FMF_FORMULA = ("ŷ_j = u · p_j; ℓ = −Σ_{j∈S⁺} Σ_{k∈S⁻} log σ(ŷ_j − ŷ_k) + λ‖θ‖² + λ‖u‖²")
_FMF_CONV = "θ = P.ravel(), P (n_items, d) row-major; u is the client's private vector."
_SAMPLED = ("sampled mode: row j of `negatives` holds the N items drawn for the j-th smallest "
            "positive (uniformly with replacement from S⁻); a negative drawn twice counts twice; "
            "the sum is not rescaled")


def model_cases() -> list[Case]:
    cases = []
    n_items, d = 11, 3
    for dtype in ("float64", "float32"):
        sfx = _suffix(dtype)
        # -- FISM evaluation scores
        name = f"model/fism-scores-{sfx}"
        rng = _rng(name)
        lists = _user_lists(rng, 5, n_items, [1, 2, 4, 6, 10])
        indptr, indices = _csr(lists)
        theta = rng.normal(size=2 * n_items * d).astype(dtype)
        params = {"model": "fism", "n_items": n_items, "hyperparameters": {"dim": d, "gamma": 0.7,
                                                                            "lam": 1e-4, "negatives": 0}}
        inp = {"theta": theta, "indptr": indptr, "indices": indices, "users": np.arange(5, dtype=np.int64)}
        out = compute_fism_scores(inp, params, "numpy")
        cases.append(Case(
            name, "fism_scores", "FISM evaluation scores of every item for five users (one with a single item)",
            "score(u, k) = p_k · |S_u|^(−γ) Σ_{l ∈ S_u} q_l", _FISM_CONV +
            " At evaluation every item is scored with all training items (docs/model.md).", "docs/model.md, paper Eq. 1",
            dtype, params, inp, {"scores": _close(out["scores"], dtype, C_REDUCTION)},
            f"rtol = {C_REDUCTION}u, atol = {C_REDUCTION}u·max|scores|: dot products of d terms and sums "
            "of |S| vectors, in the case's dtype"))

        # -- BPR, FISM and FMF, exact and sampled, and a one-item client
        variants = [("fism", "exact", 4), ("fism", "sampled", 4), ("fism", "exact", 1),
                    ("fmf", "exact", 4), ("fmf", "sampled", 4)]
        for model_name, mode, n_pos in variants:
            extra = "-one-item" if n_pos == 1 else ""
            name = f"model/{model_name}-bpr-{mode}{extra}-{sfx}"
            rng = _rng(name)
            hyper = {"dim": d, "lam": 0.05, "negatives": 3 if mode == "sampled" else 0}
            if model_name == "fism":
                hyper["gamma"] = 0.8
            params = {"model": model_name, "n_items": n_items, "hyperparameters": hyper}
            model = _model(params)
            items = np.sort(rng.choice(n_items, size=n_pos, replace=False)).astype(np.int64)
            theta = (rng.normal(size=model.n_params()) * 0.7).astype(dtype)
            inp = {"theta": theta, "items": items}
            if mode == "sampled":
                t, client = 3, 17
                inp["negatives"] = model.sample_negatives(items, generator(SEED, "negatives", t, client))
                params["negatives_drawn_with"] = {"seed": SEED, "stream": "negatives", "keys": [t, client],
                                                  "how": "rfrs_ref.seeding.generator(seed, stream, *keys), "
                                                         "then Model.sample_negatives"}
            if model.has_private:
                inp["private"] = rng.normal(size=d).astype(dtype)
            out = compute_bpr(inp, params, "numpy")
            outs = {"loss": _close(out["loss"], dtype, C_REDUCTION),
                    "grad": _close(out["grad"], dtype, C_REDUCTION)}
            if model.has_private:
                outs["private_grad"] = _close(out["private_grad"], dtype, C_REDUCTION)
            conv = (_FISM_CONV if model_name == "fism" else _FMF_CONV) + (" " + _SAMPLED if mode == "sampled" else "")
            desc = f"{model_name.upper()} BPR loss and gradient of one client, {mode} negatives"
            if n_pos == 1:
                desc += "; the client has one item, so its positive scores 0 ((n − 1)^(−γ) has no set)"
            cases.append(Case(
                name, "bpr", desc, _FISM_FORMULA if model_name == "fism" else _FMF_FORMULA, conv,
                "docs/model.md, paper Eqs. 1 and 7", dtype, params, inp, outs,
                f"rtol = {C_REDUCTION}u, atol = {C_REDUCTION}u·max|output|: sums over every "
                "(positive, negative) pair, log σ and σ evaluated stably"))
    return cases


# ====================================================================================== optim

def _optimizer(params):
    from rfrs_ref.optim import OPTIMIZERS

    return OPTIMIZERS.get(params["optimizer"])(**params["hyperparameters"])


def _state(inp, opt):
    return {k: inp[f"state_{k}"] for k in opt.arrays}


def compute_optimizer(inp, params, backend):
    opt = _optimizer(params)
    t = int(params["t"])
    state = _state(inp, opt)
    g = inp["g"]
    dtype = g.dtype
    out: dict[str, Any] = {"step_size": opt.step_size(t)}
    if backend == "numpy":
        up = opt.client_rule(state, g, t)
        stored = {k: np.asarray(up[k]).astype(dtype) for k in opt.arrays}
        rec = opt.recover(state, stored, t)
        verdict = opt.verify(state, stored, t)
        ok, check = verdict.ok, verdict.check
        for k in opt.arrays:
            out[f"upload_{k}"] = np.asarray(up[k], dtype=np.float64)
        out["recovered"] = rec
        tampered = {}
        for v in params["tampered"]:
            vd = opt.verify(state, {k: inp[f"tampered_{v}_{k}"] for k in opt.arrays}, t)
            tampered[v] = (vd.ok, vd.check)
    else:
        U = {k: np.empty((1, g.size), dtype=dtype) for k in opt.arrays}
        opt.client_rule_batch(state, g[None, :], t, U, backend=backend)
        R = np.empty((1, g.size), dtype=dtype)
        opt.recover_batch(state, U, t, R, backend=backend)
        okv, checks, _ = opt.verify_batch(state, U, t, recovered=R, backend=backend)
        ok, check = bool(okv[0]), checks[0]
        for k in opt.arrays:
            out[f"upload_{k}"] = U[k][0]
        out["recovered"] = R[0]
        tampered = {}
        for v in params["tampered"]:
            T = {k: inp[f"tampered_{v}_{k}"][None, :] for k in opt.arrays}
            okv, checks, _ = opt.verify_batch(state, T, t, backend=backend)
            tampered[v] = (bool(okv[0]), checks[0])
    out["verdict_honest_ok"] = bool(ok)
    out["verdict_honest_check"] = check
    for v, (vok, vcheck) in tampered.items():
        out[f"verdict_{v}_ok"] = bool(vok)
        out[f"verdict_{v}_check"] = vcheck
    return out


def _tamperings(opt, state, upload, t, rng) -> dict[str, tuple[str, dict]]:
    """name -> (the check it must trip first, tampered upload) for every check of ``opt``."""
    D = upload["theta"].size
    out = {}
    bad = {k: upload[k].copy() for k in opt.arrays}
    bad["theta"][rng.integers(D)] = np.nan
    out["nan-theta"] = ("nonfinite", bad)
    step = float(np.abs(upload["theta"] - state["theta"]).max())
    for check in opt.checks:
        bad = {k: upload[k].copy() for k in opt.arrays}
        j = int(rng.integers(D))
        if check.startswith("negative-"):
            bad[check.split("-", 1)[1]][j] = -1.0
        elif check in ("v-rule", "r-rule"):
            key = check[0]
            bad[key][j] = bad[key][j] * 1.5 + 1.0
        elif check == "theta-rule":
            bad["theta"][j] += 100.0 * step + 1e-3
        else:
            continue
        out[check] = (check, bad)
    return out


#: the coordinates of an optimiser case with ε where the second moment is of the order of
#: ε² (√v and √r at 0.8ε and 1.2ε) and the gradient of the order of ε (first round:
#: ε/√(1 − β₂)), and the factors that set them: ε changes θ there by half of the step
#: or more, so an ε inside the square root (or left out) misses θ by over a hundred times
#: the float32 tolerance, and every quantity there is a sum of positive terms (no
#: cancellation: the value does not depend on how a CPU rounds)
EPS_COORDINATES = (2, 6)
_EPS_G = (1.5, -0.75)
_EPS_ROOT = (0.8, 1.2)
_EPS_M = (2.0, -1.5)


def _eps_coordinates(opt_name: str, hyper: dict, state: dict, g: np.ndarray, t: int) -> None:
    """Set :data:`EPS_COORDINATES` of ``state`` and ``g`` (in place, in their dtype) so that
    ε matters there: v̄ (r̄) = (cε)², m̄ and g of the order of ε and of the same sign
    (m = β₁m̄ + (1 − β₁)g does not cancel); Adam's first round: g = ±cε/√(1 − β₂),
    whose (1 − β₂)g² is of the order of ε²."""
    eps = hyper["eps"]
    J = list(EPS_COORDINATES)
    dt = g.dtype
    if t == 1 and opt_name == "adam":
        g[J] = (eps * np.array(_EPS_G) / math.sqrt(1.0 - hyper["beta2"])).astype(dt)
        return
    g[J] = (eps * np.array(_EPS_G)).astype(dt)
    for k in state:
        if k in ("v", "r"):
            state[k][J] = ((eps * np.array(_EPS_ROOT)) ** 2).astype(dt)
        elif k == "m":
            state[k][J] = (eps * np.array(_EPS_M)).astype(dt)


def optim_cases() -> list[Case]:
    from rfrs_ref.optim import OPTIMIZERS, VERIFY_SAFETY

    cases = []
    D = 9
    formulas = {
        "sgd": "θ = θ̄ − η g; ĝ = (θ̄ − θ)/η",
        "momentum": "m = β₃ m̄ + g; θ = θ̄ − η m; ĝ = m − β₃ m̄",
        "adam": ("m = β₁m̄ + (1−β₁)g; v = β₂v̄ + (1−β₂)g²; ηₜ = η√(1−β₂ᵗ)/(1−β₁ᵗ); "
                 "θ = θ̄ − ηₜ m/(√v + ε); ĝ = (m − β₁m̄)/(1−β₁)"),
        "adagrad": "r = r̄ + g²; θ = θ̄ − η g/(√r + ε); ĝ = (θ̄ − θ)(√r + ε)/η",
        "rmsprop": "r = β₄ r̄ + (1−β₄) g²; θ = θ̄ − η g/(√r + ε); ĝ = (θ̄ − θ)(√r + ε)/η",
    }
    hyper = {"sgd": {"lr": 0.05}, "momentum": {"lr": 0.05, "beta3": 0.9},
             "adam": {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
             "adagrad": {"lr": 0.05, "eps": 1e-8}, "rmsprop": {"lr": 0.01, "beta4": 0.99, "eps": 1e-8}}
    plan = [(name, dtype, 7, "") for name in OPTIMIZERS for dtype in ("float64", "float32")]
    plan.append(("adam", "float64", 1, "-first-round"))
    for opt_name, dtype, t, extra in plan:
        name = f"optim/{opt_name}{extra}-{_suffix(dtype)}"
        rng = _rng(name)
        params = {"optimizer": opt_name, "hyperparameters": hyper[opt_name], "t": t}
        opt = _optimizer(params)
        if t == 1:
            state = {k: np.zeros(D, dtype=dtype) for k in opt.arrays}
            state["theta"] = rng.normal(size=D).astype(dtype)
        else:
            state = {"theta": rng.normal(size=D).astype(dtype)}
            for k in opt.arrays:
                if k in ("m",):
                    state[k] = (rng.normal(size=D) * 0.1).astype(dtype)
                elif k in ("v", "r"):
                    state[k] = (rng.random(size=D) * 0.02 + 1e-4).astype(dtype)
        g = (rng.normal(size=D) * 0.3).astype(dtype)
        eps = hyper[opt_name].get("eps")
        if eps is not None:
            _eps_coordinates(opt_name, hyper[opt_name], state, g, t)
        inp = {f"state_{k}": state[k] for k in opt.arrays}
        inp["g"] = g
        honest = opt.client_rule(state, g, t)
        stored = {k: honest[k].astype(dtype) for k in opt.arrays}
        tamper = _tamperings(opt, state, stored, t, rng)
        for v, (_, bad) in tamper.items():
            for k in opt.arrays:
                inp[f"tampered_{v}_{k}"] = bad[k].astype(dtype)
        params["tampered"] = list(tamper)
        out = compute_optimizer(inp, params, "numpy")
        for v, (check, _) in tamper.items():
            if out[f"verdict_{v}_check"] != check:
                raise AssertionError(f"{name}: tampering {v!r} tripped {out[f'verdict_{v}_check']!r}, "
                                     f"not {check!r}")
        if not out["verdict_honest_ok"]:
            raise AssertionError(f"{name}: the honest upload fails verification")
        u = unit_roundoff(dtype)
        outs: dict[str, Expected] = {"step_size": _close(out["step_size"], "float64", C_ELEMENTWISE)}
        for k in opt.arrays:
            scale = _scale(out[f"upload_{k}"]) + _scale(state[k])
            outs[f"upload_{k}"] = _close(out[f"upload_{k}"], dtype, C_ELEMENTWISE, scale)
        bound = opt.recovery_bound(state, stored, t)
        outs["recovered"] = Expected(out["recovered"], rtol=0.0, atol=float(VERIFY_SAFETY * bound.max()),
                                     note="recovered from the upload stored in the case's dtype; equals g "
                                          "to the rounding bound of docs/optimizers.md recovery")
        if not np.all(np.abs(out["recovered"] - g.astype(np.float64)) <= VERIFY_SAFETY * bound):
            raise AssertionError(f"{name}: recovery is not exact within its bound")
        outs["verdict_honest_ok"] = _exact(True)
        outs["verdict_honest_check"] = _exact(None)
        for v, (check, _) in tamper.items():
            outs[f"verdict_{v}_ok"] = _exact(False)
            outs[f"verdict_{v}_check"] = _exact(check, note="the first failed check, in the optimiser's "
                                                            f"order {list(opt.checks)}")
        cases.append(Case(
            name, "optimizer",
            f"{opt_name} client rule at round {t}, the recovery of g from the stored upload, and "
            "update-rule verification of the honest upload and of tampered ones"
            + (" (first round: zero moments, ηₜ at t = 1)" if t == 1 else ""),
            formulas[opt_name],
            "t is the global round, from 1; ε is added outside the square root and not rescaled by "
            "the bias correction; the upload is stored in the case's dtype before recovery and "
            "verification; a tampered upload fails with the first failed check in the order "
            f"{list(opt.checks)} ('nonfinite' for any NaN or ±inf).",
            "docs/optimizers.md", dtype, params, inp, outs,
            f"uploads: rtol = {C_ELEMENTWISE}u, atol = {C_ELEMENTWISE}u·(max|upload| + max|state|) with "
            f"u = {u:.3g}; recovered: atol = {VERIFY_SAFETY:g} × the largest per-coordinate rounding "
            "bound of the recovery (rfrs_ref.optim.tolerance) for uploads stored in this dtype; "
            "verdicts exact"))
    return cases


# ================================================================================== aggregate

_RULE_HYPER = {"mean": {}, "krum": {"k": 0, "fallback": "error"}, "median": {"fallback": "error"},
               "trmean": {"fallback": "error"}, "rfa": {"nu": 1e-6, "tol": 1e-6, "max_iter": 100,
                                                        "fallback": "error"},
               "bulyan": {"fallback": "error"}, "mda": {"max_subsets": 10_000_000, "fallback": "error"},
               "meamed": {"fallback": "error"}, "monna": {"pivot": 0, "fallback": "error"},
               # τ is set per case (the median distance to the previous centre, so that some
               # clients are clipped and some not); two iterations exercise the loop
               "cc": {"tau": None, "iterations": 2},
               "caf": {"fallback": "error"}, "smea": {"max_subsets": 100_000, "fallback": "error"}}

#: the rules with golden vectors (every registered rule)
GOLDEN_RULES = tuple(_RULE_HYPER)
#: the pre-aggregators with golden vectors, each in front of ``mean`` (and NNM in front of Krum,
#: bucketing in front of the trimmed mean)
GOLDEN_PRE = ("nnm", "bucketing", "clip", "arc")
#: the attacks with golden vectors (a-ra has none: docs/golden-vectors.md says why)
GOLDEN_ATTACKS = ("none", "ascent", "noise", "camouflage", "alie", "ipm", "inf", "mimic",
                  "opt-ipm", "opt-alie")

_RULE_FORMULA = {
    "cc": ("from the previous centre v₀ (input cc_center), L times v ← v + Σᵢ pᵢ·clip_τ(xᵢ − v), "
           "pᵢ = nᵢ/Σnⱼ, clip_τ(z) = z·min(1, τ/‖z‖); then v_L = a·v₀ + Σ wᵢxᵢ and every upload "
           "Ā = a·S + Σ wᵢ A[i], S the server's value of that array (input reference_<array>)"),
    "caf": ("c = 1; while Σc > n − 2f: μ = Σcᵢxᵢ/Σc, (λ, u) the top eigenpair of Σcᵢ(xᵢ − μ)(xᵢ − μ)ᵀ/Σc, "
            "remember c if λ is the smallest so far, τᵢ = (u·(xᵢ − μ))², cᵢ ← cᵢ(1 − τᵢ/max over "
            "weighted rows τ), the argmax set to 0; Ā = Σ cᵢnᵢ A[i] / Σ cᵢnᵢ with the remembered c"),
    "smea": ("S* = the first (lexicographic) subset of n − f clients whose covariance "
             "(1/|S|)Σ(xᵢ − μ_S)(xᵢ − μ_S)ᵀ has the smallest largest eigenvalue; "
             "Ā = Σ_{S*} nᵢ A[i] / Σ_{S*} nᵢ"),
    "monna": ("N = the n − f clients nearest to the pivot client 0 (itself included; finite first, ties "
              "to the smaller index); Ā = Σ_N nᵢ A[i] / Σ_N nᵢ"),
    "meamed": ("per coordinate, keep the n − f features closest to their median (remove f times the "
               "end farther from it, the upper one on a tie); Āₖ = Σ_{kept at k} nᵢ A[i,k] / Σ nᵢ"),
    "mda": ("S* = the first (lexicographic) subset of n − f clients of smallest diameter "
            "max_{i,j∈S} ‖xᵢ − xⱼ‖; Ā = Σ_{S*} nᵢ A[i] / Σ_{S*} nᵢ"),
    "mean": "Ā = Σᵢ nᵢ A[i] / Σᵢ nᵢ",
    "krum": ("score(i) = Σ of the n − f − 2 smallest ‖xᵢ − xⱼ‖² (j ≠ i); keep the k lowest scores "
             "(k = n − f by default; ties to the smaller index); Ā = Σ_{kept} nᵢ A[i] / Σ_{kept} nᵢ"),
    "median": ("per coordinate, keep the middle client (odd n) or the two middle clients (even n) "
               "ranked by feature; Āₖ = Σ_{kept at k} nᵢ A[i,k] / Σ nᵢ"),
    "trmean": ("per coordinate, drop the f largest and f smallest features; Āₖ = Σ_{kept at k} nᵢ "
               "A[i,k] / Σ nᵢ"),
    "rfa": ("smoothed Weiszfeld from the nᵢ-weighted mean: z ← Σ αᵢxᵢ/Σ αᵢ, αᵢ = nᵢ/max(ν, ‖z − xᵢ‖), "
            "until a step ≤ tol × the weighted median distance; wᵢ = αᵢ/Σα; Ā = Σ wᵢ A[i]"),
    "bulyan": ("select n − 2f clients by iterated Krum (neighbours |R| − f − 2 clipped to [1, |R| − 1]); "
               "per coordinate keep the n − 4f selected closest to their median; Āₖ weighted by nᵢ"),
}

_RULE_CONV = ("A non-finite feature or upload value makes its client infinitely far (per-client rules) "
              "or ranks as np.sort orders it, NaN as +inf (coordinate-wise rules); ties go to the smaller client index. "
              "Parameter-space features are θᵢ − θ̄ (docs/aggregation.md). The same decision (weights, or the "
              "per-coordinate kept set) applies to every uploaded array.")


class _GivenPermutation:
    """The round's generator as bucketing reads it (``permutation(n)``), returning the
    case's input ``permutation``: the shuffle is an input, as the noise attack's normals are."""

    def __init__(self, perm) -> None:
        self.perm = np.asarray(perm, dtype=np.int64)

    def permutation(self, n: int) -> np.ndarray:
        if self.perm.shape != (n,) or sorted(self.perm.tolist()) != list(range(n)):
            raise GoldenFormatError(f"input 'permutation' must be a permutation of 0..{n - 1}, "
                                    f"got {self.perm.tolist()!r}")
        return self.perm.copy()


def _aggregator(params):
    """The rule of an aggregate case, behind its pre-aggregators when it names any."""
    from rfrs_ref.aggregate import PRE, RULES, PreAggregated

    rule = RULES.get(params["rule"])(**params["hyperparameters"])
    pre = params.get("pre") or []
    if not pre:
        return rule
    hyper = params.get("pre_hyperparameters") or {}
    return PreAggregated(tuple(PRE.get(p)(**hyper.get(p, {})) for p in pre), rule)


def compute_aggregate(inp, params, backend):
    rule = _aggregator(params)
    arrays = {k[len("upload_"):]: v for k, v in inp.items() if k.startswith("upload_")}
    kw: dict[str, Any] = {}
    if getattr(rule, "takes_round_inputs", False):
        kw["reference"] = {k[len("reference_"):]: v for k, v in inp.items()
                           if k.startswith("reference_")} or None
        kw["rng"] = _GivenPermutation(inp["permutation"]) if "permutation" in inp else None
    if getattr(rule, "state_arrays", ()):
        kw["rule_state"] = {k: inp[k] for k in rule.state_arrays}
    res = rule.aggregate(inp["features"], arrays, inp["n_samples"], int(params["f"]), backend=backend,
                         **kw)
    out: dict[str, Any] = {f"aggregate_{k}": np.asarray(v, dtype=np.float64) for k, v in res.arrays.items()}
    if res.weights is not None:
        out["weights"] = np.asarray(res.weights, dtype=np.float64)
    out["kept"] = np.asarray(res.kept, dtype=np.float64)
    diag = res.diagnostics
    out["f_used"] = diag.get("f_used")
    if params["rule"] == "krum":
        out["krum_scores"] = np.array([np.inf if s is None else s for s in diag["scores"]], dtype=np.float64)
        out["krum_selected"] = np.asarray(diag["selected"], dtype=np.int64)
        out["krum_neighbours"] = int(diag["neighbours"])
    elif params["rule"] == "bulyan":
        out["bulyan_selected"] = np.asarray(diag["selected"], dtype=np.int64)
    elif params["rule"] == "rfa":
        out["rfa_iterations"] = int(diag["iterations"])
        out["rfa_converged"] = bool(diag["converged"])
    elif params["rule"] == "cc":
        out["cc_center"] = np.asarray(res.state["cc_center"], dtype=np.float64)
        out["cc_center_weight"] = float(diag["center_weight"])
        out["cc_clipped"] = np.asarray(diag["clipped"], dtype=np.int64)
    elif params["rule"] == "caf":
        out["caf_steps"] = int(diag["steps"])
        out["caf_filter_weights"] = np.asarray(diag["filter_weights"], dtype=np.float64)
    elif params["rule"] == "smea":
        out["smea_selected"] = np.asarray(diag["selected"], dtype=np.int64)
    return out


def _round_inputs(rng, n, D, dtype, detect, hostile=None, ties=False):
    """A round of Adam uploads: honest clients near a common gradient, and Byzantine
    rows (ascent, or ``hostile`` values) at the end; features for ``detect``."""
    from rfrs_ref.optim import Adam

    opt = Adam(lr=0.01)
    t = 5
    state = {"theta": rng.normal(size=D), "m": rng.normal(size=D) * 0.05,
             "v": rng.random(size=D) * 0.01 + 1e-4}
    state = {k: v.astype(dtype) for k, v in state.items()}
    if ties:
        # integer gradients on a line: Krum scores tie exactly in any summation order
        G = np.zeros((n, D))
        G[:, 0] = [0, 1, 2, 3, 4, 5, 6][:n]
        G[:, 1:] = 1.0
    else:
        G = rng.normal(size=D) * 0.5 + rng.normal(size=(n, D)) * 0.2
    nb = 2
    if not ties:
        G[n - nb:] = -3.0 * G[n - nb:]  # gradient ascent, scaled
    G = G.astype(dtype)
    ups = {k: np.empty((n, D), dtype=dtype) for k in opt.arrays}
    for i in range(n):
        u = opt.client_rule(state, G[i], t)
        for k in opt.arrays:
            ups[k][i] = u[k]
    if hostile is not None:
        with np.errstate(all="ignore"):
            for j, val in enumerate(hostile):
                r = n - 1 - j
                for k in opt.arrays:
                    ups[k][r] = val
                G[r] = val
    if ties:
        X = G.copy()  # the integer gradients themselves: recovery would round the ties away
    elif detect == "gradient":
        X = np.empty((n, D), dtype=dtype)
        for i in range(n):
            with np.errstate(all="ignore"):
                X[i] = opt.recover(state, {k: ups[k][i] for k in opt.arrays}, t)
    else:
        from rfrs_ref.aggregate import parameter_features

        X = parameter_features(ups["theta"], state["theta"])
    return state, ups, X


def _threshold(values, margin: float = 1e-4) -> float:
    """A threshold between the given positive values: their median rounded to 3
    significant digits, moved until no value lies within ``margin`` (relative) of
    it, so that no rounding of another implementation flips a comparison with it."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    t = float(f"{float(np.median(v)):.3g}")
    for _ in range(100):
        if np.all(np.abs(v - t) > margin * t):
            return t
        t = float(f"{t * 1.013:.4g}")
    raise AssertionError(f"no threshold with a margin among {v.tolist()}")  # pragma: no cover


def _cc_inputs(rng, X, ns, iterations: int) -> tuple[np.ndarray, float]:
    """(previous centre v₀, τ) for a centered-clipping case: v₀ near the honest features,
    τ between the distances of every iteration (checked on a float64 replay)."""
    X64 = np.asarray(X, dtype=np.float64)
    ok = np.isfinite(X64).all(axis=1)
    fin = X64[ok]
    v0 = fin.mean(axis=0) * 0.8 + rng.normal(size=X.shape[1]) * 0.1 * float(np.abs(fin).max())
    tau = _threshold(np.linalg.norm(fin - v0, axis=1))
    p = np.where(ok, ns, 0) / np.sum(np.where(ok, ns, 0))
    for _ in range(20):
        v, margin_ok = v0.copy(), True
        for _ in range(iterations):
            d = np.linalg.norm(fin - v, axis=1)
            margin_ok &= bool(np.all(np.abs(d - tau) > 1e-4 * tau))
            c = np.minimum(1.0, tau / d)
            v = v + (p[ok] * c) @ (fin - v)
        if margin_ok:
            return v0, tau
        tau = float(f"{tau * 1.013:.4g}")
    raise AssertionError("no τ with a margin for the centered-clipping case")  # pragma: no cover


def aggregate_cases() -> list[Case]:
    from rfrs_ref.aggregate import PRE, RULES
    from rfrs_ref.params import values

    cases = []
    n, D, f = 11, 6, 2
    plan = []
    for rule in (r for r in RULES if r in GOLDEN_RULES):
        for detect in ("gradient", "parameter"):
            for dtype in ("float64", "float32"):
                plan.append((rule, None, detect, dtype, None, False, n, f))
        plan.append((rule, None, "gradient", "float64", [np.nan, np.inf], False, n, f))
        plan.append((rule, None, "gradient", "float64", [1e38, -np.inf], False, n, f))
    plan.append(("krum", None, "gradient", "float64", None, True, 7, 1))
    for pre in (p for p in PRE if p in GOLDEN_PRE):
        for detect in ("gradient", "parameter"):
            for dtype in ("float64", "float32"):
                plan.append(("mean", pre, detect, dtype, None, False, n, f))
        plan.append(("mean", pre, "gradient", "float64", [np.nan, np.inf], False, n, f))
        plan.append(("mean", pre, "gradient", "float64", [1e38, -np.inf], False, n, f))
    plan.append(("krum", "nnm", "gradient", "float64", None, False, n, f))
    # bucketing then the mean is the mean whatever the buckets (n′_b = Σ nᵢ): a rule that is
    # not linear in its rows sees the buckets, their shuffle and their size
    for dtype in ("float64", "float32"):
        plan.append(("trmean", "bucketing", "gradient", dtype, None, False, n, f))
    for rule, pre, detect, dtype, hostile, ties, n_, f_ in plan:
        tag = detect
        if hostile is not None:
            tag += "-nonfinite" if np.isnan(hostile[0]) else "-huge"
        if ties:
            tag += "-ties"
        name = (f"aggregate/{rule}-{tag}-{_suffix(dtype)}" if pre is None
                else f"aggregate/pre-{pre}-{rule}-{tag}-{_suffix(dtype)}")
        rng = _rng(name)
        state, ups, X = _round_inputs(rng, n_, D, dtype, detect, hostile, ties)
        hyper = dict(_RULE_HYPER[rule])
        if ties:
            hyper["k"] = 1
        inp = {"features": X, "n_samples": (np.full(n_, 5) if ties else rng.integers(1, 30, size=n_)).astype(np.int64)}
        for k, v in ups.items():
            inp[f"upload_{k}"] = v
        if detect == "parameter":
            inp["theta_bar"] = state["theta"]
        pre_hyper: dict[str, dict] = {}
        if rule == "cc":
            v0, hyper["tau"] = _cc_inputs(rng, X, inp["n_samples"].astype(np.float64), hyper["iterations"])
            inp["cc_center"] = v0
        if pre == "clip":
            norms = np.linalg.norm(np.asarray(X, dtype=np.float64)[np.isfinite(X).all(axis=1)], axis=1)
            pre_hyper["clip"] = {"clip_norm": _threshold(norms)}
        elif pre is not None:
            pre_hyper[pre] = values(PRE.get(pre)())
        if pre == "bucketing":
            inp["permutation"] = rng.permutation(n_).astype(np.int64)
        if rule == "cc" or pre in ("clip", "arc"):
            # the server's value of each uploaded array, toward which clipping shrinks
            for k in ups:
                inp[f"reference_{k}"] = state[k]
        params = {"rule": rule, "hyperparameters": hyper, "f": f_, "detect": detect}
        if pre is not None:
            params["pre"] = [pre]
            params["pre_hyperparameters"] = pre_hyper
        out = compute_aggregate(inp, params, "numpy")
        # CAF's filter weights follow eigenvectors: a few more roundings than a weighted sum
        c_arr = C_REDUCTION if rule == "caf" else C_ELEMENTWISE
        outs: dict[str, Expected] = {}
        for k in ups:
            # The scale of the rounding is that of the rows the output is made of: the
            # hostile rows (1e38) are left out, else atol = 64u·1e38 ≈ 7e23 would accept
            # any aggregate of a robust rule, and the output's own magnitude is added for
            # a rule that lets a hostile row through (the mean after a pre-aggregator).
            rows = ups[k][: n_ - len(hostile)] if hostile is not None else ups[k]
            fin = np.asarray(out[f"aggregate_{k}"], dtype=np.float64)
            scale = _scale(rows[np.isfinite(rows).all(axis=1)]) + (
                _scale(fin) if hostile is not None else 0.0)
            if f"reference_{k}" in inp:
                scale += _scale(inp[f"reference_{k}"])
            outs[f"aggregate_{k}"] = _close(out[f"aggregate_{k}"], dtype, c_arr, scale)
        if "weights" in out:
            if rule == "rfa":
                outs["weights"] = _close(out["weights"], "float64", C_ELEMENTWISE, 1.0, role="informational",
                                         note="RFA's weights depend on where its iteration stops")
            elif rule in ("cc", "caf") or pre is not None:
                outs["weights"] = _close(out["weights"], dtype, c_arr, 1.0,
                                         note="ratios of distances, norms or filter weights computed "
                                              "from the features: roundings of the case's dtype")
            else:
                outs["weights"] = _close(out["weights"], "float64", C_ELEMENTWISE, 1.0)
        outs["kept"] = _close(out["kept"], "float64", 4, 1.0,
                              note="fraction of coordinates at which the client takes part (1 or 0 "
                                   "for per-client rules)")
        outs["f_used"] = _exact(out["f_used"])
        if rule == "krum":
            finite = X[np.isfinite(X).all(axis=1)].astype(np.float64)
            diam = float(np.abs(finite).max(initial=0.0))
            outs["krum_scores"] = _close(out["krum_scores"], dtype, C_REDUCTION, diam * diam * D,
                                         note="+inf for a client with a non-finite feature or upload")
            outs["krum_selected"] = _exact(out["krum_selected"], note="kept clients, lowest score first, "
                                                                      "ties to the smaller index")
            outs["krum_neighbours"] = _exact(out["krum_neighbours"])
            if pre is not None:
                outs["krum_scores"].role = "informational"
                outs["krum_scores"].note = "scores of the mixed rows"
        elif rule == "bulyan":
            outs["bulyan_selected"] = _exact(out["bulyan_selected"], note="in the order of selection")
        elif rule == "rfa":
            outs["rfa_iterations"] = _exact(out["rfa_iterations"], role="informational")
            outs["rfa_converged"] = _exact(out["rfa_converged"], role="informational")
        elif rule == "cc":
            fin = np.asarray(X, dtype=np.float64)[np.isfinite(X).all(axis=1)]
            outs["cc_center"] = _close(out["cc_center"], dtype, C_ELEMENTWISE,
                                       _scale(fin) + _scale(inp["cc_center"]),
                                       note="the new centre v_L: the rule's state for the next round")
            outs["cc_center_weight"] = _close(out["cc_center_weight"], dtype, C_ELEMENTWISE, 1.0,
                                              note="a, the previous centre's share of v_L")
            outs["cc_clipped"] = _exact(out["cc_clipped"], note="clients clipped at each iteration")
        elif rule == "caf":
            outs["caf_steps"] = _exact(out["caf_steps"], role="informational",
                                       note="filter steps run (the last may be one that only tests Σc)")
            outs["caf_filter_weights"] = _close(out["caf_filter_weights"], dtype, C_REDUCTION, 1.0,
                                                role="informational",
                                                note="the filter weights c of the remembered step")
        elif rule == "smea":
            outs["smea_selected"] = _exact(out["smea_selected"], note="S*, increasing client index")
        desc = f"{rule} on {detect}-space features of {n_} Adam uploads, f = {f_}"
        if pre is not None:
            desc = f"{pre} then " + desc
        if rule == "cc":
            desc += (f"; from the previous centre cc_center, τ = {hyper['tau']}, "
                     f"{hyper['iterations']} iterations, uploads combined around reference_<array>")
        if pre == "bucketing":
            desc += "; the shuffle π is the input 'permutation' (bucket b = π[2b], π[2b + 1])"
        elif pre in ("clip", "arc"):
            desc += "; uploads shrink toward reference_<array> (the server's state)"
        if hostile is not None:
            desc += (f"; the last {len(hostile)} clients upload {', '.join(str(h) for h in hostile)} in every "
                     "array (and feature)")
        elif not ties:
            desc += "; the last 2 clients upload gradient ascent (−3g through the rule)"
        if ties:
            desc = ("classic Krum (k = 1) on integer gradients on a line: several clients tie on the "
                    "lowest score; the smaller index wins")
        tol = (f"aggregated arrays: rtol = {c_arr}u, atol = {c_arr}u·(max|finite upload| + "
               f"max|reference|); weights: {C_ELEMENTWISE}u absolute ({c_arr}u of the case's dtype for "
               f"cc, caf and pre-aggregated rules); kept: 4u; Krum scores: {C_REDUCTION}u relative "
               f"and {C_REDUCTION}u·D·max|x|² absolute; selections exact")
        formula = _RULE_FORMULA[rule] if pre is None else f"{_PRE_FORMULA[pre]}; then {_RULE_FORMULA[rule]}"
        cases.append(Case(name, "aggregate", desc, formula, _RULE_CONV, "docs/aggregation.md", dtype, params,
                          inp, outs, tol))
    return cases


_PRE_FORMULA = {
    "nnm": ("x′ᵢ = Σ_{j∈N(i)} nⱼxⱼ / Σ_{j∈N(i)} nⱼ, N(i) the n − f rows nearest to xᵢ (itself first, "
            "ties by index); every upload mixed with the same weights"),
    "bucketing": ("buckets of s consecutive rows of the permutation π (input); x′_b = Σ_{i∈b} nᵢxᵢ / "
                  "Σ_{i∈b} nᵢ, n′_b = Σ_{i∈b} nᵢ; the rule sees f′ = min(f, n′)"),
    "clip": ("sᵢ = min(1, C/‖xᵢ‖); x′ᵢ = sᵢxᵢ and every upload A′ᵢ = S + sᵢ(Aᵢ − S), S its reference"),
    "arc": ("the k = ⌊2f(n − f)/n⌋ rows of largest norm clipped to the (k + 1)-th largest norm "
            "(ties: the larger index first); uploads A′ᵢ = S + sᵢ(Aᵢ − S)"),
}


# ===================================================================================== attack

def compute_attack(inp, params, backend):
    from rfrs_ref.attack import ATTACKS, AttackContext

    opt = _optimizer(params)
    attack = ATTACKS.get(params["attack"])(**params["attack_hyperparameters"])
    t = int(params["t"])
    state = _state(inp, opt)
    uploads = {k: np.array(inp[f"honest_{k}"], copy=True) for k in opt.arrays}
    grads = np.array(inp["grads"], copy=True)
    grads.flags.writeable = False
    rule = None
    if "rule" in params:  # the attacks that simulate the server's aggregation
        rule = _aggregator({"rule": params["rule"], "hyperparameters": params["rule_hyperparameters"]})
    ctx = AttackContext(t=t, optimizer=opt, state=state, grads=grads, uploads=uploads,
                        byzantine=np.asarray(inp["byzantine"], dtype=bool),
                        clients=np.asarray(inp["clients"], dtype=np.int64),
                        n_samples=np.asarray(inp["n_samples"], dtype=np.int64), f=int(params["f"]),
                        rng=generator(int(params["seed"]), "attack", t), backend=backend,
                        rule=rule, detect=params.get("detect", "gradient"))
    diag = attack.apply_inplace(ctx)
    out: dict[str, Any] = {f"upload_{k}": np.asarray(v, dtype=np.float64) for k, v in uploads.items()}
    if params["attack"] == "noise":
        k = int(np.sum(inp["byzantine"]))
        out["noise"] = generator(int(params["seed"]), "attack", t).standard_normal((k, grads.shape[1]))
        out["noise_norm"] = np.asarray(diag["noise_norm"], dtype=np.float64)
    elif params["attack"] == "alie":
        out["alie_z"] = diag["z"]
    elif params["attack"] == "camouflage":
        out["camouflaged_fraction"] = diag["camouflaged_fraction"]
    elif params["attack"] in ("opt-ipm", "opt-alie"):
        out["opt_tau"] = float(diag["tau"])
        out["opt_objective"] = float(diag["objective"])
        out["opt_evals"] = int(diag["evals"])
    elif params["attack"] == "mimic":
        out["mimic_client"] = diag["client"]
    return out


#: the line search of the optimal attacks' cases (see ``attack_cases``)
OPTIMAL_ATTACK_SEARCH = {"evals": 12, "delta": 1.0}


def attack_cases() -> list[Case]:
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.optim import Adam

    cases = []
    n, D, t = 7, 8, 6
    descriptions = {
        "none": "Byzantine clients upload honestly",
        "ascent": "each Byzantine client uploads rule(state, −g, t)",
        "noise": ("the honest upload with θ + σz, z ~ N(0, I): D float64 standard normals per "
                  "Byzantine client in increasing row order, from the generator of stream 'attack', key t"),
        "camouflage": ("θ honest, m and v from g̃ of paper Eq. 6 (with ε) where it gives the same update, "
                       "else g, coordinate by coordinate"),
        "alie": "every Byzantine client uploads rule(μ − z·σ) of the Byzantine clients' gradients",
        "ipm": "every Byzantine client uploads rule(−ϵ · mean of the Byzantine clients' gradients)",
        "inf": "every Byzantine client uploads +inf in every array (the rule is not obeyed)",
        "mimic": ("every Byzantine client uploads a copy of the upload of the round's first honest "
                  "client (index 0, rows in ascending client id)"),
        "opt-ipm": ("every Byzantine client uploads rule(−τ·μ), μ the honest clients' mean gradient, τ by "
                    "ByzFL's line search maximising ‖θ̄_rule(τ) − Σ_honest nᵢθᵢ/Σ_honest nᵢ‖ against the "
                    "server's rule (params: rule, rule_hyperparameters, detect)"),
        "opt-alie": ("every Byzantine client uploads rule(μ + τ·σ) of the honest clients' gradients (σ with "
                     "ddof = 1), τ by the same line search against the server's rule"),
    }
    #: the server every optimal attack simulates: (rule, its hyperparameters, detection space)
    servers = {"opt-ipm": ("krum", dict(_RULE_HYPER["krum"]), "gradient"),
               "opt-alie": ("trmean", dict(_RULE_HYPER["trmean"]), "parameter")}
    # (attack, name tag, hyperparameters other than its defaults); mimic also copies honest client
    # number 1 of the round: the honest rows are 0, 2, 3, 6, so row 1 (Byzantine) is not it
    plan = [(a, "", {}) for a in ATTACKS if a in GOLDEN_ATTACKS] + [("mimic", "-index-1", {"index": 1})]
    descriptions["mimic-index-1"] = (
        "every Byzantine client uploads a copy of the upload of the round's honest client number 1 "
        "(from 0, among the honest rows in ascending client id: row 2, not row 1, which is Byzantine)")
    for attack_name, tag, extra in plan:
        for dtype in ("float64", "float32"):
            name = f"attack/{attack_name}{tag}-adam-{_suffix(dtype)}"
            rng = _rng(name)
            opt = Adam(lr=0.01)
            params = {"optimizer": "adam", "hyperparameters": {"lr": 0.01, "beta1": 0.9, "beta2": 0.999,
                                                               "eps": 1e-8},
                      "attack": attack_name, "attack_hyperparameters": {}, "t": t, "f": 2, "seed": SEED}
            from rfrs_ref.params import values

            params["attack_hyperparameters"] = values(ATTACKS.get(attack_name)(**extra))
            if attack_name in servers:
                params["rule"], params["rule_hyperparameters"], params["detect"] = servers[attack_name]
                # a shorter search from a smaller first step: every comparison it makes differs
                # by more than 0.5% of the objective (tests/golden), and it both expands and
                # contracts; ByzFL's defaults (20 evaluations, δ = 10) run on to τ ≈ 5e6, where
                # the objective is flat to 1e-8 and the rounding of an implementation's sums
                # would decide the comparisons
                params["attack_hyperparameters"].update(OPTIMAL_ATTACK_SEARCH)
            # a mid-run state where |m̄|/√v̄ is large on many coordinates, so camouflage bites
            m_bar = rng.normal(size=D) * 0.2
            state = {"theta": rng.normal(size=D), "m": m_bar,
                     "v": (0.1 * m_bar) ** 2 + 1e-8}
            state = {k: v.astype(dtype) for k, v in state.items()}
            G = (rng.normal(size=D) * 0.05 + rng.normal(size=(n, D)) * 0.05).astype(dtype)
            byz = np.zeros(n, dtype=bool)
            byz[[1, 4, 5]] = True
            honest = {k: np.empty((n, D), dtype=dtype) for k in opt.arrays}
            opt.client_rule_batch(state, G, t, honest, backend="numpy")
            inp = {f"state_{k}": state[k] for k in opt.arrays}
            n_samples = rng.integers(1, 20, size=n).astype(np.int64)
            # the Byzantine rows share one nᵢ: attacks that give every Byzantine client the same
            # upload make their rows an exact tie for a rule (Krum's scores of identical rows),
            # which float32 rounding may break either way; with equal nᵢ no output depends on
            # which of the identical rows a rule keeps
            n_samples[byz] = n_samples[byz][0]
            inp.update({"grads": G, "byzantine": byz, "clients": np.arange(10, 10 + n, dtype=np.int64),
                        "n_samples": n_samples})
            for k in opt.arrays:
                inp[f"honest_{k}"] = honest[k]
            out = compute_attack(inp, params, "numpy")
            if attack_name == "noise":
                inp["noise"] = out["noise"]
            if attack_name == "camouflage" and not out["camouflaged_fraction"] > 0.2:
                raise AssertionError(f"{name}: only {out['camouflaged_fraction']} of the coordinates "
                                     "are camouflaged; the case would not test the attack")
            outs: dict[str, Expected] = {}
            for k in opt.arrays:
                outs[f"upload_{k}"] = _close(out[f"upload_{k}"], dtype, C_ELEMENTWISE,
                                             _scale(out[f"upload_{k}"]) + _scale(state[k]))
            if attack_name == "noise":
                outs["noise"] = _exact(out["noise"], note="what NumPy's PCG64 generator draws: equal to "
                                                          "the input 'noise'")
                outs["noise_norm"] = _close(out["noise_norm"], "float64", C_REDUCTION)
            elif attack_name == "alie":
                outs["alie_z"] = _close(out["alie_z"], "float64", C_ELEMENTWISE)
            elif attack_name in servers:
                outs["opt_tau"] = _close(out["opt_tau"], "float64", C_ELEMENTWISE,
                                         note="the attack factor the line search chose: a sum of its "
                                              "steps, decided by comparisons of the simulated aggregates")
                # J = ‖θ̄_rule(τ) − Σ_honest nᵢθᵢ/Σ_honest nᵢ‖: each of its D coordinates is a
                # difference of two aggregates of θ, each within the rounding of an aggregate
                theta_scale = _scale(out["upload_theta"]) + _scale(state["theta"])
                outs["opt_objective"] = _close(
                    out["opt_objective"], dtype, C_REDUCTION, np.sqrt(D) * theta_scale,
                    note="J at the chosen τ: the distance of the simulated aggregate θ from the honest "
                         "clients' nᵢ-weighted mean θ, the quantity the search maximises")
                outs["opt_evals"] = _exact(out["opt_evals"], role="informational")
            elif attack_name == "mimic":
                outs["mimic_client"] = _exact(out["mimic_client"], note="the id of the client copied")
            elif attack_name == "camouflage":
                outs["camouflaged_fraction"] = _exact(
                    out["camouflaged_fraction"], role="informational",
                    note="coordinates at the edge of the test on the step may fall either way in "
                         "another implementation's rounding")
            cases.append(Case(
                name, "attack", descriptions[attack_name + tag] + f"; Adam, round {t}, Byzantine rows 1, 4, 5",
                descriptions[attack_name + tag], "The attack rewrites only the Byzantine rows; gradient-space "
                "attacks push their gradient through the optimiser's rule (docs/attacks.md). Inputs 'honest_*' "
                "are the honest uploads before the attack.", "docs/attacks.md", dtype, params, inp, outs,
                f"uploads: rtol = {C_ELEMENTWISE}u, atol = {C_ELEMENTWISE}u·(max|upload| + max|state|)"))
    return cases


# ================================================================================== federated

class _RecordingOptimizer:
    """Forwards to an optimiser and keeps what the round loop passes through it."""

    def __init__(self, opt) -> None:
        self._opt = opt
        self.rounds: list[dict] = []

    def __getattr__(self, name):
        return getattr(self._opt, name)

    def new_round(self) -> None:
        self.rounds.append({})

    def client_rule_batch(self, state, grads, t, out, backend="numba", *, rows=None):
        self._opt.client_rule_batch(state, grads, t, out, backend, rows=rows)
        cur = self.rounds[-1]
        if rows is None and "grads" not in cur:
            n = grads.shape[0]
            cur["grads"] = np.array(grads, copy=True)
            cur["honest"] = {k: np.array(out[k][:n], copy=True) for k in self._opt.arrays}

    def recover_batch(self, state, uploads, t, out, backend="numba", *, rows=None):
        cur = self.rounds[-1]
        if "uploads" not in cur:
            cur["uploads"] = {k: np.array(uploads[k], copy=True) for k in self._opt.arrays}
        self._opt.recover_batch(state, uploads, t, out, backend, rows=rows)
        if "recovered" not in cur:
            cur["recovered"] = np.array(out[: uploads["theta"].shape[0]], copy=True)

    def verify_batch(self, state, uploads, t, recovered=None, backend="numba", **kw):
        cur = self.rounds[-1]
        if "uploads" not in cur:
            cur["uploads"] = {k: np.array(uploads[k], copy=True) for k in self._opt.arrays}
        res = self._opt.verify_batch(state, uploads, t, recovered=recovered, backend=backend, **kw)
        self.rounds[-1]["verified"] = np.asarray(res[0], dtype=bool).copy()
        return res

    def features_verify_batch(self, state, uploads, t, out, space="gradient", backend="numba",
                              **kw):
        # the round's one read of the uploads: recovery (gradient space) and verification
        cur = self.rounds[-1]
        if "uploads" not in cur:
            cur["uploads"] = {k: np.array(uploads[k], copy=True) for k in self._opt.arrays}
        res = self._opt.features_verify_batch(state, uploads, t, out, space, backend, **kw)
        if space == "gradient" and "recovered" not in cur:
            cur["recovered"] = np.array(out[: uploads["theta"].shape[0]], copy=True)
        cur["verified"] = np.asarray(res[0], dtype=bool).copy()
        return res


class _RecordingRule:
    def __init__(self, rule) -> None:
        self._rule = rule
        self.calls: list[dict] = []

    def __getattr__(self, name):
        return getattr(self._rule, name)

    def aggregate(self, features, arrays, n_samples, f, *, backend="numba"):
        res = self._rule.aggregate(features, arrays, n_samples, f, backend=backend)
        self.calls.append({"features": np.array(features, copy=True), "n_samples": np.array(n_samples),
                           "f": int(f), "result": res})
        return res


def compute_federated(inp, params, backend):
    from rfrs_ref.aggregate import RULES
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.federated.round import Federation, RoundBuffers, run_round
    from rfrs_ref.model import MODELS
    from rfrs_ref.optim import OPTIMIZERS

    train = _interactions(inp["indptr"], inp["indices"], params["n_items"])
    model = MODELS.get(params["model"])(n_items=int(params["n_items"]), **params["model_hyperparameters"])
    opt = _RecordingOptimizer(OPTIMIZERS.get(params["optimizer"])(**params["optimizer_hyperparameters"]))
    rule = _RecordingRule(RULES.get(params["rule"])(**params["rule_hyperparameters"]))
    attack = ATTACKS.get(params["attack"])(**params["attack_hyperparameters"])
    fed = Federation(model=model, optimizer=opt, rule=rule, detect=params["detect"], attack=attack,
                     train=train, byzantine=np.asarray(inp["byzantine"], dtype=bool),
                     client_fraction=float(params["client_fraction"]),
                     assumed_fraction=float(params["assumed_fraction"]), seed=int(params["seed"]),
                     verify=bool(params["verify"]), backend=backend,
                     # trace: the server materialises every recovered gradient
                     trace=True)
    theta0 = inp["theta0"]
    state = opt._opt.init(theta0)
    from rfrs_ref.federated.population import clients_per_round

    buf = RoundBuffers(clients_per_round(train.n_users, fed.client_fraction), model.n_params(),
                       theta0.dtype, opt.arrays)
    out: dict[str, Any] = {}
    for t in range(1, int(params["rounds"]) + 1):
        opt.new_round()
        n_calls = len(rule.calls)
        state, record = run_round(fed, state, t, buf)
        cur = opt.rounds[-1]
        p = f"r{t}_"
        clients = np.asarray(record["clients"], dtype=np.int64)
        byz = np.asarray(record["byzantine"], dtype=bool)
        out[p + "clients"] = clients
        out[p + "byzantine"] = byz
        out[p + "n_samples"] = np.asarray(record["n_samples"], dtype=np.int64)
        out[p + "f"] = int(record["f"])
        out[p + "f_rule"] = int(record["f_rule"])
        out[p + "grads"] = cur["grads"].astype(np.float64)
        for k in opt.arrays:
            out[p + f"honest_{k}"] = cur["honest"][k].astype(np.float64)
            out[p + f"uploads_{k}"] = cur["uploads"][k].astype(np.float64)
        if "recovered" in cur:
            out[p + "recovered"] = cur["recovered"].astype(np.float64)
        out[p + "verified"] = cur.get("verified", np.ones(clients.size, dtype=bool))
        if params["attack"] == "noise":
            k = int(byz.sum())
            out[p + "attack_noise"] = generator(int(params["seed"]), "attack", t).standard_normal(
                (k, model.n_params()))
        if len(rule.calls) > n_calls:
            call = rule.calls[-1]
            out[p + "rule_rows"] = np.flatnonzero(out[p + "verified"]).astype(np.int64)
            out[p + "features"] = call["features"].astype(np.float64)
            if params["rule"] == "krum":
                diag = call["result"].diagnostics
                out[p + "krum_scores"] = np.array([np.inf if s is None else s for s in diag["scores"]])
        if record["weights"] is not None:  # per-client rules; coordinate-wise rules have none
            out[p + "weights"] = np.asarray(record["weights"], dtype=np.float64)
        out[p + "kept"] = np.asarray(record["kept"], dtype=np.float64)
        for k in opt.arrays:
            out[p + f"state_{k}"] = np.asarray(state[k], dtype=np.float64)
    return out


def federated_cases() -> list[Case]:
    from rfrs_ref.model import FISM
    from rfrs_ref.params import values

    cases = []
    scenarios = [
        ("krum", "gradient", "ascent", "float64"),
        ("krum", "gradient", "ascent", "float32"),
        ("trmean", "parameter", "noise", "float64"),
    ]
    for rule, detect, attack, dtype in scenarios:
        name = f"federated/adam-{rule}-{detect}-{attack}-{_suffix(dtype)}"
        rng = _rng(name)
        n_users, n_items, d = 16, 12, 3
        sizes = [1] + list(rng.integers(2, 7, size=n_users - 1))
        lists = _user_lists(rng, n_users, n_items, sizes)
        indptr, indices = _csr(lists)
        byz = np.zeros(n_users, dtype=bool)
        byz[rng.choice(np.arange(1, n_users), size=4, replace=False)] = True
        model = FISM(n_items=n_items, dim=d, lam=1e-3, gamma=1.0)
        theta0 = (rng.normal(size=model.n_params()) * 0.3).astype(dtype)
        from rfrs_ref.aggregate import RULES
        from rfrs_ref.attack import ATTACKS

        attack_hyper = values(ATTACKS.get(attack)())
        if attack == "noise":
            attack_hyper["sigma"] = 0.05
        params = {"n_items": n_items, "model": "fism", "model_hyperparameters": values(model),
                  "optimizer": "adam", "optimizer_hyperparameters": {"lr": 0.05, "beta1": 0.9,
                                                                     "beta2": 0.999, "eps": 1e-8},
                  "rule": rule, "rule_hyperparameters": values(RULES.get(rule)()), "detect": detect,
                  "attack": attack, "attack_hyperparameters": attack_hyper,
                  "client_fraction": 0.5, "assumed_fraction": 0.25, "seed": SEED, "rounds": 3,
                  "verify": True}
        inp = {"indptr": indptr, "indices": indices, "theta0": theta0, "byzantine": byz}
        out = compute_federated(inp, params, "numpy")
        c = C_RUN if dtype == "float32" else C_REDUCTION
        outs: dict[str, Expected] = {}
        for key, value in out.items():
            base = key.split("_", 1)[1]
            if isinstance(value, np.ndarray) and value.dtype.kind in "iub":
                outs[key] = _exact(value)
            elif isinstance(value, (int, bool)):
                outs[key] = _exact(value)
            elif base == "attack_noise":
                outs[key] = _exact(value, note="the standard normals of the 'attack' stream, key t")
            elif base in ("weights", "kept"):
                outs[key] = _close(value, "float64", C_ELEMENTWISE, 1.0)
            elif base == "krum_scores":
                feats = out[key.replace("krum_scores", "features")]
                outs[key] = _close(value, dtype, c, _scale(feats) ** 2 * feats.shape[1])
            elif base in ("recovered", "features") and dtype == "float32":
                # recovery from float32 uploads cancels: its error is relative to the moments
                mscale = _scale(out[key[:3] + "uploads_m"]) / (1 - 0.9)
                outs[key] = _close(value, dtype, c, max(_scale(value), mscale))
            else:
                outs[key] = _close(value, dtype, c)
        desc = (f"three rounds of FISM (d = {d}) with Adam on {n_users} users and {n_items} items "
                f"(user 0 holds one item), e = 0.5, 4 Byzantine clients attacking with {attack}, "
                f"{rule} on {detect}-space features, f = floor(0.25 · 8) = 2, verification on")
        cases.append(Case(
            name, "federated", desc,
            "docs/training.md: sample, gradients on θ̄ᵗ⁻¹, client rule, attack, recovery, verification, "
            "features, rule, weighted combination",
            "Rounds are numbered from 1. Another implementation that cannot reproduce NumPy's "
            "generator takes r<t>_clients (and, for noise, r<t>_attack_noise) as given. Arrays "
            "r<t>_* with one row per sampled client follow r<t>_clients; r<t>_features are the rows "
            "that passed verification (r<t>_rule_rows), in that order; r<t>_weights (per-client rules "
            "only) and r<t>_kept are 0 for excluded clients; f_rule = max(0, f − excluded).",
            "docs/training.md", dtype, params, inp, outs,
            f"values: rtol = {c}u, atol = {c}u·max|value| (u of the case's dtype; a run accumulates "
            "roundings over rounds); recovered gradients and features in float32: atol scaled by "
            "max|m|/(1 − β₁), the magnitude recovery cancels; weights and kept: 64u of float64; "
            "clients, flags, selections exact"))
    return cases


# ===================================================================================== I/O

#: kind -> function(inputs, params, backend) -> outputs
KINDS: dict[str, Callable[[dict, dict, str], dict]] = {
    "fism_scores": compute_fism_scores,
    "bpr": compute_bpr,
    "optimizer": compute_optimizer,
    "aggregate": compute_aggregate,
    "attack": compute_attack,
    "federated": compute_federated,
}

#: case families, in export order
FAMILIES: dict[str, Callable[[], list[Case]]] = {
    "model": model_cases,
    "optim": optim_cases,
    "aggregate": aggregate_cases,
    "attack": attack_cases,
    "federated": federated_cases,
}


def _matches(name: str, patterns) -> bool:
    """``name`` matches a glob pattern, or lies under a pattern naming a folder."""
    return any(fnmatch.fnmatch(name, p) or name.startswith(p.rstrip("/") + "/") for p in patterns)


def all_cases(only: Iterable[str] | None = None) -> list[Case]:
    """Every case, or those whose name matches one of the patterns in ``only``
    (globs such as ``aggregate/krum-*``, or a family folder such as ``optim``)."""
    pats = list(only) if only else None
    out = []
    for family, make in FAMILIES.items():
        if pats and not any(fnmatch.fnmatch(family, p.split("/")[0]) for p in pats):
            continue
        out.extend(c for c in make() if pats is None or _matches(c.name, pats))
    return out


def _npy_bytes(a: np.ndarray) -> bytes:
    a = np.asarray(a)
    if a.dtype.kind == "f":
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    elif a.dtype.kind in "iu":
        a = a.astype(np.dtype(f"<{a.dtype.kind}8"), copy=False)
    elif a.dtype.kind == "b":
        a = a.astype(np.bool_, copy=False)
    else:
        raise TypeError(f"golden arrays must be float, integer or bool, got dtype {a.dtype}")
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(a), version=(1, 0), allow_pickle=False)
    return buf.getvalue()


def _json_value(v):
    if isinstance(v, (np.floating, float)):
        v = float(v)
        if not math.isfinite(v):
            raise ValueError(f"a JSON value must be finite (store non-finite values in an array), got {v}")
        return v
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    return v


def _array_meta(a: np.ndarray, file: str) -> dict:
    dt = np.dtype(a.dtype)
    name = {"f": str(dt), "i": "int64", "u": "int64", "b": "bool"}[dt.kind]
    return {"file": file, "dtype": name, "shape": list(a.shape)}


def write_case(root: pathlib.Path, case: Case) -> None:
    folder = root / case.name
    folder.mkdir(parents=True, exist_ok=True)
    meta_in = {}
    for k, a in sorted(case.inputs.items()):
        a = np.asarray(a)
        fname = f"in.{k}.npy"
        (folder / fname).write_bytes(_npy_bytes(a))
        meta_in[k] = _array_meta(a, fname)
    meta_out = {}
    for k, e in sorted(case.outputs.items()):
        entry: dict[str, Any] = {}
        if isinstance(e.value, np.ndarray):
            fname = f"out.{k}.npy"
            (folder / fname).write_bytes(_npy_bytes(e.value))
            entry.update(_array_meta(e.value, fname))
        else:
            entry["value"] = _json_value(e.value)
        if e.exact:
            entry["compare"] = "exact"
        else:
            entry.update({"compare": "close", "rtol": e.rtol, "atol": e.atol})
        entry["role"] = e.role
        if e.note:
            entry["note"] = e.note
        meta_out[k] = entry
    doc = {"format": FORMAT, "version": VERSION, "name": case.name, "kind": case.kind,
           "description": case.description, "formula": case.formula, "convention": case.convention,
           "reference": case.reference, "dtype": case.dtype, "params": _json_value(case.params),
           "inputs": meta_in, "outputs": meta_out, "tolerance": case.tolerance}
    (folder / "case.json").write_text(json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False,
                                                 allow_nan=False) + "\n", encoding="utf-8")


def export(directory, only: Iterable[str] | None = None) -> list[str]:
    """Write every case under ``directory`` (created; case folders replaced) and
    ``index.json``. Returns the case names. Same bytes on every export on one machine."""
    root = pathlib.Path(directory)
    # A directory prepared by someone else may hold links: a family folder linked
    # elsewhere would have a case folder there removed and rewritten, a linked
    # index.json its target overwritten. Every place written is checked first.
    where = f"{root} (export)"
    confined(root, "index.json", where, what="the index")
    cases = all_cases(only)
    if not cases:  # patterns that match no case: nothing to write, not even an empty index
        return []
    _refuse_foreign(root, where, cases)
    root.mkdir(parents=True, exist_ok=True)
    # one export at a time: two exports merging into one index would each read it before
    # the other wrote it, and one's cases would vanish from the index (never checked)
    lock = DirectoryLock(root)
    lock.acquire()
    try:
        return _export_locked(root, where, cases, only)
    finally:
        lock.release()


#: the files write_case puts in a case folder (an export cut short leaves some of them)
_CASE_FILE = re.compile(r"case\.json|(in|out)\.[^/]+\.npy")


def _refuse_foreign(root: pathlib.Path, where: str, cases) -> None:
    """Refuse, before anything is written, a directory the export would take from its
    owner: a run's directory (a sweep clears it when the run starts again), a results
    directory that a sweep wrote (its tables are there), its ``runs/`` folder or a folder in
    it (every entry there is a run directory of the sweep) or its ``figures/`` (where the
    sweep draws), an ``index.json`` that is not an index of golden vectors (the export
    replaces it), or, where no such index is, a case folder holding files an export does
    not write (the export removes and rewrites case folders)."""
    from rfrs_ref.experiments.results import (figures_folder_above, is_store,
                                              run_directory_above, runs_folder_above)

    owner = run_directory_above(root)
    if owner is not None:
        where = ("is a run's directory" if owner == root.resolve()
                 else f"lies in the directory of a run, {owner}")
        raise GoldenFormatError(f"{root} {where}, which is that run's alone (a sweep clears "
                                "it when the run starts again); export into another directory")
    if is_store(root):
        raise GoldenFormatError(f"{root} is a results directory (a sweep's tables are there), "
                                "which is its sweep's; export into another directory")
    runs = runs_folder_above(root)
    if runs is not None:
        raise GoldenFormatError(f"{root} is or lies inside {runs}, the runs/ folder of the "
                                f"results directory {runs.parent}, which holds only the run "
                                "directories of its sweep; export into another directory")
    figures = figures_folder_above(root)
    if figures is not None:
        raise GoldenFormatError(f"{root} is or lies inside {figures}, the figures/ folder of "
                                f"the results directory {figures.parent}, where its sweep "
                                "draws its figures; export into another directory")
    index = root / "index.json"
    if index.exists() or index.is_symlink():
        try:
            doc = read_json(index, "index of golden vectors", max_bytes=MAX_FILE_BYTES)
        except UntrustedFileError as exc:
            raise GoldenFormatError(f"{exc}; the export would replace it: move it away or "
                                    "export into another directory") from None
        if not (isinstance(doc, dict) and doc.get("format") == FORMAT):
            raise GoldenFormatError(f"{index} is not an index of golden vectors (no \"format\": "
                                    f"\"{FORMAT}\"); the export would replace it: it is left as it "
                                    "is, move it away or export into another directory")
        return
    for case in cases:
        confined(root, case.name, where, what="case folder")  # a link leading out: refused
        folder = root / case.name
        if folder.is_symlink() or not folder.is_dir():
            continue  # a link inside the vectors is replaced, its target kept
        foreign = sorted(e.name for e in folder.iterdir() if not _CASE_FILE.fullmatch(e.name))
        if foreign:
            raise GoldenFormatError(f"{folder} holds {foreign[0]!r}, which no export writes, and "
                                    f"{root} has no index of golden vectors: the export would "
                                    "remove the folder; move it away or export into another "
                                    "directory")


def _export_locked(root: pathlib.Path, where: str, cases, only) -> list[str]:
    from rfrs_ref import __version__

    prev_cases: list[dict] = []
    if only and (root / "index.json").exists():
        # the index is merged, not replaced: read it before anything is written
        prev_cases = [{k: v for k, v in c.items() if k != "folder"} for c in read_index(root)]
    for case in cases:
        confined(root, case.name, where, what="case folder")
    for case in cases:
        folder = root / case.name
        if folder.is_symlink():
            folder.unlink()  # a link inside the vectors: replaced by the folder, target kept
        elif folder.exists():
            shutil.rmtree(folder)
        write_case(root, case)
    index = {"format": FORMAT, "version": VERSION,
             "producer": {"name": "rfrs-ref", "version": __version__, "numpy": np.__version__},
             "seed": SEED,
             "cases": [{"name": c.name, "kind": c.kind, "dtype": c.dtype, "path": f"{c.name}/case.json"}
                       for c in cases]}
    if prev_cases:
        names = {c["name"] for c in index["cases"]}
        index["cases"] = sorted([c for c in prev_cases if c["name"] not in names]
                                + index["cases"], key=lambda c: c["name"])
    text = json.dumps(index, indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
    atomic_write(root / "index.json", lambda fh: fh.write(text.encode("utf-8")))
    return [c.name for c in cases]


# ===================================================================================== check

@dataclasses.dataclass
class Mismatch:
    """Where a recomputed output differs from the expected one."""

    output: str | None  # None: about the case as a whole (its inputs)
    index: tuple | None
    expected: Any
    got: Any
    tolerance: float | None
    count: int = 1
    size: int = 1
    message: str = ""

    def __str__(self) -> str:
        if self.message and self.output is None:  # about the case as a whole (its inputs)
            return self.message
        if self.message:
            return f"output {self.output!r}: {self.message}"
        where = "" if self.index is None else f" index {self.index}"
        tol = "" if self.tolerance is None else f" (|Δ| > tol {self.tolerance:.3g})"
        many = f"; {self.count} of {self.size} elements differ" if self.size > 1 else ""
        return f"output {self.output!r}{where}: expected {self.expected!r}, got {self.got!r}{tol}{many}"


@dataclasses.dataclass
class CaseResult:
    name: str
    backend: str
    ok: bool
    mismatches: list[Mismatch]
    error: str = ""

    def line(self) -> str:
        if self.ok:
            return f"ok    {self.name} [{self.backend}]"
        if self.error:
            return f"FAIL  {self.name} [{self.backend}]: {self.error}"
        return f"FAIL  {self.name} [{self.backend}]: " + "; ".join(str(m) for m in self.mismatches[:3])


def _py(x):
    if isinstance(x, np.generic):
        return x.item()
    return x


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def compare_output(name: str, spec: dict, expected, got) -> Mismatch | None:
    """Compare one recomputed output ``got`` (the candidate) with the case's ``expected``
    value (the reference) under ``spec``'s rule.

    ``close``: ``|got − expected| ≤ atol + rtol·|expected|`` elementwise, the
    tolerance from the expected value alone; ``exact`` (and every integer,
    boolean, string or null): equality, bit for bit once read as float64 except that any
    NaN matches any NaN (whatever its sign or payload): a float zero of the other sign than
    the expected one (−0.0 for 0.0) is a mismatch, which ``==`` would not see. An integer
    has no sign of zero (the int 0 matches −0.0, compared by value). Either way a NaN or
    infinite ``got`` where ``expected`` is finite is a mismatch, and a non-finite ``expected``
    is matched only by the same value (NaN by NaN, +inf by +inf): the rule of
    :mod:`rfrs_ref.agreement`. A ``spec`` that states no usable rule (unknown
    ``compare``, a tolerance that is negative, NaN or infinite) is a mismatch
    too: the case file is input and cannot declare anything equal. So is a
    finite tolerance so wide that 0 would match every element of an expected
    value that is not all zero (``rtol ≥ 1``, or ``atol`` above the largest
    |expected|): it checks nothing.

    An integer on either side (a selection, a count, a client id: an integer the
    recomputation gives, or an integer the case states) compares exactly whatever
    ``compare`` says: a case that states ``krum_selected`` as floats 1.1, 2.2 ... under
    ``close`` with rtol 0.25 does not thereby match the selection 1, 2 ...
    """
    how = spec.get("compare") if isinstance(spec, dict) else None
    if how not in ("exact", "close"):
        return Mismatch(name, None, None, None, None,
                        message=f"the case states no comparison rule ('compare' is {how!r}, not "
                                "'exact' or 'close')")
    rtol = atol = 0.0
    if how == "close":
        try:
            rtol, atol = agreement.check_tolerance(spec.get("rtol"), spec.get("atol"), "tolerance")
        except ValueError as exc:
            return Mismatch(name, None, None, None, None, message=f"unusable {exc}")
        vacuous = _vacuous(expected, rtol, atol)
        if vacuous:
            return Mismatch(name, None, None, None, None, message=vacuous)
    if got is None and expected is None:
        return None
    got = _py(got)
    if isinstance(expected, (np.ndarray, list)) or isinstance(got, (np.ndarray, list)):
        return _compare_arrays(name, how, rtol, atol, expected, got)
    if _is_number(expected) and _is_number(got):
        exact = how == "exact" or isinstance(expected, int) or isinstance(got, int)
        if isinstance(expected, int) and isinstance(got, int):
            ok = expected == got
        else:
            ok = agreement.agrees(expected, got, *((0.0, 0.0) if exact else (rtol, atol)))
            if ok and exact and math.isfinite(agreement.as_float(expected)) \
                    and math.isfinite(agreement.as_float(got)):
                # Python compares an int and a float by value, exactly: 2**53 + 1 is not the
                # float 2**53, which it rounds to in float64
                ok = expected == got
        if ok and how == "exact" and _zero_signs_differ(expected, got):
            return Mismatch(name, None, expected, got, None, message=_ZERO_SIGN.format(
                got=got, expected=_py(expected), where=""))
        if ok:
            return None
        tol = None if exact else float(agreement.tolerance(agreement.as_float(expected), rtol, atol))
        return Mismatch(name, None, expected, got, tol)
    if expected != got or type(expected) is not type(got):
        return Mismatch(name, None, expected, got, None)
    return None


#: why an exact comparison fails a zero of the other sign (a Mismatch message)
_ZERO_SIGN = ("{where}got {got!r}, expected {expected!r}: the sign of zero differs under exact "
              "comparison (−0.0 is not 0.0; only a NaN matches any NaN, whatever its sign or payload)")


def _zero_signs_differ(expected, got):
    """Elementwise: True where ``expected`` and ``got`` are both float zeros of opposite
    signs (−0.0 against 0.0), which ``==`` calls equal and an exact comparison does not.
    An integer has no sign of zero: where either side is an integer (a Python ``int``, an
    integer or boolean array) this is False, the values being compared by value."""
    if isinstance(expected, float) and isinstance(got, float):
        return expected == 0.0 == got and math.copysign(1.0, expected) != math.copysign(1.0, got)
    e, g = np.asarray(expected), np.asarray(got)
    if e.dtype.kind != "f" or g.dtype.kind != "f":
        return np.zeros(np.broadcast_shapes(e.shape, g.shape), dtype=bool)
    return (e == 0) & (g == 0) & (np.signbit(e) != np.signbit(g))


def _vacuous(expected, rtol: float, atol: float) -> str:
    """Why the tolerance checks nothing ('' when it checks something): 0 would match every
    element of ``expected``, which has a finite non-zero element (an expected value that
    is all zero or non-finite has no magnitude to judge the tolerance by)."""
    try:
        e = np.asarray(expected, dtype=np.float64)
    except (ValueError, TypeError, OverflowError):
        return ""  # not numbers: the comparison itself reports it
    nonzero = np.isfinite(e) & (e != 0)
    if not nonzero.any():
        return ""
    if agreement.disagree(e[nonzero], 0.0, rtol, atol).any():
        return ""
    return (f"unusable tolerance: rtol = {rtol:g}, atol = {atol:g} would accept 0 for every "
            f"element (largest |expected| {float(np.abs(e[nonzero]).max()):.3g}): it checks nothing")


def _compare_arrays(name, how, rtol, atol, expected, got) -> Mismatch | None:
    try:
        e = np.asarray(expected)
        g = np.asarray(got)
    except (ValueError, TypeError, OverflowError):
        return Mismatch(name, None, None, None, None, message="the expected value is not a rectangular "
                        "array of numbers")
    if e.shape != g.shape:
        return Mismatch(name, None, None, None, None, message=f"shape {g.shape}, expected {e.shape}")
    if how == "close" and e.size == 0:
        # a float output with no element (inputs cut to zero columns) compares no value;
        # an empty exact list (no client selected) still states something: its length
        return Mismatch(name, None, None, None, None, message=f"the expected value has shape {e.shape}, "
                        "no element: it checks nothing")
    if e.dtype.kind not in "fiub" or g.dtype.kind not in "fiub":
        if e.dtype.kind == g.dtype.kind == "U" and (e == g).all():
            return None
        return Mismatch(name, None, None, None, None,
                        message=f"expected an array of {e.dtype.kind!r} kind, got one of {g.dtype.kind!r} kind"
                        if e.dtype.kind != g.dtype.kind else "the values differ")
    if (e.dtype.kind == "b") != (g.dtype.kind == "b") and e.size:
        # a flag is a flag: [true, false] is not [1, 0] (an empty JSON list has no dtype)
        return Mismatch(name, None, None, None, None,
                        message=f"expected an array of {e.dtype}, got one of {g.dtype}: a "
                        "boolean output is compared with booleans only")
    flags = _bool_elements(expected, e) != _bool_elements(got, g)
    if flags.any():
        # a JSON list mixing booleans and numbers ([true, 2]) reads as integers, true as 1:
        # element by element too, a boolean matches a boolean only
        idx = tuple(int(i) for i in np.argwhere(flags)[0])
        return Mismatch(name, idx, _element(expected, idx), _element(got, idx), None,
                        message=f"index {idx}: expected {_element(expected, idx)!r}, got "
                        f"{_element(got, idx)!r}: a boolean is compared with booleans only (a "
                        "list that mixes booleans and numbers)")
    tol = None
    ints = np.zeros(e.shape, dtype=bool)  # integers of a list that NumPy read as floats
    if e.dtype.kind in "iub" and g.dtype.kind in "iub":
        bad = e != g  # integers beyond 2**53 would collide in float64
    elif how == "exact" or e.dtype.kind in "iub" or g.dtype.kind in "iub":
        bad = agreement.disagree(e, g)  # an integer on either side is compared exactly
        if how == "exact":
            # bit for bit: −0.0 is not 0.0 (NumPy's == says it is); any NaN still matches any
            # NaN. Integers written in a list of floats are compared by value below.
            bad = bad | _zero_signs_differ(e, g)
        if (e.dtype.kind in "iu") != (g.dtype.kind in "iu"):
            # in float64 an int64 beyond 2**53 rounds to a float it is not: compare the
            # finite pairs as Python numbers, an int and a float by value, exactly
            with np.errstate(invalid="ignore"):
                fin = np.isfinite(e.astype(np.float64)) & np.isfinite(g.astype(np.float64))
            bad = bad | (fin & (e.astype(object) != g.astype(object)))
    else:
        bad = agreement.disagree(e, g, rtol, atol)
        tol = agreement.tolerance(e, rtol, atol)
    if e.dtype.kind == "f" or g.dtype.kind == "f":
        # a JSON list mixing integers and floats ([1, 2.5]) reads as floats: its integers
        # (and those of a recomputed list) are still compared exactly, one by one, by value
        ints = _int_elements(expected, e.shape) | _int_elements(got, g.shape)
        if ints.any():
            at = [tuple(int(i) for i in w) for w in np.argwhere(ints)]
            # as written: float64 rounds the int 2**53 + 1 of a list to the float 2**53
            eo = [_element(expected, w) for w in at]
            go = [_element(got, w) for w in at]
            bad = np.array(bad, dtype=bool, copy=True)
            bad[ints] = agreement.disagree(e[ints], g[ints]) | np.array(
                [_finite(x) and _finite(y) and x != y for x, y in zip(eo, go)], dtype=bool)
    if not bad.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
    tv = None if tol is None or ints[idx] else float(np.asarray(tol)[idx] if np.ndim(tol) else tol)
    exact_e = _element(expected, idx) if ints[idx] else _py(e[idx])
    exact_g = _element(got, idx) if ints[idx] else _py(g[idx])
    if how == "exact" and not ints[idx] and _zero_signs_differ(exact_e, exact_g):
        many = f"; {int(bad.sum())} of {int(bad.size)} elements differ" if bad.size > 1 else ""
        return Mismatch(name, idx, exact_e, exact_g, None, int(bad.sum()), int(bad.size),
                        message=_ZERO_SIGN.format(got=exact_g, expected=exact_e,
                                                  where=f"index {idx}: " if idx else "") + many)
    return Mismatch(name, idx, exact_e, exact_g, tv, int(bad.sum()), int(bad.size))


def _int_elements(value, shape: tuple) -> np.ndarray:
    """Which elements of ``value`` (of ``shape``, as NumPy reads it) are integers written as
    such: the ints (not booleans) of a list, such as a JSON list that NumPy reads as floats
    because it also holds floats. All False for an array."""
    mask = np.zeros(shape, dtype=bool)
    if not isinstance(value, list):
        return mask
    stack = [(value, ())]
    while stack:
        x, at = stack.pop()
        if isinstance(x, list):
            stack.extend((v, at + (i,)) for i, v in enumerate(x))
        elif isinstance(x, (int, np.integer)) and not isinstance(x, bool) and len(at) == len(shape):
            mask[at] = True
    return mask


def _bool_elements(value, array: np.ndarray) -> np.ndarray:
    """Which elements of ``value`` (read by NumPy as ``array``) are booleans: all of an array
    of booleans, none of another array, and those written as booleans in a list (which NumPy
    reads as integers when the list also holds numbers: ``[true, 2]`` is ``[1, 2]``)."""
    if not isinstance(value, list):
        return np.full(array.shape, array.dtype.kind == "b")
    mask = np.zeros(array.shape, dtype=bool)
    stack = [(value, ())]
    while stack:
        x, at = stack.pop()
        if isinstance(x, list):
            stack.extend((v, at + (i,)) for i, v in enumerate(x))
        elif isinstance(x, (bool, np.bool_)) and len(at) == array.ndim:
            mask[at] = True
    return mask


def _finite(x) -> bool:
    """Whether the number ``x`` (an int of any size, a float) is finite."""
    return isinstance(x, int) or math.isfinite(x)


def _element(value, idx: tuple):
    """Element ``idx`` of ``value`` as written (a list's int stays an int)."""
    if isinstance(value, list):
        for i in idx:
            value = value[i]
        return value
    return _py(np.asarray(value)[idx])


#: the dtypes case.json may state for an array (what export writes), and the ``descr`` of
#: each in the file's header
ARRAY_DTYPES = ("float32", "float64", "int64", "bool")
_DESCR = {"float32": "<f4", "float64": "<f8", "int64": "<i8", "bool": "|b1"}


def _array(folder: pathlib.Path, meta: dict, key: str, where: str) -> np.ndarray:
    """The array that entry ``key`` of case.json names, confined to the case's folder, in
    the documented layout (``.npy`` version 1.0, C order, little-endian: ``read_npy``'s
    ``strict``) and checked against the dtype and shape the entry states."""
    src = str(folder / "case.json")
    path = confined(folder, meta.get("file"), src, what=f"{where} {key!r}: file")
    a = read_npy(path, src, strict=True, max_bytes=MAX_FILE_BYTES)
    dtype, shape = meta.get("dtype"), meta.get("shape")
    if dtype not in ARRAY_DTYPES or a.dtype.str != _DESCR[dtype]:
        raise GoldenFormatError(f"{src}: {where} {key!r}: {path.name} holds {a.dtype}, the case states "
                                f"dtype {dtype!r} (one of {', '.join(ARRAY_DTYPES)})")
    if not isinstance(shape, list) or list(a.shape) != shape:
        raise GoldenFormatError(f"{src}: {where} {key!r}: {path.name} has shape {list(a.shape)}, the "
                                f"case states {shape!r}")
    return a.astype(a.dtype.newbyteorder("="), copy=False)


def _entries(meta: dict, key: str, src: str) -> dict:
    v = meta.get(key)
    if not isinstance(v, dict) or not all(isinstance(m, dict) for m in v.values()):
        raise GoldenFormatError(f"{src}: {key!r} must be an object of name -> entry objects")
    return v


def load_case(folder) -> tuple[dict, dict, dict]:
    """(case.json, inputs, expected outputs) of one case folder.

    The case folder's files are input: every array file named in case.json
    must lie inside the folder (no ``..``, no absolute path, no symbolic link
    leading out), be a plain ``.npy`` of the stated dtype and shape; anything
    else raises :class:`GoldenFormatError` (a ``ValueError``) naming the file.
    """
    folder = pathlib.Path(folder)
    src = folder / "case.json"
    meta = read_json(src, "case.json", max_bytes=MAX_FILE_BYTES)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION \
            or isinstance(meta.get("version"), bool):
        got = (meta.get("format"), meta.get("version")) if isinstance(meta, dict) else (None, None)
        raise GoldenFormatError(f"{src}: not a {FORMAT} version {VERSION} case "
                                f"(format {got[0]!r}, version {got[1]!r})")
    if depth_exceeds(meta, MAX_DEPTH):
        raise GoldenFormatError(f"{src}: nested more than {MAX_DEPTH} levels deep")
    if not isinstance(meta.get("name"), str) or not isinstance(meta.get("params"), dict):
        raise GoldenFormatError(f"{src}: 'name' must be a string and 'params' an object")
    inputs = {k: _array(folder, m, k, "input") for k, m in _entries(meta, "inputs", str(src)).items()}
    expected = {}
    for k, m in _entries(meta, "outputs", str(src)).items():
        expected[k] = _array(folder, m, k, "output") if "file" in m else m.get("value")
    return meta, inputs, expected


#: the parameters a case may state that set how long a recomputation loops or how much
#: memory it takes, and the most a case may state: far above every export, at least every
#: reference setting, and no more than a small case needs (10¹² Weiszfeld steps or A-hum
#: steps would never end; 10⁸ items would allocate gigabytes per client). The loop counts:
#: RFA's ``max_iter`` (exports 100), centered clipping's ``iterations`` (2), the optimal
#: attacks' ``evals`` (12; default 20), MDA's and SMEA's ``max_subsets`` (rfrs-ref's own
#: cap) and a-ra's ``hum_steps`` (A-hum: 30). The sizes: a model's ``n_items`` (exports
#: 11 and 12) and ``dim`` (3; default 64), its sampled
#: ``negatives`` per positive (3), a-ra's ``samples`` per Byzantine client (10) and
#: ``n_targets`` (1). Every other count a case states is bounded by its input arrays
#: (Krum's k and bucketing's bucket size by the rows, an index by the clients), by the
#: outputs it states (a federated run's ``rounds``, see :func:`_implausible`) or loops over
#: nothing (an optimiser's round t sets powers, not steps).
LOOP_LIMITS = {"max_iter": 10_000, "iterations": 10_000, "evals": 10_000, "max_subsets": 10_000_000,
               "hum_steps": 1_000,
               "n_items": 1_000, "dim": 64, "negatives": 100, "samples": 100, "n_targets": 100}


def _loop_counts(x, path: str = "params"):
    """(path, key, value) of every LOOP_LIMITS key nested in ``x``, wherever it is (a rule's
    hyperparameters, an attack's, a model's, or ``params`` itself)."""
    stack = [(x, path)]
    while stack:
        obj, where = stack.pop()
        if isinstance(obj, dict):
            for k, v in obj.items():
                if k in LOOP_LIMITS:
                    yield f"{where}.{k}", k, v
                stack.append((v, f"{where}.{k}"))
        elif isinstance(obj, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(obj))


#: the most rows an input matrix of a case may have (an export's have at most a dozen):
#: the pairwise rules' work and memory grow with n² (Krum's distance matrix), so a case of
#: 16 MiB holding two million rows of one value would need terabytes
MAX_ROWS = 4096


def _implausible_inputs(inputs: dict) -> str:
    """Why the input arrays of a case are larger than a golden case can be ('' if not)."""
    for key, a in inputs.items():
        shape = np.shape(a)
        if len(shape) >= 2 and shape[0] > MAX_ROWS:
            return (f"input {key!r} has {shape[0]:,} rows: a golden case holds at most "
                    f"{MAX_ROWS:,} (the pairwise rules' work and memory grow with the square of "
                    "the rows)")
    return ""


#: the scalars of ``params`` that the recomputation converts itself (``int(params["f"])``,
#: ``bool(params["verify"])``, ...), and the JSON type each must have: a conversion would
#: otherwise compute something else than the case states and still pass it (f = 2.9 run as
#: f = 2, ``"verify": "false"`` run with verification, since ``bool("false")`` is True). The
#: hyperparameters are checked by the rules, optimisers and attacks they are given to.
PARAM_TYPES = {"f": "integer", "t": "integer", "seed": "integer", "verify": "boolean",
               "client_fraction": "number", "assumed_fraction": "number"}


def _mistyped(params: dict) -> str:
    """Why a scalar of ``params`` that the recomputation converts (:data:`PARAM_TYPES`) has
    another JSON type than it must ('' when none has)."""
    for key, what in PARAM_TYPES.items():
        if key not in params:
            continue  # the recomputation reports what it needs and lacks
        v = params[key]
        ok = (isinstance(v, bool) if what == "boolean" else
              isinstance(v, int) and not isinstance(v, bool) if what == "integer" else
              isinstance(v, (int, float)) and not isinstance(v, bool))
        if not ok:
            shown = describe_object(v, 40)
            return (f"params.{key} is {shown} ({type(v).__name__}): it must be a JSON {what}, or "
                    "the recomputation would convert it into another value than the case states")
    return ""


#: the parameters a case of each kind takes, as the export writes them: every one takes
#: part in the recomputation but ``negatives_drawn_with`` (a ``bpr`` case's account of how
#: its input ``negatives`` were drawn) and an ``aggregate`` case's ``detect`` (the space
#: its input ``features`` are in, checked against them by :func:`detect_disagrees`). Any
#: other key would be stated without taking part (a typo ``"trimm": 3``, a parameter of
#: another kind), and a case passing with it would vouch for a parameter nothing used:
#: :func:`unused_params` refuses it. Every key of :data:`PARAM_TYPES` is among them.
CASE_PARAMS = {
    "fism_scores": ("model", "n_items", "hyperparameters"),
    "bpr": ("model", "n_items", "hyperparameters", "negatives_drawn_with"),
    "optimizer": ("optimizer", "hyperparameters", "t", "tampered"),
    "aggregate": ("rule", "hyperparameters", "f", "detect", "pre", "pre_hyperparameters"),
    "attack": ("optimizer", "hyperparameters", "attack", "attack_hyperparameters", "t", "f", "seed"),
    "federated": ("n_items", "model", "model_hyperparameters", "optimizer", "optimizer_hyperparameters",
                  "rule", "rule_hyperparameters", "detect", "attack", "attack_hyperparameters",
                  "client_fraction", "assumed_fraction", "seed", "rounds", "verify"),
}
#: the attacks that simulate the server's aggregation (they read the attack context's
#: rule and detection space), and the parameters that name that server in an ``attack``
#: case: given for another attack, they would take no part
SERVER_ATTACKS = ("opt-ipm", "opt-alie")
SERVER_PARAMS = ("rule", "rule_hyperparameters", "detect")
#: kind -> {params key holding hyperparameters: (registry, the params key naming the entry)}
_HYPER_OWNERS = {
    "fism_scores": {"hyperparameters": ("MODELS", "model")},
    "bpr": {"hyperparameters": ("MODELS", "model")},
    "optimizer": {"hyperparameters": ("OPTIMIZERS", "optimizer")},
    "aggregate": {"hyperparameters": ("RULES", "rule")},
    "attack": {"hyperparameters": ("OPTIMIZERS", "optimizer"),
               "attack_hyperparameters": ("ATTACKS", "attack"),
               "rule_hyperparameters": ("RULES", "rule")},
    "federated": {"model_hyperparameters": ("MODELS", "model"),
                  "optimizer_hyperparameters": ("OPTIMIZERS", "optimizer"),
                  "rule_hyperparameters": ("RULES", "rule"),
                  "attack_hyperparameters": ("ATTACKS", "attack")},
}


def _registry(name: str):
    from rfrs_ref.aggregate import PRE, RULES
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.model import MODELS
    from rfrs_ref.optim import OPTIMIZERS

    return {"MODELS": MODELS, "OPTIMIZERS": OPTIMIZERS, "RULES": RULES, "ATTACKS": ATTACKS,
            "PRE": PRE}[name]


def _key(key) -> str:
    """A key of case.json as a message shows it: itself when it is printable and short, else
    described (a lone surrogate, a key of a thousand characters)."""
    return key if isinstance(key, str) and key.isprintable() and 0 < len(key) <= 40 \
        else describe_object(key, 40)


def _unknown_hyperparameters(where: str, registry, entry, hyper) -> str:
    """Why the hyperparameters ``hyper`` (at ``where``) hold a key that entry ``entry`` of
    ``registry`` does not declare ('' when none; also when ``entry`` or ``hyper`` is not
    usable, which the recomputation reports)."""
    from rfrs_ref.params import hyperparameters

    if not isinstance(hyper, dict) or not isinstance(entry, str) or entry not in registry:
        return ""
    takes = [h.name for h in hyperparameters(registry.get(entry))]
    for key in hyper:
        if key not in takes:
            return (f"{where}.{_key(key)} is not a hyperparameter of "
                    f"{registry.family} {entry!r} (it takes: {', '.join(takes) or 'none'})")
    return ""


def unused_params(src: str, meta: dict) -> str:
    """Why the ``params`` of a case (``case.json`` at ``src``) hold a key the recomputation
    of its kind does not take ('' when none): a key outside :data:`CASE_PARAMS` (and, in an
    ``attack`` case, a server's parameters, :data:`SERVER_PARAMS`, for an attack outside
    :data:`SERVER_ATTACKS`), a hyperparameter the entry it is given to does not declare, or
    hyperparameters of a pre-aggregator that ``params.pre`` does not list. Each message
    names the file, the key and the keys that are taken."""
    params, kind = meta["params"], meta.get("kind")
    if kind not in CASE_PARAMS:
        return ""
    takes = list(CASE_PARAMS[kind])
    whose = f"an {kind} case" if kind[0] in "aeiou" else f"a {kind} case"
    if kind == "attack" and params.get("attack") in SERVER_ATTACKS:
        takes += SERVER_PARAMS
    elif kind == "attack":
        whose += f" whose attack is {describe_object(params.get('attack'), 40)} (only " \
                 f"{' and '.join(SERVER_ATTACKS)} simulate the server, named by {', '.join(SERVER_PARAMS)})"
    for key in params:
        if key not in takes:
            return (f"{src}: params.{_key(key)} is not a parameter of {whose}: it would "
                    f"take no part in the recomputation (the parameters it takes: {', '.join(sorted(takes))})")
    for key, (registry, owner) in _HYPER_OWNERS[kind].items():
        if key in params:
            why = _unknown_hyperparameters(f"params.{key}", _registry(registry), params.get(owner),
                                           params[key])
            if why:
                return f"{src}: {why}"
    pre_hyper = params.get("pre_hyperparameters")
    if kind == "aggregate" and isinstance(pre_hyper, dict):
        pre = params.get("pre") or []
        chain = [p for p in pre if isinstance(p, str)] if isinstance(pre, list) else []
        for name, hyper in pre_hyper.items():
            where = f"params.pre_hyperparameters.{_key(name)}"
            if name not in chain:
                listed = (f"params.pre lists {', '.join(chain)}" if chain
                          else "params.pre lists no pre-aggregator")
                return (f"{src}: {where}: {describe_object(name, 40)} is not a pre-aggregator of the "
                        f"case ({listed}): its hyperparameters would take no part in the "
                        "recomputation (list it in params.pre, or remove them)")
            why = _unknown_hyperparameters(where, _registry("PRE"), name, hyper)
            if why:
                return f"{src}: {why}"
    return ""


def dtype_field_disagrees(src: str, meta: dict, inputs: dict) -> str:
    """Why the ``dtype`` field of a case (``case.json`` at ``src``) is not the dtype of its
    floating-point inputs ('' when it is): ``float32`` or ``float64``, the dtype of every
    floating-point input but :data:`FLOAT64_INPUTS` (float64 in every case). Another
    implementation computes in the dtype the case states; a case stating ``float32`` over
    float64 inputs would have it check a float32 computation against a float64 one."""
    dtype = meta.get("dtype")
    if dtype not in ("float32", "float64"):
        return (f"{src}: dtype is {describe_object(dtype, 40)}: it must be 'float32' or 'float64', "
                "the dtype of the case's floating-point inputs")
    for key in sorted(inputs):
        a = np.asarray(inputs[key])
        if a.dtype.kind in "fc" and key not in FLOAT64_INPUTS and a.dtype != np.dtype(dtype):
            return (f"{src}: dtype is {dtype!r}, but the case's floating-point inputs are {a.dtype} "
                    f"(input {key!r}): the dtype a case states is that of its inputs")
    return ""


#: the fields of a case.json, as :func:`write_case` writes them: what a recomputation reads
#: (``format``, ``version``, ``name``, ``kind``, ``dtype``, ``params``, ``inputs``,
#: ``outputs``) and the text that tells a reader the case (``description``, ``formula``,
#: ``convention``, ``reference``, ``tolerance``). Any other key (a misspelt ``"outptus"``,
#: a ``"tolerances"`` object) would state something no check reads: :func:`unknown_fields`
#: refuses it.
CASE_FIELDS = ("convention", "description", "dtype", "format", "formula", "inputs", "kind", "name",
               "outputs", "params", "reference", "tolerance", "version")


def unknown_fields(src: str, meta: dict) -> str:
    """Why case.json (at ``src``) holds a key outside :data:`CASE_FIELDS` ('' when it holds
    none): such a key takes no part in the check, and a case passing with it would vouch
    for something nothing read (a misspelt ``"outptus"`` beside the real outputs)."""
    for key in meta:
        if key not in CASE_FIELDS:
            return (f"{src}: {describe_object(key, 40)} is not a field of a case: it would take no "
                    f"part in the check (the fields of case.json: {', '.join(CASE_FIELDS)})")
    return ""


#: the fields of an index.json entry that repeat what its case's case.json states
INDEX_FIELDS = ("kind", "dtype")


def index_disagrees(where: str, entry: dict, src: str, meta: dict) -> str:
    """Why the index.json entry ``entry`` (named by ``where``: the index, the entry's number
    and name) states another ``kind`` or ``dtype`` (:data:`INDEX_FIELDS`) than the case's
    own case.json at ``src`` ('' when both agree). A reader choosing cases from the index
    (an implementation's float32 cases, its aggregate cases) would otherwise run a case as
    something it is not, or leave it out, while the check passed it."""
    for field in INDEX_FIELDS:
        listed, own = entry.get(field), meta.get(field)
        if field not in entry or listed != own or type(listed) is not type(own):
            stated = (f"states {field} {describe_object(listed, 40)}" if field in entry
                      else f"states no {field}")
            return (f"{where} {stated}, but {src} states {field} {describe_object(own, 40)}: an entry "
                    "states its case's own kind and dtype")
    return ""


#: the spaces an aggregate case's input ``features`` may be in (its ``params.detect``)
DETECT_SPACES = ("gradient", "parameter")


def detect_disagrees(src: str, meta: dict, inputs: dict) -> str:
    """Why an ``aggregate`` case's ``params.detect`` (case.json at ``src``) is not the space
    of its input ``features`` ('' when it is, and for other kinds, whose recomputation reads
    ``detect``). The rule sees the features only; ``detect`` says how they were made:

    - ``parameter``: features = θᵢ − θ̄ (:func:`rfrs_ref.aggregate.parameter_features` of
      the inputs ``upload_theta`` and ``theta_bar``), one subtraction in the case's dtype,
      which IEEE arithmetic rounds the same way everywhere: compared bit for bit (a zero
      of the other sign differs, any NaN matches a NaN);
    - ``gradient``: the case holds no ``theta_bar``, which would take no part. Features
      recovered from the uploads are not checked: recovering them needs the optimiser,
      its state and the round, which an aggregate case does not hold (and the ties case's
      features are integer gradients, not recovered ones)."""
    params = meta["params"]
    if meta.get("kind") != "aggregate":
        return ""
    detect = params.get("detect")
    if detect not in DETECT_SPACES:
        return (f"{src}: params.detect is {describe_object(detect, 40)}: it must be "
                f"{' or '.join(map(repr, DETECT_SPACES))}, the space of the input 'features'")
    if detect == "gradient":
        if "theta_bar" in inputs:
            return (f"{src}: params.detect is 'gradient', but the case holds the input 'theta_bar', "
                    "from which only parameter-space features are made: it would take no part in the "
                    "check (state detect 'parameter', or remove it)")
        return ""
    missing = [k for k in ("features", "upload_theta", "theta_bar") if k not in inputs]
    if missing:
        return (f"{src}: params.detect is 'parameter', but the case has no input {missing[0]!r}: "
                "parameter-space features are upload_theta − theta_bar, row by row")
    X, T, tb = (np.asarray(inputs[k]) for k in ("features", "upload_theta", "theta_bar"))
    if (T.dtype.kind != "f" or X.dtype != T.dtype or tb.dtype != T.dtype or T.ndim != 2
            or X.shape != T.shape or tb.shape != (T.shape[1],)):
        return (f"{src}: params.detect is 'parameter', but input 'features' ({X.dtype}, shape "
                f"{list(X.shape)}) cannot be upload_theta − theta_bar (upload_theta {T.dtype}, shape "
                f"{list(T.shape)}; theta_bar {tb.dtype}, shape {list(tb.shape)})")
    from rfrs_ref.aggregate import parameter_features

    want = parameter_features(T, tb)
    with np.errstate(invalid="ignore"):
        same = ((X == want) & (np.signbit(X) == np.signbit(want))) | (np.isnan(X) & np.isnan(want))
    if not same.all():
        idx = tuple(int(i) for i in np.argwhere(~same)[0])
        return (f"{src}: params.detect is 'parameter', but input 'features' at index {idx} is "
                f"{X[idx].item()!r} where upload_theta − theta_bar is {want[idx].item()!r}: "
                "parameter-space features are θᵢ − θ̄, bit for bit")
    return ""


#: the suffix of a case's name and the dtype of its floating-point inputs
SUFFIX_DTYPES = {"-f32": np.dtype(np.float32), "-f64": np.dtype(np.float64)}
#: inputs held in float64 whatever the case's dtype: state rfrs-ref keeps in float64
#: (centered clipping's previous centre) and draws made in float64 (the noise attack's
#: standard normals)
FLOAT64_INPUTS = ("cc_center", "noise")


def dtype_disagrees(name: str, inputs: dict) -> str:
    """Why the floating-point inputs of case ``name`` disagree with its name's suffix ('' if
    they agree, or the name has no ``-f32``/``-f64`` suffix).

    The suffix is the dtype of the case's floating-point inputs, and the tolerance the
    export gives a case of that name (which bounds what the case may state) is that
    dtype's: a case named ``-f32`` holding float64 inputs would check a float64
    computation within float32's tolerance. Every floating-point input has the suffix's
    dtype, except :data:`FLOAT64_INPUTS`, float64 in every case."""
    want = next((d for suffix, d in SUFFIX_DTYPES.items() if name.endswith(suffix)), None)
    if want is None:
        return ""
    for key in sorted(inputs):
        a = np.asarray(inputs[key])
        if a.dtype.kind not in "fc":
            continue
        if key in FLOAT64_INPUTS:
            if a.dtype != np.float64:
                return f"input {key!r} is {a.dtype}: it is float64 in every case"
        elif a.dtype != want:
            suffix = name[name.rfind("-"):]
            return (f"input {key!r} is {a.dtype}, but the case is named {suffix!r}: its "
                    f"floating-point inputs are {want} (the suffix is their dtype, and the "
                    f"tolerances a case of that name may state are {want}'s)")
    return ""


def _implausible(meta: dict) -> str:
    """Why the parameters of a case cannot be what it states, before recomputing it
    ('' when they can). The models and rules check their own preconditions; what remains
    is how long the recomputation loops and how much it allocates, which nothing else
    bounds: the length of a federated run (a case.json claiming 10⁹ rounds would run for days)
    and the loop counts and sizes of :data:`LOOP_LIMITS`, each refused above its limit in
    one line naming the parameter, its value and the limit. A scalar the recomputation
    converts (:data:`PARAM_TYPES`) must have its JSON type (:func:`_mistyped`)."""
    mistyped = _mistyped(meta["params"])
    if mistyped:
        return mistyped
    for where, key, v in _loop_counts(meta["params"]):
        if not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= LOOP_LIMITS[key]):
            shown = describe_object(v, 40)
            return (f"{where} is {shown}: it must be an integer from 0 to {LOOP_LIMITS[key]:,} (a golden "
                    "case is small; more would loop for hours or exhaust memory)")
    if meta.get("kind") != "federated":
        return ""
    rounds = meta["params"].get("rounds")
    # ASCII digits only: str.isdigit accepts '²', which int() does not read
    stated = {k.split("_", 1)[0] for k in meta["outputs"]
              if re.fullmatch(r"r[0-9]+", k.split("_", 1)[0])}
    if not (isinstance(rounds, int) and not isinstance(rounds, bool) and 1 <= rounds == len(stated)
            and stated == {f"r{t}" for t in range(1, rounds + 1)}):
        return (f"params.rounds is {rounds!r}, but the outputs describe rounds "
                f"{sorted(int(x[1:]) for x in stated)}: they must describe rounds 1 to params.rounds")
    return ""


#: how far a stated tolerance may exceed the exported one (relative): an exported ``atol``
#: scales with the magnitude of values recomputed by NumPy, which another machine may round
#: differently in their last bits; 1e-9 leaves those bits and nothing a check could notice
TOLERANCE_SLACK = 1e-9


@functools.lru_cache(maxsize=None)
def _exported_cases(family: str) -> dict[str, Case]:
    """case name -> the :class:`Case` :func:`export` writes for the cases of ``family``:
    built by the exporter's own code, once per process."""
    return {c.name: c for c in FAMILIES[family]()}


def _exported_case(case: str) -> Case | None:
    family = case.split("/", 1)[0]
    if family not in FAMILIES:
        return None
    return _exported_cases(family).get(case)


def exported_tolerance(case: str, output: str) -> tuple[float, float] | None:
    """(rtol, atol) that rfrs-ref's export gives ``output`` of ``case`` ((0, 0) when it is
    exported as exact); None when rfrs-ref exports no such case or output."""
    c = _exported_case(case)
    if c is None or output not in c.outputs:
        return None
    e = c.outputs[output]
    return (0.0, 0.0) if e.exact else (float(e.rtol), float(e.atol))


def _canonical_params(params) -> str:
    return json.dumps(_json_value(params), sort_keys=True, ensure_ascii=False, allow_nan=False)


def inputs_differ(case: str, params: dict, inputs: dict[str, np.ndarray]) -> str:
    """What first differs between a case's ``params`` and ``inputs`` (as read from its
    folder) and those rfrs-ref's export writes for the case of that name: an input's file
    (its bytes as written: dtype, shape and every value), an input one side lacks, or
    ``params``; '' when they are identical or rfrs-ref exports no such case."""
    c = _exported_case(case)
    if c is None:
        return ""
    for k in sorted(set(c.inputs) | set(inputs)):
        if k not in inputs:
            return f"input {k!r} is missing"
        if k not in c.inputs:
            return f"input {k!r} is not one this version exports"
        if _npy_bytes(np.asarray(inputs[k])) != _npy_bytes(np.asarray(c.inputs[k])):
            return f"input {k!r} differs"
    try:
        same = _canonical_params(params) == _canonical_params(c.params)
    except (TypeError, ValueError):
        same = False
    return "" if same else "params differ"


def _looser_than_export(case: str, output: str, spec, got, differs: str = "") -> tuple[Mismatch | None, bool]:
    """(a mismatch when ``spec`` states a ``close`` tolerance looser than the one rfrs-ref's
    export gives the output, whether the atol went unjudged). Without the bound a case file
    could accept anything short of "checks nothing": rtol 0.5 passes every value within 50%.
    Not judged where the comparison is exact whatever the case states (a recomputed integer,
    boolean, string or null).

    The exported atol scales with the exported values: when the case's inputs ``differ``
    from those the export writes (:func:`inputs_differ`), a stated atol above 0 cannot be
    judged against it (it is another case's bound) and the second element is True (the
    caller fails the case for its inputs); the rtol, and the zero tolerance of an output
    exported exact, do not depend on the values and are judged all the same."""
    if not isinstance(spec, dict) or spec.get("compare") != "close":
        return None, False
    try:
        rtol, atol = agreement.check_tolerance(spec.get("rtol"), spec.get("atol"), "tolerance")
        kind = np.asarray(got).dtype.kind
    except (ValueError, TypeError, OverflowError):
        return None, False  # compare_output reports an unusable rule or value
    if kind not in "fc":
        return None, False
    allowed = exported_tolerance(case, output)
    if allowed is None:
        return Mismatch(output, None, None, None, None, message=(
            f"states rtol {rtol!r}, atol {atol!r}, but {case!r} is not a case rfrs-ref exports: "
            "no exported tolerance bounds it (export the case, or compare it exactly)")), False
    exact = allowed == (0.0, 0.0)
    unjudged = bool(differs) and not exact and atol > 0.0
    bounds = [("rtol", rtol, allowed[0])] + ([] if unjudged else [("atol", atol, allowed[1])])
    over = [(k, v, a) for k, v, a in bounds if v > a * (1.0 + TOLERANCE_SLACK)]
    if not over:
        return None, unjudged
    return Mismatch(output, None, None, None, None, message="stated tolerance looser than rfrs-ref's "
                    "export gives it: " + ", ".join(
                        f"{k} {v!r} where at most {a!r} is allowed" for k, v, a in over)
                    + (" (the output is exported exact)" if exact else "")), unjudged


def check_case(folder, backend: str = "numpy", listed: str | None = None, entry: dict | None = None,
               where: str = "index.json") -> CaseResult:
    """Recompute one case with ``backend`` and compare every output (``listed``: the name
    the index gives it, which must be the case's own; ``entry``: the index.json entry that
    lists it, named ``where`` in messages, whose kind and dtype must be the case's own,
    :func:`index_disagrees`). A ``close`` tolerance looser than
    the one rfrs-ref's export gives the output (:func:`exported_tolerance`) fails it, next
    to any value mismatch; a case whose inputs differ from the export's
    (:func:`inputs_differ`) and that states an atol above 0 fails for its inputs, its atol
    having no bound (its rtol is still judged)."""
    folder = pathlib.Path(folder)
    name = str(folder)
    try:
        meta, inputs, expected = load_case(folder)
        if listed is not None and meta["name"] != listed:
            # the index's name is what --only selects and the user reads: it must be this case
            return CaseResult(listed, backend, False, [], f"cannot read the case: {folder / 'case.json'} "
                              f"is case {meta['name']!r}, the index lists it as {listed!r}")
        name = meta["name"]
        fn = KINDS[meta["kind"]]
    except UntrustedFileError as exc:  # unreadable case: report, do not stop the other cases
        return CaseResult(name, backend, False, [], f"cannot read the case: {exc}")
    except Exception as exc:
        return CaseResult(name, backend, False, [], f"cannot read the case: {type(exc).__name__}: {exc}")
    try:
        src = str(folder / "case.json")
        bad = (unknown_fields(src, meta) or _implausible(meta) or _implausible_inputs(inputs)
               or dtype_disagrees(meta["name"], inputs) or dtype_field_disagrees(src, meta, inputs)
               or unused_params(src, meta) or detect_disagrees(src, meta, inputs)
               # the case's own defects first: an index entry repeats what case.json states
               or ("" if entry is None else index_disagrees(where, entry, src, meta)))
    except Exception as exc:  # a case.json no check foresaw: this case fails, the others run
        bad = f"{type(exc).__name__}: {exc}"
    if bad:
        return CaseResult(name, backend, False, [], f"cannot read the case: {bad}")
    try:
        got = fn(inputs, meta["params"], backend)
    except Exception as exc:
        return CaseResult(name, backend, False, [], f"recomputation raised {type(exc).__name__}: {exc}")
    mismatches = []
    differs: list[str] = []  # what differs from the export's inputs, found when first needed
    unjudged = False  # an atol that the export of other inputs cannot bound
    # A case that states no output, or leaves out one the code produces, would check
    # less than its "ok" says (an emptied or cut-down case.json): every output counts.
    if not meta["outputs"]:
        return CaseResult(name, backend, False, [], "the case states no output: nothing to compare")
    for k in got:
        if k not in meta["outputs"]:
            mismatches.append(Mismatch(k, None, None, None, None, message="produced by the current "
                                       "code but not stated in the case (a case must state every output)"))
    for k, spec in meta["outputs"].items():
        if k not in got:
            mismatches.append(Mismatch(k, None, None, None, None, message="not produced by the current code"))
            continue
        try:
            m = compare_output(k, spec, expected[k], got[k])
        except Exception as exc:  # the case file is input: whatever it holds, report and go on
            m = Mismatch(k, None, None, None, None, message=f"cannot be compared ({type(exc).__name__}: {exc})")
        if m is not None:
            mismatches.append(m)
        if m is None or not m.message:  # a usable rule: it may not be looser than the export's
            try:  # (a value mismatch and a looser tolerance are both reported)
                if not differs:
                    differs.append(inputs_differ(name, meta["params"], inputs))
                loose, no_atol = _looser_than_export(name, k, spec, got[k], differs[0])
                unjudged = unjudged or no_atol
            except Exception as exc:  # the exporter itself failed: nothing bounds the tolerance
                loose = Mismatch(k, None, None, None, None, message="its tolerance cannot be bounded "
                                 f"(the export raised {type(exc).__name__}: {exc})")
            if loose is not None:
                mismatches.append(loose)
    if meta["kind"] == "attack" and "noise" in inputs and "noise" in got:
        m = compare_output("noise (input)", {"compare": "exact"}, inputs["noise"], got["noise"])
        if m is not None:
            mismatches.append(m)
    if unjudged:
        # the atols the case states scale with values this version does not export for it:
        # judging them against this version's (another case's) would fail a sound case with
        # a wrong reason, and passing them would let an edit of the inputs escape the bound
        from rfrs_ref import __version__

        mismatches.insert(0, Mismatch(None, None, None, None, None, message=(
            f"its inputs differ from those rfrs-ref {__version__} exports for {name!r} ({differs[0]}): "
            "exported by another version of rfrs-ref, or edited, so the atol it states cannot be "
            "bounded; re-export the vectors with this version (rfrs-ref golden export)")))
    return CaseResult(name, backend, not mismatches, mismatches)


def _part_of_vectors(root: pathlib.Path) -> tuple[pathlib.Path, str] | None:
    """(the folder the vectors would be in, the ``--only`` pattern that selects ``root``)
    when ``root`` is laid out as a case folder (it holds a ``case.json`` and sits in a
    family's folder) or a family's folder (named for a family, holding case folders) of
    exported vectors; None otherwise. Judged from names alone: nothing outside ``root`` is
    opened (a folder above may be anyone's, and its ``index.json`` a pipe or a device),
    nor any file inside it."""
    if not (root.name and root.parent.name):
        root = root.absolute()  # '.', 'sgd-f64': the names of the folders above are needed
    try:
        if (root / "case.json").is_file() and root.parent.name in FAMILIES:
            return root.parent.parent, f"{root.parent.name}/{root.name}"
        if root.name in FAMILIES and root.is_dir() and any(
                (d / "case.json").is_file() for d in root.iterdir()):
            return root.parent, f"{root.name}/*"
    except OSError:
        pass
    return None


def read_index(directory) -> list[dict]:
    """The case entries (``name``, ``path``, ...) of ``directory/index.json``, validated:
    every ``path`` is a relative path to a ``case.json`` inside ``directory``
    (resolved: ``..``, absolute paths and symbolic links leading out are refused), and so
    is ``index.json`` itself, which is read only once it is known to stay inside.
    Nothing outside ``directory`` is read: without an index, a folder laid out as a case's
    or a family's is named as such from its path (:func:`_part_of_vectors`).
    Raises :class:`GoldenFormatError` / FileNotFoundError with one-line messages."""
    root = pathlib.Path(directory)
    index_path = root / "index.json"
    if not index_path.exists():
        # a case's folder, or a family's, given instead of the folder export wrote
        part = _part_of_vectors(root)
        if part is not None:
            top, only = part
            raise FileNotFoundError(
                f"{index_path}: no index of golden vectors: {root} is laid out as part of "
                f"exported vectors (a {'case' if '*' not in only else 'family'} folder); if they "
                f"are in {top}, check this folder with `rfrs-ref golden check {top} --only '{only}'`")
        raise FileNotFoundError(f"{index_path}: no index of golden vectors (run `rfrs-ref golden export`)")
    # the index itself may be a link, but not one leading out of the vectors (its paths
    # are read relative to them: an index from elsewhere describes other vectors); checked
    # before it is opened, so that nothing outside the vectors is read
    confined(root, "index.json", str(index_path), what="the index")
    index = read_json(index_path, "index of golden vectors", max_bytes=MAX_FILE_BYTES)
    if not isinstance(index, dict) or index.get("format") != FORMAT or index.get("version") != VERSION \
            or isinstance(index.get("version"), bool):
        raise GoldenFormatError(f"{index_path}: not a {FORMAT} version {VERSION} index")
    cases = index.get("cases")
    if not isinstance(cases, list):
        raise GoldenFormatError(f"{index_path}: 'cases' must be a list of case entries")
    out = []
    seen: dict = {}
    for i, entry in enumerate(cases):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise GoldenFormatError(f"{index_path}: case entry {i} must be an object with a string 'name'")
        path = confined(root, entry.get("path"), str(index_path), what=f"case {entry['name']!r}: path")
        if path.name != "case.json":
            raise GoldenFormatError(f"{index_path}: case {entry['name']!r}: path {entry['path']!r} does not "
                                    "name a case.json")
        # one case listed twice (or two names for one folder) would be counted as two
        # checked cases while another went unchecked
        for what, key in (("name", entry["name"]), ("case folder", path.parent)):
            if (what, key) in seen:
                raise GoldenFormatError(f"{index_path}: case entries {seen[(what, key)]} and {i} have the "
                                        f"same {what} {str(key)!r}; each case is listed once")
            seen[(what, key)] = i
        out.append({**entry, "folder": path.parent})
    return out


def unlisted_cases(directory, entries: list[dict]) -> list[str]:
    """The case folders under ``directory`` (each holding a ``case.json``, found without
    following symbolic links) that none of the index ``entries`` names, as paths relative
    to ``directory`` (an exported case's name), sorted."""
    root = pathlib.Path(directory)
    listed = {pathlib.Path(e["folder"]).resolve() for e in entries}
    out = []
    for here, dirs, files in os.walk(root):  # os.walk does not follow links to folders
        dirs.sort()
        if "case.json" in files and here != str(root) and pathlib.Path(here).resolve() not in listed:
            out.append(pathlib.Path(here).relative_to(root).as_posix())
    return sorted(out)


def check(directory, backends=("numpy",), only: Iterable[str] | None = None) -> list[CaseResult]:
    """Check every case listed in ``directory/index.json`` with each backend.

    The whole index is validated (:func:`read_index`) before any case runs;
    a case that cannot be read is a failed case, not an exception. A case folder
    the index does not list (:func:`unlisted_cases`; with ``only``, one whose relative
    path matches) is a failed case too: it was not checked, and a check that passes
    must not have left cases of the vectors aside.

    A check that would check no case (an index listing none, or ``only`` patterns that
    match none) raises ValueError (:class:`GoldenFormatError` for the index) instead of
    returning an empty list, which ``all(r.ok for r in results)`` would call a pass."""
    entries = read_index(directory)
    pats = list(only) if only else None
    out = []
    index_path = pathlib.Path(directory) / "index.json"
    for i, entry in enumerate(entries):
        if pats and not _matches(entry["name"], pats):
            continue
        where = f"{index_path}: case entry {i} ({entry['name']!r})"
        for b in backends:
            out.append(check_case(entry["folder"], b, entry["name"], entry, where))
    for name in unlisted_cases(directory, entries):
        if pats and not _matches(name, pats):
            continue
        out.append(CaseResult(name, "index", False, [], f"{pathlib.Path(directory) / name / 'case.json'} is a "
                              "case that index.json does not list: not checked (list it in the index, "
                              "e.g. by exporting it again, or remove the folder)"))
    if not out:
        if pats:
            raise ValueError(f"no case to check matches {', '.join(pats)} in "
                             f"{pathlib.Path(directory) / 'index.json'}")
        raise GoldenFormatError(f"{pathlib.Path(directory) / 'index.json'}: lists no case: no case "
                                "to check")
    return out


__all__ = [
    "ARRAY_DTYPES",
    "CASE_FIELDS",
    "CASE_PARAMS",
    "DETECT_SPACES",
    "FLOAT64_INPUTS",
    "FORMAT",
    "GoldenFormatError",
    "INDEX_FIELDS",
    "KINDS",
    "SERVER_ATTACKS",
    "SERVER_PARAMS",
    "SUFFIX_DTYPES",
    "VERSION",
    "Case",
    "CaseResult",
    "Expected",
    "Mismatch",
    "all_cases",
    "check",
    "check_case",
    "compare_output",
    "detect_disagrees",
    "dtype_disagrees",
    "dtype_field_disagrees",
    "export",
    "exported_tolerance",
    "index_disagrees",
    "inputs_differ",
    "load_case",
    "read_index",
    "unknown_fields",
    "unlisted_cases",
    "unused_params",
    "write_case",
]

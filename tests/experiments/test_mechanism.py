"""Per-round mechanism measurements: hand-computed rounds, the run is the sweep's run,
and ``rfrs-ref mechanism`` on a tiny synthetic figure."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.experiments.mechanism import (COLUMNS, _pair_quantities, check_frame, cosines,
                                            measure_run, mechanism_frame, round_measures,
                                            spearman, squared_distances)
from rfrs_ref.experiments.spec import RunSpec

BACKENDS = ("numpy", "numba")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hand_computed_round(backend):
    g1, g2 = np.array([1.0, 0.0, 0.0]), np.array([0.0, 2.0, 0.0])
    G = np.vstack([g1, g2, -g1])          # the third client sends the ascent of the first
    byz = np.array([False, False, True])
    m = round_measures(G, 0.1 * G, byz, f=0, backend=backend)
    assert m["honest_cos_mean"] == pytest.approx(0.0)
    # honest mean (0.5, 1, 0): cos with g1 = 0.5/sqrt(1.25), with g2 = 1/sqrt(1.25)
    assert m["honest_to_mean_cos"] == pytest.approx((0.5 + 1.0) / 2 / math.sqrt(1.25))
    assert m["byzantine_to_mean_cos"] == pytest.approx(-0.5 / math.sqrt(1.25))
    assert m["honest_to_others_cos"] == pytest.approx(0.0)  # the other honest one: orthogonal
    # squared distances: d(1,2) = 5, d(1,3) = 4, d(2,3) = 5; m = 1 (n - f - 2)
    # Krum scores 4, 5, 4; norms 1, 2, 1 -> ranks (1.5, 3, 1.5) for both: rho = 1
    assert m["spearman_gradient"] == pytest.approx(1.0)
    assert m["spearman_parameter"] == pytest.approx(1.0)
    assert (m["n"], m["n_byzantine"], m["f"]) == (3, 1, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hostile_rows_are_left_out_not_a_crash(backend):
    G = np.array([[1.0, 0.0], [0.0, 1.0], [np.nan, 1.0], [1e38, 1e38]])
    byz = np.array([False, False, True, True])
    m = round_measures(G, G, byz, f=1, backend=backend)
    assert m["honest_cos_mean"] == pytest.approx(0.0)
    assert np.isfinite(m["byzantine_to_mean_cos"])  # the 1e38 row still has a direction
    # the NaN row is left out; 1e38 is finite: scores (2, 2, 2e76), norms (1, 1, 1.4e38)
    assert m["spearman_gradient"] == pytest.approx(1.0)
    assert math.isnan(round_measures(G[1:3], G[1:3], byz[1:3], f=0,
                                     backend=backend)["spearman_gradient"])
    C = cosines(G)
    assert np.isnan(C[2]).all() and C[0, 0] == pytest.approx(1.0)
    assert np.isinf(squared_distances(G)[2]).all()
    assert np.isinf(_pair_quantities(G, np.isfinite(G).all(axis=1))[2]).all()
    one = round_measures(G[:1], G[:1], byz[:1], f=0, backend=backend)
    assert math.isnan(one["honest_cos_mean"]) and math.isnan(one["byzantine_to_mean_cos"])


def test_an_unknown_backend_is_refused():
    G = np.eye(3)
    with pytest.raises(ValueError, match="'numpy' or 'numba', got 'cuda'"):
        round_measures(G, G, np.zeros(3, dtype=bool), 0, backend="cuda")


# -- the fast measures against the oracle ---------------------------------------------------
HOSTILE = (np.nan, np.inf, -np.inf, 1e38, 1e200, 0.0)


@st.composite
def _round(draw, integers: bool):
    """A round: n rows of G and P (integers times a power of 2, so that every sum of
    squares is exact and ties fall alike in both backends, or normal draws), the
    Byzantine mask, f, and some rows hostile (non-finite, huge, zero)."""
    n = draw(st.integers(1, 9))
    D = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    if integers:
        scale = 2.0 ** draw(st.integers(-20, 20))
        G = rng.integers(-8, 9, size=(n, D)).astype(np.float64) * scale
        P = rng.integers(-8, 9, size=(n, D)).astype(np.float64) * scale
    else:
        G = rng.normal(size=(n, D)) * 10.0 ** draw(st.integers(-30, 30))
        P = rng.normal(size=(n, D))
        if n > 1 and draw(st.booleans()):  # a near-copy: the distances of close rows
            G[1] = G[0] * (1 + 1e-9)
    byz = rng.random(n) < draw(st.sampled_from([0.0, 0.3, 0.6]))
    for X in (G, P):
        for i in np.flatnonzero(rng.random(n) < draw(st.sampled_from([0.0, 0.2, 0.5]))):
            v = draw(st.sampled_from(HOSTILE))
            if v == 0.0:
                X[i] = 0.0
            else:
                X[i, rng.integers(D)] = v
    f = draw(st.integers(0, max(0, n - 1)))
    return G, P, byz, f


def _agree(fast, oracle, atol):
    assert set(fast) == set(oracle)
    for k in oracle:
        a, b = fast[k], oracle[k]
        if isinstance(b, float) and math.isnan(b):
            assert math.isnan(a), (k, a, b)
        else:
            assert a == pytest.approx(b, rel=atol, abs=atol), (k, a, b)


@settings(max_examples=150, deadline=None)
@given(_round(integers=True))
def test_fast_measures_equal_the_oracle_on_exact_sums(case):
    """Every measure, Spearman's included: with exact sums of squares both backends see
    the same Krum scores and norms, ties included."""
    G, P, byz, f = case
    with np.errstate(all="ignore"):
        oracle = round_measures(G, P, byz, f)
    G0, P0 = G.copy(), P.copy()
    _agree(round_measures(G, P, byz, f, backend="numba"), oracle, 1e-12)
    assert np.array_equal(G, G0, equal_nan=True) and np.array_equal(P, P0, equal_nan=True)


@settings(max_examples=150, deadline=None)
@given(_round(integers=False))
def test_fast_measures_agree_with_the_oracle_to_rounding(case):
    """The cosines within 1e-12 (each is a sum of at most 40 products divided by norms:
    error a few units of D·2⁻⁵³), the distances within the kernel's bound; Spearman's
    correlations are compared above, where no rounding can break a tie differently."""
    from rfrs_ref.kernels.distances import sq_dists64_error

    G, P, byz, f = case
    with np.errstate(all="ignore"):
        oracle = round_measures(G, P, byz, f)
        fast = round_measures(G, P, byz, f, backend="numba")
        for X in (G, P):
            exact = squared_distances(X)
            got = _pair_quantities(X, np.isfinite(X).all(axis=1))
            both = np.isfinite(exact)
            assert np.array_equal(both, np.isfinite(got))
            assert np.all(np.abs(got[both] - exact[both])
                          <= 4 * sq_dists64_error(X.shape[1]) * exact[both])
    for k in ("spearman_gradient", "spearman_parameter"):
        del oracle[k], fast[k]
    _agree(fast, oracle, 1e-12)


def test_spearman_by_hand():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks (1, 2, 3) vs (2, 1, 3): 1 - 6 * 2 / (3 * 8) = 0.5
    assert spearman([1, 2, 3], [5, 4, 9]) == pytest.approx(0.5)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_the_measured_run_is_the_sweeps_run(ex, tmp_path):
    from rfrs_ref.federated.trainer import train

    spec = RunSpec(ex.tiny_config(attack="ascent", byzantine_fraction=0.3, preset="a-rfrs",
                                  rounds=5))
    rows = measure_run(spec)
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5]
    train(spec.config, tmp_path / "run")
    recs = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().split()
            if line]
    assert [r["byzantine_share_kept"] for r in rows] == [r["byzantine_share_kept"] for r in recs]
    assert [r["f"] for r in rows] == [r["f"] for r in recs]
    for r in rows:
        assert set(r) == set(COLUMNS)
        # gradient ascent: a Byzantine client points away from the honest mean
        assert r["byzantine_to_mean_cos"] < 0 < r["honest_to_mean_cos"]
    thinned = measure_run(spec, every=2)
    assert [r["round"] for r in thinned] == [2, 4, 5]
    assert thinned[0] == rows[1]


def test_mechanism_command(ex, tmp_path):
    from rfrs_ref.cli.main import main

    sets = ["--set", "client_fraction=0.1", "--set",
            f"dataset_params={json.dumps(ex.TINY_DATA)}"]
    args = ["mechanism", "4", "--dataset", "synthetic", "--alpha", "0.4", "--rounds", "4",
            "--series", "A-RFRS", "--series", "Krum", *sets, "--out", str(tmp_path)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    csvs = sorted(p.name for p in tmp_path.glob("*.csv"))
    assert csvs == ["defenses-synthetic-a0.4-seed0-a-rfrs.csv",
                    "defenses-synthetic-a0.4-seed0-krum.csv"]
    df = pd.read_csv(tmp_path / csvs[0])
    assert list(df["round"]) == [1, 2, 3, 4] and (df["series"] == "A-RFRS").all()
    ex.assert_image_not_blank(tmp_path / "defenses-synthetic-a0.4-seed0.png")
    assert "| A-RFRS |" in (tmp_path / "defenses-synthetic-a0.4-seed0.md").read_text()
    # the plot is never written through a link planted at its name
    png = tmp_path / "defenses-synthetic-a0.4-seed0.png"
    victim = tmp_path.parent / f"{tmp_path.name}-victim.png"
    victim.write_text("precious")
    png.unlink()
    png.symlink_to(victim)
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1 and "is a link" in again.output, again.output
    assert victim.read_text() == "precious" and "Traceback" not in again.output
    bad = CliRunner().invoke(main, ["mechanism", "4", "--dataset", "synthetic", *sets,
                                    "--out", str(tmp_path / "x")])
    assert bad.exit_code != 0 and "--alpha" in bad.output and "Traceback" not in bad.output
    bad = CliRunner().invoke(main, ["mechanism", "4", "--dataset", "synthetic", "--alpha",
                                    "0.4", "--series", "Nope", *sets, "--out",
                                    str(tmp_path / "x")])
    assert bad.exit_code != 0 and "not a series" in bad.output


def test_a_full_disk_is_said_in_one_line(ex, tmp_path, monkeypatch):
    """An OSError while the tables or the plot are written (a full disk) used to escape the
    command as a traceback; it is one line naming what could not be written."""
    from rfrs_ref.cli.main import main
    from rfrs_ref.experiments import results

    def full_disk(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(results, "atomic_write_text", full_disk)
    args = ["mechanism", "4", "--dataset", "synthetic", "--alpha", "0.4", "--rounds", "2",
            "--series", "Krum", "--set", "client_fraction=0.1", "--set",
            f"dataset_params={json.dumps(ex.TINY_DATA)}", "--out", str(tmp_path)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.exception
    assert "could not write" in res.output and "No space left on device" in res.output


def test_mechanism_reads_a_complete_series_and_measures_the_rest(ex, tmp_path):
    from rfrs_ref.cli.main import main

    sets = ["--set", "client_fraction=0.1", "--set",
            f"dataset_params={json.dumps(ex.TINY_DATA)}"]
    base = ["mechanism", "4", "--dataset", "synthetic", "--alpha", "0.4", "--rounds", "4",
            "--every", "2", *sets, "--out", str(tmp_path)]
    res = CliRunner().invoke(main, [*base, "--series", "Krum"])
    assert res.exit_code == 0, res.output
    krum = tmp_path / "defenses-synthetic-a0.4-seed0-krum.csv"
    first = krum.read_bytes()
    assert list(pd.read_csv(krum)["round"]) == [2, 4]
    # a later call with both series reads Krum's table and measures A-RFRS only
    res = CliRunner().invoke(main, [*base, "--series", "Krum", "--series", "A-RFRS"])
    assert res.exit_code == 0, res.output
    assert "Krum: already measured" in res.output and "A-RFRS: already" not in res.output
    summary = (tmp_path / "defenses-synthetic-a0.4-seed0.md").read_text()
    assert "| Krum |" in summary and "| A-RFRS |" in summary
    assert krum.read_bytes() == first
    # another --every, a table cut short, or another run's key: measured again
    res = CliRunner().invoke(main, [*base[:-4], "--every", "1", *sets, "--out", str(tmp_path),
                                    "--series", "Krum"])
    assert res.exit_code == 0 and "already measured" not in res.output, res.output
    assert list(pd.read_csv(krum)["round"]) == [1, 2, 3, 4]
    df = pd.read_csv(krum)
    df.iloc[:2].to_csv(krum, index=False)
    res = CliRunner().invoke(main, [*base[:-4], "--every", "1", *sets, "--out", str(tmp_path),
                                    "--series", "Krum"])
    assert "already measured" not in res.output and len(pd.read_csv(krum)) == 4
    df.assign(key="0" * 16).to_csv(krum, index=False)
    res = CliRunner().invoke(main, [*base[:-4], "--every", "1", *sets, "--out", str(tmp_path),
                                    "--series", "Krum"])
    assert "already measured" not in res.output
    assert (pd.read_csv(krum)["key"].astype(str) != "0" * 16).all()
    res = CliRunner().invoke(main, [*base[:-4], "--every", "1", *sets, "--out", str(tmp_path),
                                    "--series", "Krum", "--again"])
    assert res.exit_code == 0 and "already measured" not in res.output, res.output


# -- a table in --out is input ---------------------------------------------------------------------
def _measured(ex, tmp_path):
    """Measure Krum for 2 rounds into tmp_path; return (the CLI args, the CSV path)."""
    from rfrs_ref.cli.main import main

    sets = ["--set", "client_fraction=0.1", "--set",
            f"dataset_params={json.dumps(ex.TINY_DATA)}"]
    args = ["mechanism", "4", "--dataset", "synthetic", "--alpha", "0.4", "--rounds", "2",
            "--series", "Krum", *sets, "--out", str(tmp_path)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    return args, tmp_path / "defenses-synthetic-a0.4-seed0-krum.csv"


@pytest.mark.parametrize("col, value, expected", [
    ("honest_cos_mean", "inf", "line 2, column honest_cos_mean: inf is not a cosine in [−1, 1]"),
    ("byzantine_share_kept", "7.5", "line 2, column byzantine_share_kept: 7.5 is not a share"),
    ("byzantine_share_sampled", "", "line 2, column byzantine_share_sampled: empty (NaN)"),
    ("spearman_gradient", "abc", "line 2, column spearman_gradient: 'abc' is not a number"),
    ("spearman_parameter", "-1.5", "-1.5 is not a rank correlation in [−1, 1]"),
    ("honest_to_others_cos", "-inf", "-inf is not a cosine"),
    ("n", "2.5", "line 2, column n: 2.5 is not a non-negative integer"),
    ("n_byzantine", "999", "999 Byzantine clients of n = "),
])
def test_a_recorded_table_that_is_not_a_measurement_is_refused(ex, tmp_path, col, value,
                                                                   expected):
    from rfrs_ref.cli.main import main

    args, csv = _measured(ex, tmp_path)
    df = pd.read_csv(csv, dtype=str, keep_default_na=False)
    df.loc[0, col] = value
    df.to_csv(csv, index=False)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output and "already measured" not in res.output
    line = [x for x in res.output.splitlines() if x.startswith("Error")]
    assert len(line) == 1 and str(csv) in line[0] and expected in line[0], res.output
    # --again measures it again, replacing the file
    res = CliRunner().invoke(main, [*args, "--again"])
    assert res.exit_code == 0, res.output
    check_frame(pd.read_csv(csv), csv)


def test_a_recorded_table_that_names_a_column_twice_is_refused(ex, tmp_path):
    """pandas reads a second `byzantine_share_kept` as `byzantine_share_kept.1`: the summary
    printed the first, whichever the file meant."""
    from rfrs_ref.cli.main import main

    args, csv = _measured(ex, tmp_path)
    lines = csv.read_text().splitlines()
    csv.write_text("\n".join([lines[0] + ",byzantine_share_kept"] + [x + ",0.0" for x in lines[1:]]) + "\n")
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    line = [x for x in res.output.splitlines() if x.startswith("Error")]
    assert len(line) == 1 and str(csv) in line[0] and "'byzantine_share_kept' appears twice" in line[0], \
        res.output
    assert CliRunner().invoke(main, [*args, "--again"]).exit_code == 0


def test_a_recorded_table_with_the_measurements_nan_when_too_few_rows_is_read(ex, tmp_path):
    from rfrs_ref.cli.main import main

    args, csv = _measured(ex, tmp_path)
    df = pd.read_csv(csv)
    # a round with fewer than 2 honest clients has no honest pair, and one without a
    # Byzantine client no Byzantine cosine: the measurement writes an empty cell
    for col in ("honest_cos_mean", "honest_cos_q10", "honest_cos_q50", "honest_cos_q90",
                "honest_to_others_cos", "byzantine_to_mean_cos", "spearman_parameter", "loss"):
        df.loc[0, col] = float("nan")
    df.loc[1, "honest_cos_mean"] = 1.0 + 1e-12  # rounding of a cosine of parallel rows
    df.to_csv(csv, index=False)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "Krum: already measured" in res.output


def test_check_frame_requires_every_column():
    df = pd.DataFrame({"round": [1]})
    with pytest.raises(ValueError, match="t.csv: no column.*honest_cos_mean"):
        check_frame(df, "t.csv")


def test_a_round_without_an_honest_pair_measures_nan_and_its_table_is_accepted():
    rng = np.random.default_rng(0)
    G = rng.normal(size=(4, 6))
    row = round_measures(G, G, np.array([True, True, True, False]), 1)
    assert math.isnan(row["honest_cos_mean"]) and math.isnan(row["honest_to_others_cos"])
    row.update(round=1, byzantine_share_sampled=0.75, byzantine_share_kept=0.75, loss=1.0)
    check_frame(mechanism_frame([row]), "t.csv")


def test_a_failed_mechanism_leaves_none_of_the_folders_it_made(ex, tmp_path, monkeypatch):
    """The hold on --out made it and its missing parents; a measurement that failed left
    them behind, empty. A folder that existed before is kept."""
    from rfrs_ref.cli.main import main
    from rfrs_ref.experiments import mechanism

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mechanism, "measure_run", fail)
    sets = ["--set", "client_fraction=0.1", "--set",
            f"dataset_params={json.dumps(ex.TINY_DATA)}"]
    out = tmp_path / "a" / "b"
    res = CliRunner().invoke(main, ["mechanism", "4", "--dataset", "synthetic", "--alpha", "0.4",
                                    "--rounds", "2", "--series", "Krum", *sets, "--out", str(out)])
    assert res.exit_code != 0
    assert not (tmp_path / "a").exists()


@settings(max_examples=100, deadline=None)
@given(_round(integers=True), st.integers(-1000, 1000))
def test_fast_measures_of_uploads_and_a_centre_equal_those_of_the_differences(case, shift):
    """``mechanism`` hands the fast measures the float32 uploads θᵢ and the server's θ̄
    instead of forming θᵢ − θ̄: the same measures, Spearman's included (exact sums)."""
    from rfrs_ref.experiments.mechanism import _round_measures_fast

    G, P, byz, f = case
    centre = (np.arange(P.shape[1]) % 7 - 3.0) * shift
    with np.errstate(all="ignore"):
        theta = (P + centre).astype(np.float32)
        oracle = round_measures(G, theta.astype(np.float64) - centre, byz, f)
    _agree(_round_measures_fast(G, theta, byz, f, centre=centre), oracle, 1e-12)


@pytest.mark.parametrize("rule", [{"preset": "a-rfrs"},
                                  {"defense": "krum", "detect": "parameter"}])
def test_the_fast_measures_of_real_rounds_are_the_oracles(data_dir, monkeypatch, rule):
    """ML100K under the ascent attack at α = 0.4, Adam: each measured round's numbers from
    the uploads as ``mechanism`` hands them over (float32 θᵢ and θ̄, never θᵢ − θ̄)
    against the oracle's on the float64 differences."""
    from rfrs_ref.experiments import mechanism
    from rfrs_ref.experiments.spec import make_config

    config = make_config({"dataset": "ml100k", "data_dir": str(data_dir), "rounds": 3,
                          "attack": "ascent", "byzantine_fraction": 0.4,
                          "client_fraction": 0.02, **rule})
    pairs = []
    fast = mechanism._round_measures_fast

    def both(G, theta, byz, f, centre=None):
        got = fast(G, theta, byz, f, centre=centre)
        params = theta.astype(np.float64) - np.asarray(centre, dtype=np.float64)
        pairs.append((dict(got), round_measures(G, params, byz, f)))
        return got

    monkeypatch.setattr(mechanism, "_round_measures_fast", both)
    rows = measure_run(RunSpec(config))
    assert len(rows) == len(pairs) == 3
    for got, oracle in pairs:
        assert oracle["n_byzantine"] > 0 and math.isfinite(oracle["spearman_gradient"])
        _agree(got, oracle, 1e-12)

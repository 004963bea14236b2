"""Golden vectors: deterministic export, clean re-check, caught perturbations, self-describing files."""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import assume, given
from hypothesis import strategies as st

from rfrs_ref import golden
from rfrs_ref.aggregate import PRE, RULES
from rfrs_ref.attack import ATTACKS
from rfrs_ref.optim import OPTIMIZERS


def _files(root: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _copy(exported, tmp_path) -> pathlib.Path:
    dst = tmp_path / "vectors"
    shutil.copytree(exported, dst)
    return dst


def _index(root) -> list[dict]:
    return json.loads((root / "index.json").read_text())["cases"]


# -- export ----------------------------------------------------------------------------------------

def test_export_is_byte_for_byte_deterministic(exported, tmp_path):
    again = tmp_path / "again"
    golden.export(again)
    a, b = _files(exported), _files(again)
    assert a.keys() == b.keys()
    different = [k for k in a if a[k] != b[k]]
    assert not different


def test_every_family_entry_has_cases_in_both_precisions(exported):
    names = {c["name"] for c in _index(exported)}
    # the entries without golden vectors are the ones docs/golden-vectors.md lists: a new
    # rule or attack needs its cases or a line there
    assert set(RULES) == set(golden.GOLDEN_RULES)
    assert set(PRE) == set(golden.GOLDEN_PRE)
    assert set(ATTACKS) - set(golden.GOLDEN_ATTACKS) == {"a-ra"}
    for rule in golden.GOLDEN_RULES:
        for detect in ("gradient", "parameter"):
            for sfx in ("f32", "f64"):
                assert f"aggregate/{rule}-{detect}-{sfx}" in names
        assert f"aggregate/{rule}-gradient-nonfinite-f64" in names
        assert f"aggregate/{rule}-gradient-huge-f64" in names
    for pre in golden.GOLDEN_PRE:
        for detect in ("gradient", "parameter"):
            for sfx in ("f32", "f64"):
                assert f"aggregate/pre-{pre}-mean-{detect}-{sfx}" in names
        assert f"aggregate/pre-{pre}-mean-gradient-nonfinite-f64" in names
        assert f"aggregate/pre-{pre}-mean-gradient-huge-f64" in names
    assert "aggregate/pre-nnm-krum-gradient-f64" in names
    assert {"aggregate/pre-bucketing-trmean-gradient-f64", "aggregate/pre-bucketing-trmean-gradient-f32"} <= names
    for opt in OPTIMIZERS:
        assert {f"optim/{opt}-f32", f"optim/{opt}-f64"} <= names
    for attack in golden.GOLDEN_ATTACKS:
        assert {f"attack/{attack}-adam-f32", f"attack/{attack}-adam-f64"} <= names
    assert {"attack/mimic-index-1-adam-f32", "attack/mimic-index-1-adam-f64"} <= names
    for model in ("fism", "fmf"):
        for mode in ("exact", "sampled"):
            assert f"model/{model}-bpr-{mode}-f64" in names
    assert {"model/fism-scores-f64", "model/fism-bpr-exact-one-item-f64", "aggregate/krum-gradient-ties-f64",
            "federated/adam-krum-gradient-ascent-f64", "federated/adam-trmean-parameter-noise-f64"} <= names


def test_case_files_are_self_describing_strict_json_and_plain_npy(exported):
    for entry in _index(exported):
        path = exported / entry["path"]
        text = path.read_text(encoding="utf-8")
        meta = json.loads(text, parse_constant=lambda c, p=path: pytest.fail(f"{p}: non-strict JSON {c}"))
        for key in ("description", "formula", "convention", "reference", "tolerance", "params"):
            assert meta[key] != "" and meta[key] is not None, (path, key)
        for group in ("inputs", "outputs"):
            for name, spec in meta[group].items():
                if "file" not in spec:
                    assert group == "outputs" and "value" in spec
                    continue
                raw = (path.parent / spec["file"]).read_bytes()
                assert raw[:8] == b"\x93NUMPY\x01\x00", (path, name)  # format version 1.0
                arr = np.load(path.parent / spec["file"], allow_pickle=False)
                assert list(arr.shape) == spec["shape"], (path, name)
                assert {"float32": "<f4", "float64": "<f8", "int64": "<i8", "bool": "|b1"}[spec["dtype"]] \
                    == arr.dtype.str, (path, name)
        for spec in meta["outputs"].values():
            assert spec["compare"] in ("exact", "close")
            assert spec["role"] in ("required", "informational")
            if spec["compare"] == "close":
                assert 0 <= spec["rtol"] and 0 <= spec["atol"]


def test_every_case_states_the_fields_of_the_format_and_its_index_entry_agrees(exported):
    """What `golden check` refuses in a case.json or index.json is never written by the
    export: a field outside golden.CASE_FIELDS, an index entry's kind or dtype other than
    its case's own."""
    for i, entry in enumerate(_index(exported)):
        path = exported / entry["path"]
        meta = json.loads(path.read_text(encoding="utf-8"))
        assert set(meta) == set(golden.CASE_FIELDS), (path, sorted(meta))
        assert golden.unknown_fields(str(path), meta) == ""
        assert golden.index_disagrees(f"entry {i}", entry, str(path), meta) == "", entry


def test_float_tolerances_are_tight(exported):
    """Tolerances are a few hundred roundings of the case's dtype, never a loose guess."""
    for entry in _index(exported):
        meta = json.loads((exported / entry["path"]).read_text())
        u = golden.unit_roundoff(meta["dtype"])
        for name, spec in meta["outputs"].items():
            if spec["compare"] == "close" and name != "recovered" and not name.endswith(("_recovered", "_features")):
                assert spec["rtol"] <= golden.C_RUN * u + 1e-300, (entry["name"], name, spec["rtol"])


def test_export_only_a_family_keeps_the_other_cases_listed(exported, tmp_path):
    root = _copy(exported, tmp_path)
    names = golden.export(root, only=["optim"])
    assert names and all(n.startswith("optim/") for n in names)
    assert len(_index(root)) == len(_index(exported))


def test_an_export_never_runs_beside_another_on_one_folder(exported, tmp_path):
    """Two exports merging into one index each read it before the other wrote it: one's
    cases vanished from the index, and `golden check` then passed without checking them.
    The folder is one export's at a time."""
    import subprocess
    import sys

    from rfrs_ref.cli.main import main

    root = _copy(exported, tmp_path)
    before = (root / "index.json").read_bytes()
    hold = ("import sys, time; from rfrs_ref.files import DirectoryLock; "
            "DirectoryLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-P", "-c", hold, str(root)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        res = CliRunner().invoke(main, ["golden", "export", str(root), "--only", "optim"])
        assert res.exit_code == 1 and "in use by process" in res.output, res.output
        assert "Traceback" not in res.output
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert (root / "index.json").read_bytes() == before
    assert golden.export(root, only=["optim"])  # taken over once the holder is gone
    assert len(_index(root)) == len(_index(exported)) and not (root / ".lock").exists()


# -- known answers the vectors must encode ---------------------------------------------------------

def test_krum_tie_goes_to_the_smaller_index(exported):
    folder = exported / "aggregate/krum-gradient-ties-f64"
    _, inp, out = golden.load_case(folder)
    scores = out["krum_scores"]
    tied = np.flatnonzero(scores == scores.min())
    assert tied.size >= 2
    assert out["krum_selected"].tolist() == [int(tied[0])]
    np.testing.assert_array_equal(out["weights"], np.eye(inp["features"].shape[0])[tied[0]])


def test_one_item_client_has_no_leave_one_out_term(exported):
    meta, inp, out = golden.load_case(exported / "model/fism-bpr-exact-one-item-f64")
    n_items, d = meta["params"]["n_items"], meta["params"]["hyperparameters"]["dim"]
    lam = meta["params"]["hyperparameters"]["lam"]
    grad = out["grad"].reshape(2, n_items, d)
    (item,) = inp["items"]
    theta = inp["theta"].reshape(2, n_items, d)
    # its own p gets only the regulariser: the positive's score has no set to average over
    np.testing.assert_allclose(grad[0, item], 2 * lam * theta[0, item], rtol=1e-15)


def test_tampered_uploads_fail_their_own_check(exported):
    for entry in _index(exported):
        if entry["kind"] != "optimizer":
            continue
        meta, _, out = golden.load_case(exported / pathlib.Path(entry["path"]).parent)
        assert out["verdict_honest_ok"] is True and out["verdict_honest_check"] is None
        for v in meta["params"]["tampered"]:
            assert out[f"verdict_{v}_ok"] is False
            assert out[f"verdict_{v}_check"] in OPTIMIZERS.get(meta["params"]["optimizer"]).checks


def test_nonfinite_byzantine_rows_get_no_weight_from_robust_rules(exported):
    for rule in ("krum", "rfa"):
        _, inp, out = golden.load_case(exported / f"aggregate/{rule}-gradient-nonfinite-f64")
        bad = ~np.isfinite(inp["features"]).all(axis=1)
        assert bad.sum() == 2 and (out["weights"][bad] == 0).all()
        assert np.isfinite(out["aggregate_theta"]).all()
    _, _, out = golden.load_case(exported / "aggregate/mean-gradient-nonfinite-f64")
    assert np.isnan(out["aggregate_theta"]).all()  # no defence: the NaN goes through


def test_new_rules_give_nonfinite_clients_no_weight(exported):
    for name in ("cc", "caf", "smea"):
        _, inp, out = golden.load_case(exported / f"aggregate/{name}-gradient-nonfinite-f64")
        bad = ~np.isfinite(inp["features"]).all(axis=1)
        assert bad.sum() == 2 and (out["weights"][bad] == 0).all(), name
        assert np.isfinite(out["aggregate_theta"]).all(), name
    _, _, out = golden.load_case(exported / "aggregate/cc-gradient-nonfinite-f64")
    assert np.isfinite(out["cc_center"]).all()
    # nnm leaves a non-finite client's own row as it is, for the rule to treat: the mean
    # after it lets it through, as the mean alone does
    _, _, out = golden.load_case(exported / "aggregate/pre-nnm-mean-gradient-nonfinite-f64")
    assert np.isnan(out["aggregate_theta"]).all()


def test_cc_vectors_carry_the_previous_centre(exported, tmp_path):
    """The stateful rule's previous centre is an input: changing it changes the answer."""
    root = _copy(exported, tmp_path)
    folder = root / "aggregate/cc-gradient-f64"
    meta, inp, out = golden.load_case(folder)
    assert meta["params"]["hyperparameters"]["iterations"] == 2
    assert 0 < out["cc_center_weight"] < 1 and out["cc_clipped"].max() > 0
    assert (out["cc_clipped"] < inp["features"].shape[0]).all()  # some clipped, some not
    np.save(folder / meta["inputs"]["cc_center"]["file"], inp["cc_center"] + 1e-3)
    res = _check_one(root, "aggregate/cc-gradient-f64")
    assert not res.ok and any("cc_center" in str(m) or "aggregate" in str(m) for m in res.mismatches)


def test_bucketing_then_mean_is_the_mean_and_its_shuffle_is_an_input(exported, tmp_path):
    _, inp, out = golden.load_case(exported / "aggregate/pre-bucketing-mean-gradient-f64")
    w = inp["n_samples"] / inp["n_samples"].sum()
    np.testing.assert_allclose(out["aggregate_theta"], w @ inp["upload_theta"], rtol=1e-13, atol=1e-14)
    root = _copy(exported, tmp_path)
    folder = root / "aggregate/pre-bucketing-mean-gradient-f64"
    meta, inp, _ = golden.load_case(folder)
    np.save(folder / meta["inputs"]["permutation"]["file"], np.zeros_like(inp["permutation"]))
    res = _check_one(root, "aggregate/pre-bucketing-mean-gradient-f64")
    assert not res.ok and "permutation" in res.error


def test_bucketing_in_front_of_the_trimmed_mean_sees_the_buckets(exported, tmp_path, monkeypatch):
    """Bucketing then the mean is the mean whatever the buckets, so its mean cases pass a
    bucketing that ignores the shuffle or cuts buckets of the wrong size; in front of the
    trimmed mean both fail, and the trimming keeps clear margins at every coordinate."""
    from rfrs_ref.aggregate import pre

    for sfx in ("f64", "f32"):
        name = f"aggregate/pre-bucketing-trmean-gradient-{sfx}"
        meta, inp, out = golden.load_case(exported / name)
        assert meta["params"]["pre"] == ["bucketing"] and meta["params"]["rule"] == "trmean"
        perm, ns, X = inp["permutation"], inp["n_samples"], inp["features"].astype(np.float64)
        assert not np.array_equal(perm, np.arange(perm.size))
        buckets = [perm[b:b + 2] for b in range(0, perm.size, 2)]
        assert [len(b) for b in buckets] == [2] * 5 + [1]  # the last bucket holds the rest
        Xb = np.array([ns[b] @ X[b] / ns[b].sum() for b in buckets])
        f = meta["params"]["f"]
        srt = np.sort(Xb, axis=0)
        # the kept ranks f..n′−f−1 are decided with a margin no rounding of the bucket means
        # can cross: the kept fractions are compared to 4u
        gaps = np.minimum(srt[f] - srt[f - 1], srt[-f] - srt[-f - 1])
        assert (gaps > 1e-4 * np.abs(X).max()).all(), name
    ours = pre.Bucketing.mixing

    class _Unshuffled:
        def permutation(self, n):
            return np.arange(n)

    wrong = {
        "unshuffled": lambda self, X, ns, f, ok, rng, backend: ours(self, X, ns, f, ok, _Unshuffled(),
                                                                    backend),
        "buckets of 3": lambda self, X, ns, f, ok, rng, backend: ours(
            pre.Bucketing(bucket_size=3), X, ns, f, ok, rng, backend),
    }
    for label, mixing in wrong.items():
        monkeypatch.setattr(pre.Bucketing, "mixing", mixing)
        for sfx in ("f64", "f32"):
            assert not _check_one(exported, f"aggregate/pre-bucketing-trmean-gradient-{sfx}").ok, label
            # the mean's cases cannot tell
            assert _check_one(exported, f"aggregate/pre-bucketing-mean-gradient-{sfx}").ok, label
    monkeypatch.setattr(pre.Bucketing, "mixing", ours)
    for sfx in ("f64", "f32"):
        assert _check_one(exported, f"aggregate/pre-bucketing-trmean-gradient-{sfx}").ok


def test_optimal_attacks_copy_one_upload_to_every_byzantine_row(exported):
    for attack in ("opt-ipm", "opt-alie", "mimic"):
        meta, inp, out = golden.load_case(exported / f"attack/{attack}-adam-f64")
        byz = inp["byzantine"]
        for k in ("theta", "m", "v"):
            up, honest = out[f"upload_{k}"], inp[f"honest_{k}"]
            np.testing.assert_array_equal(up[~byz], honest[~byz])
            assert (up[byz] == up[byz][0]).all()
            assert not np.array_equal(up[byz], honest[byz])
    meta, _, out = golden.load_case(exported / "attack/opt-ipm-adam-f64")
    assert meta["params"]["rule"] == "krum" and out["opt_tau"] > 0



def test_mimic_counts_its_index_among_the_honest_rows(exported, monkeypatch):
    """A mimic that copies row ``index`` of the round, not honest row number ``index``, is
    right whenever the round's first rows are honest, as in attack/mimic-adam-*; with index 1
    and row 1 Byzantine it copies the wrong client."""
    from rfrs_ref.attack.nonfinite import Mimic

    for sfx in ("f64", "f32"):
        meta, inp, out = golden.load_case(exported / f"attack/mimic-index-1-adam-{sfx}")
        assert meta["params"]["attack_hyperparameters"] == {"index": 1} and inp["byzantine"][1]
        assert out["mimic_client"] == inp["clients"][np.flatnonzero(~inp["byzantine"])[1]]

    def by_row(self, ctx):
        rows = ctx.byzantine_rows()
        for U in ctx.uploads.values():
            U[rows] = U[self.index]
        return {"index_used": self.index, "client": int(ctx.clients[self.index])}

    monkeypatch.setattr(Mimic, "apply_inplace", by_row)
    for sfx in ("f64", "f32"):
        assert _check_one(exported, f"attack/mimic-adam-{sfx}").ok
        assert not _check_one(exported, f"attack/mimic-index-1-adam-{sfx}").ok


def test_optimal_attacks_state_the_objective_they_maximise(exported, monkeypatch):
    """An optimal attack that moves away from the honest clients' plain mean θ (ByzFL's, without
    nᵢ), or that simulates opt-alie's parameter-space trimmed mean on recovered gradients, makes
    the same comparisons on these cases: same τ, same uploads. The objective at the chosen τ,
    opt_objective, tells both apart."""
    import inspect
    import sys
    import types

    from rfrs_ref.attack import optimal

    src = inspect.getsource(optimal)
    wrong = {
        "unweighted reference": ("ref = (w / w.sum()) @ theta[honest].astype(np.float64)",
                                 "ref = theta[honest].astype(np.float64).mean(axis=0)",
                                 ("opt-ipm", "opt-alie")),
        "gradient space": ('gradient_space = ctx.detect == "gradient" and uses_features',
                           "gradient_space = uses_features", ("opt-alie",)),
    }
    for label, (old, new, attacks) in wrong.items():
        assert src.count(old) == 1, label
        mod = types.ModuleType("wrong_optimal")
        monkeypatch.setitem(sys.modules, "wrong_optimal", mod)
        exec(compile(src.replace(old, new), optimal.__file__, "exec"), mod.__dict__)
        monkeypatch.setattr(optimal._Optimal, "apply_inplace", mod._Optimal.apply_inplace)
        for attack in attacks:
            for sfx in ("f64", "f32"):
                meta, inp, expected = golden.load_case(exported / f"attack/{attack}-adam-{sfx}")
                got = golden.compute_attack(inp, meta["params"], "numpy")
                differ = {k for k, spec in meta["outputs"].items()
                          if golden.compare_output(k, spec, expected[k], got[k]) is not None}
                assert differ == {"opt_objective"}, (label, attack, sfx, differ)
        monkeypatch.undo()
    for attack in ("opt-ipm", "opt-alie"):
        for sfx in ("f64", "f32"):
            assert _check_one(exported, f"attack/{attack}-adam-{sfx}").ok


def test_attack_cases_do_not_hang_on_ties_that_rounding_decides(exported):
    """An attack case's outputs must not depend on the last bits of another implementation's
    sums: identical Byzantine uploads tie in a rule's scores (equal nᵢ makes the tie harmless),
    and every step the optimal attacks' search accepts raises the objective by far more than
    float32 rounding (on the old cases, Krum's float32 scores of the identical rows broke the
    tie by rounding and the search ran to τ ≈ 5e6, where the objective is flat to 1e-8)."""
    from rfrs_ref.attack import optimal

    for entry in _index(exported):
        if entry["kind"] != "attack":
            continue
        meta, inp, _ = golden.load_case(exported / entry["name"])
        byz = inp["byzantine"]
        assert (inp["n_samples"][byz] == inp["n_samples"][byz][0]).all(), entry["name"]
        if meta["params"]["attack"] not in ("opt-ipm", "opt-alie"):
            continue
        values = []
        search = optimal.line_search

        def traced(objective, *args, **kwargs):
            return search(lambda tau: values.append(objective(tau)) or values[-1], *args, **kwargs)

        optimal.line_search = traced
        try:
            golden.compute_attack(inp, meta["params"], "numpy")
        finally:
            optimal.line_search = search
        best = values[0]
        for y in values[1:]:
            if y > best:
                assert y - best > 5e-3 * abs(best), (entry["name"], values)
                best = y
            else:
                assert best - y > 5e-3 * abs(best), (entry["name"], values)

def test_federated_trace_excludes_the_noisy_uploads(exported):
    _, _, out = golden.load_case(exported / "federated/adam-trmean-parameter-noise-f64")
    for t in (1, 2, 3):
        byz, ver = out[f"r{t}_byzantine"], out[f"r{t}_verified"]
        assert (ver == ~byz).all()  # every noisy upload and no honest one is excluded
        assert out[f"r{t}_f_rule"] == max(0, out[f"r{t}_f"] - int(byz.sum()))
        assert out[f"r{t}_features"].shape[0] == int(ver.sum())


# -- check -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_fresh_export_checks_clean(exported, backend):
    results = golden.check(exported, (backend,))
    assert len(results) == len(_index(exported))
    assert [r.line() for r in results if not r.ok] == []


def _check_one(root, name, backend="numpy"):
    return golden.check_case(root / name, backend)


def test_perturbed_float_output_is_caught_with_its_location(exported, tmp_path):
    root = _copy(exported, tmp_path)
    name = "aggregate/krum-gradient-f64"
    path = root / name / "out.weights.npy"
    w = np.load(path)
    before = float(w[3])
    w[3] += 1e-9
    np.save(path, w)
    res = _check_one(root, name)
    assert not res.ok
    (m,) = res.mismatches
    assert m.output == "weights" and m.index == (3,)
    assert m.expected == before + 1e-9 and m.got == before
    assert "FAIL" in res.line() and "'weights' index (3,)" in res.line()


def test_perturbed_input_is_caught_downstream(exported, tmp_path):
    root = _copy(exported, tmp_path)
    name = "optim/adam-f64"
    path = root / name / "in.g.npy"
    g = np.load(path)
    g[4] *= 1.0 + 1e-9
    np.save(path, g)
    res = _check_one(root, name)
    assert not res.ok
    outputs = {m.output for m in res.mismatches}
    assert {"upload_m", "upload_v", "recovered"} & outputs
    assert any(m.index == (4,) for m in res.mismatches)


def test_perturbed_exact_output_and_json_value_are_caught(exported, tmp_path):
    root = _copy(exported, tmp_path)
    name = "aggregate/bulyan-parameter-f64"
    path = root / name / "out.bulyan_selected.npy"
    sel = np.load(path)
    sel[[0, 1]] = sel[[1, 0]]
    np.save(path, sel)
    res = _check_one(root, name)
    assert [m.output for m in res.mismatches] == ["bulyan_selected"]
    assert res.mismatches[0].index == (0,)

    name = "optim/rmsprop-f32"
    meta_path = root / name / "case.json"
    meta = json.loads(meta_path.read_text())
    meta["outputs"]["verdict_r-rule_check"]["value"] = "theta-rule"
    meta_path.write_text(json.dumps(meta))
    res = _check_one(root, name)
    (m,) = res.mismatches
    assert m.output == "verdict_r-rule_check" and m.expected == "theta-rule" and m.got == "r-rule"


def test_a_missing_output_or_unreadable_case_is_a_failure(exported, tmp_path):
    root = _copy(exported, tmp_path)
    name = "attack/alie-adam-f64"
    meta_path = root / name / "case.json"
    meta = json.loads(meta_path.read_text())
    meta["outputs"]["no_such_output"] = {"compare": "exact", "value": 1, "role": "required"}
    meta_path.write_text(json.dumps(meta))
    res = _check_one(root, name)
    assert not res.ok and "not produced" in res.line()
    (root / "attack/ipm-adam-f64/in.grads.npy").unlink()
    res = _check_one(root, "attack/ipm-adam-f64")
    assert not res.ok and "cannot read the case" in res.error


def test_compare_output_rules():
    spec = {"compare": "close", "rtol": 1e-12, "atol": 0.0}
    nan_inf = np.array([np.nan, np.inf, -np.inf, 1.0])
    assert golden.compare_output("x", spec, nan_inf, nan_inf.copy()) is None
    m = golden.compare_output("x", spec, nan_inf, np.array([np.nan, np.inf, np.inf, 1.0]))
    assert m.index == (2,)
    m = golden.compare_output("x", spec, np.array([1.0]), np.array([np.nan]))
    assert m.index == (0,)
    m = golden.compare_output("x", spec, np.zeros((2, 3)), np.zeros((3, 2)))
    assert "shape" in str(m)
    assert golden.compare_output("x", spec, 1.0, 1.0 + 1e-13) is None
    assert golden.compare_output("x", spec, 1.0, 1.0 + 1e-11) is not None
    assert golden.compare_output("x", {"compare": "exact"}, True, np.bool_(True)) is None
    assert golden.compare_output("x", {"compare": "exact"}, None, "nonfinite") is not None


# -- command line ------------------------------------------------------------------------------------

def test_cli_export_and_check(tmp_path):
    from rfrs_ref.cli.main import main

    runner = CliRunner()
    out = runner.invoke(main, ["golden", "export", str(tmp_path / "v"), "--only", "optim/sgd-*"])
    assert out.exit_code == 0, out.output
    assert "wrote 2 cases" in out.output
    res = runner.invoke(main, ["golden", "check", str(tmp_path / "v"), "--backend", "all"])
    assert res.exit_code == 0, res.output
    assert res.output.count("ok    optim/sgd-") == 4
    path = tmp_path / "v/optim/sgd-f64/out.upload_theta.npy"
    a = np.load(path)
    a[0] += 1.0
    np.save(path, a)
    res = runner.invoke(main, ["golden", "check", str(tmp_path / "v"), "-q"])
    assert res.exit_code == 1
    assert "FAIL  optim/sgd-f64 [numpy]: output 'upload_theta' index (0,)" in res.output
    assert "1 FAIL" in res.output
    res = runner.invoke(main, ["golden", "export", str(tmp_path / "w"), "--only", "nothing/*"])
    assert res.exit_code != 0 and "no case matches" in res.output
    # a case's folder, or a family's, named instead of the vectors' folder: the --only that
    # checks it is shown
    for part, only in (("optim/sgd-f64", "optim/sgd-f64"), ("optim", "optim/*")):
        res = runner.invoke(main, ["golden", "check", str(tmp_path / "v" / part)])
        assert res.exit_code == 1 and "Traceback" not in res.output
        assert f"rfrs-ref golden check {tmp_path / 'v'} --only '{only}'" in res.output, res.output
    # a bare rule name matches nothing: the message shows what a pattern looks like
    res = runner.invoke(main, ["golden", "export", str(tmp_path / "w"), "--only", "krum"])
    assert res.exit_code != 0 and "no case matches krum" in res.output
    assert "'aggregate/krum-*'" in res.output
    # and leaves no folder with an empty index behind ("no case to check" next)
    assert not (tmp_path / "w").exists()


# -- the agreement rule as a law: one corrupted value always fails, on either side -----------------------------

#: one case per kind (recomputed once per session)
LAW_CASES = ["model/fism-bpr-exact-f32", "optim/adam-f64", "aggregate/krum-gradient-nonfinite-f64",
             "aggregate/trmean-gradient-huge-f64", "attack/alie-adam-f32", "federated/adam-trmean-parameter-noise-f64"]
_RECOMPUTED: dict = {}


def _recomputed(exported, name):
    if name not in _RECOMPUTED:
        meta, inputs, expected = golden.load_case(exported / name)
        got = golden.KINDS[meta["kind"]](inputs, meta["params"], "numpy")
        _RECOMPUTED[name] = (meta, expected, got)
    return _RECOMPUTED[name]


def _float_outputs(meta, expected):
    return sorted(k for k, v in expected.items()
                  if (isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size)
                  or (isinstance(v, float)))


@given(data=st.data(), bad=st.sampled_from([np.nan, np.inf, -np.inf, 1e38, -1e38]),
       side=st.sampled_from(["candidate", "reference"]))
def test_any_float_output_corrupted_to_nonfinite_or_huge_fails(exported, data, bad, side):
    """Recompute a case (it agrees), corrupt any one float value of its outputs, in the
    recomputation or in the expected values, to NaN, ±inf or ±1e38: the check fails
    on that output."""
    name = data.draw(st.sampled_from(LAW_CASES), label="case")
    meta, expected, got = _recomputed(exported, name)
    for k, spec in meta["outputs"].items():
        assert golden.compare_output(k, spec, expected[k], got[k]) is None, k
    out = data.draw(st.sampled_from(_float_outputs(meta, expected)), label="output")
    e, g = expected[out], got[out]
    if isinstance(e, np.ndarray):
        idx = data.draw(st.integers(0, e.size - 1), label="index")
        e, g = np.array(e, dtype=np.float64, copy=True), np.array(g, dtype=np.float64, copy=True)
        target = g if side == "candidate" else e
        old = float(target.flat[idx])
        target.flat[idx] = bad
        where = tuple(int(i) for i in np.unravel_index(idx, e.shape))
    else:
        old = float(g if side == "candidate" else e)
        if side == "candidate":
            g = bad
        else:
            e = bad
        where = None
    assume(not (old == bad or (np.isnan(old) and np.isnan(bad))))
    m = golden.compare_output(out, meta["outputs"][out], e, g)
    assert m is not None
    if where is not None:
        assert m.index == where


# -- ε matters in every optimiser case that has one ---------------------------------------------------

def _theta_eps_inside(meta, inputs, where: str = "inside"):
    """θ of the case's rule recomputed in float64 with ε inside the square root
    (``where="inside"``) or outside it (rfrs-ref's convention)."""
    p, h = meta["params"], meta["params"]["hyperparameters"]
    t = int(p["t"])
    g = inputs["g"].astype(np.float64)
    th = inputs["state_theta"].astype(np.float64)
    root = (lambda x: np.sqrt(x + h["eps"])) if where == "inside" else (lambda x: np.sqrt(x) + h["eps"])
    if p["optimizer"] == "adam":
        b1, b2 = h["beta1"], h["beta2"]
        m = b1 * inputs["state_m"].astype(np.float64) + (1 - b1) * g
        v = b2 * inputs["state_v"].astype(np.float64) + (1 - b2) * g * g
        lr_t = h["lr"] * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        return th - lr_t * m / root(v)
    r = inputs["state_r"].astype(np.float64)
    r = r + g * g if p["optimizer"] == "adagrad" else h["beta4"] * r + (1 - h["beta4"]) * g * g
    return th - h["lr"] * g / root(r)


def test_every_optimizer_case_with_eps_catches_eps_inside_the_root(exported):
    """A float32 Adam with ε inside √ passed optim/adam-f32: its v̄ ≥ 3.7e-3 made ε = 1e-8
    change θ by 1.25e-9 against an atol of 1.1e-5 (rmsprop-f32 and adagrad-f32 likewise).
    Every optimiser case with ε holds coordinates where √v (√r) is of the order of ε:
    there ε inside the root misses θ by more than 10 times the case's tolerance, in
    float32 and float64, while ε outside (the rule) stays within a tenth of it."""
    names = [e["name"] for e in _index(exported) if e["name"].startswith("optim/")]
    with_eps = [n for n in names if n.split("/")[1].split("-")[0] in ("adam", "adagrad", "rmsprop")]
    assert {n.rsplit("-", 1)[1] for n in with_eps} == {"f32", "f64"} and len(with_eps) == 7
    for name in with_eps:
        meta, inputs, expected = golden.load_case(exported / name)
        spec = meta["outputs"]["upload_theta"]
        exp = np.asarray(expected["upload_theta"], dtype=np.float64)
        tol = spec["atol"] + spec["rtol"] * np.abs(exp)
        wrong = _theta_eps_inside(meta, inputs)
        assert golden.compare_output("upload_theta", spec, expected["upload_theta"], wrong) is not None, name
        assert np.max(np.abs(wrong - exp) / tol) > 10, name
        right = _theta_eps_inside(meta, inputs, "outside")
        assert np.max(np.abs(right - exp) / tol) < 0.1, name

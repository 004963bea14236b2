"""Hostile golden vectors: paths leading out of the vectors, garbage JSON and arrays,
unusable tolerances, non-finite values.

`golden check` reads vectors someone else may have written. A defect of the
index is one line and exit status 1 before any case runs; a defect of one
case is a FAIL line for that case (the others still run), never a traceback
and never an "ok" for a file it did not read from inside the vectors.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

from rfrs_ref import golden

CASE = "optim/sgd-f64"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden-hostile") / "vectors"
    golden.export(root, only=["optim/sgd-*"])
    return root


@pytest.fixture
def vectors(pristine, tmp_path):
    """A private copy of two exported cases (optim/sgd-f64, optim/sgd-f32)."""
    root = tmp_path / "vectors"
    shutil.copytree(pristine, root)
    return root


def _cli(*args):
    from rfrs_ref.cli.main import main

    return CliRunner().invoke(main, ["golden", *map(str, args)])


def _refused(res, *fragments) -> str:
    assert res.exit_code != 0, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    errors = [x for x in res.output.splitlines() if x.startswith("Error")]
    assert len(errors) == 1, res.output
    for frag in fragments:
        assert frag in errors[0], errors[0]
    return errors[0]


def _case_fails(root, *fragments, name=CASE, only=False) -> str:
    """`golden check` runs (``only``: on case ``name`` alone), reports FAIL for case ``name``
    with ``fragments``, exits 1."""
    res = _cli("check", root, *(("--only", name) if only else ()))
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    line = next(x for x in res.output.splitlines() if x.startswith("FAIL") and name in x)
    assert "\n" not in line
    for frag in fragments:
        assert frag in line, line
    return line


def _edit_json(path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def test_the_copy_checks_clean(vectors):
    res = _cli("check", vectors)
    assert res.exit_code == 0 and "2 ok, 0 FAIL" in res.output, res.output


# -- 3. paths from index.json and case.json stay inside the vectors --------------------------------------

@pytest.fixture
def outside(vectors, tmp_path):
    """A valid copy of the case outside the vectors directory (checking it would pass)."""
    out = tmp_path / "outside"
    shutil.copytree(vectors / CASE, out / "case")
    return out


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_an_index_path_leading_outside_is_refused(vectors, outside, how):
    target = "../outside/case/case.json" if how == "dotdot" else str(outside / "case" / "case.json")
    _edit_json(vectors / "index.json", lambda d: d["cases"][0].update(path=target))
    msg = _refused(_cli("check", vectors), "index.json", repr(target))
    assert ("climbs out" in msg) if how == "dotdot" else ("absolute" in msg)
    with pytest.raises(golden.GoldenFormatError, match="index.json"):
        golden.check(vectors)


def test_an_index_path_through_a_symlink_leading_outside_is_refused(vectors, outside):
    (vectors / "optim" / "elsewhere").symlink_to(outside / "case", target_is_directory=True)
    _edit_json(vectors / "index.json", lambda d: d["cases"][0].update(path="optim/elsewhere/case.json"))
    _refused(_cli("check", vectors), "index.json", "optim/elsewhere/case.json", "symbolic link")


def test_a_symlink_inside_the_vectors_is_followed(vectors):
    """A link that stays inside the directory is fine."""
    (vectors / "optim" / "alias").symlink_to(vectors / CASE, target_is_directory=True)
    _edit_json(vectors / "index.json", lambda d: d["cases"][0].update(path="optim/alias/case.json"))
    res = _cli("check", vectors)
    assert res.exit_code == 0, res.output


def test_an_index_path_to_something_else_than_a_case_is_refused(vectors):
    _edit_json(vectors / "index.json", lambda d: d["cases"][0].update(path="optim/sgd-f64/in.g.npy"))
    _refused(_cli("check", vectors), "index.json", "does not name a case.json")



def test_a_link_loop_in_the_vectors_is_one_line_not_a_traceback(vectors, tmp_path):
    """An index path, an array file or the export's index.json through a link to itself
    raised RuntimeError ("Symlink loop") out of golden check and export."""
    (vectors / "optim" / "loop").symlink_to("loop")
    _edit_json(vectors / "index.json", lambda d: d["cases"][0].update(path="optim/loop/case.json"))
    _refused(_cli("check", vectors), "index.json", "optim/loop/case.json", "symbolic link loop")
    fresh = tmp_path / "fresh"
    shutil.copytree(vectors, fresh, symlinks=True)
    _edit_json(fresh / "index.json", lambda d: d["cases"][0].update(path=f"{CASE}/case.json"))
    (fresh / CASE / "in.g.npy").unlink()
    (fresh / CASE / "in.g.npy").symlink_to("in.g.npy")
    _case_fails(fresh, "cannot read the case", "'in.g.npy'", "symbolic link loop")
    out = tmp_path / "out"
    out.mkdir()
    (out / "index.json").symlink_to("index.json")
    _refused(_cli("export", out, "--only", "optim/sgd-*"), "index.json", "symbolic link loop")

@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_a_case_file_leading_outside_is_refused(vectors, outside, how):
    case = vectors / CASE
    if how == "dotdot":
        target = "../../../outside/case/in.g.npy"
    elif how == "absolute":
        target = str(outside / "case" / "in.g.npy")
    else:
        (case / "in.g.npy").unlink()
        (case / "in.g.npy").symlink_to(outside / "case" / "in.g.npy")
        target = "in.g.npy"
    _edit_json(case / "case.json", lambda d: d["inputs"]["g"].update(file=target))
    _case_fails(vectors, "cannot read the case", "case.json", repr(target))


@pytest.mark.parametrize("target", ["", "in.g.npy\x00.txt", "C:\\evil.npy", "\\\\host\\share\\x.npy", 5, None])
def test_a_case_file_that_is_no_relative_path_is_refused(vectors, target):
    _edit_json(vectors / CASE / "case.json", lambda d: d["inputs"]["g"].update(file=target))
    _case_fails(vectors, "cannot read the case")


# -- 4. garbage where JSON is expected ------------------------------------------------------------------

GARBAGE = {
    "binary": b"\x89PNG\r\n\x1a\n" + bytes(range(256)),
    "nested": b"[" * 100_000 + b"]" * 100_000,
    "digits": b'{"format": "rfrs-golden", "version": 1, "cases": [], "seed": ' + b"9" * 5000 + b"}",
    "truncated": b'{"format": "rfrs-golden", "version": 1, "cases": [',
    "empty": b"",
    "not an object": b"[1, 2, 3]",
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_a_garbage_index(vectors, kind):
    (vectors / "index.json").write_bytes(GARBAGE[kind])
    _refused(_cli("check", vectors), "index.json")


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_a_garbage_case_json(vectors, kind):
    (vectors / CASE / "case.json").write_bytes(GARBAGE[kind])
    line = _case_fails(vectors, "cannot read the case")
    assert "optim/sgd-f32" not in line
    res = _cli("check", vectors)
    assert "ok    optim/sgd-f32 [numpy]" in res.output  # the other case still runs


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.update(cases={"a": 1}), "'cases' must be a list"),
    (lambda d: d.update(cases=[5]), "case entry 0"),
    (lambda d: d["cases"][0].update(name=["x"]), "case entry 0"),
    (lambda d: d.update(version=True), "not a rfrs-golden version 1 index"),
])
def test_a_mistyped_index(vectors, edit, fragment):
    _edit_json(vectors / "index.json", edit)
    _refused(_cli("check", vectors), "index.json", fragment)


@pytest.mark.parametrize("edit", [
    lambda d: d.update(inputs=[1]),
    lambda d: d["inputs"].update(g="in.g.npy"),
    lambda d: d.update(outputs=None),
    lambda d: d.update(kind=["bpr"]),
    lambda d: d.update(params="sgd"),
    lambda d: d.update(name=None),
    lambda d: d["inputs"]["g"].update(shape=[10 ** 12]),
    lambda d: d["inputs"]["g"].update(dtype="complex128"),
])
def test_a_mistyped_case(vectors, edit):
    _edit_json(vectors / CASE / "case.json", edit)
    _case_fails(vectors)


def test_a_deeply_nested_case_value(vectors):
    nest: list = []
    for _ in range(200):
        nest = [nest]
    _edit_json(vectors / CASE / "case.json", lambda d: d["outputs"]["step_size"].update(value=nest))
    _case_fails(vectors, "nested more than")


# -- 4. garbage where an .npy array is expected ------------------------------------------------------------

def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(a), allow_pickle=True)
    return buf.getvalue()


def _npz() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("g.npy", _npy(np.zeros(9)))
    return buf.getvalue()


def _claims_huge() -> bytes:
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }"
    header += " " * (63 - len(header) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\x00" * 64


NPY_GARBAGE = {
    "text": b"this is not an array",
    "binary": bytes(range(256)),
    "empty": b"",
    "npz": _npz(),
    "pickled objects": _npy(np.array([{"a": 1}, None], dtype=object)),
    "complex": _npy(np.zeros(9, dtype=np.complex128)),
    "structured": _npy(np.zeros(9, dtype=[("a", "<f8")])),
    "header claims a terabyte": _claims_huge(),
    "truncated": _npy(np.zeros(9))[:-8],
    "wrong shape": _npy(np.zeros((3, 3))),
    "wrong dtype": _npy(np.zeros(9, dtype=np.float32)),
}


@pytest.mark.parametrize("kind", list(NPY_GARBAGE))
def test_a_garbage_input_array(vectors, kind):
    (vectors / CASE / "in.g.npy").write_bytes(NPY_GARBAGE[kind])
    _case_fails(vectors, "cannot read the case", "in.g.npy")


@pytest.mark.parametrize("kind", ["npz", "pickled objects", "header claims a terabyte", "wrong shape"])
def test_a_garbage_output_array(vectors, kind):
    (vectors / CASE / "out.upload_theta.npy").write_bytes(NPY_GARBAGE[kind])
    _case_fails(vectors, "cannot read the case", "out.upload_theta.npy")


def test_an_array_file_that_is_a_directory(vectors):
    p = vectors / CASE / "in.g.npy"
    p.unlink()
    p.mkdir()
    _case_fails(vectors, "is a directory")


# -- unusable comparison rules and non-finite values -----------------------------------------------------

@pytest.mark.parametrize("spec", [
    {"compare": "close", "rtol": float("inf"), "atol": 0.0},
    {"compare": "close", "rtol": 1e-6, "atol": float("nan")},
    {"compare": "close", "rtol": -1.0, "atol": 0.0},
    {"compare": "close", "rtol": "1e300", "atol": 0.0},
    {"compare": "close", "rtol": True, "atol": 0.0},
    {"compare": "close"},
    {"compare": "whatever"},
    {},
])
def test_a_case_cannot_declare_everything_equal(vectors, spec):
    """With rtol = inf any finite value would 'match'; a case's rule is input too."""
    def edit(d):
        out = d["outputs"]["upload_theta"]
        for k in ("compare", "rtol", "atol"):
            out.pop(k, None)
        out.update(spec)

    text = json.dumps(json.loads((vectors / CASE / "case.json").read_text()))
    _edit_json(vectors / CASE / "case.json", edit)
    assert (vectors / CASE / "case.json").read_text() != text
    _case_fails(vectors, "upload_theta")


@pytest.mark.parametrize("value", ["Infinity", "NaN", "1e999", "1" + "0" * 400])
def test_a_nonfinite_or_overflowing_expected_scalar_fails(vectors, value):
    path = vectors / CASE / "case.json"
    doc = json.loads(path.read_text())
    doc["outputs"]["step_size"]["value"] = 12345.0
    path.write_text(json.dumps(doc).replace("12345.0", value))
    _case_fails(vectors, "step_size")


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 1e38])
def test_a_nonfinite_expected_array_value_fails(vectors, value):
    path = vectors / CASE / "out.upload_theta.npy"
    a = np.load(path)
    a[4] = value
    np.save(path, a)
    _case_fails(vectors, "upload_theta", "index (4,)")


def test_a_ragged_json_value_is_a_mismatch_not_a_crash(vectors):
    _edit_json(vectors / CASE / "case.json",
               lambda d: d["outputs"]["step_size"].update(value=[[1.0], [1.0, 2.0]]))
    _case_fails(vectors, "step_size")


def test_compare_output_reads_the_tolerance_from_the_expected_value():
    spec = {"compare": "close", "rtol": 0.6, "atol": 0.0}
    assert golden.compare_output("x", spec, 2.0, 1.0) is None  # |Δ| = 1 ≤ 0.6·2
    assert golden.compare_output("x", spec, 1.0, 2.0) is not None  # |Δ| = 1 > 0.6·1
    assert golden.compare_output("x", spec, np.array([1.0]), np.array([2.0])) is not None
    for bad in (np.inf, -np.inf, np.nan):
        assert golden.compare_output("x", spec, 1.0, bad) is not None
        assert golden.compare_output("x", spec, np.array([1.0]), np.array([bad])) is not None
    assert golden.compare_output("x", spec, np.inf, np.inf) is None
    assert golden.compare_output("x", spec, np.nan, np.nan) is None
    assert golden.compare_output("x", {"compare": "exact"}, np.inf, np.inf) is None


# -- export --only merging a garbage index ------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["binary", "nested", "not an object"])
def test_export_refuses_to_merge_a_garbage_index_before_writing(tmp_path, kind):
    root = tmp_path / "v"
    root.mkdir()
    (root / "index.json").write_bytes(GARBAGE[kind])
    _refused(_cli("export", root, "--only", "optim/sgd-*"), "index.json")
    assert sorted(os.listdir(root)) == ["index.json"]


def test_an_index_that_is_a_device_is_not_read_forever(vectors):
    (vectors / "index.json").unlink()
    (vectors / "index.json").symlink_to("/dev/zero")
    # outside the vectors: refused as such before it is opened
    _refused(_cli("check", vectors), "index.json", "leads outside")
    (vectors / "index.json").unlink()
    os.mkfifo(vectors / "index.json")  # inside: a pipe would block the read
    _refused(_cli("check", vectors), "index.json", "not a regular file")


@pytest.mark.parametrize("what", ["index.json", "case.json", "array"])
def test_a_file_too_large_for_a_golden_case_is_not_read(vectors, what):
    """A sparse index.json, case.json or .npy of a terabyte takes a few bytes of disk: it was
    read whole into memory (a MemoryError traceback, or the system killing the check). A
    file larger than golden.MAX_FILE_BYTES, or an array whose header claims more, is refused
    from its size, before it is read."""
    size = golden.MAX_FILE_BYTES + 1
    if what == "index.json":
        os.truncate(vectors / "index.json", size)
        _refused(_cli("check", vectors), "index.json", f"{size:,} bytes, more than the "
                 f"{golden.MAX_FILE_BYTES:,} bytes")
        return
    if what == "case.json":
        os.truncate(vectors / CASE / "case.json", size)
    else:
        path = vectors / CASE / "in.g.npy"
        header = np.lib.format.header_data_from_array_1_0(np.zeros(1))
        header["shape"] = (size // 8 + 1,)
        with open(path, "wb") as fh:
            np.lib.format.write_array_header_1_0(fh, header)
            fh.truncate(fh.tell() + 8 * header["shape"][0])  # the data it claims, sparse
        _edit_json(vectors / CASE / "case.json", lambda d: d["inputs"]["g"].update(shape=[size // 8 + 1]))
    _case_fails(vectors, "cannot read the case", f"more than the {golden.MAX_FILE_BYTES:,}")


@pytest.mark.parametrize("rounds", [10 ** 9, 0, 2, "3", True])
def test_a_federated_case_cannot_claim_an_endless_run(tmp_path, rounds):
    """The run's length comes from case.json; 10⁹ rounds would run for days."""
    root = tmp_path / "v"
    golden.export(root, only=["federated/adam-krum-gradient-ascent-f64"])
    res = _cli("check", root)
    assert res.exit_code == 0, res.output
    _edit_json(root / "federated/adam-krum-gradient-ascent-f64/case.json",
               lambda d: d["params"].update(rounds=rounds))
    _case_fails(root, "params.rounds", "must describe rounds 1 to params.rounds",
                name="federated/adam-krum-gradient-ascent-f64")


@pytest.mark.parametrize("key", ["r\u00b2_f", "r\u0661_f", "r1\u00b9_f"])
def test_a_round_key_of_non_ascii_digits_fails_its_case_and_the_others_run(tmp_path, key):
    """'r²_f' passed str.isdigit and then int('²') raised: `golden check` ended with the bare
    line `Error: invalid literal for int() with base 10: '²'`, naming no case, and checked no
    other case."""
    root = tmp_path / "v"
    golden.export(root, only=["federated/adam-krum-gradient-ascent-f64", "optim/sgd-f64"])
    case = "federated/adam-krum-gradient-ascent-f64"

    def rename(d):
        d["outputs"][key] = d["outputs"].pop("r1_f")

    _edit_json(root / case / "case.json", rename)
    line = _case_fails(root, repr(key), name=case)
    assert "invalid literal" not in line
    res = _cli("check", root)
    assert any(x.startswith("ok") and "optim/sgd-f64" in x for x in res.output.splitlines()), res.output


# -- cases that check nothing, or less than they state --------------------------------------------------

@pytest.mark.parametrize("spec", [
    {"compare": "close", "rtol": 1e300, "atol": 0.0},
    {"compare": "close", "rtol": 1.0, "atol": 0.0},
    {"compare": "close", "rtol": 0.0, "atol": 1e300},
    {"compare": "close", "rtol": 1e-15, "atol": 1e3},
])
def test_a_finite_tolerance_that_accepts_zero_everywhere_is_unusable(vectors, spec):
    """Finite and ≥ 0, yet 0 (or any value of the same order) would match: the case checks nothing."""
    def edit(d):
        d["outputs"]["upload_theta"].update(spec)

    _edit_json(vectors / CASE / "case.json", edit)
    line = _case_fails(vectors, "upload_theta", "unusable tolerance", "checks nothing")
    assert "1 ok, 1 FAIL" in _cli("check", vectors).output, line


def test_a_tolerance_is_judged_against_a_nonzero_expected_value_only():
    """An expected value that is all zero has no magnitude: the tolerance is used as stated."""
    spec = {"compare": "close", "rtol": 0.5, "atol": 1e-3}
    assert golden.compare_output("x", spec, np.zeros(3), np.full(3, 1e-4)) is None
    assert golden.compare_output("x", spec, np.zeros(3), np.full(3, 1e-2)) is not None
    assert golden.compare_output("x", spec, np.array([0.0, 1.0]), np.array([0.0, 1.2])) is None


def test_a_case_that_states_no_output_fails(vectors):
    _edit_json(vectors / CASE / "case.json", lambda d: d.update(outputs={}))
    _case_fails(vectors, "states no output", "nothing to compare")



def test_a_check_that_checks_no_case_raises_from_python_too(vectors):
    """golden.check returned [] for an index listing no case (or an --only matching none),
    and `all(r.ok for r in golden.check(d))` passed; the CLI alone refused it."""
    with pytest.raises(ValueError, match="no case to check matches nothing/"):
        golden.check(vectors, only=["nothing/*"])
    for folder in (vectors / "optim").iterdir():
        shutil.rmtree(folder)
    _edit_json(vectors / "index.json", lambda d: d.update(cases=[]))
    with pytest.raises(golden.GoldenFormatError, match="index.json: lists no case"):
        golden.check(vectors)
    _refused(_cli("check", vectors), "lists no case")

def test_a_case_that_leaves_out_an_output_fails(vectors):
    """A cut-down case.json (one output deleted) would check less than its 'ok' says."""
    _edit_json(vectors / CASE / "case.json", lambda d: d["outputs"].pop("upload_theta"))
    _case_fails(vectors, "'upload_theta'", "not stated in the case")


def test_a_duplicate_key_in_a_case_or_the_index(vectors):
    """JSON readers disagree on which of two equal keys wins: refused, naming the key."""
    path = vectors / CASE / "case.json"
    text = path.read_text()
    path.write_text(text.replace('"outputs": {', '"outputs": {"step_size": {"value": 1e300}, ', 1)
                    if '"outputs": {' in text else text.replace('"outputs":{', '"outputs":{"step_size":{}, ', 1))
    _case_fails(vectors, "duplicate key 'step_size'")
    index = vectors / "index.json"
    index.write_text(index.read_text().replace('"format":', '"seed": 1, "format":', 1))
    _refused(_cli("check", vectors), "index.json", "duplicate key 'seed'")


def test_a_lone_surrogate_in_a_case_name_is_refused(vectors):
    """A case named "optim/sgd-f64\\ud800" (half a UTF-16 pair: no text) in the index and
    its case.json was printed in its FAIL line: `golden check` ended with a
    UnicodeEncodeError traceback."""
    name = CASE + "\ud800"
    _edit_json(vectors / "index.json",
               lambda d: next(c for c in d["cases"] if c["name"] == CASE).update(name=name))
    _edit_json(vectors / CASE / "case.json", lambda d: d.update(name=name))
    _refused(_cli("check", vectors), "index.json", "lone UTF-16 surrogate")


def test_an_index_with_a_byte_order_mark(vectors):
    index = vectors / "index.json"
    index.write_bytes(b"\xef\xbb\xbf" + index.read_bytes())
    _refused(_cli("check", vectors), "index.json", "byte order mark")


def test_the_exported_tolerance_of_huge_byzantine_rows_checks_the_aggregate(tmp_path):
    """The 1e38 rows a robust rule discards used to set the scale: atol ≈ 7e23 accepted any
    aggregate of magnitude ~1 (an all-zero aggregate passed)."""
    for rule in ("krum", "median", "caf"):
        case = next(c for c in golden.all_cases([f"aggregate/{rule}-gradient-huge-f64"]))
        for k in ("aggregate_theta", "aggregate_m"):
            e = case.outputs[k]
            spec = {"compare": "close", "rtol": e.rtol, "atol": e.atol}
            assert e.atol < 1e-10, (rule, k, e.atol)
            assert golden.compare_output(k, spec, e.value, np.zeros_like(e.value)) is not None
            assert golden.compare_output(k, spec, e.value, e.value * (1 + 1e-6)) is not None
            assert golden.compare_output(k, spec, e.value, e.value.copy()) is None


@pytest.mark.parametrize("how", ["same entry twice", "two names, one folder"])
def test_an_index_that_lists_a_case_twice_is_refused(vectors, how):
    """'2 cases, 2 ok' must not hide that optim/sgd-f32 was never checked."""
    def edit(d):
        first, second = d["cases"]
        if how == "same entry twice":
            d["cases"] = [first, dict(first)]
        else:
            second["path"] = first["path"]

    _edit_json(vectors / "index.json", edit)
    _refused(_cli("check", vectors), "index.json", "each case is listed once")


def test_an_index_name_must_be_the_case_it_points_to(vectors):
    def edit(d):
        d["cases"][0]["name"], d["cases"][1]["name"] = d["cases"][1]["name"], d["cases"][0]["name"]

    _edit_json(vectors / "index.json", edit)
    _case_fails(vectors, "the index lists it as", name="optim/sgd-f32")


@pytest.mark.parametrize("case, key, value", [
    ("aggregate/rfa-gradient-f64", "max_iter", 10 ** 12),
    ("aggregate/cc-gradient-f64", "iterations", 10 ** 12),
    ("aggregate/mda-gradient-f64", "max_subsets", 10 ** 15),
    ("aggregate/rfa-gradient-f64", "max_iter", -1),
    ("aggregate/rfa-gradient-f64", "max_iter", "100"),
])
def test_a_case_cannot_make_the_recomputation_loop_for_ever(tmp_path, case, key, value):
    """10¹² iterations of centered clipping used to hang `golden check` (RFA stops when its
    iterate stops moving, but nothing else bounds a count read from the case)."""
    root = tmp_path / "v"
    golden.export(root, only=[case])

    def edit(d):
        d["params"]["hyperparameters"][key] = value
        if key == "max_iter":
            d["params"]["hyperparameters"]["tol"] = 0.0  # never converges: all the steps run

    _edit_json(root / case / "case.json", edit)
    _case_fails(root, f"params.hyperparameters.{key} is {value!r}", "must be an integer from 0", name=case)


def test_a_case_of_too_many_rows_is_refused_before_it_is_recomputed(tmp_path, monkeypatch):
    """Krum's features grown to 5,000 rows of one column (80 kB, well within the file
    limit): the recomputation would build the 5,000² distance matrix (two million rows
    would need terabytes); a case holds at most golden.MAX_ROWS rows, refused in one line
    before anything is computed."""
    case = "aggregate/krum-gradient-f64"
    root = tmp_path / "v"
    golden.export(root, only=[case])
    folder = root / case
    doc = json.loads((folder / "case.json").read_text())
    n = golden.MAX_ROWS + 1
    for key, meta in doc["inputs"].items():
        a = np.load(folder / meta["file"])
        if a.ndim >= 1 and a.shape[0] == np.load(folder / doc["inputs"]["features"]["file"]).shape[0]:
            a = np.resize(a, (n,) + a.shape[1:2] if a.ndim >= 2 else (n,))
            np.save(folder / meta["file"], a)
            meta["shape"] = list(a.shape)
    (folder / "case.json").write_text(json.dumps(doc))
    called = []
    monkeypatch.setitem(golden.KINDS, "aggregate", lambda *a: called.append(1) or {})
    _case_fails(root, f"input 'features' has {n:,} rows", "at most", name=case)
    assert not called


def test_a_case_cut_to_zero_coordinates_fails(vectors):
    """Every array of optim/sgd-f64 cut to no element, outputs recomputed to match: the
    uploads and the recovery compared nothing, and the case was 'ok'."""
    folder = vectors / CASE
    doc = json.loads((folder / "case.json").read_text())
    for meta in doc["inputs"].values():
        a = np.load(folder / meta["file"])
        a = a[..., :0] if a.ndim else a
        np.save(folder / meta["file"], a)
        meta["shape"] = list(a.shape)
    inputs = {k: np.load(folder / m["file"]) for k, m in doc["inputs"].items()}
    got = golden.KINDS[doc["kind"]](inputs, doc["params"], "numpy")
    for k, meta in doc["outputs"].items():
        if "file" in meta:
            a = np.asarray(got[k])
            np.save(folder / meta["file"], a)
            meta["shape"] = list(a.shape)
    (folder / "case.json").write_text(json.dumps(doc))
    _case_fails(vectors, "'upload_theta': the expected value has shape (0,), no element")
    # an empty exact value (no client selected) states its length: compared, not refused
    assert golden.compare_output("selected", {"compare": "exact"}, [], []) is None
    assert golden.compare_output("selected", {"compare": "exact"}, [], [1]) is not None


def test_an_index_that_is_a_link_out_of_the_vectors_is_refused(vectors, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "index.json").write_bytes((vectors / "index.json").read_bytes())
    (vectors / "index.json").unlink()
    (vectors / "index.json").symlink_to(elsewhere / "index.json")
    _refused(_cli("check", vectors), "index.json", "leads outside")
    (vectors / "index.json").unlink()
    (vectors / "index.json").symlink_to("optim/../index.real.json")
    (vectors / "index.real.json").write_bytes((elsewhere / "index.json").read_bytes())
    assert _cli("check", vectors).exit_code == 0  # a link that stays inside is followed


@pytest.mark.parametrize("link", ["optim", "optim/sgd-f64", "index.json"])
def test_export_does_not_write_through_a_link_out_of_the_vectors(tmp_path, link):
    """A vectors directory from elsewhere with `optim -> /somewhere`: export removed
    /somewhere/sgd-f64 and wrote there; a linked index.json had its target overwritten."""
    root = tmp_path / "v"
    outside = tmp_path / "outside"
    (outside / "sgd-f64").mkdir(parents=True)
    (outside / "sgd-f64" / "keep.txt").write_text("precious")
    (outside / "index.json").write_text("precious")
    (root / "optim").mkdir(parents=True) if link != "optim" else root.mkdir()
    target = {"optim": outside, "optim/sgd-f64": outside / "sgd-f64", "index.json": outside / "index.json"}[link]
    (root / link).symlink_to(target)
    _refused(_cli("export", root, "--only", "optim/sgd-*"), "leads outside")
    assert (outside / "sgd-f64" / "keep.txt").read_text() == "precious"
    assert (outside / "index.json").read_text() == "precious"


@pytest.fixture(scope="module")
def krum_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden-krum") / "vectors"
    golden.export(root, only=["aggregate/krum-gradient-f64"])
    return root


def test_an_integer_output_stated_close_is_compared_exactly(krum_case, tmp_path):
    """A case that states the selection, f and the neighbour count as floats near the
    integers under 'close' (rtol 0.25, atol 0.5) passed with 1.1 for client 1."""
    import shutil

    root = tmp_path / "vectors"
    shutil.copytree(krum_case, root)
    folder = root / "aggregate" / "krum-gradient-f64"
    sel = np.load(folder / "out.krum_selected.npy")
    np.save(folder / "out.krum_selected.npy", sel * 1.1)

    def edit(d):
        o = d["outputs"]
        o["krum_selected"].update(compare="close", dtype="float64", rtol=0.25, atol=0.0)
        o["f_used"] = {"compare": "close", "role": "required", "value": o["f_used"]["value"] + 0.4,
                       "rtol": 0.3, "atol": 0.0}
        o["krum_neighbours"] = {"compare": "close", "role": "required",
                                "value": o["krum_neighbours"]["value"] + 0.49, "rtol": 0.0, "atol": 0.5}

    _edit_json(folder / "case.json", edit)
    line = _case_fails(root, "krum_selected", "f_used", "krum_neighbours", name="aggregate/krum-gradient-f64")
    assert "tol" not in line.split("krum_selected")[1], line


def test_an_integer_output_stated_as_an_equal_float_still_matches(krum_case, tmp_path):
    import shutil

    root = tmp_path / "vectors"
    shutil.copytree(krum_case, root)
    folder = root / "aggregate" / "krum-gradient-f64"
    np.save(folder / "out.krum_selected.npy", np.load(folder / "out.krum_selected.npy").astype(np.float64))
    _edit_json(folder / "case.json", lambda d: d["outputs"]["krum_selected"].update(
        compare="close", dtype="float64", rtol=1e-15, atol=0.0))
    res = _cli("check", root)
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("expected, got", [
    (2**53 + 1, float(2**53)), (float(2**53), 2**53 + 1), (-(2**60) - 1, -float(2**60)),
    ([3, 2**53 + 1], [3.0, float(2**53)]), (np.array([2**62 + 1]), np.array([float(2**62)])),
    (np.array([4.0, float(2**53)]), np.array([4, 2**53 + 1])),
])
def test_an_integer_and_a_float_compare_exactly_beyond_two_to_the_53(expected, got):
    """An integer compared with a float went through float64, where 2**53 + 1 rounds to
    2**53: the float 2**53 matched the integer 2**53 + 1 under an exact comparison."""
    from rfrs_ref.golden import compare_output

    for spec in ({"compare": "exact"}, {"compare": "close", "rtol": 0.0, "atol": 0.0}):
        assert compare_output("x", spec, expected, got) is not None, (spec, expected, got)
    assert compare_output("x", {"compare": "exact"}, 2**53, float(2**53)) is None
    assert compare_output("x", {"compare": "exact"}, [1, 2**53], np.array([1.0, float(2**53)])) is None


def test_a_case_folder_the_index_does_not_list_fails(vectors):
    """An index cut down to one case checked that one and passed: the other case folder
    (still in the vectors) was left aside without a word."""
    _edit_json(vectors / "index.json", lambda d: d.update(cases=[c for c in d["cases"] if c["name"] == CASE]))
    line = _case_fails(vectors, "does not list", "not checked", name="optim/sgd-f32")
    assert "optim/sgd-f32/case.json" in line
    res = _cli("check", vectors, "--only", CASE)
    assert res.exit_code == 0, res.output


def test_an_unlisted_case_folder_whose_name_is_not_utf8_fails_in_one_line(vectors):
    """A case folder named with a byte that is not UTF-8 (b"x\\xff", read as "x\\udcff")
    was named in its FAIL line: on a terminal that writes UTF-8 strictly, `golden check`
    ended with a UnicodeEncodeError traceback instead of the line."""
    folder = os.fsencode(vectors / "optim") + b"/x\xff"
    os.mkdir(folder)
    shutil.copy(vectors / CASE / "case.json", os.fsdecode(folder + b"/case.json"))
    line = _case_fails(vectors, "does not list", "not checked", name="optim/x\\udcff")
    assert "\\udcff" in line


# -- a case cannot loosen the tolerance rfrs-ref's export gives an output ----------------------------------

def test_a_case_cannot_state_a_looser_tolerance_than_the_export(vectors):
    """rtol 0.5 is below the "checks nothing" threshold, yet passed an upload 30% off:
    the tolerance a case states may not exceed the one the export gives that output."""
    path = vectors / CASE / "out.upload_theta.npy"
    np.save(path, np.load(path) * 1.3)
    exported = json.loads((vectors / CASE / "case.json").read_text())["outputs"]["upload_theta"]
    _edit_json(vectors / CASE / "case.json", lambda d: d["outputs"]["upload_theta"].update(rtol=0.5))
    line = _case_fails(vectors, "'upload_theta'", "rtol 0.5", repr(exported['rtol']), "looser than")
    assert "1 ok, 1 FAIL" in _cli("check", vectors).output, line


@pytest.mark.parametrize("key, factor", [("rtol", 2.0), ("atol", 2.0), ("atol", 1e6)])
def test_any_stated_tolerance_above_the_exported_one_fails(vectors, key, factor):
    def edit(d):
        out = d["outputs"]["upload_theta"]
        out[key] = out[key] * factor

    _edit_json(vectors / CASE / "case.json", edit)
    _case_fails(vectors, "'upload_theta'", key, "looser than")


def test_a_tighter_or_equal_stated_tolerance_is_used_as_stated(vectors):
    def edit(d):
        out = d["outputs"]["upload_theta"]
        out["rtol"], out["atol"] = out["rtol"] / 2, 0.0

    _edit_json(vectors / CASE / "case.json", edit)
    res = _cli("check", vectors)
    assert res.exit_code == 0, res.output


def test_an_exact_float_output_stated_close_fails(tmp_path):
    """The noise attack's standard normals are exported exact: a case cannot compare them
    within a tolerance."""
    root = tmp_path / "v"
    name = "attack/noise-adam-f64"
    golden.export(root, only=[name])
    _edit_json(root / name / "case.json",
               lambda d: d["outputs"]["noise"].update(compare="close", rtol=1e-9, atol=0.0))
    _case_fails(root, "'noise'", "rtol 1e-09", "exact", name=name)


def test_a_case_rfrs_ref_does_not_export_cannot_state_a_tolerance(vectors):
    """A case renamed (index and case.json alike) has no exported tolerance to be bounded by."""
    _edit_json(vectors / "index.json", lambda d: [c.update(name="optim/my-sgd") for c in d["cases"]
                                                  if c["name"] == CASE])
    _edit_json(vectors / CASE / "case.json", lambda d: d.update(name="optim/my-sgd"))
    _case_fails(vectors, "'upload_theta'", "not a case rfrs-ref exports", name="optim/my-sgd")


# -- the export bounds a tolerance only for the inputs it exports ------------------------------------------

def _restate_outputs(folder, doc, atol) -> None:
    """Recompute the case's outputs (NumPy) from its inputs as they now are, state them in
    ``case.json``, each close output's atol as ``atol(old atol)``."""
    inputs = {k: np.load(folder / m["file"]) for k, m in doc["inputs"].items()}
    got = golden.KINDS[doc["kind"]](inputs, doc["params"], "numpy")
    for k, meta in doc["outputs"].items():
        if "file" in meta:
            np.save(folder / meta["file"], np.asarray(got[k]))
        else:
            meta["value"] = golden._py(got[k])
        if meta.get("compare") == "close":
            meta["atol"] = atol(meta["atol"])
    (folder / "case.json").write_text(json.dumps(doc))


def test_a_case_whose_inputs_differ_from_the_export_fails_saying_so(vectors):
    """One input of optim/sgd-f64 changed slightly, every output recomputed to match and
    stated with the tolerances the export gives them for the inputs it exports (as vectors
    exported by an earlier version whose inputs differ): the atol bound was judged against
    another case's values ("stated tolerance looser than rfrs-ref's export gives it") though
    every value agreed. Such a case fails, saying its inputs differ and to re-export."""
    folder = vectors / CASE
    doc = json.loads((folder / "case.json").read_text())
    g = np.load(folder / "in.g.npy")
    np.save(folder / "in.g.npy", g * (1.0 + 1e-3))
    # the atol an export of these inputs gives: scaled as |g|
    _restate_outputs(folder, doc, lambda atol: atol * (1.0 + 1e-3))
    line = _case_fails(vectors, "inputs differ", "input 'g'", "re-export")
    assert "looser than" not in line and "expected" not in line, line
    assert "1 ok, 1 FAIL" in _cli("check", vectors).output
    # with the atol the export gives the other inputs, the edit fails all the same: a case
    # cannot escape the bound by editing its inputs
    _edit_json(folder / "case.json", lambda d: [o.update(atol=o["atol"] / (1.0 + 1e-3))
                                                for o in d["outputs"].values() if o.get("compare") == "close"])
    _case_fails(vectors, "inputs differ", "input 'g'")
    # the parameters are inputs too
    _edit_json(vectors / "optim/sgd-f32/case.json", lambda d: d["params"]["hyperparameters"].update(lr=0.1))
    line = _case_fails(vectors, "inputs differ", "params", name="optim/sgd-f32")


def test_a_case_with_edited_inputs_cannot_escape_the_rtol_bound(vectors):
    """With inputs that differ the rtol bound, which does not depend on the values, is still
    judged, and the value comparison still runs."""
    g = np.load(vectors / CASE / "in.g.npy")
    np.save(vectors / CASE / "in.g.npy", g * (1.0 + 1e-3))
    _edit_json(vectors / CASE / "case.json", lambda d: d["outputs"]["upload_theta"].update(rtol=0.5))
    line = _case_fails(vectors, "inputs differ", "'upload_theta'", "rtol 0.5", "looser than")
    assert "atol" not in line.split("looser than")[1].split(";")[0], line


def test_a_wrong_value_and_a_looser_tolerance_are_both_reported(vectors):
    """A value off beyond even the loosened tolerance: the tolerance message replaced the
    value mismatch, which was lost."""
    path = vectors / CASE / "out.upload_theta.npy"
    np.save(path, np.load(path) * 3.0)
    _edit_json(vectors / CASE / "case.json", lambda d: d["outputs"]["upload_theta"].update(rtol=0.5))
    line = _case_fails(vectors, "'upload_theta'", "rtol 0.5", "looser than", "expected", "|Δ| > tol")
    assert "inputs differ" not in line, line


def test_a_boolean_output_is_compared_with_booleans_only():
    # [true, false] compared equal to [1, 0]: a flag stated as a count passed
    spec = {"compare": "exact"}
    assert golden.compare_output("x", spec, np.array([True, False]), np.array([True, False])) is None
    for expected, got in (([1, 0], np.array([True, False])), (np.array([True, False]), [1, 0]),
                          (np.array([1.0, 0.0]), np.array([True, False]))):
        m = golden.compare_output("x", spec, expected, got)
        assert m is not None and "a boolean output is compared with booleans only" in str(m)
    assert golden.compare_output("x", spec, [], np.zeros(0, bool)) is None  # JSON's [] has no dtype


@pytest.mark.parametrize("how", ["npy", "json"])
def test_a_case_stating_a_boolean_output_as_integers_fails(tmp_path, how):
    case = "federated/adam-krum-gradient-ascent-f64"
    root = tmp_path / "vectors"
    golden.export(root, only=[case])
    path = root / case / "case.json"
    doc = json.loads(path.read_text())
    entry = doc["outputs"]["r1_verified"]
    flags = np.load(root / case / entry["file"])
    assert flags.dtype == bool and flags.any()
    if how == "npy":
        np.save(root / case / entry["file"], flags.astype(np.int64))
        entry["dtype"] = "int64"
    else:
        for k in ("file", "dtype", "shape"):
            entry.pop(k)
        entry["value"] = flags.astype(int).tolist()
    path.write_text(json.dumps(doc))
    _case_fails(root, "r1_verified", "booleans only", name=case)


def test_a_boolean_inside_a_list_of_numbers_is_compared_with_booleans_only(tmp_path):
    """Krum's selection [2, 1, 5, ...] stated as [2, true, 5, ...] passed: NumPy reads a JSON
    list mixing booleans and integers as integers, true as 1."""
    spec = {"compare": "exact"}
    for expected, got in (([2, True, 5], np.array([2, 1, 5])), ([1.5, True], np.array([1.5, 1.0])),
                          ([[0, False]], np.array([[0, 0]]))):
        m = golden.compare_output("x", spec, expected, got)
        assert m is not None and "a boolean is compared with booleans only" in str(m), (expected, m)
    assert golden.compare_output("x", spec, [2, 1, 5], np.array([2, 1, 5])) is None
    assert golden.compare_output("x", spec, [True, False], np.array([True, False])) is None
    case = "aggregate/krum-gradient-f64"
    root = tmp_path / "vectors"
    golden.export(root, only=[case])
    path = root / case / "case.json"
    doc = json.loads(path.read_text())
    entry = doc["outputs"]["krum_selected"]
    selected = np.load(root / case / entry["file"]).tolist()
    assert 1 in selected
    for k in ("file", "dtype", "shape"):
        entry.pop(k)
    entry["value"] = [True if x == 1 else x for x in selected]
    path.write_text(json.dumps(doc))
    _case_fails(root, "krum_selected", "booleans only", name=case)


# -- export never takes a directory from its owner -------------------------------------------------------

@pytest.mark.parametrize("only", [(), ("--only", "optim/sgd-*")])
def test_export_never_replaces_an_index_that_is_not_golden_vectors(tmp_path, only):
    """`golden export site` over a folder with its own index.json replaced that file with
    the vectors' index (exit 0) when the whole set was exported; only --only refused it."""
    root = tmp_path / "site"
    root.mkdir()
    (root / "index.json").write_text('{"my": "site index"}\n')
    _refused(_cli("export", root, *only), "index.json", "not an index of golden vectors",
             "left as it is")
    assert sorted(os.listdir(root)) == ["index.json"]
    assert (root / "index.json").read_text() == '{"my": "site index"}\n'


def test_export_never_removes_a_folder_it_did_not_write(tmp_path):
    root = tmp_path / "v"
    (root / "optim" / "sgd-f64").mkdir(parents=True)
    (root / "optim" / "sgd-f64" / "notes.md").write_text("mine")
    _refused(_cli("export", root, "--only", "optim/sgd-*"), "notes.md", "no export writes")
    assert os.listdir(root / "optim" / "sgd-f64") == ["notes.md"]
    # what an export cut short leaves (arrays, no case.json, no index) is exported again
    shutil.rmtree(root / "optim")
    (root / "optim" / "sgd-f64").mkdir(parents=True)
    (root / "optim" / "sgd-f64" / "in.g.npy").write_bytes(b"half")
    assert _cli("export", root, "--only", "optim/sgd-*").exit_code == 0
    assert _cli("export", root, "--only", "optim/sgd-*").exit_code == 0  # and over itself
    assert _cli("check", root).exit_code == 0


@pytest.mark.parametrize("where", ["run", "inside", "sweep"])
def test_export_never_writes_into_a_runs_directory(tmp_path, where):
    """A run's directory (train's, or a sweep's runs/<key>, which the sweep clears when
    that run starts again) took the vectors without a word."""
    run = tmp_path / "run"
    if where == "sweep":
        (tmp_path / "results.csv").write_text("key\n")
        run = tmp_path / "runs" / ("0123456789abcdef")
    run.mkdir(parents=True)
    if where != "sweep":
        (run / "config.json").write_text("{}")
        (run / "metrics.csv").write_text("round\n")
    out = run / "vectors" if where == "inside" else run
    before = sorted(os.listdir(run))
    _refused(_cli("export", out, "--only", "optim/sgd-*"), "run", "another directory")
    assert sorted(os.listdir(run)) == before


@pytest.mark.parametrize("out, fragment", [
    ("results", "is a results directory"), ("results/runs", "the runs/ folder"),
    ("results/runs/vectors", "the runs/ folder"), ("results/figures", "the figures/ folder"),
    ("results/figures/v", "the figures/ folder")])
def test_export_never_writes_into_a_results_directory_its_runs_or_its_figures(tmp_path, out,
                                                                               fragment):
    """`golden export RESULTS/runs` put case folders among the sweep's run directories (the
    sweep reads each entry as a run), `golden export RESULTS` its index among the tables,
    exit 0: only a run's own directory was refused."""
    store = tmp_path / "results"
    (store / "runs" / "0123456789abcdef").mkdir(parents=True)
    (store / "figures").mkdir()
    (store / "results.csv").write_text("key,k,metric,value\n")
    (store / "provenance.json").write_text("{}")
    before = sorted(str(p.relative_to(store)) for p in store.rglob("*"))
    _refused(_cli("export", tmp_path / out, "--only", "optim/sgd-*"), fragment,
             "another directory")
    assert sorted(str(p.relative_to(store)) for p in store.rglob("*")) == before


# -- every loop count and size a case can state is capped ------------------------------------------------

class _TookTooLong(BaseException):
    """Raised by :func:`_within` (a BaseException: the check's own handlers must not swallow it)."""


@contextlib.contextmanager
def _within(seconds: int):
    """Fail the test, instead of hanging it, when the block runs longer than ``seconds``."""
    def ring(signum, frame):
        raise _TookTooLong(f"still running after {seconds} s")

    before = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


FEDERATED = "federated/adam-krum-gradient-ascent-f64"


@pytest.fixture(scope="module")
def federated_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden-federated") / "vectors"
    golden.export(root, only=[FEDERATED, "model/fism-*-f64"])
    return root


def _a_ra(**hyper):
    def edit(d):
        d["params"]["attack"] = "a-ra"
        d["params"]["attack_hyperparameters"] = {"targets": "0", **hyper}
    return edit


@pytest.mark.parametrize("case, edit, where, value, limit", [
    (FEDERATED, _a_ra(hum_steps=10 ** 12), "params.attack_hyperparameters.hum_steps", 10 ** 12, "1,000"),
    (FEDERATED, _a_ra(samples=10 ** 9), "params.attack_hyperparameters.samples", 10 ** 9, "100"),
    (FEDERATED, _a_ra(targets="", n_targets=10 ** 9), "params.attack_hyperparameters.n_targets", 10 ** 9,
     "100"),
    (FEDERATED, lambda d: d["params"]["model_hyperparameters"].update(negatives=10 ** 6),
     "params.model_hyperparameters.negatives", 10 ** 6, "100"),
    (FEDERATED, lambda d: d["params"]["model_hyperparameters"].update(dim=10 ** 6),
     "params.model_hyperparameters.dim", 10 ** 6, "64"),
    (FEDERATED, lambda d: d["params"].update(n_items=10 ** 8), "params.n_items", 10 ** 8, "1,000"),
    ("model/fism-bpr-sampled-f64", lambda d: d["params"]["hyperparameters"].update(negatives=10 ** 9),
     "params.hyperparameters.negatives", 10 ** 9, "100"),
    ("model/fism-scores-f64", lambda d: d["params"].update(n_items=-1), "params.n_items", -1, "1,000"),
])
def test_every_loop_count_and_size_a_case_states_is_capped(federated_case, tmp_path, case, edit, where,
                                                           value, limit):
    """a-ra with hum_steps = 10¹² in a federated case looped for ever (hum_steps was not among
    the capped counts); 10⁶ model dimensions or negatives allocated gigabytes per client."""
    root = tmp_path / "vectors"
    shutil.copytree(federated_case, root)
    _edit_json(root / case / "case.json", edit)
    with _within(60):
        results = golden.check(root, only=[case])
    assert len(results) == 1 and not results[0].ok
    line = results[0].line()
    assert line.startswith(f"FAIL  {case} [numpy]: cannot read the case: "), line
    assert f"{where} is {value!r}: it must be an integer from 0 to {limit}" in line, line
    assert "\n" not in line


def test_a_small_a_ra_case_is_still_recomputed(federated_case, tmp_path):
    """Within the caps a-ra runs: the case fails on its values (edited), not on its params."""
    root = tmp_path / "vectors"
    shutil.copytree(federated_case, root)
    _edit_json(root / FEDERATED / "case.json", _a_ra(hum_steps=3, samples=4))
    with _within(120):
        (res,) = golden.check(root, only=[FEDERATED])
    assert not res.ok and not res.error, res.line()
    assert "its inputs differ" in res.line() and "recomputation raised" not in res.line(), res.line()


# -- nothing outside the vectors' folder is read ---------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "nested", "golden index"])
def test_a_folder_without_an_index_reads_nothing_above_it(vectors, tmp_path, kind):
    """Without vectors/index.json, `golden check` read ../index.json and ../../index.json
    with no check: a pipe there blocked it for ever, /dev/zero ate memory, JSON nested
    100,000 deep ended in a RecursionError traceback."""
    above = tmp_path / "index.json"
    if kind == "fifo":
        os.mkfifo(above)
    elif kind == "dev-zero":
        above.symlink_to("/dev/zero")
    elif kind == "nested":
        above.write_bytes(GARBAGE["nested"])
    else:
        above.write_bytes((vectors / "index.json").read_bytes())
    (vectors / "index.json").unlink()
    with _within(30):
        res = _cli("check", vectors)
        msg = _refused(res, "index.json", "no index of golden vectors")
        # a case's folder given instead of the vectors': named from its path, the index above unread
        res = _cli("check", vectors / CASE)
    assert "--only" not in msg, msg  # the folder above is not taken for the vectors
    _refused(res, f"rfrs-ref golden check {vectors} --only '{CASE}'")


@pytest.mark.parametrize("target", ["text", "nested", "fifo"])
def test_an_index_link_leading_out_is_refused_before_it_is_read(vectors, tmp_path, target):
    """vectors/index.json -> ../outside: the outside file was read and parsed first, and
    reported as 'not valid JSON' (or 'nested too deeply'), never as a link leading out."""
    outside = tmp_path / "outside"
    if target == "fifo":
        os.mkfifo(outside)
    else:
        outside.write_bytes(b"secret outside text\n" if target == "text" else GARBAGE["nested"])
    (vectors / "index.json").unlink()
    (vectors / "index.json").symlink_to("../outside")
    with _within(30):
        msg = _refused(_cli("check", vectors), "index.json", "leads outside")
    assert "JSON" not in msg and "regular file" not in msg, msg


# -- the arrays' layout is the documented one -------------------------------------------------------------

def _npy_layout(a: np.ndarray, layout: str) -> bytes:
    """``a`` (its values unchanged) written as an .npy file in ``layout``."""
    buf = io.BytesIO()
    if layout == "fortran":
        header = {"descr": a.dtype.str, "fortran_order": True, "shape": a.shape}
        np.lib.format.write_array_header_1_0(buf, header)
        buf.write(np.asfortranarray(a).tobytes(order="F"))
    elif layout == "big-endian":
        np.lib.format.write_array(buf, a.astype(a.dtype.newbyteorder(">")), version=(1, 0))
    else:
        np.lib.format.write_array(buf, a, version={"version 2.0": (2, 0), "version 3.0": (3, 0)}[layout])
    return buf.getvalue()


LAYOUTS = {"fortran": "Fortran (column-major) order", "big-endian": "big-endian ('>f8')",
           "version 2.0": "format version 2.0", "version 3.0": "format version 3.0"}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("file", ["in.g.npy", "out.upload_theta.npy"])
def test_an_array_in_another_layout_fails_its_case(vectors, layout, file):
    """The docs fix the layout (version 1.0, '<f8', C order); NumPy reads the others, so a
    case whose arrays were Fortran-ordered, big-endian or of version 2.0 checked ok, where
    a reader written from the docs reads them byte-swapped or transposed."""
    path = vectors / CASE / file
    a = np.load(path)
    path.write_bytes(_npy_layout(a, layout))
    assert np.array_equal(np.load(path), a)  # the same values, to NumPy
    _case_fails(vectors, "cannot read the case", file, "not in the plain .npy layout", LAYOUTS[layout])


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_two_dimensional_array_in_another_layout_fails_its_case(tmp_path, layout):
    """attack/ascent-adam-f64's (7, 8) gradients in Fortran order, read in the documented
    layout, are the transpose's bytes: the case passed."""
    root = tmp_path / "vectors"
    case = "attack/ascent-adam-f64"
    golden.export(root, only=[case])
    path = root / case / "in.grads.npy"
    a = np.load(path)
    assert a.ndim == 2 and a.shape[0] != a.shape[1]
    path.write_bytes(_npy_layout(a, layout))
    _case_fails(root, "cannot read the case", "in.grads.npy", LAYOUTS[layout], name=case)


# -- an integer stated inside a list of floats is compared exactly ----------------------------------------

@pytest.mark.parametrize("expected, got", [
    ([1, 2.5], np.array([1.0005, 2.5])),
    ([[1.5, 2], [3, 4.5]], np.array([[1.5, 2.0], [3.001, 4.5]])),
    ([2 ** 53 + 1, 0.5], np.array([float(2 ** 53), 0.5])),
    ([1.0005, 2.5], [1, 2.5]),
])
def test_an_integer_in_a_list_of_floats_is_compared_exactly(expected, got):
    """A stated integer alone compared exactly, but inside [1, 2.5] it became the float 1.0
    and passed against 1.0005 under rtol 1e-3."""
    spec = {"compare": "close", "rtol": 1e-3, "atol": 0.0}
    m = golden.compare_output("x", spec, expected, got)
    assert m is not None and m.tolerance is None, (expected, got)
    assert "|Δ| > tol" not in str(m) and "1 of" in str(m), str(m)
    # the floats of the list stay under the tolerance, and equal integers match
    assert golden.compare_output("x", spec, [1, 2.5], np.array([1.0, 2.5001])) is None
    assert golden.compare_output("x", spec, [[1.5, 2], [3, 4.5]],
                                 np.array([[1.5001, 2.0], [3.0, 4.5]])) is None
    assert golden.compare_output("x", {"compare": "exact"}, [2 ** 53 + 1, 0.5],
                                 np.array([float(2 ** 53), 0.5])) is not None


# -- an exact comparison tells −0.0 from 0.0 ------------------------------------------------------------

@pytest.mark.parametrize("expected, got", [
    (0.0, -0.0), (-0.0, 0.0), (np.float64(0.0), np.float64(-0.0)),
    (np.array([1.0, 0.0, 2.0]), np.array([1.0, -0.0, 2.0])),
    (np.array([[-0.0, 3.0]]), np.array([[0.0, 3.0]])),
    (np.array(0.0), np.array(-0.0)),
    (np.array([0.0], dtype=np.float32), np.array([-0.0])),
    ([1.5, 0.0], np.array([1.5, -0.0])),
])
def test_an_exact_comparison_tells_the_sign_of_zero(expected, got):
    """`exact` is documented as bit for bit, but NumPy's == calls −0.0 and 0.0 equal: a
    recomputed −0.0 passed where the case states 0.0. Under `close` they stay equal."""
    m = golden.compare_output("x", {"compare": "exact"}, expected, got)
    assert m is not None and "the sign of zero differs under exact comparison" in str(m), (expected, got, m)
    assert "got -0.0, expected 0.0" in str(m) or "got 0.0, expected -0.0" in str(m), str(m)
    assert golden.compare_output("x", {"compare": "close", "rtol": 1e-3, "atol": 0.0}, expected, got) is None


def test_an_exact_comparison_still_matches_any_nan_and_integer_zeros():
    """The exceptions, as documented: any NaN matches any NaN (sign bit, payload), and an
    integer has no sign of zero (the JSON integer 0, alone or in a list of floats)."""
    spec = {"compare": "exact"}
    payload = np.array([0x7FF8000000000001, 0xFFF8000000000000], dtype="<u8").view("<f8")
    assert golden.compare_output("x", spec, np.array([np.nan, np.nan]), payload) is None
    assert golden.compare_output("x", spec, float(payload[1]), np.nan) is None
    for expected, got in ((0, -0.0), (-0.0, 0), ([0, 1.5], np.array([-0.0, 1.5])),
                          (np.array([0]), np.array([-0.0])), (-0.0, -0.0),
                          (np.array([-0.0, 0.0]), np.array([-0.0, 0.0]))):
        assert golden.compare_output("x", spec, expected, got) is None, (expected, got)
    # the first differing element is named by what differs there
    m = golden.compare_output("x", spec, np.array([1.0, 0.0]), np.array([1.5, -0.0]))
    assert m is not None and "sign of zero" not in str(m) and "2 of 2" in str(m), str(m)


def test_a_case_stating_an_exact_zero_of_the_other_sign_fails(krum_case, tmp_path):
    """Krum's weights stated exact (tighter than the export: allowed) with −0.0 for a client
    Krum leaves out, whose recomputed weight is 0.0: the check passed."""
    root = tmp_path / "vectors"
    shutil.copytree(krum_case, root)
    folder = root / "aggregate" / "krum-gradient-f64"

    def exact(d):
        for k in ("rtol", "atol"):
            d["outputs"]["weights"].pop(k)
        d["outputs"]["weights"]["compare"] = "exact"

    _edit_json(folder / "case.json", exact)
    res = _cli("check", root)
    assert res.exit_code == 0, res.output  # the exact weights themselves match
    w = np.load(folder / "out.weights.npy")
    zero = int(np.flatnonzero(w == 0)[0])
    assert not np.signbit(w[zero])
    w[zero] = -0.0
    np.save(folder / "out.weights.npy", w)
    _case_fails(root, "'weights'", f"index ({zero},)", "got 0.0, expected -0.0", "sign of zero",
                name="aggregate/krum-gradient-f64")


# -- a parameter the recomputation converts must have the type it states ----------------------------------

def _every_output_exact(d):
    """Every output compared exactly (tighter than the export's tolerances: allowed), so
    that a case whose params differ from the export's is compared, not failed for them."""
    for out in d["outputs"].values():
        out.pop("rtol", None)
        out.pop("atol", None)
        out["compare"] = "exact"


@pytest.mark.parametrize("case, key, value, shown", [
    ("aggregate/krum-gradient-f64", "f", lambda f: f + 0.5, "(float)"),
    ("aggregate/krum-gradient-f64", "f", str, "(str)"),
    (CASE, "t", lambda t: t + 0.25, "(float)"),
    (CASE, "t", str, "(str)"),
    (FEDERATED, "verify", lambda v: "false", "'false' (str)"),
    (FEDERATED, "seed", float, "(float)"),
    (FEDERATED, "client_fraction", str, "(str)"),
])
def test_a_parameter_is_not_converted_into_another_value(krum_case, vectors, federated_case, tmp_path,
                                                         case, key, value, shown):
    """f = 2.5 ran as int(2.5) = 2, "verify": "false" as bool("false") = True: the case passed,
    stating a parameter the recomputation did not use."""
    src = {"aggregate/krum-gradient-f64": krum_case, CASE: vectors, FEDERATED: federated_case}[case]
    root = tmp_path / "v"
    shutil.copytree(src, root)
    _edit_json(root / case / "case.json", _every_output_exact)
    assert _cli("check", root, "--only", case).exit_code == 0  # compared exactly, the case passes
    _edit_json(root / case / "case.json", lambda d: d["params"].update({key: value(d["params"][key])}))
    _case_fails(root, f"cannot read the case: params.{key} is ", shown, "it must be a JSON",
                name=case, only=True)


# -- the suffix of a case's name is the dtype of its inputs ----------------------------------------------

def _recast_inputs(folder, dtype, keys=None) -> None:
    """Store the floating-point inputs of the case in ``folder`` (those in ``keys``, default
    all) in ``dtype``, recompute every output from them and state it, compared exactly
    except ``close`` outputs, which keep their rtol and get atol 0 (a tighter atol than the
    export's: allowed, and judged whatever the inputs)."""
    doc = json.loads((folder / "case.json").read_text())
    for k, meta in doc["inputs"].items():
        if meta["dtype"].startswith("float") and (keys is None or k in keys):
            path = folder / meta["file"]
            np.save(path, np.load(path).astype(dtype))
            meta["dtype"] = np.dtype(dtype).name
    _restate_outputs(folder, doc, lambda atol: 0.0)


def test_a_case_named_f32_cannot_hold_float64_inputs(vectors):
    """optim/sgd-f32 with its inputs in float64 and every output recomputed from them, then
    its θ moved by a relative 1e-7 (about 10⁹ float64 roundings, within float32's rtol):
    with atol 0 nothing bounded it but the rtol the export gives the name's float32 case,
    so the case passed a float64 computation checked to float32's tolerance."""
    name = "optim/sgd-f32"
    folder = vectors / name
    _recast_inputs(folder, np.float64)
    path = folder / "out.upload_theta.npy"
    np.save(path, np.load(path) * (1.0 + 1e-7))
    line = _case_fails(vectors, "cannot read the case", "input 'g' is float64",
                       "named '-f32'", "floating-point inputs are float32", name=name)
    assert "1 ok, 1 FAIL" in _cli("check", vectors).output, line


def test_a_case_named_f64_cannot_hold_float32_inputs(vectors):
    folder = vectors / CASE
    _recast_inputs(folder, np.float32, keys={"state_theta"})
    _case_fails(vectors, "cannot read the case", "input 'state_theta' is float32", "named '-f64'",
                "floating-point inputs are float64")


def test_inputs_of_the_suffix_dtype_with_other_values_are_compared_not_refused(vectors):
    """The rule is on the dtype alone: inputs of the name's dtype that differ from the
    export's are recomputed and compared (here exactly, atol 0), as before."""
    folder = vectors / "optim/sgd-f32"
    g = np.load(folder / "in.g.npy")
    np.save(folder / "in.g.npy", (g * 1.5).astype(np.float32))
    _recast_inputs(folder, np.float32)
    res = _cli("check", vectors)
    assert res.exit_code == 0, res.output


def test_an_input_kept_in_float64_in_every_case_must_be_float64(tmp_path):
    """The noise attack's normals are drawn in float64, and stay float64 in its f32 case."""
    root = tmp_path / "v"
    name = "attack/noise-adam-f32"
    golden.export(root, only=[name])
    assert _cli("check", root).exit_code == 0
    folder = root / name
    assert np.load(folder / "in.noise.npy").dtype == np.float64
    _recast_inputs(folder, np.float32, keys={"noise"})
    _case_fails(root, "cannot read the case", "input 'noise' is float32", "float64 in every case",
                name=name)


def test_every_exported_case_holds_inputs_of_its_suffix_dtype():
    names = []
    for family, cases in golden.FAMILIES.items():
        for c in cases():
            assert golden.dtype_disagrees(c.name, c.inputs) == "", c.name
            names.append(c.name)
    assert all(n.endswith(tuple(golden.SUFFIX_DTYPES)) for n in names)
    assert golden.dtype_disagrees("optim/mine", {"g": np.zeros(3, np.float16)}) == ""  # no suffix


# -- every parameter a case states takes part in its recomputation ----------------------------------------

PRE_CASE = "aggregate/pre-nnm-mean-gradient-f64"
KRUM = "aggregate/krum-gradient-f64"
IPM = "attack/ipm-adam-f64"


@pytest.fixture(scope="module")
def param_cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden-params") / "vectors"
    golden.export(root, only=[KRUM, PRE_CASE, IPM, CASE, FEDERATED])
    return root


def _set(*path, value):
    def edit(d):
        at = d["params"]
        for key in path[:-1]:
            at = at[key]
        at[path[-1]] = value
    return edit


@pytest.mark.parametrize("case, edit, fragments", [
    (KRUM, _set("trimm", value=3), ["params.trimm is not a parameter of an aggregate case",
                                    "take no part", "detect, f, hyperparameters, pre, pre_hyperparameters, rule"]),
    (KRUM, _set("attack_hyperparameters", value={"sigma": 1.0}), ["params.attack_hyperparameters is not"]),
    (CASE, _set("f", value=2), ["params.f is not a parameter of an optimizer case",
                                "hyperparameters, optimizer, t, tampered"]),
    (FEDERATED, _set("pre", value=["nnm"]), ["params.pre is not a parameter of a federated case"]),
    (IPM, _set("rule", value="krum"), ["params.rule is not a parameter of an attack case whose attack is "
                                       "'ipm'", "only opt-ipm and opt-alie simulate the server"]),
    (IPM, _set("detect", value="parameter"), ["params.detect is not a parameter of an attack case"]),
    # hyperparameters an entry does not declare (the constructor refused them with a TypeError)
    (KRUM, _set("hyperparameters", "kk", value=3), ["params.hyperparameters.kk is not a hyperparameter of "
                                                    "aggregation rule 'krum'", "it takes: k, fallback"]),
    (FEDERATED, _set("attack_hyperparameters", "sigma", value=0.5),
     ["params.attack_hyperparameters.sigma is not a hyperparameter of attack 'ascent'"]),
    # hyperparameters of a pre-aggregator the case does not run
    (KRUM, _set("pre_hyperparameters", value={"nnm": {}}),
     ["params.pre_hyperparameters.nnm: 'nnm' is not a pre-aggregator of the case",
      "params.pre lists no pre-aggregator", "take no part"]),
    (PRE_CASE, _set("pre_hyperparameters", "clip", value={"clip_norm": 5.0}),
     ["params.pre_hyperparameters.clip: 'clip' is not a pre-aggregator of the case (params.pre lists nnm)"]),
    (PRE_CASE, _set("pre_hyperparameters", "nnm", value={"k": 3}),
     ["params.pre_hyperparameters.nnm.k is not a hyperparameter of pre-aggregator 'nnm'"]),
])
def test_a_parameter_no_recomputation_takes_fails_the_case(param_cases, tmp_path, case, edit, fragments):
    """A case stating a parameter its recomputation never reads ("trimm": 3, the rule of an
    attack that simulates none, hyperparameters of a pre-aggregator it does not run) passed
    with its outputs compared exactly: it vouched for a parameter nothing used."""
    root = tmp_path / "v"
    shutil.copytree(param_cases, root)
    _edit_json(root / case / "case.json", _every_output_exact)
    assert _cli("check", root, "--only", case).exit_code == 0  # compared exactly, the case passes
    _edit_json(root / case / "case.json", edit)
    _case_fails(root, f"cannot read the case: {root / case / 'case.json'}: params.", *fragments,
                name=case, only=True)


def test_every_parameter_the_export_writes_is_one_a_case_takes():
    every = set().union(*golden.CASE_PARAMS.values())
    assert set(golden.PARAM_TYPES) <= every
    assert set(golden.CASE_PARAMS) == set(golden.KINDS)
    for cases in golden.FAMILIES.values():
        for c in cases():
            meta = json.loads(json.dumps({"kind": c.kind, "params": golden._json_value(c.params)}))
            assert golden.unused_params("case.json", meta) == "", c.name


def test_the_server_attacks_are_those_that_simulate_the_rule():
    """An attack that reads the context's rule takes params.rule in an attack case."""
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.attack.optimal import _Optimal

    assert {n for n, cls in ATTACKS.items() if issubclass(cls, _Optimal)} == set(golden.SERVER_ATTACKS)


# -- the dtype a case states is that of its inputs ---------------------------------------------------------

@pytest.mark.parametrize("name, dtype, fragments", [
    ("optim/sgd-f32", "float64", ["dtype is 'float64'", "floating-point inputs are float32 (input 'g')"]),
    (CASE, "float32", ["dtype is 'float32'", "floating-point inputs are float64 (input 'g')"]),
    (CASE, "float16", ["dtype is 'float16': it must be 'float32' or 'float64'"]),
    (CASE, None, ["dtype is None: it must be 'float32' or 'float64'"]),
])
def test_a_case_stating_another_dtype_than_its_inputs_fails(vectors, name, dtype, fragments):
    """optim/sgd-f32 stating "dtype": "float64" passed: an implementation computing in the
    dtype the case states would check a float64 computation against float32 inputs."""
    def edit(d):
        if dtype is None:
            del d["dtype"]
        else:
            d["dtype"] = dtype
    _edit_json(vectors / name / "case.json", edit)
    line = _case_fails(vectors, f"cannot read the case: {vectors / name / 'case.json'}: dtype is",
                       *fragments, name=name)
    assert "1 ok, 1 FAIL" in _cli("check", vectors).output, line


def test_every_exported_case_states_the_dtype_of_its_inputs():
    for cases in golden.FAMILIES.values():
        for c in cases():
            assert golden.dtype_field_disagrees("case.json", {"dtype": c.dtype}, c.inputs) == "", c.name


# -- every field of case.json is one of the format ---------------------------------------------------------

@pytest.mark.parametrize("key, value", [
    ("outptus", lambda d: dict(d["outputs"])),  # a misspelt copy beside the real outputs
    ("tolerances", lambda d: {"upload_theta": {"rtol": 0.5}}),
    ("comment", lambda d: "checked by hand"),
])
def test_a_field_outside_the_format_fails_the_case(vectors, key, value):
    """A case.json holding "outptus" or "tolerances" beside its real fields passed: it
    stated something no check read."""
    _edit_json(vectors / CASE / "case.json", lambda d: d.update({key: value(d)}))
    line = _case_fails(vectors, f"cannot read the case: {vectors / CASE / 'case.json'}: {key!r} is not a "
                       "field of a case", "take no part",
                       "(the fields of case.json: convention, description, dtype, format, formula, inputs, "
                       "kind, name, outputs, params, reference, tolerance, version)")
    assert "1 ok, 1 FAIL" in _cli("check", vectors).output, line


# -- an index entry states its case's own kind and dtype ---------------------------------------------------

@pytest.mark.parametrize("edit, fragments", [
    (lambda e: e.update(kind="aggregate"), ["states kind 'aggregate', but", "states kind 'optimizer'"]),
    (lambda e: e.update(dtype="float32"), ["states dtype 'float32', but", "states dtype 'float64'"]),
    (lambda e: e.pop("dtype"), ["states no dtype, but", "states dtype 'float64'"]),
])
def test_an_index_entry_stating_another_kind_or_dtype_fails_its_case(vectors, edit, fragments):
    """An index listing optim/sgd-f64 as an aggregate case, or as a float32 one, passed: a
    reader choosing cases by the index would run it as something it is not, or skip it."""
    def at(d):
        (i,) = [i for i, e in enumerate(d["cases"]) if e["name"] == CASE]
        edit(d["cases"][i])
        return i
    doc = json.loads((vectors / "index.json").read_text())
    i = at(doc)
    (vectors / "index.json").write_text(json.dumps(doc))
    line = _case_fails(vectors, f"cannot read the case: {vectors / 'index.json'}: case entry {i} ({CASE!r}) ",
                       f"{vectors / CASE / 'case.json'}", *fragments, "its case's own kind and dtype")
    assert "1 ok, 1 FAIL" in _cli("check", vectors).output, line
    (result,) = [r for r in golden.check(vectors) if r.name == CASE]
    assert not result.ok


# -- an aggregate case's detect is the space of its features -----------------------------------------------

PARAMETER_CASE = "aggregate/krum-parameter-f64"


@pytest.fixture(scope="module")
def detect_cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden-detect") / "vectors"
    golden.export(root, only=[KRUM, PARAMETER_CASE])
    return root


def _add_input(folder, key, a):
    np.save(folder / f"in.{key}.npy", a)
    _edit_json(folder / "case.json", lambda d: d["inputs"].update(
        {key: {"file": f"in.{key}.npy", "dtype": a.dtype.name, "shape": list(a.shape)}}))


def _nudge_theta_bar(folder):
    path = folder / "in.theta_bar.npy"
    tb = np.load(path)
    tb[3] = np.nextafter(tb[3], np.inf)
    np.save(path, tb)


def _negate_a_zero(folder):
    """Store θ̄ = θ₀ at coordinate 0, so that feature (0, 0) is θ₀ − θ̄ = +0.0, and state −0.0."""
    tb, T = np.load(folder / "in.theta_bar.npy"), np.load(folder / "in.upload_theta.npy")
    tb[0] = T[0, 0]
    np.save(folder / "in.theta_bar.npy", tb)
    X = np.load(folder / "in.features.npy")
    X[:, 0] = T[:, 0] - tb[0]
    X[0, 0] = -0.0
    np.save(folder / "in.features.npy", X)


@pytest.mark.parametrize("case, edit, fragments", [
    (PARAMETER_CASE, lambda f: _edit_json(f / "case.json", _set("detect", value="gradient")),
     ["params.detect is 'gradient', but the case holds the input 'theta_bar'", "take no part"]),
    (KRUM, lambda f: _edit_json(f / "case.json", _set("detect", value="parameter")),
     ["params.detect is 'parameter', but the case has no input 'theta_bar'"]),
    (KRUM, lambda f: _add_input(f, "theta_bar", np.zeros(6)),
     ["params.detect is 'gradient', but the case holds the input 'theta_bar'"]),
    (KRUM, lambda f: _edit_json(f / "case.json", _set("detect", value="gradients")),
     ["params.detect is 'gradients': it must be 'gradient' or 'parameter'"]),
    (KRUM, lambda f: _edit_json(f / "case.json", lambda d: d["params"].pop("detect")),
     ["params.detect is None: it must be"]),
    (PARAMETER_CASE, _nudge_theta_bar,
     ["params.detect is 'parameter', but input 'features' at index (0, 3) is", "bit for bit"]),
    (PARAMETER_CASE, _negate_a_zero, ["input 'features' at index (0, 0) is -0.0 where upload_theta − "
                                      "theta_bar is 0.0"]),
])
def test_an_aggregate_case_whose_features_are_not_in_its_detect_space_fails(detect_cases, tmp_path, case,
                                                                             edit, fragments):
    """The rule sees the features only: a parameter-space case stating detect "gradient", a
    gradient-space one stating "parameter", or a θ̄ its features were not made from passed,
    with every output compared exactly; a reader would build the features from another
    space than the case's."""
    root = tmp_path / "v"
    shutil.copytree(detect_cases, root)
    _edit_json(root / case / "case.json", _every_output_exact)
    assert _cli("check", root, "--only", case).exit_code == 0  # compared exactly, the case passes
    edit(root / case)
    if case == PARAMETER_CASE and edit is _negate_a_zero:  # restate the outputs of the new features
        _restate_outputs(root / case, json.loads((root / case / "case.json").read_text()), lambda atol: 0.0)
        _edit_json(root / case / "case.json", _every_output_exact)
    _case_fails(root, f"cannot read the case: {root / case / 'case.json'}: params.detect is ",
                *fragments, name=case, only=True)


def test_every_exported_aggregate_case_has_features_of_its_detect_space():
    spaces = set()
    for c in golden.FAMILIES["aggregate"]():
        meta = {"kind": c.kind, "params": golden._json_value(c.params)}
        assert golden.detect_disagrees("case.json", meta, c.inputs) == "", c.name
        spaces.add(c.params["detect"])
    assert spaces == set(golden.DETECT_SPACES)

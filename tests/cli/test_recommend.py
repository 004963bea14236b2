"""``rfrs-ref recommend`` and the provenance a run records."""

import hashlib
import json
import os
import re
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main

SMALL = ["--dataset", "synthetic", "--synthetic-users", "60", "--synthetic-items", "80",
         "--client-fraction", "0.1"]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "run"
    res = CliRunner().invoke(main, ["train", *SMALL, "--rounds", "4", "--out", str(out)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return out


def test_top_k_equals_the_evaluation_ranking(small_run):
    from rfrs_ref.federated.trainer import Trainer, load_config
    from rfrs_ref.kernels.topk import topk_numpy

    res = CliRunner().invoke(main, ["recommend", str(small_run), "--user", "7", "-k", "6"])
    assert res.exit_code == 0, res.output
    got = [int(m) for m in re.findall(r"^\s*\d+\s+\S+\s+item (\d+)", res.output, re.M)]
    trainer = Trainer(load_config(small_run))
    theta = np.load(small_run / "state.npz")["theta"]
    scores = trainer.model.scores(theta, trainer.split.train, np.array([7]), backend="numpy")
    seen = trainer.split.train.items_of(7).astype(np.int64)
    expected = topk_numpy(scores, np.array([0, seen.size]), seen, 6)[0].tolist()
    assert got == expected and len(got) == 6
    assert not set(got) & set(seen.tolist())


def test_ids_npz_maps_dense_to_dataset_ids(small_run):
    with np.load(small_run / "ids.npz", allow_pickle=False) as z:
        assert z["user_ids"].tolist() == list(range(60))
        assert z["item_ids"].tolist() == list(range(80))


@pytest.mark.parametrize("args, code, message", [
    (["--user", "60"], 2, "user 60 is not in synthetic"),
    (["--user", "-1"], 2, "user -1 is not in synthetic"),
])
def test_unknown_user_is_one_line(small_run, args, code, message):
    res = CliRunner().invoke(main, ["recommend", str(small_run), *args])
    assert res.exit_code == code and message in res.output
    assert "Traceback" not in res.output


def test_run_without_final_state_is_one_line(small_run, tmp_path):
    import shutil

    unfinished = tmp_path / "unfinished"
    shutil.copytree(small_run, unfinished)
    (unfinished / "state.npz").unlink()
    res = CliRunner().invoke(main, ["recommend", str(unfinished), "--user", "1"])
    assert res.exit_code == 1
    assert "has no final state" in res.output and "--resume" in res.output
    # while a process trains it, resuming would be refused as "in use": it says to wait
    from rfrs_ref.files import DirectoryLock

    with DirectoryLock(unfinished):
        res = CliRunner().invoke(main, ["recommend", str(unfinished), "--user", "1"])
    assert res.exit_code == 1 and "still training (process " in res.output, res.output
    assert "--resume" not in res.output
    assert not (unfinished / ".lock").exists()


def test_a_finished_run_that_kept_no_state_does_not_send_the_reader_to_resume(small_run,
                                                                             tmp_path):
    # a sweep's run: final_metrics.json, no checkpoint, no state.npz (kept only with
    # --keep-state); `train --resume` would answer "nothing to resume"
    swept = tmp_path / "swept"
    shutil.copytree(small_run, swept)
    (swept / "state.npz").unlink()
    (swept / "checkpoint.npz").unlink()
    res = CliRunner().invoke(main, ["recommend", str(swept), "--user", "1"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    line = " ".join(res.output.split())
    assert "the run finished (round 4) without keeping its final state" in line
    assert "--keep-state" in line and "--resume" not in line
    res = CliRunner().invoke(main, ["train", "--resume", str(swept)])
    assert res.exit_code == 1 and "nothing to resume" in res.output
    # the Python line it gives trains the run again into a directory recommend reads
    code = re.search(r'python -c "(.*?)"', line).group(1)
    code = code.replace("'DIR'", repr(str(tmp_path / "d")))
    exec(code, {})
    res = CliRunner().invoke(main, ["recommend", str(tmp_path / "d"), "--user", "1"])
    assert res.exit_code == 0, res.output
    assert np.array_equal(np.load(tmp_path / "d" / "state.npz")["theta"],
                          np.load(small_run / "state.npz")["theta"])


def test_the_target_items_of_a_targeted_attack_are_marked(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["train", *SMALL, "--rounds", "2", "--attack", "a-ra",
                                    "--byzantine-fraction", "0.2", "--a-ra-targets", "5,11",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["recommend", str(out), "--user", "7", "-k", "80",
                                    "--include-seen"])
    assert res.exit_code == 0, res.output
    marked = re.findall(r"^\s*\d+\s+\S+\s+item (\d+).*\[target\]$", res.output, re.M)
    assert sorted(int(i) for i in marked) == [5, 11]  # synthetic: the ids are the indices
    # a run without targets marks none, and a record whose targets are no item indices
    # is not taken at its word
    cfg = json.loads((out / "config.json").read_text())
    cfg["derived"]["target_items"] = [5, "11"]
    (out / "config.json").write_text(json.dumps(cfg))
    res = CliRunner().invoke(main, ["recommend", str(out), "--user", "7", "-k", "80",
                                    "--include-seen"])
    assert res.exit_code == 0 and "[target]" not in res.output


def test_a_folder_that_holds_no_run_says_what_to_give(tmp_path):
    res = CliRunner().invoke(main, ["recommend", str(tmp_path), "--user", "1"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    line = " ".join(res.output.split())
    assert f"{tmp_path}: no run here (no config.json)" in line
    assert "`rfrs-ref train` wrote" in line and "Errno" not in line


def test_a_diverged_run_says_so(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["train", *SMALL, "--rounds", "8", "--eval-every", "1",
                                    "--byzantine-fraction", "0.4", "--optimizer", "momentum",
                                    "--lr", "1e6", "--attack", "ascent", "--preset",
                                    "no-defense", "--out", str(out)])
    assert res.exit_code == 1 and "the model diverged" in res.output
    res = CliRunner().invoke(main, ["recommend", str(out), "--user", "1"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "the run diverged at round " in res.output and "nothing to recommend" in res.output


def test_config_records_code_version(small_run):
    from rfrs_ref import __version__

    code = json.loads((small_run / "config.json").read_text())["code"]
    assert code["package"] == __version__
    assert code["git_commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}", code["git_commit"])
    assert json.loads((small_run / "config.json").read_text())["data_files"] == []


def test_code_version_never_fails_without_git(monkeypatch):
    import subprocess

    from rfrs_ref import provenance

    def no_git(*a, **k):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert provenance.code_version()["git_commit"] == "unknown"


DATA = os.environ.get("RFRS_DATA_DIR")


@pytest.mark.skipif(not DATA or not os.path.isdir(os.path.join(DATA or "", "ml-100k")),
                    reason="needs RFRS_DATA_DIR with ml-100k")
def test_ml100k_run_pins_its_data_and_names_its_items(tmp_path):
    from rfrs_ref.data.datasets import load_item_names

    out = tmp_path / "ml"
    res = CliRunner().invoke(main, ["train", "--dataset", "ml100k", "--rounds", "2",
                                    "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    files = json.loads((out / "config.json").read_text())["data_files"]
    assert [f["file"] for f in files] == ["u.data"]
    raw = open(files[0]["path"], "rb").read()
    assert files[0]["sha256"] == hashlib.sha256(raw).hexdigest() and files[0]["bytes"] == len(raw)
    ids = np.load(out / "ids.npz")
    assert ids["user_ids"].size == 943 and ids["item_ids"].size == 1682
    res = CliRunner().invoke(main, ["recommend", str(out), "--user", "1", "-k", "10"])
    assert res.exit_code == 0, res.output
    rows = re.findall(r"^\s*\d+\s+\S+\s+item (\d+)  (.*?)(  \[test item\])?$", res.output, re.M)
    assert len(rows) == 10
    names = load_item_names("ml100k")
    item_ids = ids["item_ids"].tolist()
    for source_id, name, _ in rows:
        assert names[item_ids.index(int(source_id))] == name
    res = CliRunner().invoke(main, ["recommend", str(out), "--user", "944"])
    assert res.exit_code == 2 and "user 944 is not in ml100k" in res.output


def test_damaged_files_are_one_line(small_run, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(small_run, bad)
    (bad / "state.npz").write_bytes(b"not a zip file")
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "1"])
    assert res.exit_code == 1 and "not the final state of this run" in res.output
    np.savez(bad / "state.npz", theta=np.zeros(3, np.float32), round=np.array(4))
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "1"])
    assert res.exit_code == 1 and "not the final state of this run" in res.output
    np.savez(bad / "ids.npz", user_ids=np.arange(5), item_ids=np.arange(80))
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "1"])
    assert res.exit_code == 1 and "not this run's" in res.output
    (bad / "config.json").write_text("{")
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "1"])
    assert res.exit_code == 1 and "not a run's configuration" in res.output


def test_recommend_finds_the_data_where_the_run_read_it(tmp_path, monkeypatch,
                                                        ml100k_run_on_copied_data):
    """A run trained with RFRS_DATA_DIR set, recommended from a shell without it: the
    folder config.json records is used (the sha256 check proves the data the same)."""
    data, out = ml100k_run_on_copied_data
    # another shell: no RFRS_DATA_DIR, an empty cache, no network
    monkeypatch.delenv("RFRS_DATA_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("RFRS_DATA_MIRROR", "http://127.0.0.1:9")
    res = CliRunner().invoke(main, ["recommend", str(out), "--user", "1", "-k", "3"])
    assert res.exit_code == 0, res.output
    assert f"the folder the run read it from: {data}" in res.output
    assert len(re.findall(r"^\s*\d+\s+\S+\s+item \d+", res.output, re.M)) == 3
    # the items are named from that folder too (u.item), as with RFRS_DATA_DIR set
    from rfrs_ref.data.datasets import load_item_names

    names = load_item_names("ml100k", str(data))
    rows = re.findall(r"^\s*\d+\s+\S+\s+item (\d+)  (.*?)(  \[test item\])?$", res.output, re.M)
    item_ids = np.load(out / "ids.npz")["item_ids"].tolist()
    assert len(rows) == 3
    for source_id, name, _ in rows:
        assert name and names[item_ids.index(int(source_id))] == name
    # once the folder is gone, the loader's own message, in one line, saying how to fetch
    # it; nothing is downloaded (it tried the network on the run's say, here a dead mirror)
    from rfrs_ref.data import datasets

    def no_download(*args, **kwargs):
        raise AssertionError("recommend downloaded a dataset")

    monkeypatch.setattr(datasets, "fetch", no_download)
    shutil.rmtree(data)
    res = CliRunner().invoke(main, ["recommend", str(out), "--user", "1"])
    assert res.exit_code == 1 and "Traceback" not in res.output and "ml100k" in res.output
    assert "rfrs-ref data fetch ml100k" in " ".join(res.output.split()), res.output
    assert "downloading it failed" not in res.output, res.output


def _copy_run(small_run, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(small_run, bad)
    return bad


@pytest.mark.parametrize("edit, message", [
    # every user relabelled: user 0's list would be printed as "user 7"
    (lambda d: d["user_ids"].__setitem__(slice(None), 7), "user_ids holds an id more than once"),
    (lambda d: d.__setitem__("user_ids", d["user_ids"][::-1].copy()),
     "user_ids[0] is 59, but the dataset's id there is 0"),
    (lambda d: d.__setitem__("item_ids", d["item_ids"] + 0.5), "item_ids is float64, expected"),
    (lambda d: d.__setitem__("user_ids", d["user_ids"].astype(str)), "user_ids is <U"),
])
def test_ids_npz_must_be_the_datasets_ids(small_run, tmp_path, edit, message):
    bad = _copy_run(small_run, tmp_path)
    d = dict(np.load(bad / "ids.npz"))
    edit(d)
    np.savez(bad / "ids.npz", **d)
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "7"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert f"{bad / 'ids.npz'}: " in res.output and message in res.output
    assert "not this run's" in res.output and " item " not in res.output
    assert len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("data_files, message", [
    ([1], "data_files[0] is 1, expected an object"),
    ([{"file": "u.data", "path": "/x/u.data", "sha256": 5}], "data_files[0] is {"),
    ({"file": "u.data"}, "data_files is dict"),
])
def test_malformed_data_files_are_one_line(small_run, tmp_path, data_files, message):
    bad = _copy_run(small_run, tmp_path)
    record = json.loads((bad / "config.json").read_text())
    record["data_files"] = data_files
    (bad / "config.json").write_text(json.dumps(record))
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "7"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert f"{bad / 'config.json'}: " in res.output and message in res.output


def test_state_with_an_extra_array_is_refused_before_it_is_read(small_run, tmp_path, monkeypatch):
    bad = _copy_run(small_run, tmp_path)
    arrays = dict(np.load(bad / "state.npz"))
    np.savez(bad / "state.npz", **arrays, extra=np.zeros(10, np.float32))
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "7"])
    assert res.exit_code == 1 and "array 'extra' is no array of this run's final state" in res.output
    # an array larger than the model's is refused from its header: never loaded
    theta = arrays["theta"]
    np.savez(bad / "state.npz", **{**arrays, "theta": np.zeros(theta.size * 4, theta.dtype)})
    sizes = []
    real_load = np.lib.format.read_array

    def read_array(*a, **k):
        out = real_load(*a, **k)
        sizes.append(out.size)
        return out

    monkeypatch.setattr(np.lib.format, "read_array", read_array)
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "7"])
    assert res.exit_code == 1 and "not the final state of this run" in res.output
    assert f"more than the {theta.size} value(s)" in res.output
    assert theta.size * 4 not in sizes


@pytest.mark.parametrize("value", [np.array(3.7), np.array(4.0), np.array(True),
                                   np.array(-1)])
def test_a_round_that_is_no_integer_is_refused_not_rounded(small_run, tmp_path, value):
    # round 3.7 printed "top 10 of the model after round 3" and exited 0
    bad = _copy_run(small_run, tmp_path)
    arrays = dict(np.load(bad / "state.npz"))
    np.savez(bad / "state.npz", **{**arrays, "round": value})
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "7"])
    assert res.exit_code == 1 and "not the final state of this run" in res.output, res.output
    assert "'round' is " in res.output and "not the one integer ≥ 0" in res.output


@pytest.mark.parametrize("name", ["config.json", "final_metrics.json"])
def test_a_json_file_with_a_key_twice_is_refused(small_run, tmp_path, name):
    # the last value won: config.json could show one configuration to a reader and another
    # to recommend
    bad = _copy_run(small_run, tmp_path)
    text = (bad / name).read_text()
    if name == "final_metrics.json":
        (bad / "state.npz").unlink()  # read only for a run without a final state
        text = json.dumps({"status": "diverged", "round": 2, "reason": "r", "what": "w"})
    key = "config" if name == "config.json" else "status"
    (bad / name).write_text('{"' + key + '": null, ' + text.lstrip()[1:])
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "7"])
    assert res.exit_code == 1, res.output
    if name == "config.json":
        assert f"{bad / name}: not a run's configuration (config.json: duplicate key " \
               "'config'" in res.output
    else:  # the run's own words were ignored: it said diverged, but said it twice
        assert "the run diverged" not in res.output and "has no final state" in res.output


def _recommend_in_a_process(run, timeout=120):
    """``rfrs-ref recommend RUN --user 7`` in a process of its own, stopped after ``timeout``
    seconds: (exit status or None when it had to be stopped, output)."""
    import subprocess
    import sys

    try:
        # -P: the source tree (the working directory) must not shadow the installed package,
        # whose rfrs_ref.cli is the top-level cli/ folder
        res = subprocess.run([sys.executable, "-P", "-m", "rfrs_ref.cli.main", "recommend",
                              str(run), "--user", "7"], capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return None, (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else ""
    return res.returncode, res.stdout + res.stderr


@pytest.mark.parametrize("name", ["config.json", "final_metrics.json"])
def test_a_run_file_that_is_a_fifo_is_refused_without_waiting(small_run, tmp_path, name):
    # open() of a FIFO waits for a writer: the command hung for ever
    bad = _copy_run(small_run, tmp_path)
    if name == "final_metrics.json":
        (bad / "state.npz").unlink()  # read only for a run without a final state
    (bad / name).unlink()
    os.mkfifo(bad / name)
    code, out = _recommend_in_a_process(bad, timeout=60)
    assert code == 1, f"exit status {code} (None: it hung): {out}"
    assert "Traceback" not in out and " item " not in out
    if name == "config.json":
        assert f"{bad / name}: not a regular file" in out, out


@pytest.mark.parametrize("name", ["config.json", "state.npz", "ids.npz"])
def test_a_run_file_that_is_a_link_out_of_the_run_is_refused(small_run, tmp_path, name):
    # the run's files were read wherever a link led: another run's model or configuration
    # was ranked as this run's
    bad = _copy_run(small_run, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (bad / name).rename(elsewhere / name)
    (bad / name).symlink_to(elsewhere / name)
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "7"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    line = " ".join(res.output.split())
    assert f"{bad / name}: a link (to {elsewhere / name})" in line, line
    assert " item " not in res.output


@pytest.mark.parametrize("field, value, message", [
    ("seed", 1.5, "config.seed must be a non-negative integer, got 1.5"),
    ("dataset", ["synthetic"], "config.dataset must be one of"),
    ("ks", ["a"], "config.ks must be a non-empty list of positive integers"),
    ("test_fraction", 5, "config.test_fraction must be a number in [0, 1), got 5"),
    ("model_params", {"dim": 2.5}, "config.model_params.dim must be an integer, got 2.5"),
    ("dataset_params", {"n_users": 10 ** 12, "n_items": 80},
     "config.dataset_params.n_users = 1000000000000: the run would need about"),
])
def test_a_forged_configuration_is_one_line_naming_config_json(small_run, tmp_path, field,
                                                               value, message):
    # a seed of 1.5 ranked under a split no run made; a list as the dataset, a K that is no
    # number or a synthetic dataset of 10^12 users ended in a traceback
    bad = _copy_run(small_run, tmp_path)
    record = json.loads((bad / "config.json").read_text())
    record["config"][field] = value
    (bad / "config.json").write_text(json.dumps(record))
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "7"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    line = " ".join(res.output.split())
    assert f"{bad / 'config.json'}: " in line and message in line, line
    assert len(res.output.strip().splitlines()) == 1, res.output


def test_ids_npz_claiming_more_ids_than_the_dataset_is_refused_before_it_is_read(small_run,
                                                                                tmp_path):
    # a header claiming 10^11 ids in a few bytes of zip: numpy tried to allocate 745 GiB
    # and the command ended in a MemoryError traceback
    import io
    import zipfile

    bad = _copy_run(small_run, tmp_path)
    with zipfile.ZipFile(bad / "ids.npz", "w") as zf:
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            head, {"descr": "<i8", "fortran_order": False, "shape": (10 ** 11,)})
        zf.writestr("user_ids.npy", head.getvalue() + bytes(800))
        items = io.BytesIO()
        np.save(items, np.arange(80))
        zf.writestr("item_ids.npy", items.getvalue())
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "7"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    line = " ".join(res.output.split())
    assert f"{bad / 'ids.npz'}: unreadable (array 'user_ids' is int64[100000000000], more " \
           "than the 60 value(s)" in line, line


def test_a_recorded_data_path_too_long_for_the_system_is_one_line(tmp_path, monkeypatch,
                                                                  ml100k_run_on_copied_data):
    # where the loader does not find the data, the folder config.json records is tried: a
    # path the system refuses (ENAMETOOLONG) ended in an OSError traceback
    data, out = ml100k_run_on_copied_data
    record = json.loads((out / "config.json").read_text())
    record["data_files"][0]["path"] = "/" + "a" * 5000 + "/ml-100k/u.data"
    (out / "config.json").write_text(json.dumps(record))
    monkeypatch.delenv("RFRS_DATA_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("RFRS_DATA_MIRROR", "http://127.0.0.1:9")
    res = CliRunner().invoke(main, ["recommend", str(out), "--user", "1"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "ml100k" in res.output and len(res.output.strip().splitlines()) == 1, res.output


@pytest.mark.parametrize("name", ["state.npz", "ids.npz"])
def test_a_huge_run_file_is_refused_from_its_headers_without_reading_it(small_run, tmp_path,
                                                                        name):
    """A state.npz or ids.npz of a terabyte (sparse: no disk is used) is refused from what
    the zip's directory says, read at the file's end, never read whole into memory."""
    bad = _copy_run(small_run, tmp_path)
    (bad / name).unlink()
    with open(bad / name, "wb") as fh:
        fh.truncate(1 << 40)
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "7"])
    assert res.exit_code == 1, res.output
    assert f"{bad / name}" in res.output and "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception


@pytest.mark.parametrize("name", ["config.json", "final_metrics.json"])
def test_a_huge_json_run_file_is_refused_before_it_is_read(small_run, tmp_path, name):
    # config.json and final_metrics.json were read into memory whole: a sparse file of
    # terabytes there (a few bytes on disk) took every byte of memory before any check
    bad = _copy_run(small_run, tmp_path)
    if name == "final_metrics.json":
        (bad / "state.npz").unlink()  # read only for a run without a final state
    with open(bad / name, "r+b") as fh:
        fh.truncate(1 << 40)
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "7"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    line = " ".join(res.output.split())
    assert f"{bad / name}: 1099511627776 bytes, more than the 16777216" in line, line


def test_a_configuration_beyond_this_machines_memory_is_refused_before_the_data(
        small_run, tmp_path, monkeypatch):
    # a recorded n_users of 10^8 (2.6 TB by the estimate) had the process killed for memory
    # while it generated the data, without a word; the machine is made 1 MB here, so that
    # the small run's own configuration is such a one
    from rfrs_ref.cli import train as train_cli

    bad = _copy_run(small_run, tmp_path)
    monkeypatch.setattr(train_cli, "machine_memory", lambda: 1 << 20)
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "7"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    line = " ".join(res.output.split())
    assert f"{bad / 'config.json'}: config.dataset_params." in line, line
    assert "the run would need about" in line, line
    assert "more than 4 times this machine's memory" in line, line
    monkeypatch.setattr(train_cli, "machine_memory", lambda: 1 << 40)
    res = CliRunner().invoke(main, ["recommend", str(bad), "--user", "7"])
    assert res.exit_code == 0, res.output

"""Compressed run records (``rfrs-ref compact``): outcome.json.gz is read wherever
outcome.json is, a results directory holding only compressed records runs nothing and
redraws the same files, and a compressed record is input like any other (a gzip bomb,
cut-short data, trailing bytes, two records that differ, a link)."""

from __future__ import annotations

import gzip
import json
import shutil
import zlib

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main
from rfrs_ref.experiments.committed import committed_files, gzip_records
from rfrs_ref.experiments.figures import figure, reproduce
from rfrs_ref.experiments.results import (MAX_RECORD_BYTES, OUTCOME, OUTCOME_GZ, Store,
                                          gzip_bytes, record_bytes, two_records)
from rfrs_ref.experiments.spec import RunSpec, make_config
from rfrs_ref.experiments.sweep import run_sweep

TINY = {"dataset": "synthetic", "dataset_params": {"n_users": 60, "n_items": 40, "mean_items": 8.0},
        "client_fraction": 0.2, "rounds": 2, "eval_every": 1}


def _one_run(tmp_path, seed=0):
    out = tmp_path / "res"
    runs = [RunSpec(make_config({**TINY, "seed": seed}), trial=seed, labels={"series": "Adam"})]
    run_sweep(runs, out, workers=0, threads=1)
    return out, runs


def test_compressed_records_alone_run_nothing_and_redraw_the_same_files(ex, tmp_path):
    first = tmp_path / "first"
    report, _ = reproduce(figure("10"), ex.fig10_scale(), first, workers=0, threads=1)
    assert report.finished == 4
    fresh = tmp_path / "fresh"
    shutil.copytree(first, fresh)
    plain = {p.parent.name: p.read_bytes() for p in (fresh / "runs").glob(f"*/{OUTCOME}")}
    done = gzip_records(fresh)
    assert sorted(done.compressed) == sorted(plain) and not done.left
    assert done.bytes_after < done.bytes_before / 2
    for key, text in plain.items():
        d = fresh / "runs" / key
        assert not (d / OUTCOME).exists()
        assert gzip.decompress((d / OUTCOME_GZ).read_bytes()) == text
    # what is committed: the compressed records, the tables, the PNGs and the provenance
    record = committed_files(fresh)
    assert sum(p.name == OUTCOME_GZ for p in record) == 4
    bare = tmp_path / "bare"
    ex.copy_files(fresh, bare, record)
    again, _ = reproduce(figure("10"), ex.fig10_scale(), bare, workers=0, threads=1)
    assert (again.total, again.skipped, again.finished, again.failed) == (4, 4, 0, 0)
    for rel in ex.REDRAWN:
        assert (bare / rel).read_bytes() == (first / rel).read_bytes(), rel
    # a second call finds nothing to do
    twice = gzip_records(bare)
    assert (twice.compressed, len(twice.already), twice.left) == ([], 4, [])


def test_compression_is_deterministic():
    text = json.dumps({"status": "ok", "final": {"precision@1": 0.25}}).encode()
    assert gzip_bytes(text) == gzip_bytes(text)
    assert gzip.decompress(gzip_bytes(text)) == text


def _bomb() -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b" " * (1 << 20)
    body = b"".join(c.compress(chunk) for _ in range(MAX_RECORD_BYTES // len(chunk) + 2))
    return b'' + body + c.flush()


@pytest.mark.parametrize("damage", ["bomb", "cut short", "trailing bytes", "not gzip",
                                    "not a JSON object"])
def test_a_damaged_compressed_record_is_no_result_and_the_sweep_names_it(tmp_path, damage):
    """A compressed record is input: one that decompresses past the limit (a few kilobytes
    of gzip that would fill the memory), is cut short, has other bytes after it, is not gzip,
    or holds no JSON object is no record of the run: named, kept with --no-retry-failed,
    run again otherwise."""
    out, runs = _one_run(tmp_path)
    key = runs[0].key
    store = Store(out)
    d = store.run_dir(key)
    good = (d / OUTCOME).read_bytes()
    (d / OUTCOME).unlink()
    data = {"bomb": _bomb(), "cut short": gzip_bytes(good)[:-9],
            "trailing bytes": gzip_bytes(good) + b"\x00junk",
            "not gzip": good, "not a JSON object": gzip_bytes(b"[1, 2]")}[damage]
    (d / OUTCOME_GZ).write_bytes(data)
    assert store.outcome_path(key) == d / OUTCOME_GZ
    why = store.outcome_problem(key)
    assert why and store.read_outcome(key) is None
    if damage == "bomb":
        assert "MiB once decompressed" in why
    kept = run_sweep(runs, out, workers=0, threads=1, retry_failed=False)
    assert (kept.finished, kept.kept_failed) == (0, 1)
    assert (d / OUTCOME_GZ).read_bytes() == data  # left as it was
    again = run_sweep(runs, out, workers=0, threads=1)
    assert again.finished == 1
    # the run's new record is plain, and no compressed one is left beside it
    assert store.read_outcome(key)["status"] == "ok" and not (d / OUTCOME_GZ).exists()


def test_two_records_that_differ_are_no_result_the_same_bytes_twice_are_one(tmp_path):
    out, runs = _one_run(tmp_path)
    key = runs[0].key
    store = Store(out)
    d = store.run_dir(key)
    text = (d / OUTCOME).read_bytes()
    (d / OUTCOME_GZ).write_bytes(gzip_bytes(text))
    assert two_records(d) is None and store.read_outcome(key)["status"] == "ok"
    # an interrupted compression (both files, same bytes) is finished by the next call
    done = gzip_records(out)
    assert done.compressed == [key] and not (d / OUTCOME).exists()
    # another record beside it: neither is taken
    other = json.loads(text)
    other["final"]["model"]["precision@1"] = 1.0
    (d / OUTCOME).write_text(json.dumps(other))
    assert "differ" in two_records(d)
    assert store.read_outcome(key) is None and "differ" in store.outcome_problem(key)
    left = gzip_records(out)
    assert left.compressed == [] and [p.name for p, _ in left.left] == [key]
    again = run_sweep(runs, out, workers=0, threads=1)
    assert again.finished == 1 and two_records(d) is None
    assert not (d / OUTCOME_GZ).exists()


def test_a_linked_record_is_left_and_named_and_the_command_fails(tmp_path):
    out, runs = _one_run(tmp_path)
    d = Store(out).run_dir(runs[0].key)
    elsewhere = tmp_path / "elsewhere.json"
    shutil.move(d / OUTCOME, elsewhere)
    (d / OUTCOME).symlink_to(elsewhere)
    res = CliRunner().invoke(main, ["compact", str(out)])
    assert res.exit_code == 1
    assert "link" in res.output and str(d) in res.output
    assert (d / OUTCOME).is_symlink() and not (d / OUTCOME_GZ).exists()
    # a compressed record that is a link is not the run's either
    (d / OUTCOME).unlink()
    gz_elsewhere = tmp_path / "elsewhere.json.gz"
    gz_elsewhere.write_bytes(gzip_bytes(elsewhere.read_bytes()))
    (d / OUTCOME_GZ).symlink_to(gz_elsewhere)
    store = Store(out)
    assert "link" in store.outcome_problem(runs[0].key)
    assert store.read_outcome(runs[0].key) is None


def test_the_command_takes_folders_of_results_and_refuses_what_is_none(tmp_path):
    out, _ = _one_run(tmp_path)
    runner = CliRunner()
    res = runner.invoke(main, ["compact", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "1 records compressed" in res.output
    plain = tmp_path / "plain"
    plain.mkdir()
    res = runner.invoke(main, ["compact", str(plain)])
    assert res.exit_code == 2 and "not a results directory" in res.output


def test_a_users_folder_with_a_runs_folder_of_its_own_is_left_as_it_is(tmp_path):
    # `compact PROJECT` (or a folder holding it) where PROJECT/runs/ is the user's own (train's
    # default place for runs) replaced the user's runs/exp/outcome.json by a .gz and removed it
    project = tmp_path / "project"
    mine = project / "runs" / "exp"
    mine.mkdir(parents=True)
    (mine / OUTCOME).write_text('{"my": "notes"}\n')
    runner = CliRunner()
    for arg in (project, tmp_path):
        res = runner.invoke(main, ["compact", str(arg)])
        assert res.exit_code == 2 and "not a results directory" in res.output, res.output
    with pytest.raises(ValueError, match="not a results directory"):
        gzip_records(project)
    assert sorted(p.name for p in mine.iterdir()) == [OUTCOME]
    assert (mine / OUTCOME).read_text() == '{"my": "notes"}\n'
    assert not (project / ".lock").exists()


def test_a_directory_a_sweep_holds_is_refused(tmp_path):
    from rfrs_ref.experiments.results import StoreLocked, store_lock

    out, runs = _one_run(tmp_path)
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()

    def hold():
        with store_lock(out):
            ready.set()
            done.wait(30)

    p = ctx.Process(target=hold)
    p.start()
    try:
        assert ready.wait(30)
        with pytest.raises(StoreLocked):
            gzip_records(out)
        assert (Store(out).run_dir(runs[0].key) / OUTCOME).exists()
    finally:
        done.set()
        p.join(30)


def test_train_refuses_a_run_directory_holding_a_compressed_record(tmp_path):
    """A sweep's run directory moved out of its results directory still holds a sweep's
    record: the trainer refuses it whichever form the record has."""
    out, runs = _one_run(tmp_path)
    gzip_records(out)
    d = tmp_path / "moved"
    shutil.copytree(Store(out).run_dir(runs[0].key), d)
    res = CliRunner().invoke(main, ["train", "--dataset", "synthetic", "--rounds", "1",
                                    "--out", str(d)])
    assert res.exit_code != 0 and OUTCOME_GZ in res.output


def test_record_bytes_of_a_plain_record_is_the_file(tmp_path):
    p = tmp_path / OUTCOME
    p.write_bytes(b'{"a": 1}')
    assert record_bytes(p) == b'{"a": 1}'

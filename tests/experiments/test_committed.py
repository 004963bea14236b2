"""The committed record of a results directory: enough to skip every run and redraw the same
tables and figures; the .gitignore keeps exactly the bulk out; provenance of each call."""

from __future__ import annotations

import io
import json
import pathlib
import shutil
import subprocess
import tarfile

import pytest

from rfrs_ref.experiments.committed import (COMMITTED_GLOBS, PROVENANCE, committed_files,
                                            read_provenance)
from rfrs_ref.experiments.figures import QUICK_TRIALS, Scale, figure, reproduce
from rfrs_ref.experiments.results import OUTCOME, ROUNDS_FILE, Store, read_rounds
from rfrs_ref.experiments.spec import RunSpec
from rfrs_ref.experiments.sweep import run_sweep

REPO = pathlib.Path(__file__).resolve().parents[2]



def test_the_record_alone_runs_nothing_and_redraws_the_same_files(ex, tmp_path):
    first = tmp_path / "first"
    report, _ = reproduce(figure("10"), ex.fig10_scale(), first, workers=0, threads=1)
    assert (report.finished, report.failed) == (4, 0)
    record = committed_files(first)
    assert {str(p) for p in record} >= {*ex.REDRAWN, PROVENANCE}
    outcomes = [p for p in record if p.name == OUTCOME]
    assert len(outcomes) == 4
    # the bulk is not part of the record
    assert not any(p.suffix in (".parquet", ".pdf", ".jsonl") or p.name == ROUNDS_FILE
                   for p in record)

    fresh = tmp_path / "fresh"
    ex.copy_files(first, fresh, record)
    again, _ = reproduce(figure("10"), ex.fig10_scale(), fresh, workers=0, threads=1)
    assert (again.total, again.skipped, again.finished, again.failed) == (4, 4, 0, 0)
    for rel in ex.REDRAWN:
        assert (fresh / rel).read_bytes() == (first / rel).read_bytes(), rel
    # a call that ran nothing leaves the provenance as it was
    assert (fresh / PROVENANCE).read_bytes() == (first / PROVENANCE).read_bytes()


def test_provenance_records_each_call_that_ran_something(ex, tmp_path):
    runs = [RunSpec(ex.tiny_config(seed=s, rounds=2)) for s in range(2)]
    run_sweep(runs[:1], tmp_path, workers=0, threads=1)
    run_sweep(runs, tmp_path, workers=0, threads=1)
    before = (tmp_path / PROVENANCE).read_bytes()
    run_sweep(runs, tmp_path, workers=0, threads=1)
    assert (tmp_path / PROVENANCE).read_bytes() == before
    calls = read_provenance(tmp_path)["calls"]
    assert [c["runs"] for c in calls] == [
        {"total": 1, "skipped": 0, "finished": 1, "failed": 0},
        {"total": 2, "skipped": 1, "finished": 1, "failed": 0}]
    for c in calls:
        assert c["wall_s"] > 0 and c["run_wall_s_sum"] > 0
        assert c["machine"]["cores"] >= 1 and c["versions"]["numpy"]
        assert "commit" in c and "dirty" in c and c["started"] <= c["finished"]


def test_outcomes_stay_small_and_the_round_summary_sits_beside_them(ex, tmp_path):
    spec = RunSpec(ex.tiny_config(rounds=6))
    run_sweep([spec], tmp_path, workers=0, threads=1)
    d = tmp_path / "runs" / spec.key
    assert "rounds" not in json.loads((d / OUTCOME).read_text())
    assert [r["round"] for r in read_rounds(d)] == list(range(1, 7))


def test_an_outcome_written_with_its_rounds_inside_is_compacted_and_not_run_again(ex, tmp_path):
    spec = RunSpec(ex.tiny_config(rounds=3))
    run_sweep([spec], tmp_path, workers=0, threads=1)
    d = tmp_path / "runs" / spec.key
    rounds = read_rounds(d)
    legacy = {**json.loads((d / OUTCOME).read_text()), "rounds": rounds}
    (d / OUTCOME).write_text(json.dumps(legacy, indent=1) + "\n")
    (d / ROUNDS_FILE).unlink()
    (tmp_path / PROVENANCE).unlink()
    report = run_sweep([spec], tmp_path, workers=0, threads=1)
    assert (report.skipped, report.finished) == (1, 0)
    assert "rounds" not in json.loads((d / OUTCOME).read_text())
    assert Store(tmp_path).read_rounds(spec.key) == rounds
    # runs recorded without provenance get one entry made from their outcomes
    (entry,) = read_provenance(tmp_path)["calls"]
    assert entry["reconstructed"] and entry["runs"]["finished"] == 1 and entry["commit"] is None
    assert entry["run_wall_s_sum"] > 0 and entry["hosts"] and entry["versions"]
    before = (tmp_path / PROVENANCE).read_bytes()
    run_sweep([spec], tmp_path, workers=0, threads=1)
    assert (tmp_path / PROVENANCE).read_bytes() == before


def test_resilience_runs_keep_their_rounds_in_the_outcome(ex, tmp_path):
    spec = RunSpec(ex.tiny_config(rounds=2, resilience=True, attack="ascent",
                                  byzantine_fraction=0.2))
    run_sweep([spec], tmp_path, workers=0, threads=1)
    d = tmp_path / "runs" / spec.key
    assert all("resilience" in r for r in json.loads((d / OUTCOME).read_text())["rounds"])
    assert not (d / ROUNDS_FILE).exists()


def _git_ignored(paths: list[str]) -> set[str]:
    res = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "--stdin"],
                         input="\n".join(paths) + "\n", capture_output=True, text=True)
    if res.returncode not in (0, 1):
        pytest.skip(f"git check-ignore is not usable here: {res.stderr.strip()}")
    return set(res.stdout.split())


def test_gitignore_keeps_exactly_the_record(ex, tmp_path):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = tmp_path / "out"
    reproduce(figure("10"), ex.fig10_scale(), out, workers=0, threads=1)
    (out / "runs" / "0123456789abcdef").mkdir()
    for name in ("checkpoint.npz", "state.npz", "capture.npz", "capture.json"):
        (out / "runs" / "0123456789abcdef" / name).write_text("x")
    every = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    record = set(committed_files(out))
    assert record and set(every) - record
    where = {f"results/fig10/{p}": p for p in every}
    ignored = _git_ignored(list(where))
    assert {p for name, p in where.items() if name not in ignored} == record, COMMITTED_GLOBS


def test_tables_hold_every_recorded_run_of_the_experiment_whatever_the_call(ex, tmp_path):
    first = [RunSpec(ex.tiny_config(seed=s, rounds=2)) for s in range(2)]
    second = [RunSpec(ex.tiny_config(seed=s, rounds=2, optimizer="sgd")) for s in range(2)]
    grid = [*first, *second]
    run_sweep(first, tmp_path, workers=0, threads=1, table_runs=grid)
    only_first = (tmp_path / "results.csv").read_bytes()
    # a call running the other half keeps the first half in the tables, in the grid's order
    report = run_sweep(second, tmp_path, workers=0, threads=1, table_runs=grid)
    assert list(dict.fromkeys(report.table["key"])) == [s.key for s in grid]
    both = {p: (tmp_path / p).read_bytes() for p in ("results.csv", "runs.csv", "summary.csv")}
    assert both["results.csv"].startswith(only_first.splitlines(keepends=True)[0])
    # any part of the grid asked for again runs nothing and writes the same bytes
    for part in (first, second, grid):
        again = run_sweep(part, tmp_path, workers=0, threads=1, table_runs=grid)
        assert again.finished == 0
        for p, data in both.items():
            assert (tmp_path / p).read_bytes() == data, p
    # a call whose tables would not hold every recorded run (another scale, another grid)
    # is refused before anything is written, rather than dropping their rows unsaid
    for part, table in ((second, None), (first, first), (second, second)):
        with pytest.raises(ValueError, match=r"records 2 finished run\(s\) that this call's "
                                             r"tables would not hold .* nothing was run"):
            run_sweep(part, tmp_path, workers=0, threads=1, table_runs=table)
        for p, data in both.items():
            assert (tmp_path / p).read_bytes() == data, p
    # a failed run, a damaged record and another run's record copied in are not results:
    # they neither count as runs the tables would drop nor stop the call
    x = tmp_path.parent / (tmp_path.name + "-x")
    shutil.copytree(tmp_path, x)
    (x / "runs" / first[0].key / "outcome.json").write_text("{not json")
    record = json.loads((x / "runs" / first[1].key / "outcome.json").read_text())
    (x / "runs" / first[1].key / "outcome.json").write_text(
        json.dumps({**record, "status": "failed"}))
    assert run_sweep(second, x, workers=0, threads=1, run=False).finished == 0


def test_a_figure_restricted_to_one_dataset_tabulates_the_others_recorded_runs():
    from rfrs_ref.experiments.figures import whole_grid

    fig = figure("4")
    lastfm = whole_grid(fig, Scale(datasets=("lastfm",)))
    assert [r.key for r in lastfm] == [r.key for r in whole_grid(fig, Scale())]
    ml100k_runs = {r.key for r in fig.runs(Scale(datasets=("ml100k",)))}
    assert ml100k_runs < {r.key for r in lastfm}
    # a dataset outside the figure's own is added after them
    extra = whole_grid(fig, Scale(datasets=("synthetic",), rounds=2))
    assert [r.config.dataset for r in extra][-1] == "synthetic"
    # fewer trials than the figure's keep the others' rows; more add theirs
    full = [r.key for r in whole_grid(fig, Scale())]
    assert [r.key for r in whole_grid(fig, Scale(datasets=("citeulike-a",), trials=2))] == full
    more = whole_grid(fig, Scale(trials=7))
    assert set(full) < {r.key for r in more} and {r.config.seed for r in more} == set(range(7))
    quick = whole_grid(fig, Scale(quick=True, trials=1))
    assert {r.config.seed for r in quick} == set(range(QUICK_TRIALS))
    abl = figure("ablation-exact")
    assert {r.config.seed for r in whole_grid(abl, Scale(trials=1))} == set(range(abl.trials))


#: the committed directories made with options beyond the figure's defaults, and those options
#: (as each directory's provenance.json records its command)
COMMITTED_SCALES = {"pca-init1": Scale(overrides={"init_scale": 1.0})}


def _committed_dirs():
    """The repository's committed results directories that a figure of the registry makes
    (its experiment name, or that name and a suffix), with that figure."""
    from rfrs_ref.experiments.figures import FIGURES

    by_experiment = {}
    for _, f in FIGURES.items():
        by_experiment.setdefault(f.experiment, f)
    root = REPO / "results"
    if not root.is_dir():
        return []
    def made_by(name):  # NAME, or NAME-suffix (the ranking's Last.fm half: ranking-lastfm)
        if name in by_experiment:
            return by_experiment[name]
        prefixes = [e for e in by_experiment if name.startswith(f"{e}-")]
        return by_experiment[max(prefixes, key=len)] if prefixes else None

    return [pytest.param(d.name, made_by(d.name), id=d.name) for d in sorted(root.iterdir())
            if made_by(d.name) is not None and (d / "results.csv").is_file()]


@pytest.mark.parametrize("name, fig", _committed_dirs())
def test_the_committed_results_regenerate_their_tables_byte_for_byte(name, fig, tmp_path):
    """The committed record of results/NAME alone, tabulated again by this code (what
    `rfrs-ref reproduce FIG --out results/NAME` does when every run is recorded), gives the
    committed tables: a change of the tables' code is seen here, not in a later diff."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", f"results/{name}"],
                             capture_output=True, check=False)
    if archive.returncode != 0 or not archive.stdout:
        pytest.skip("not a git checkout with committed results")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp_path, filter="data")
    fresh = tmp_path / "results" / name
    report, _ = reproduce(fig, COMMITTED_SCALES.get(name, Scale()), fresh, workers=0,
                          plot=False, run=False)
    assert report.finished == report.failed == 0
    for table in ("results.csv", "runs.csv", "summary.csv", "summary.md"):
        committed = subprocess.run(["git", "-C", str(REPO), "show",
                                    f"HEAD:results/{name}/{table}"],
                                   capture_output=True, check=True).stdout
        assert (fresh / table).read_bytes() == committed, f"results/{name}/{table}"
    if fig.kind == "ranking":
        # the ranking's "figure" is a Markdown table, committed like the tables
        from rfrs_ref.experiments.ranking import write_ranking
        from rfrs_ref.experiments.results import read_table

        drawn = write_ranking(read_table(fresh), tmp_path / "drawn")
        committed = subprocess.run(["git", "-C", str(REPO), "show",
                                    f"HEAD:results/{name}/figures/ranking.md"],
                                   capture_output=True, check=True).stdout
        assert drawn.read_bytes() == committed, f"results/{name}/figures/ranking.md"


def test_the_documented_figures_are_the_committed_ones():
    """docs/reproduction.md shows docs/figures/*.png: each must be, byte for byte, a figure
    that a committed results directory draws (a stale copy showed Fig. 4 with an empty
    Last.fm panel and Fig. 11 without Last.fm after both were committed)."""
    committed = {}
    for png in (REPO / "results").glob("*/figures/*.png"):
        committed.setdefault(png.name, set()).add(png.read_bytes())
    documented = sorted((REPO / "docs" / "figures").glob("*.png"))
    if not documented or not committed:
        pytest.skip("no documented or committed figures in this checkout")
    stale = [p.name for p in documented if p.read_bytes() not in committed.get(p.name, set())]
    assert not stale, (f"docs/figures/{', '.join(stale)} differ from every committed "
                       "results/*/figures/ file of that name: copy the committed figure")


@pytest.mark.parametrize("damaged", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_an_unreadable_provenance_is_kept_aside_not_overwritten(tmp_path, damaged):
    # a provenance.json that could not be read was taken as no record and overwritten by
    # the next call's: whatever calls it held were lost without a trace
    from rfrs_ref.experiments.committed import PROVENANCE, read_provenance, record_call

    (tmp_path / PROVENANCE).write_bytes(damaged)
    entry = record_call(tmp_path, started="2026-01-01T00:00:00+00:00", wall_s=1.0, total=1,
                        skipped=0, finished=1, failed=0, workers=1, command=["rfrs-ref"])
    assert (tmp_path / f"{PROVENANCE}.unreadable").read_bytes() == damaged
    assert entry["unreadable_provenance_kept_as"] == f"{PROVENANCE}.unreadable"
    assert read_provenance(tmp_path)["calls"] == [entry]
    # a second damaged record goes beside the first, and a readable one is appended to
    (tmp_path / PROVENANCE).write_bytes(damaged)
    record_call(tmp_path, started="2026-01-01T00:00:00+00:00", wall_s=1.0, total=1,
                skipped=0, finished=1, failed=0, workers=1, command=["rfrs-ref"])
    assert (tmp_path / f"{PROVENANCE}.unreadable.2").read_bytes() == damaged
    last = record_call(tmp_path, started="2026-01-01T00:00:00+00:00", wall_s=1.0, total=1,
                       skipped=0, finished=1, failed=0, workers=1, command=["rfrs-ref"])
    assert "unreadable_provenance_kept_as" not in last
    assert len(read_provenance(tmp_path)["calls"]) == 2

"""What a worker does with one run: outcomes, failures, PCA capture."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rfrs_ref.experiments.figures import PCA_CLIENTS, Scale, figure
from rfrs_ref.experiments.spec import RunSpec, make_config
from rfrs_ref.experiments.worker import execute_run, pca_2d, separation


def test_pca_known_answer_points_on_a_line():
    t = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    direction = np.array([3.0, 4.0]) / 5.0
    X = 7.0 + t[:, None] * direction[None, :]
    xy, ev = pca_2d(X)
    np.testing.assert_allclose(ev, [1.0, 0.0], atol=1e-12)
    # rows 0 and 4 tie for the largest |coordinate|; the first row is made positive
    np.testing.assert_allclose(xy[:, 0], -t, atol=1e-12)
    np.testing.assert_allclose(xy[:, 1], 0.0, atol=1e-12)
    # no tie: the row farthest from the mean (t = 2.5 - 0.5 below) comes out positive
    t = np.array([-1.0, 0.0, 0.5, 2.5])
    xy, _ = pca_2d(-7.0 - t[:, None] * direction[None, :])
    np.testing.assert_allclose(xy[:, 0], t - t.mean(), atol=1e-12)


@settings(max_examples=20)
@given(arrays(np.float64, st.tuples(st.integers(3, 12), st.integers(2, 30)),
              elements=st.floats(-100, 100)))
def test_pca_agrees_with_svd(X):
    xy, ev = pca_2d(X)
    Xc = X - X.mean(axis=0)
    U, S, Vt = np.linalg.svd(Xc, full_matrices=False)
    total = (S ** 2).sum()
    if total < 1e-9:
        return
    ref = U[:, :2] * S[:2]
    assert ev.sum() <= 1 + 1e-9
    np.testing.assert_allclose(ev[0], S[0] ** 2 / total, rtol=1e-6, atol=1e-9)
    # each component up to sign, where its eigenvalue is separated from the next
    for j in range(min(2, len(S))):
        gap = min([abs(S[j] ** 2 - S[i] ** 2) for i in range(len(S)) if i != j] or [np.inf])
        if gap < 1e-6 * total:
            continue
        sign = np.sign(np.dot(xy[:, j], ref[:, j])) or 1.0
        np.testing.assert_allclose(xy[:, j], sign * ref[:, j], atol=1e-6 * np.sqrt(total))


def test_pca_rejects_non_finite_rows():
    X = np.ones((3, 4))
    X[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        pca_2d(X)


def test_separation_known_answer():
    X = np.array([[0.0], [2.0], [10.0], [12.0]])
    byz = np.array([False, False, True, True])
    # centroids 1 and 11; spread 1 in each group: 100 / (1 + 1)
    assert separation(X, byz) == pytest.approx(50.0)
    assert separation(X, np.zeros(4, bool)) is None


def _task(spec: RunSpec, run_dir=None) -> dict:
    return {"spec": spec.to_json(), "key": spec.key, "run_dir": run_dir, "data_dir": None,
            "keep_state": False}


def test_a_failing_run_is_reported_not_raised(ex):
    spec = RunSpec(ex.tiny_config(dataset_params={**ex.TINY_DATA, "n_items": 1}))
    out = execute_run(_task(spec))
    assert out["status"] == "failed"
    assert "n_items" in out["error"] and "Traceback" in out["traceback"]
    assert out["wall_s"] >= 0 and out["key"] == spec.key


def test_a_run_whose_resilience_sum_is_not_finite_is_a_failure(ex):
    # it was recorded "ok", its C_g null as if the total were unknown
    spec = RunSpec(ex.tiny_config(dtype="float64", optimizer="sgd",
                                  optimizer_params={"lr": 1e-300}, attack="noise",
                                  attack_params={"sigma": 100.0}, byzantine_fraction=0.2,
                                  resilience=True, backend="numpy"))
    out = execute_run(_task(spec))
    assert out["status"] == "failed"
    assert out["error"].startswith("NonFiniteResilience: ") and "C_g at round 1" in out["error"]


def test_an_ordinary_run_returns_its_files_when_not_shared(ex):
    spec = RunSpec(ex.tiny_config())
    out = execute_run(_task(spec))
    assert out["status"] == "ok", out["traceback"]
    assert set(out["files"]) == {"config.json", "metrics.csv", "final_metrics.json"}
    assert [h["round"] for h in out["history"]] == [0, 2, 4]
    assert [r["round"] for r in out["rounds"]] == [1, 2, 3, 4]


def _interrupted(spec, run_dir, after: int):
    """``run_dir`` holding ``spec``'s run stopped after round ``after`` (its checkpoint)."""
    from rfrs_ref.federated.trainer import Trainer

    class Stop(Exception):
        pass

    def stop(t, record, latest):
        if t == after + 1:
            raise Stop

    with pytest.raises(Stop):
        Trainer(spec.config).run(run_dir, progress=stop)
    return run_dir


def test_a_run_cut_off_resumes_from_its_checkpoint_and_ends_the_same(ex, tmp_path):
    spec = RunSpec(ex.tiny_config(rounds=6, eval_every=2, checkpoint_every=2, attack="ascent",
                                  byzantine_fraction=0.2, preset="a-rfrs"))
    whole = execute_run(_task(spec, str(tmp_path / "whole")))
    # a run interrupted after round 4: its directory holds the checkpoint of round 4
    partial = _interrupted(spec, tmp_path / "partial", 4)
    resumed = execute_run(_task(spec, str(partial)))
    assert resumed["status"] == "ok", resumed["traceback"]
    assert resumed["resumed_from"] == 4 and whole["resumed_from"] is None
    assert resumed["final"]["model"] == whole["final"]["model"]
    assert resumed["history"] == whole["history"]
    assert not (partial / "checkpoint.npz").exists() and not (partial / "state.npz").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_at_the_checkpoints_name_is_no_checkpoint_and_never_waited_on(ex, tmp_path):
    """A sweep's run directory of the same configuration with a FIFO where its checkpoint
    was: the run starts again from scratch (as for any unreadable checkpoint) instead of
    waiting for ever for a writer; it ends as the run from scratch does."""
    spec = RunSpec(ex.tiny_config(rounds=4, eval_every=2, checkpoint_every=2))
    whole = execute_run(_task(spec, str(tmp_path / "whole")))
    partial = _interrupted(spec, tmp_path / "partial", 2)
    (partial / "checkpoint.npz").unlink()
    os.mkfifo(partial / "checkpoint.npz")
    done: list = []
    worker = threading.Thread(target=lambda: done.append(execute_run(_task(spec, str(partial)))),
                              daemon=True)
    worker.start()
    worker.join(120)
    if worker.is_alive():  # let the waiting open finish, so the test process can end
        os.close(os.open(partial / "checkpoint.npz", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("the run waited on the FIFO at checkpoint.npz")
    out = done[0]
    assert out["status"] == "ok", out["traceback"]
    assert out["resumed_from"] is None
    assert out["final"]["model"] == whole["final"]["model"]


def test_capture_run_projects_the_ninety_uploads_of_round_24(ex, tmp_path):
    fig = figure("1")
    runs = fig.runs(Scale(datasets=("synthetic",),
                          overrides={"dataset_params": {"n_users": 150, "n_items": 200}}))
    assert len(runs) == 2 and {r.kind for r in runs} == {"capture"}
    out = execute_run(_task(runs[0], str(tmp_path / "run")))
    assert out["status"] == "ok", out["traceback"]
    cap = out["capture"]
    assert cap["round"] == 24
    assert len(cap["byzantine"]) == PCA_CLIENTS
    assert np.asarray(cap["theta_pca"]).shape == (PCA_CLIENTS, 2)
    assert np.asarray(cap["gradient_pca"]).shape == (PCA_CLIENTS, 2)
    assert 0 < sum(cap["byzantine"]) < PCA_CLIENTS
    assert out["rounds"][-1]["n_byzantine_sampled"] == sum(cap["byzantine"])
    for key in ("theta", "gradient"):
        assert sum(cap[f"{key}_explained"]) <= 1 + 1e-9
        assert cap["separation"][key] is not None and cap["separation"][key] >= 0
    assert (tmp_path / "run" / "capture.npz").exists()


def test_capture_gradients_are_the_recovered_ones(ex):
    """Under gradient ascent the server recovers −g from a Byzantine upload; the capture
    projects what the server sees, so the groups separate along the first component."""
    spec = RunSpec(make_config({**ex.TINY, "model": "fmf", "attack": "ascent",
                                "byzantine_fraction": 0.4, "client_fraction": 0.2,
                                "rounds": 3}), kind="capture")
    out = execute_run(_task(spec))
    assert out["status"] == "ok", out["traceback"]
    cap = out["capture"]
    byz = np.asarray(cap["byzantine"])
    pc1 = np.asarray(cap["gradient_pca"])[:, 0]
    # the sign of a component is a convention: the two groups lie on opposite sides
    assert np.sign(pc1[byz].mean()) == -np.sign(pc1[~byz].mean())


# -- a capture run's files are whole or absent ---------------------------------------------------
_UNDER_LIMIT = """\
import json, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
import rfrs_ref.federated.round, rfrs_ref.federated.trainer  # noqa: E401 - before the limit
from rfrs_ref.experiments.worker import execute_run
task = json.loads(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
out = execute_run(task)
print(json.dumps({"status": out["status"], "error": out["error"]}))
"""


def _whole(path) -> bool:
    import json
    import zipfile

    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                return all(z[k].size >= 0 for k in z.files) and len(z.files) == 4
        except (OSError, ValueError, EOFError, zipfile.BadZipFile):
            return False
    try:
        json.loads(path.read_text())
        return True
    except ValueError:
        return False


def test_a_capture_run_stopped_by_a_full_disk_leaves_no_part_of_a_file(ex, tmp_path):
    """A capture run (Fig. 1) wrote capture.npz and its JSON files in place: a full disk
    mid-write left a truncated file under the finished file's name. Each file now lands
    whole or not at all, final_metrics.json (the end of a capture) last."""
    import json
    import subprocess
    import sys

    from rfrs_ref.experiments.worker import CAPTURE_FILES

    spec = RunSpec(make_config({**ex.TINY, "model": "fmf", "attack": "ascent",
                                "byzantine_fraction": 0.4, "rounds": 2, "backend": "numpy"}),
                   kind="capture")
    whole = tmp_path / "whole"
    assert execute_run(_task(spec, str(whole)))["status"] == "ok"
    sizes = {name: (whole / name).stat().st_size for name in CAPTURE_FILES}
    for name in ("capture.npz", "capture.json"):
        run_dir = tmp_path / name
        # any file larger than the limit cannot be written whole: this one, and maybe others
        proc = subprocess.run([sys.executable, "-c", _UNDER_LIMIT,
                               json.dumps(_task(spec, str(run_dir))), str(sizes[name] - 1)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.splitlines()[-1])
        assert out["status"] == "failed" and "too large" in out["error"], out
        left = {p.name: p for p in run_dir.iterdir() if p.name in CAPTURE_FILES}
        assert name not in left
        assert [n for n, p in left.items() if not _whole(p)] == []
        assert "final_metrics.json" not in left
        assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]

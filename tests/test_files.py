"""Atomic writes: the old content or the new, never part, and no leftovers."""

from __future__ import annotations

import os

import pytest

from rfrs_ref.files import atomic_write


def test_atomic_write_replaces_the_file(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")
    atomic_write(path, lambda fh: fh.write(b"new"))
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_a_failed_write_keeps_the_old_content_and_no_temporary(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")

    def half(fh):
        fh.write(b"ne")
        raise RuntimeError("killed half-way")

    with pytest.raises(RuntimeError, match="half-way"):
        atomic_write(path, half)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_threads_writing_one_path_each_replace_it_whole(tmp_path):
    """The temporary name carried the process id only, so two threads of one process writing
    one path shared it: the second removed the first's file and created its own, the first
    renamed the second's (perhaps half-written) file over the target, and the second's
    rename then failed (FileNotFoundError)."""
    import threading

    path = tmp_path / "table.csv"
    both_open = threading.Barrier(2, timeout=60)
    errors: list[BaseException] = []

    def writer(text: bytes):
        def write(fh):
            fh.write(text[:3])
            both_open.wait()  # each thread holds its temporary file open, half-written
            fh.write(text[3:])

        try:
            atomic_write(path, write)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,))
               for t in (b"first whole table\n", b"second whole table\n")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert path.read_bytes() in (b"first whole table\n", b"second whole table\n")
    assert [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_the_temporary_name_is_hidden_beside_the_target_and_one_per_call(tmp_path):
    import fnmatch

    from rfrs_ref.files import temporary_name

    path = tmp_path / "results.csv"
    a, b = temporary_name(path), temporary_name(path)
    assert a != b and a.parent == b.parent == tmp_path
    for name in (a.name, b.name):  # .gitignore's results/**/.*.tmp
        assert fnmatch.fnmatch(name, ".*.tmp") and name.startswith(f".results.csv.{os.getpid()}-")


def test_an_entry_at_the_temporary_name_is_neither_followed_nor_removed(tmp_path, monkeypatch):
    """Another writer's file (or a planted link) at the name drawn is left as it is, and
    another name is drawn."""
    import rfrs_ref.files as files

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    taken = tmp_path / ".out.bin.1-2-taken.tmp"
    taken.symlink_to(victim)
    other = tmp_path / ".out.bin.1-2-other.tmp"
    (tmp_path / ".out.bin.1-3-writer.tmp").write_bytes(b"another writer's half")
    names = iter([taken, tmp_path / ".out.bin.1-3-writer.tmp", other])
    monkeypatch.setattr(files, "temporary_name", lambda path: next(names))
    atomic_write(tmp_path / "out.bin", lambda fh: fh.write(b"new"))
    assert (tmp_path / "out.bin").read_bytes() == b"new"
    assert victim.read_text() == "precious" and taken.is_symlink()
    assert (tmp_path / ".out.bin.1-3-writer.tmp").read_bytes() == b"another writer's half"
    assert not other.exists()


# -- the directory lock ---------------------------------------------------------------------------
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from rfrs_ref.files import LOCK_NAME, DirectoryLock, DirectoryLocked  # noqa: E402

HOLD = ("import sys, time; from rfrs_ref.files import DirectoryLock; "
        "DirectoryLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)")


def test_a_held_lock_refuses_another_holder_and_names_the_first(tmp_path):
    d = tmp_path / "run"
    with DirectoryLock(d):
        assert f"process {os.getpid()} on " in (d / LOCK_NAME).read_text()
        # a second open file of the same process is another owner, refused like any other
        with pytest.raises(DirectoryLocked, match=f"{d} is in use by process {os.getpid()} on "):
            DirectoryLock(d).acquire()
    assert not (d / LOCK_NAME).exists()
    with DirectoryLock(d):
        pass


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path):
    holder = subprocess.Popen([sys.executable, "-P", "-c", HOLD, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DirectoryLocked, match=f"process {holder.pid} on "):
            DirectoryLock(tmp_path).acquire()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    assert (tmp_path / LOCK_NAME).exists()  # nothing cleaned up after the kill...
    with DirectoryLock(tmp_path):  # ...and nothing needs to be
        assert f"process {os.getpid()} on " in (tmp_path / LOCK_NAME).read_text()


COUNT = """
import pathlib, sys
from rfrs_ref.files import DirectoryLock, DirectoryLocked
d = pathlib.Path(sys.argv[1]); done = 0
while done < 40:
    try:
        lock = DirectoryLock(d).acquire()
    except DirectoryLocked:
        continue
    try:
        n = int((d / "count").read_text())
        (d / "count").write_text(str(n + 1))  # not atomic: only the lock makes it safe
        done += 1
    finally:
        lock.release()
"""


def test_processes_taking_and_releasing_the_lock_never_overlap(tmp_path):
    (tmp_path / "count").write_text("0")
    procs = [subprocess.Popen([sys.executable, "-P", "-c", COUNT, str(tmp_path)]) for _ in range(3)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    assert (tmp_path / "count").read_text() == "120"
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_where_no_directory_can_be_is_an_os_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        DirectoryLock(tmp_path / "file" / "run").acquire()
    assert (tmp_path / "file").read_text() == "x"


def test_a_lock_file_without_a_live_flock_is_no_lock(tmp_path):
    # what a pid-file lock would trust: a live pid (ours) written by a process that holds
    # nothing; only the kernel's lock counts, so pid reuse cannot keep a directory locked
    (tmp_path / LOCK_NAME).write_text(f"process {os.getpid()} on elsewhere\n")
    with DirectoryLock(tmp_path):
        pass


def test_a_link_planted_as_the_lock_file_is_not_followed(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK_NAME).symlink_to(target)
    with pytest.raises(OSError):
        DirectoryLock(tmp_path / "run").acquire()
    assert target.read_text() == "keep me\n"


# -- shared holders (commands that only add their own files: mechanism, plot) ---------------------
def test_shared_holders_coexist_and_the_last_one_removes_the_file(tmp_path):
    a = DirectoryLock(tmp_path, shared=True).acquire()
    b = DirectoryLock(tmp_path, shared=True).acquire()
    a.release()
    assert (tmp_path / LOCK_NAME).exists()  # b still writes there
    b.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_shared_and_exclusive_holders_exclude_each_other(tmp_path):
    with DirectoryLock(tmp_path, shared=True):
        with pytest.raises(DirectoryLocked, match="another process"):
            DirectoryLock(tmp_path).acquire()
    with DirectoryLock(tmp_path):
        with pytest.raises(DirectoryLocked, match=f"process {os.getpid()} "):
            DirectoryLock(tmp_path, shared=True).acquire()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_shared_holder_clears_a_dead_holders_name(tmp_path):
    # the pid of a holder long gone must not name it in the messages of later refusals
    (tmp_path / LOCK_NAME).write_text("process 1 on elsewhere\n")
    with DirectoryLock(tmp_path, shared=True):
        with pytest.raises(DirectoryLocked) as info:
            DirectoryLock(tmp_path).acquire()
    assert "elsewhere" not in str(info.value)


@pytest.mark.parametrize("shared", [False, True])
def test_a_lock_file_that_is_not_ours_is_left_alone(tmp_path, shared):
    from rfrs_ref.files import ForeignLockFile

    (tmp_path / LOCK_NAME).write_text("pid=12 owner=make\n")
    with pytest.raises(ForeignLockFile, match="not a lock file of rfrs-ref"):
        DirectoryLock(tmp_path, shared=shared).acquire()
    assert (tmp_path / LOCK_NAME).read_text() == "pid=12 owner=make\n"


def test_a_fifo_planted_as_the_lock_file_is_refused_naming_it(tmp_path):
    # opened read-write it did not block, but the holder's line was then read from it:
    # "Illegal seek", naming neither the file nor what was wrong with it
    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / LOCK_NAME)
    with pytest.raises(OSError, match="not a regular file") as info:
        DirectoryLock(tmp_path / "run").acquire()
    assert info.value.filename == str(tmp_path / "run" / LOCK_NAME)
    import stat

    assert stat.S_ISFIFO((tmp_path / "run" / LOCK_NAME).lstat().st_mode)  # left as it is

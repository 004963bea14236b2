"""Every command of the README works as written from the repository root: the
subcommand exists, its options parse, and the files it names ship with the project.
The examples themselves: the sweep file parses and dry-runs, the wrong Krum is caught."""

from __future__ import annotations

import pathlib
import re
import shlex

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def readme_commands() -> list[str]:
    blocks = re.findall(r"```\n(.*?)```", README.read_text(), re.S)
    lines = [line.split("  #")[0].strip() for b in blocks for line in b.splitlines()]
    cmds = []
    for line in lines:
        # "pip install . && rfrs-ref train ..." holds a command too
        for part in line.split("&&"):
            part = part.strip()
            if part.startswith("rfrs-ref "):
                cmds.append(part)
    return cmds


def test_the_readme_has_commands():
    cmds = readme_commands()
    assert len(cmds) >= 12
    assert any("examples/grid.toml" in c for c in cmds)
    assert any("examples/wrong_krum.py" in c for c in cmds)


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_parses_from_the_repository_root(command, tmp_path, monkeypatch):
    args = shlex.split(command)[1:]
    # a copy of the repository root's examples/, and the run directory the README's set-up
    # command creates (runs/ml100k), in a scratch working directory
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "results").symlink_to(ROOT / "results")  # the committed results ship too
    (tmp_path / "runs" / "ml100k").mkdir(parents=True)
    for arg in args:
        if arg.startswith("examples/"):
            assert (ROOT / arg.split(":")[0]).is_file(), f"{arg} does not ship with the project"
        if arg.startswith("results/") and arg != "results/ranking":
            assert (ROOT / arg).exists(), f"{arg} does not ship with the project"
    import click

    name, rest = args[0], args[1:]
    cmd = main.get_command(None, name)
    assert cmd is not None, f"no command {name!r}"
    if isinstance(cmd, click.Group):  # golden export
        name, rest = rest[0], rest[1:]
        cmd = cmd.get_command(None, name)
        assert cmd is not None, f"no command {name!r}"
    cmd.make_context(name, list(rest))  # raises on an unknown or invalid option
    if "--callable" in args:  # the code a README example checks must exist
        import importlib

        target = args[args.index("--callable") + 1]
        where = target.rpartition(":")[0]
        if where.endswith(".py"):
            assert (ROOT / where).is_file(), target
        else:
            importlib.import_module(where)


def test_example_sweep_file_parses_and_dry_runs(tmp_path):
    from rfrs_ref.experiments.spec import load_sweep

    sw = load_sweep(ROOT / "examples" / "grid.toml")
    assert len(sw.runs) == 8
    assert {r.config.dataset for r in sw.runs} == {"ml100k"}
    assert all(r.config.ks == (1, 2, 3, 4, 5, 10, 20) for r in sw.runs)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["sweep", str(ROOT / "examples" / "grid.toml"), "--dry-run",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.count("to run") == 8
    # the first line names the folder the runs would go to
    assert res.output.splitlines()[0] == f"sweep ml100k-ascent: 8 runs -> {out}"
    assert not out.exists()


def test_the_wrong_krum_is_caught_and_the_right_one_is_not():
    wrong = CliRunner().invoke(main, ["conformance", "--rule", "krum", "--callable",
                                      str(ROOT / "examples" / "wrong_krum.py") + ":krum",
                                      "--max-examples", "30"])
    assert wrong.exit_code == 1, wrong.output
    assert re.search(r"finite_output\s+FAILS", wrong.output)
    assert "counterexample for finite_output" in wrong.output
    right = CliRunner().invoke(main, ["conformance", "--rule", "krum", "--callable",
                                      "rfrs_ref.aggregate:Krum", "--max-examples", "30"])
    assert right.exit_code == 0, right.output
    assert "FAILS" not in right.output


def test_a_callable_file_that_does_not_exist_is_one_line(tmp_path):
    res = CliRunner().invoke(main, ["conformance", "--rule", "krum", "--callable",
                                    str(tmp_path / "nope.py") + ":krum"])
    assert res.exit_code == 1 and "no file" in res.output and "Traceback" not in res.output


def test_user_visible_text_never_cites_the_outside_specification():
    # help texts, errors and docs point at docs/ pages a user has
    for folder in ("cli", "rfrs_ref", "docs"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in (".py", ".md"):
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                assert not re.search(r"\bSPEC\b(?!\.toml)", line), f"{path}:{i}: {line.strip()}"
    assert not re.search(r"\bSPEC\b", README.read_text())

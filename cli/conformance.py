"""``rfrs-ref conformance``: run the laws of docs/conformance.md on third-party rules,
optimisers, pre-aggregators and attacks."""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import subprocess
import sys
import tempfile

import click

from rfrs_ref.untrusted import describe_exception

#: the child's program. Its input (stdin, JSON) is the parent's import path, the command
#: line, the file the report goes to and a token the report must carry; all of it is read
#: before the code under test is loaded, and none of it is in the child's environment, so
#: neither that code nor a process it starts (another `rfrs-ref conformance`) inherits it
_CHILD_MAIN = ("import json, sys; job = json.loads(sys.stdin.read()); sys.path[:] = job['path']; "
               "from rfrs_ref.cli.main import main; "
               "main(['conformance', *job['argv']], prog_name='rfrs-ref', "
               "obj={'conformance_report': (job['report'], job['token'])})")



def _with_laws(names: list[str], table: str) -> list[str]:
    """The registry's ``names`` that the suite has laws for (``table``, a mapping of
    :mod:`rfrs_ref.testing.conformance`), in registry order; every name when the suite
    cannot be imported (Hypothesis missing: the command then says so when it runs)."""
    try:
        from rfrs_ref.testing import conformance as C
    except ModuleNotFoundError:
        return list(names)
    laws = getattr(C, table)
    return [n for n in names if n in laws]


def _choices():
    from rfrs_ref.aggregate import RULES as rule_registry
    from rfrs_ref.aggregate.pre import PRE
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.optim import OPTIMIZERS as optimizer_registry

    return (_with_laws(rule_registry.names(), "RULE_LAWS"),
            _with_laws(optimizer_registry.names(), "OPTIMIZER_LAWS"),
            _with_laws(PRE.names(), "PRE_LAWS"), _with_laws(ATTACKS.names(), "ATTACK_LAWS"))


#: the choices of --rule, --optimizer, --pre and --attack: the registries' entries that
#: have laws (a registered attack without laws, e.g. ascent, is not offered)
RULES, OPTIMIZERS, PRES, ATTACK_CHOICES = _choices()
#: the adapters of pre-aggregators and attacks (rules have more: weights, result, flower)
FAMILY_ADAPTERS = ("vector", "rfrs", "byzfl")


def _parse_options(items, hint: str = "--option") -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=hint)
        k, v = item.split("=", 1)
        if k in out:  # which of the two would the adapter get? (the last, silently)
            raise click.BadParameter(f"{k} is given twice", param_hint=hint)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v  # a plain word, e.g. to_keep=n-f
        except (ValueError, RecursionError):  # a number past the digit limit, nesting too deep
            raise click.BadParameter(f"{k}: the value is not a usable JSON value (too many digits "
                                     "or nested too deeply)", param_hint=hint) from None
    return out


def _resolve(target: str, A):
    """``path/to/file.py:name`` loads that file; ``package.module:name`` imports the module,
    looking in the current directory first, as ``python -m`` would."""
    import importlib.util
    import os
    import pathlib
    import sys

    where, sep, attr = target.rpartition(":")
    if sep and where.endswith(".py"):
        path = pathlib.Path(where)
        if not path.is_file():
            raise A.AdapterError(f"--callable {target}: no file {path}")
        spec = importlib.util.spec_from_file_location(f"_conformance_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        obj = module
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise A.AdapterError(f"--callable {target}: {path} has no attribute {attr!r}")
            obj = getattr(obj, part)
        return obj
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return A.resolve_callable(target)


@click.command("conformance")
@click.option("--rule", type=click.Choice(RULES), default=None,
              help="The aggregation rule the callable implements (chooses the laws).")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=None,
              help="The optimiser the callable implements (client_rule/recover, docs/optimizers.md).")
@click.option("--pre", type=click.Choice(PRES), default=None,
              help="The pre-aggregator the callable implements: pre(features, n_samples, f) -> "
                   "(n', D) mixed rows (docs/conformance.md).")
@click.option("--attack", type=click.Choice(ATTACK_CHOICES), default=None,
              help="The attack the callable implements: attack(vectors) -> (D,) Byzantine vector, "
                   "as ByzFL's attacks (docs/conformance.md).")
@click.option("--callable", "target", required=True, metavar="MODULE:NAME",
              help="The code under test: an importable module (the current directory is "
                   "searched first), e.g. flwr.server.strategy.aggregate:aggregate_krum, or a "
                   "file, e.g. examples/wrong_krum.py:krum.")
@click.option("--adapter", type=click.Choice(["vector", "weights", "result", "rfrs", "flower", "byzfl"]),
              default=None, help="How the callable is called [default: from its module: flwr → "
                                 "flower, byzfl → byzfl, rfrs_ref → rfrs, else vector]; "
                                 "--pre and --attack take vector, rfrs or byzfl.")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Adapter option, e.g. to_keep=n-f for Flower's Krum, nu=1e-6 for ByzFL, c=1.0 "
                   "for ByzFL's Clipping, tau=0.1 for its attacks (repeatable).")
@click.option("--rule-option", "--reference-option", "rule_options", multiple=True, metavar="KEY=VALUE",
              help="Hyperparameter of rfrs-ref's rule, pre-aggregator or attack that the laws "
                   "compare with, e.g. k=1 for classic Krum, clip_norm=2.0, epsilon=2.0, z=-1.5 "
                   "[default: rfrs-ref's defaults; with --adapter rfrs, the --option values] "
                   "(repeatable).")
@click.option("--max-examples", type=click.IntRange(min=1), default=50, show_default=True,
              help="Hypothesis examples per law.")
@click.option("--seed", type=int, default=None, help="Hypothesis seed [default: derandomised].")
@click.option("--law", "laws", multiple=True, help="Run only this law (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def conformance(rule, optimizer, pre, attack, target, adapter, options, rule_options, max_examples,
                seed, laws, as_json):
    """Check a third-party rule, optimiser, pre-aggregator or attack against the laws of
    docs/conformance.md.

    Prints which laws hold and, for each that fails, a minimal counterexample
    shrunk by Hypothesis. Exit status 1 when a law fails or none was checked.

    The code under test runs in a process of its own: one that ends it early
    (os._exit, a crash) fails the check instead of ending it with status 0.

    \b
    Examples:
      rfrs-ref conformance --rule krum --callable examples/wrong_krum.py:krum
      rfrs-ref conformance --rule krum --callable flwr.server.strategy.aggregate:aggregate_krum
      rfrs-ref conformance --rule trmean --callable byzfl.aggregators:TrMean
      rfrs-ref conformance --rule krum --callable rfrs_ref.aggregate:Krum
      rfrs-ref conformance --optimizer adam --callable rfrs_ref.optim:Adam
      rfrs-ref conformance --pre nnm --callable byzfl.aggregators.preaggregators:NNM
      rfrs-ref conformance --pre clip --callable byzfl.aggregators.preaggregators:Clipping --option c=1.0
      rfrs-ref conformance --attack ipm --callable byzfl.attacks:InnerProductManipulation --option tau=0.1
      rfrs-ref conformance --attack alie --callable rfrs_ref.attack:ALIE --option z=1.5
    """
    obj = click.get_current_context().obj
    child = obj.get("conformance_report") if isinstance(obj, dict) else None
    if child is None:
        # what can be refused without the code under test is refused here, at once
        _check_family(rule, optimizer, pre, attack, adapter, rule_options)
        _parse_options(options)
        _parse_options(rule_options, "--rule-option")
        argv = _argv(rule, optimizer, target, adapter, options, max_examples, seed, laws, as_json,
                     rule_options, pre, attack)
        raise SystemExit(_run_isolated(argv))
    report, token = child
    try:
        code = _check(rule, optimizer, target, adapter, options, max_examples, seed, laws, as_json,
                      rule_options, pre, attack)
    except click.exceptions.ClickException as exc:
        _write_report(report, token, exc.exit_code)
        raise
    except Exception:  # the suite's own failure: its traceback, no report (status 1)
        raise
    except BaseException as exc:
        # the suite returns its status and its laws turn what the code under test raises
        # into failures: an exit or another BaseException here comes from the code under
        # test as it is imported or built (sys.exit(0) in a module used to end the run
        # with status 0, no law checked)
        what = (f"called exit({exc.code!r})" if isinstance(exc, SystemExit)
                else f"raised {describe_exception(exc)}")
        click.echo(f"Error: the code under test {what} while it was loaded or built: no law "
                   "was checked, which is not a pass.", err=True)
        _write_report(report, token, 1)
        raise SystemExit(1) from None
    _write_report(report, token, code)
    if code:
        raise SystemExit(code)


def _check_family(rule, optimizer, pre, attack, adapter, rule_options) -> None:
    """Exactly one of --rule, --optimizer, --pre, --attack, with an adapter and options it takes."""
    given = [flag for flag, v in (("--rule", rule), ("--optimizer", optimizer), ("--pre", pre),
                                  ("--attack", attack)) if v is not None]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --rule, --optimizer, --pre and --attack"
                               + (f" (got {' and '.join(given)})" if given else ""))
    if rule_options and optimizer is not None:
        raise click.UsageError("--rule-option applies to --rule, --pre and --attack only")
    if (pre is not None or attack is not None) and adapter not in (None, *FAMILY_ADAPTERS):
        raise click.UsageError(f"--adapter {adapter} does not apply to {given[0]}; choose one of: "
                               f"{', '.join(FAMILY_ADAPTERS)}")


def _argv(rule, optimizer, target, adapter, options, max_examples, seed, laws, as_json,
          rule_options=(), pre=None, attack=None) -> list[str]:
    """The command line that repeats this one in the child process."""
    argv = ["--callable", target, "--max-examples", str(max_examples)]
    for flag, value in (("--rule", rule), ("--optimizer", optimizer), ("--pre", pre),
                        ("--attack", attack), ("--adapter", adapter), ("--seed", seed)):
        if value is not None:
            argv += [flag, str(value)]
    for item in options:
        argv += ["--option", item]
    for item in rule_options:
        argv += ["--rule-option", item]
    for law in laws:
        argv += ["--law", law]
    return argv + (["--json"] if as_json else [])


def _run_isolated(argv: list[str]) -> int:
    """Run the check in a child process and return the exit status it reported.

    The child starts with the parent's ``sys.path`` (not ``python -m``'s, which
    would put the working directory first, where a source checkout of rfrs-ref
    may shadow the installed package) and working directory, so it resolves
    ``--callable`` as this process would. It writes its exit status, with a
    token drawn here, to a file once the suite has finished (or refused its
    input); a report without the token is not the suite's. A child that ends
    without writing it (``os._exit(0)`` in the code under test, a segfault in
    an extension, a kill) ran no suite to the end, which is an error, whatever
    its own exit status. A child that reported
    success but then exited otherwise (an ``atexit`` hook) fails too.
    """
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="rfrs-conformance-") as tmp:
        report = pathlib.Path(tmp) / "report.json"
        job = {"path": sys.path, "argv": argv, "report": str(report), "token": token}
        # the job goes through stdin: an argument may exceed the limit of a command line, and
        # the environment would hand the report's name and token to the code under test
        proc = subprocess.run([sys.executable, "-c", _CHILD_MAIN], input=json.dumps(job),
                              capture_output=True, text=True, errors="replace")
        click.echo(proc.stdout, nl=False)
        click.echo(proc.stderr, nl=False, err=True)
        try:
            written = json.loads(report.read_text())
            reported = written["exit"] if written["token"] == token else None
        except (OSError, ValueError, KeyError, TypeError):
            reported = None
    if not isinstance(reported, int):
        click.echo(f"Error: the process that ran the code under test ended (exit status "
                   f"{proc.returncode}) before the suite reported: no law was checked to the "
                   "end, which is not a pass.", err=True)
        return 1
    if reported == 0 and proc.returncode != 0:
        click.echo(f"Error: the suite passed, but the process that ran the code under test "
                   f"then exited with status {proc.returncode}.", err=True)
        return 1
    return reported


def _write_report(path: str, token: str, code: int) -> None:
    pathlib.Path(path).write_text(json.dumps({"exit": int(code), "token": token}))


def _check(rule, optimizer, target, adapter, options, max_examples, seed, laws, as_json, rule_options=(),
           pre=None, attack=None) -> int:
    """The suite itself (in the child process); returns the exit status (1: a law failed)."""
    try:
        from rfrs_ref.testing import adapters as A
        from rfrs_ref.testing.conformance import (
            format_results,
            run_attack_conformance,
            run_optimizer_conformance,
            run_pre_conformance,
            run_rule_conformance,
        )
    except ModuleNotFoundError as exc:  # Hypothesis is a test dependency
        raise click.ClickException(f"the conformance suite needs {exc.name}: pip install 'rfrs-ref[test]'") from exc

    _check_family(rule, optimizer, pre, attack, adapter, rule_options)
    opts = _parse_options(options)
    ref_opts: dict = {}  # the reference's hyperparameters, when not rfrs-ref's defaults
    try:
        obj = _resolve(target, A)
    except (A.AdapterError, ModuleNotFoundError, OSError, SyntaxError) as exc:
        raise click.ClickException(str(exc)) from exc
    if pre is not None or attack is not None:
        family, name = ("pre", pre) if pre is not None else ("attack", attack)
        how = adapter or A.guess_adapter(target, obj)
        if how not in FAMILY_ADAPTERS:  # a guess (flwr → flower) that this family does not have
            how = "vector"
        try:
            fn = A.adapt_family(obj, how, family, **opts)
        except (A.AdapterError, TypeError, ValueError, KeyError) as exc:
            raise click.ClickException(str(exc)) from exc
        ref_opts = _parse_options(rule_options, "--rule-option")
        if not ref_opts and how == "rfrs":  # rfrs-ref's own compared with itself, same options
            ref_opts = {k: v for k, v in opts.items() if k != "backend"}
        run = run_pre_conformance if family == "pre" else run_attack_conformance
        try:
            results = run(name, fn, max_examples=max_examples, seed=seed, laws=list(laws) or None,
                          reference_options=ref_opts)
        except A.AdapterError as exc:  # a --rule-option rfrs-ref's class does not take
            raise click.BadParameter(str(exc), param_hint="--rule-option") from None
        except ValueError as exc:  # an unknown --law
            raise click.BadParameter(str(exc), param_hint="--law") from None
        what = "pre-aggregator" if family == "pre" else "attack"
        said = "".join(f", {k}={json.dumps(v)}" for k, v in opts.items())
        title = f"{target} as {what} {name} (adapter {how}{said}), {max_examples} examples per law"
        if ref_opts:
            title += (f"; the reference is rfrs-ref's {name} with "
                      + ", ".join(f"{k}={json.dumps(v)}" for k, v in ref_opts.items())
                      + " (not its defaults)")
    elif rule is not None:
        name = adapter or A.guess_adapter(target, obj)
        try:
            fn = A.adapt(obj, name, **opts)
        except (A.AdapterError, TypeError, ValueError, KeyError) as exc:  # a hyperparameter it rejects
            raise click.ClickException(str(exc)) from exc
        ref_opts = _parse_options(rule_options, "--rule-option")
        if not ref_opts and name == "rfrs":  # rfrs-ref's rule compared with itself, same options
            ref_opts = {k: v for k, v in opts.items() if k != "backend"}
        try:
            results = run_rule_conformance(rule, fn, max_examples=max_examples, seed=seed,
                                           laws=list(laws) or None, reference_options=ref_opts)
        except A.AdapterError as exc:  # a --rule-option rfrs-ref's rule does not take
            raise click.BadParameter(str(exc), param_hint="--rule-option") from None
        except ValueError as exc:  # an unknown --law
            raise click.BadParameter(str(exc), param_hint="--law") from None
        # a pass under options is a pass of that variant: the report says which, so that a
        # run with --rule-option max_iter=1 (the reference one Weiszfeld step) does not read
        # as a pass against rfrs-ref's defaults
        said = "".join(f", {k}={json.dumps(v)}" for k, v in opts.items())
        title = f"{target} as {rule} (adapter {name}{said}), {max_examples} examples per law"
        if ref_opts:
            title += ("; reference_rule compares with rfrs-ref's " + rule + " with "
                      + ", ".join(f"{k}={json.dumps(v)}" for k, v in ref_opts.items())
                      + " (not its defaults)")
    else:
        if opts:
            raise click.UsageError("--option applies to aggregation adapters only")
        try:
            results = run_optimizer_conformance(optimizer, obj, max_examples=max_examples, seed=seed,
                                                laws=list(laws) or None)
        except A.AdapterError as exc:
            raise click.ClickException(str(exc)) from None
        except ValueError as exc:  # an unknown --law
            raise click.BadParameter(str(exc), param_hint="--law") from None
        title = f"{target} as {optimizer}, {max_examples} examples per law"
    if as_json:
        click.echo(json.dumps({"target": target, "rule": rule, "optimizer": optimizer, "pre": pre,
                               "attack": attack, "options": opts, "reference_options": ref_opts,
                               "results": [r.as_dict() for r in results]},
                              indent=1, ensure_ascii=False))
    else:
        click.echo(format_results(results, title))
    if any(r.status == "fails" for r in results):
        return 1
    if not any(r.status == "holds" for r in results):
        # every selected law skipped (e.g. --law weights_sum_to_one on a callable without
        # weights): nothing was checked, which is not a pass
        raise click.ClickException("no law was checked: every selected law was skipped ("
                                   + "; ".join(f"{r.law}: {r.message}" for r in results) + ")")
    return 0

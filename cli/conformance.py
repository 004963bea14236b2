"""``rfrs-ref conformance``: run the laws of docs/conformance.md on third-party code."""

from __future__ import annotations

import json

import click

RULES = ["mean", "krum", "median", "trmean", "rfa", "bulyan", "mda", "meamed", "monna", "cc", "caf", "smea"]
OPTIMIZERS = ["sgd", "momentum", "adam", "adagrad", "rmsprop"]


def _parse_options(items) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--option")
        k, v = item.split("=", 1)
        if k in out:  # which of the two would the adapter get? (the last, silently)
            raise click.BadParameter(f"{k} is given twice", param_hint="--option")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v  # a plain word, e.g. to_keep=n-f
        except (ValueError, RecursionError):  # a number past the digit limit, nesting too deep
            raise click.BadParameter(f"{k}: the value is not a usable JSON value (too many digits "
                                     "or nested too deeply)", param_hint="--option") from None
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
@click.option("--callable", "target", required=True, metavar="MODULE:NAME",
              help="The code under test: an importable module (the current directory is "
                   "searched first), e.g. flwr.server.strategy.aggregate:aggregate_krum, or a "
                   "file, e.g. examples/wrong_krum.py:krum.")
@click.option("--adapter", type=click.Choice(["vector", "weights", "result", "rfrs", "flower", "byzfl"]),
              default=None, help="How the callable is called [default: from its module: flwr → "
                                 "flower, byzfl → byzfl, rfrs_ref → rfrs, else vector].")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Adapter option, e.g. to_keep=n-f for Flower's Krum, nu=1e-6 for ByzFL (repeatable).")
@click.option("--max-examples", type=click.IntRange(min=1), default=50, show_default=True,
              help="Hypothesis examples per law.")
@click.option("--seed", type=int, default=None, help="Hypothesis seed [default: derandomised].")
@click.option("--law", "laws", multiple=True, help="Run only this law (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def conformance(rule, optimizer, target, adapter, options, max_examples, seed, laws, as_json):
    """Check a third-party rule or optimiser against the laws of docs/conformance.md.

    Prints which laws hold and, for each that fails, a minimal counterexample
    shrunk by Hypothesis. Exit status 1 when a law fails.

    \b
    Examples:
      rfrs-ref conformance --rule krum --callable examples/wrong_krum.py:krum
      rfrs-ref conformance --rule krum --callable flwr.server.strategy.aggregate:aggregate_krum
      rfrs-ref conformance --rule trmean --callable byzfl.aggregators:TrMean
      rfrs-ref conformance --rule krum --callable rfrs_ref.aggregate:Krum
      rfrs-ref conformance --optimizer adam --callable rfrs_ref.optim:Adam
    """
    try:
        from rfrs_ref.testing import adapters as A
        from rfrs_ref.testing.conformance import format_results, run_optimizer_conformance, run_rule_conformance
    except ModuleNotFoundError as exc:  # Hypothesis is a test dependency
        raise click.ClickException(f"the conformance suite needs {exc.name}: pip install 'rfrs-ref[test]'") from exc

    if (rule is None) == (optimizer is None):
        raise click.UsageError("give exactly one of --rule and --optimizer")
    opts = _parse_options(options)
    try:
        obj = _resolve(target, A)
    except (A.AdapterError, ModuleNotFoundError, OSError, SyntaxError) as exc:
        raise click.ClickException(str(exc)) from exc
    if rule is not None:
        name = adapter or A.guess_adapter(target, obj)
        try:
            fn = A.adapt(obj, name, **opts)
        except (A.AdapterError, TypeError) as exc:
            raise click.ClickException(str(exc)) from exc
        try:
            results = run_rule_conformance(rule, fn, max_examples=max_examples, seed=seed,
                                           laws=list(laws) or None)
        except ValueError as exc:  # an unknown --law
            raise click.BadParameter(str(exc), param_hint="--law") from None
        title = f"{target} as {rule} (adapter {name}), {max_examples} examples per law"
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
        click.echo(json.dumps({"target": target, "rule": rule, "optimizer": optimizer,
                               "results": [r.as_dict() for r in results]}, indent=1, ensure_ascii=False))
    else:
        click.echo(format_results(results, title))
    if any(r.status == "fails" for r in results):
        raise SystemExit(1)
    if not any(r.status == "holds" for r in results):
        # every selected law skipped (e.g. --law weights_sum_to_one on a callable without
        # weights): nothing was checked, which is not a pass
        raise click.ClickException("no law was checked: every selected law was skipped ("
                                   + "; ".join(f"{r.law}: {r.message}" for r in results) + ")")

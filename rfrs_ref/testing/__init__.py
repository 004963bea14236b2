"""Hypothesis strategies and law checkers for docs/conformance.md, usable on any implementation.

- :mod:`rfrs_ref.testing.strategies`: rounds with Byzantine rows (NaN, ±inf,
  1e38, copies, clusters), optimiser states and gradient pairs, multi-round
  gradient sequences, tiny federations.
- :mod:`rfrs_ref.testing.laws`: one checker per law (Krum's kept-set bound, the
  coordinate range law, recovery exactness, Lemma 2, the chains of Theorems
  1–4, camouflage, permutation invariance, convex weights...), each taking any
  callable and raising :class:`LawViolation` with the values.
- :mod:`rfrs_ref.testing.adapters`: other conventions (Flower's
  ``[(layers, num_examples)]``, ByzFL's aggregator objects, vector- or
  weight-returning functions) turned into rfrs-ref's
  ``rule(features, n_samples, f) -> Outcome``.
- :mod:`rfrs_ref.testing.conformance`: which laws apply to which rule, run with
  Hypothesis, reporting the shrunk counterexample of every law that fails
  (``rfrs-ref conformance`` on the command line).

Example::

    from rfrs_ref.testing import adapters, run_rule_conformance
    from flwr.server.strategy.aggregate import aggregate_krum
    for r in run_rule_conformance("krum", adapters.flower(aggregate_krum)):
        print(r.law, r.status, r.message)

Needs Hypothesis (the ``test`` extra).
"""

from rfrs_ref.testing.adapters import ADAPTERS, Outcome, adapt, load_byzfl_aggregators, resolve_callable
from rfrs_ref.testing.conformance import (
    OPTIMIZER_LAWS,
    RULE_LAWS,
    LawResult,
    format_results,
    run_optimizer_conformance,
    run_rule_conformance,
)
from rfrs_ref.testing.laws import LawViolation

__all__ = [
    "ADAPTERS",
    "OPTIMIZER_LAWS",
    "RULE_LAWS",
    "LawResult",
    "LawViolation",
    "Outcome",
    "adapt",
    "format_results",
    "load_byzfl_aggregators",
    "resolve_callable",
    "run_optimizer_conformance",
    "run_rule_conformance",
]

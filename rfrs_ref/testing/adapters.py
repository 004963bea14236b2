"""Adapters: other libraries' aggregation functions in rfrs-ref's convention.

The law checkers of :mod:`rfrs_ref.testing.laws` call a rule as

    rule(features, n_samples, f) -> Outcome(vector, weights)

with ``features`` the (n, D) detection features (one row per client),
``n_samples`` the (n,) training-set sizes nᵢ (positive integers), ``f`` the
assumed number of Byzantine clients, and the result the aggregated feature
vector (D,) and, when the rule exposes them, the per-client weights (n,)
(docs/aggregation.md). An adapter turns a third-party callable into that form:

==========  ==================================================================
name        what the callable is
==========  ==================================================================
``vector``  ``fn(features, n_samples, f) -> (D,)`` aggregated vector
``weights`` ``fn(features, n_samples, f) -> (n,)`` weights (the vector is
            ``Σ wᵢ xᵢ`` over the rows with wᵢ ≠ 0, the rows as given: a
            copy taken before the call, so that a callable overwriting
            its input cannot choose what its weights combine)
``result``  ``fn(features, n_samples, f) ->`` an object or mapping with
            ``weights`` and/or ``vector`` (or ``arrays['x']``), e.g. an
            rfrs-ref :class:`~rfrs_ref.aggregate.AggregationResult`
``rfrs``    an rfrs-ref rule instance or class (``rfrs_ref.aggregate``)
``flower``  a function of ``flwr.server.strategy.aggregate`` taking
            ``[(list_of_layer_arrays, num_examples), ...]``
``byzfl``   a ByzFL aggregator class or instance (``byzfl.aggregators``),
            called on the (n, D) matrix
==========  ==================================================================

Flower: every client's features are one layer (a 1-D array) with
``num_examples = nᵢ``; ``f`` is passed as ``num_malicious`` (Krum, Bulyan),
and as ``proportiontocut = (f + ¼)/n`` to ``aggregate_trimmed_avg``, which cuts
``int(proportiontocut · n)`` = f values per side (and stays below ½ as SciPy
requires, since n > 2f). ``aggregate_krum`` keeps
``to_keep = 0`` (classic Krum) unless the adapter option says otherwise
(``to_keep=n-f`` gives multi-Krum with rfrs-ref's default k). Bulyan's inner
rule is the module's ``aggregate_krum``.

ByzFL: a class is instantiated for every call with ``f`` when its constructor
takes an ``f`` argument (plus the adapter options, e.g. ``nu``, ``T``); an
instance is called as it is. ByzFL ignores nᵢ.

What a callable returns is held to the convention, never coerced into it: an
aggregate must be a real array (float or integer dtype) of shape exactly (D,),
weights one of shape exactly (n,), each read as float64 only after that check
(:func:`real_array`). Converting first would drop a complex value's imaginary
part, parse strings as numbers and flatten a (1, D, 1) array into (D,), so that
an output the convention rules out would be judged on the number it happens to
contain. A boolean array is no number either (a mask where weights belong is a
different convention). A mismatch raises :class:`OutputError`, which fails the
law being checked, with the example as its counterexample.

Pre-aggregators and attacks have adapters of their own (:data:`PRE_ADAPTERS`,
:data:`ATTACK_ADAPTERS`: ``vector``, ``rfrs``, ``byzfl``): a pre-aggregator is
called as ``pre(features, n_samples, f) -> (n′, D)`` mixed rows, an attack as
``attack(vectors) -> (D,)``, ByzFL's convention (the (k, D) gradients it reads,
the one Byzantine vector it returns); :func:`rfrs_attack` runs rfrs-ref's
attacks, which write a round's uploads, on a round built from the vectors.

ByzFL 0.0.11 imports its training framework, and with it torchvision, from
the package's ``__init__``; :func:`load_byzfl_aggregators` imports the
aggregators module without running that ``__init__``, so a CPU-only torch
without torchvision suffices.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rfrs_ref.untrusted import describe_exception, describe_object, exception_message


@dataclasses.dataclass
class Outcome:
    """What a rule under test returned, in rfrs-ref's convention.

    Attributes:
        vector: (D,) float64 aggregated feature vector.
        weights: (n,) float64 per-client weights, or None when the rule does not
            expose them (coordinate-wise rules, vector-only libraries).
        returned: what the callable returned, as it returned it (before the adapter
            converted it into ``vector`` and ``weights``, which are new arrays): the
            ``inputs_unchanged`` law checks that it shares no memory with the rule's
            inputs. Empty for an Outcome built by hand, whose vector and weights are
            what was returned.

    The adapters build it from arrays :func:`real_array` has checked; the laws check
    an Outcome built by hand the same way (a real array of exactly that shape).
    """

    vector: np.ndarray
    weights: np.ndarray | None = None
    returned: tuple = ()


RuleFn = Callable[[np.ndarray, np.ndarray, int], Outcome]


class AdapterError(ValueError):
    """A callable cannot be adapted, or (as its subclass :class:`OutputError`) returned
    something its convention rules out."""


class OutputError(AdapterError):
    """The code under test returned something its convention rules out (a complex,
    string, object or boolean array, or the wrong shape).

    It is the candidate's failure, not the suite's: the law being checked fails
    with it. ``details`` names what was expected and what was received
    (JSON-friendly, for the counterexample).
    """

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details


#: what each kind of NumPy dtype is, in words, for the error messages
_KINDS = {"b": "booleans", "c": "complex numbers", "O": "Python objects", "U": "strings",
          "S": "byte strings", "V": "structured records", "M": "datetimes", "m": "timedeltas"}


def real_array(value, shape: tuple[int, ...], what: str, meaning: str = "", *,
               dtypes: tuple | None = None) -> np.ndarray:
    """``value`` as a NumPy array, after checking that it is a real numeric array of
    exactly ``shape``; the array keeps its dtype (callers convert to float64).

    Real numeric means a float or integer dtype (``dtypes``, when given, narrows
    that to a list, e.g. float32 and float64 for optimiser uploads). Nothing is
    converted before the check: ``np.asarray(value, float64)`` would drop an
    imaginary part, read ``"0.5"`` as 0.5 and ``True`` as 1.0, and a reshape
    would flatten (1, D, 1) into (D,), so a result the convention rules out would
    pass as the number it contains. A torch tensor is read through NumPy.

    Raises:
        OutputError: naming ``what`` (who returned it), the expected dtype and
            shape (``meaning`` says what the array is) and what was received.
    """
    expected = ("a " + " or ".join(np.dtype(d).name for d in dtypes) if dtypes
                else "a real (float or integer)")
    expected += f" array of shape {tuple(shape)}" + (f", {meaning}" if meaning else "")
    try:
        arr = _to_numpy(value)
    except Exception as exc:  # a ragged list, an object NumPy cannot read
        raise OutputError(f"{what} returned {type(value).__name__}, which is not an array "
                          f"({describe_exception(exc)}); "
                          f"expected {expected}", expected_shape=list(shape),
                          received_type=type(value).__name__) from None
    kind = arr.dtype.kind
    ok_dtype = (arr.dtype in [np.dtype(d) for d in dtypes]) if dtypes else kind in "fiu"
    if not ok_dtype or arr.shape != tuple(shape):
        what_dtype = f"{arr.dtype}" + (f" ({_KINDS[kind]})" if kind in _KINDS else "")
        raise OutputError(f"{what} returned {type(value).__name__} of dtype {what_dtype} and shape "
                          f"{arr.shape}; expected {expected}", expected_shape=list(shape),
                          received_shape=list(arr.shape), received_dtype=str(arr.dtype),
                          received_type=type(value).__name__)
    return arr


def weighted_vector(features: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Σᵢ wᵢ xᵢ over the rows with wᵢ ≠ 0, in float64 (a NaN row with weight 0
    cannot reach the result)."""
    X = np.asarray(features, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    rows = np.flatnonzero(w != 0)
    if rows.size == 0:
        return np.zeros(X.shape[1])
    with np.errstate(all="ignore"):
        return w[rows] @ X[rows]


def _as_vector(value, D: int, what: str) -> np.ndarray:
    """The aggregated feature vector: a real array of shape exactly (D,), as float64."""
    return real_array(value, (D,), what, "the aggregated feature vector").astype(np.float64)


def _as_weights(value, n: int, what: str) -> np.ndarray:
    """The per-client weights: a real array of shape exactly (n,), as float64."""
    return real_array(value, (n,), what, "one weight per client").astype(np.float64)


def _to_numpy(value):
    """NumPy view of an array-like, including torch tensors (without importing torch)."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


# -- our own rules --------------------------------------------------------------------------

def _own(obj, registry, options: dict, what: str):
    """An rfrs-ref registry entry as an instance: a name is looked up in ``registry``, a
    class is built with ``options`` (its hyperparameters); an instance takes no options."""
    if isinstance(obj, str):
        obj = registry.get(obj)
    if isinstance(obj, type):
        return obj(**options)
    if options:
        raise AdapterError(f"options {sorted(options)} given for {what} instance {describe_object(obj)}")
    return obj


def rfrs(rule, **options) -> RuleFn:
    """An rfrs-ref rule (instance, class or registry name) as a rule under test.

    ``options`` are the rule's hyperparameters when a class or name is given;
    ``backend`` (default ``"numpy"``, the oracle) selects the kernels.
    """
    from rfrs_ref.aggregate import RULES

    backend = options.pop("backend", "numpy")
    rule = _own(rule, RULES, options, "a rule")

    def call(features, n_samples, f):
        res = rule.aggregate(features, {"x": features}, n_samples, f, backend=backend)
        label = f"rfrs {rule.name}"
        w = None if res.weights is None else _as_weights(res.weights, features.shape[0], label)
        return Outcome(_as_vector(res.arrays["x"], features.shape[1], label), w,
                       (res.arrays["x"], res.weights))

    call.__name__ = f"rfrs:{rule.name}"
    return call


# -- generic conventions -----------------------------------------------------------------------

def vector(fn, **options) -> RuleFn:
    """``fn(features, n_samples, f, **options) -> (D,)``."""

    def call(features, n_samples, f):
        out = fn(features, n_samples, f, **options)
        return Outcome(_as_vector(out, features.shape[1], _name(fn)), returned=(out,))

    call.__name__ = _name(fn)
    return call


def weights(fn, **options) -> RuleFn:
    """``fn(features, n_samples, f, **options) -> (n,)`` weights."""

    def call(features, n_samples, f):
        given = np.array(features, copy=True)  # what the weights combine, whatever fn does to its input
        out = fn(features, n_samples, f, **options)
        w = _as_weights(out, features.shape[0], _name(fn))
        return Outcome(weighted_vector(given, w), w, (out,))

    call.__name__ = _name(fn)
    return call


def result(fn, **options) -> RuleFn:
    """``fn(...)`` returning an object or mapping with ``weights`` and/or ``vector``
    (or ``arrays['x']``, as rfrs-ref's :class:`AggregationResult`)."""

    def get(obj, key):
        if isinstance(obj, Mapping):
            return obj.get(key)
        return getattr(obj, key, None)

    def call(features, n_samples, f):
        given = np.array(features, copy=True)  # what weights alone combine (see ``weights``)
        out = fn(features, n_samples, f, **options)
        w = get(out, "weights")
        v, field = get(out, "vector"), "vector"
        if v is None:
            arrays = get(out, "arrays")
            if isinstance(arrays, Mapping) and "x" in arrays:
                v, field = arrays["x"], "arrays['x']"
        returned = (v, w)
        if w is not None:
            w = _as_weights(w, features.shape[0], f"{_name(fn)} (its 'weights')")
        if v is None:
            if w is None:
                raise OutputError(f"{_name(fn)} returned neither 'vector' nor 'weights' "
                                  f"(got {type(out).__name__})", received_type=type(out).__name__)
            return Outcome(weighted_vector(given, w), w, returned)
        return Outcome(_as_vector(v, features.shape[1], f"{_name(fn)} (its {field!r})"), w, returned)

    call.__name__ = _name(fn)
    return call


# -- Flower ------------------------------------------------------------------------------------

def _parse_to_keep(value, n: int, f: int) -> int:
    if isinstance(value, str):
        v = value.replace(" ", "")
        if v in ("n-f", "n−f"):
            return n - f
        return int(v)
    return int(value)


def flower(fn, **options) -> RuleFn:
    """A ``flwr.server.strategy.aggregate`` function in rfrs-ref's convention.

    Options: ``to_keep`` for ``aggregate_krum`` and ``aggregate_bulyan``'s
    inner Krum (an integer, or ``"n-f"``); ``proportiontocut`` for
    ``aggregate_trimmed_avg`` (default (f + ¼)/n, which cuts exactly f per side and is
    below ½ whenever n > 2f).
    """
    name = getattr(fn, "__name__", "")
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    params = set(inspect.signature(fn).parameters)

    def call(features, n_samples, f):
        n = features.shape[0]
        ns = np.asarray(n_samples)
        results = [([np.array(features[i], copy=True)], int(ns[i])) for i in range(n)]
        kw: dict[str, Any] = {}
        if name == "aggregate_bulyan":
            inner = options.get("aggregation_rule") or module.aggregate_krum
            kw = {"num_malicious": f, "aggregation_rule": inner,
                  "to_keep": _parse_to_keep(options.get("to_keep", 0), n, f)}
        elif name == "aggregate_krum":
            kw = {"num_malicious": f, "to_keep": _parse_to_keep(options.get("to_keep", 0), n, f)}
        elif name == "aggregate_trimmed_avg":
            kw = {"proportiontocut": float(options.get("proportiontocut", (f + 0.25) / n))}
        else:
            if "num_malicious" in params:
                kw["num_malicious"] = f
            kw.update({k: v for k, v in options.items() if k in params})
        with np.errstate(all="ignore"):
            layers = fn(results, **kw)
        if not isinstance(layers, (list, tuple)) or len(layers) != 1:
            got = f"{len(layers)} layers" if isinstance(layers, (list, tuple)) else type(layers).__name__
            raise OutputError(f"flower {name} returned {got}; expected a list of one layer "
                              "(its inputs have one)")
        return Outcome(_as_vector(layers[0], features.shape[1], f"flower {name}"))

    call.__name__ = f"flower:{name}"
    return call


# -- ByzFL -------------------------------------------------------------------------------------

def load_byzfl_aggregators():
    """ByzFL's ``byzfl.aggregators.aggregators`` module, imported without
    running ``byzfl/__init__.py`` (which needs torchvision).

    The package is registered in ``sys.modules`` as a bare package module (its
    installed directory as ``__path__``) and the aggregators submodule is then
    imported normally; it needs NumPy, SciPy and torch.

    Raises:
        ModuleNotFoundError: byzfl (or torch) is not installed.
    """
    if "byzfl.aggregators.aggregators" in sys.modules:
        return sys.modules["byzfl.aggregators.aggregators"]
    spec = importlib.util.find_spec("byzfl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "byzfl is not installed; install it with `pip install byzfl==0.0.11 --no-deps` "
            "after torch (see docs/conformance.md)", name="byzfl")
    if "byzfl" not in sys.modules:
        pkg = types.ModuleType("byzfl")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        pkg.__file__ = spec.origin
        sys.modules["byzfl"] = pkg
    return importlib.import_module("byzfl.aggregators.aggregators")


def byzfl(obj, **options) -> RuleFn:
    """A ByzFL aggregator (class or instance) in rfrs-ref's convention.

    A class is instantiated for every call, with ``f=f`` when its constructor
    takes ``f``, and with ``options`` (``nu``, ``T``...). The features are
    passed as a float64 NumPy matrix; nᵢ is not used (ByzFL has none).
    """
    make, label = _byzfl_factory(obj, options, "aggregator")

    def call(features, n_samples, f):
        agg = make(f)
        with np.errstate(all="ignore"):
            out = agg(np.array(features, dtype=np.float64, copy=True))
        return Outcome(_as_vector(out, features.shape[1], f"byzfl {label}"))

    call.__name__ = f"byzfl:{label}"
    return call


#: adapter name -> factory(callable, **options) -> RuleFn
ADAPTERS: dict[str, Callable[..., RuleFn]] = {
    "vector": vector,
    "weights": weights,
    "result": result,
    "rfrs": rfrs,
    "flower": flower,
    "byzfl": byzfl,
}


#: top-level modules of the libraries the crosscheck extra installs (and ByzFL beside it)
_CROSSCHECK_LIBRARIES = ("flwr", "torch", "byzfl")

def resolve_callable(spec: str):
    """The object named by ``"package.module:attribute"`` (attribute may be dotted).

    Modules under ``byzfl`` are imported through :func:`load_byzfl_aggregators`.
    """
    if ":" not in spec:
        raise AdapterError(f"callable {spec!r} must be written package.module:attribute "
                           "(an importable module) or path/to/file.py:attribute (a file)")
    mod_name, attr = spec.split(":", 1)
    if mod_name == "byzfl" or mod_name.startswith("byzfl."):
        load_byzfl_aggregators()
    try:
        obj = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        hint = ""
        if (exc.name or "").split(".")[0] in _CROSSCHECK_LIBRARIES:
            hint = ("; the libraries rfrs-ref cross-checks come with its crosscheck extra: "
                    "pip install 'rfrs-ref[crosscheck]' (ByzFL: pip install --no-deps "
                    "byzfl==0.0.11), see docs/conformance.md")
        raise AdapterError(f"cannot import {mod_name!r} (from {spec!r}): "
                           f"{exception_message(exc)}{hint}") from exc
    except Exception as exc:  # an empty or relative name, or a module that fails as it loads
        raise AdapterError(f"cannot import {mod_name!r} (from {spec!r}): "
                           f"{describe_exception(exc)}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except (AttributeError, TypeError):  # TypeError: an attribute name that is no string
            raise AdapterError(f"{mod_name!r} has no attribute {attr!r}") from None
    return obj


def guess_adapter(spec: str, obj) -> str:
    """The adapter a callable most likely needs, from where it lives."""
    mod = spec.split(":", 1)[0]
    if mod.startswith("flwr"):
        return "flower"
    if mod.startswith("byzfl"):
        return "byzfl"
    if mod.startswith("rfrs_ref"):
        return "rfrs"
    return "vector"


def adapt(obj, adapter: str, **options) -> RuleFn:
    """``ADAPTERS[adapter](obj, **options)`` with a clear error for an unknown name."""
    try:
        factory = ADAPTERS[adapter]
    except KeyError:
        raise AdapterError(f"unknown adapter {adapter!r}; choose one of: {', '.join(ADAPTERS)}") from None
    return factory(obj, **options)


def _name(fn) -> str:
    for attr in ("__qualname__", "__name__"):
        try:
            name = getattr(fn, attr, None)
        except BaseException:  # noqa: BLE001 - the callable is input: its __getattr__ too
            name = None
        if isinstance(name, str) and name:
            return name
    return describe_object(fn)


# -- pre-aggregators ---------------------------------------------------------------------------
#
# A pre-aggregator under test is called as ``pre(features, n_samples, f) -> (n′, D)``: the
# round's (n, D) features, the clients' nᵢ (int64, ≥ 1) and the assumed f, returning the
# mixed rows (n′ = n for nnm, clip and arc; ⌈n/s⌉ for bucketing with buckets of s). The
# adapters return what the callable returned, as a NumPy array when it is a torch tensor;
# the laws check its dtype and shape (:func:`real_array`) before reading a value.

PreFn = Callable[[np.ndarray, np.ndarray, int], Any]


def rfrs_pre(pre, **options) -> PreFn:
    """An rfrs-ref pre-aggregator (instance, class or registry name) as a pre-aggregator
    under test: its mixing matrix M on the round (finite-client mask from the features,
    nᵢ as float64) applied to the features with the float64 oracle
    (:func:`rfrs_ref.kernels.mixing.mix_rows_numpy`), in the features' dtype.

    ``options`` are its hyperparameters when a class or name is given; ``backend``
    (default ``"numpy"``) selects the kernels of the mixing. Bucketing draws its
    permutation from a generator seeded 0 when the adapter is made, advanced call by call.
    """
    from rfrs_ref.aggregate.pre import PRE
    from rfrs_ref.kernels.mixing import mix_rows_numpy

    backend = options.pop("backend", "numpy")
    pre = _own(pre, PRE, options, "a pre-aggregator")
    rng = np.random.default_rng(0)

    def call(features, n_samples, f):
        X = np.asarray(features)
        n = X.shape[0]
        cond = pre.condition(n, int(f))
        if cond is not None:
            raise AdapterError(f"rfrs-ref's {pre.name} needs {cond}; got n={n}, f={f}")
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(X).all(axis=1)
        mx = pre.mixing(X, np.asarray(n_samples, dtype=np.float64), int(f), ok, rng, backend)
        return mix_rows_numpy(mx.matrix, X)

    call.__name__ = f"rfrs:{pre.name}"
    call.pre = pre
    return call


def vector_pre(fn, **options) -> PreFn:
    """``fn(features, n_samples, f, **options) -> (n′, D)`` mixed rows."""

    def call(features, n_samples, f):
        return _to_numpy(fn(features, n_samples, f, **options))

    call.__name__ = _name(fn)
    return call


def _byzfl_factory(obj, options: dict, what: str):
    """``make(f)``: a ByzFL object per call (a class, with ``f=f`` when its constructor
    takes ``f``, and the options) or the instance itself."""
    if isinstance(obj, type):
        params = set(inspect.signature(obj.__init__).parameters)

        def make(f):
            kw = dict(options)
            if "f" in params and f is not None:
                kw["f"] = int(f)
            return obj(**kw)

        return make, obj.__name__
    if options:
        raise AdapterError(f"options {sorted(options)} given for a ByzFL {what} instance; "
                           "pass the class")
    return (lambda f: obj), type(obj).__name__


def byzfl_pre(obj, **options) -> PreFn:
    """A ByzFL pre-aggregator (``byzfl.aggregators.preaggregators``: ``NNM``,
    ``Bucketing``, ``Clipping``, ``ARC``; class or instance) in rfrs-ref's convention.

    A class is instantiated for every call, with ``f=f`` when its constructor takes
    ``f`` (NNM, ARC), and with ``options`` (``s`` for Bucketing, ``c`` for Clipping:
    ByzFL's defaults are s = 1 and c = 2.0, rfrs-ref's 2 and 1.0). It is called on a
    float64 copy of the features (ByzFL's Clipping and ARC scale the rows they are given
    in place); nᵢ is not used (ByzFL has none). Bucketing shuffles with NumPy's global
    generator.
    """
    make, label = _byzfl_factory(obj, options, "pre-aggregator")

    def call(features, n_samples, f):
        with np.errstate(all="ignore"):
            return _to_numpy(make(f)(np.array(features, dtype=np.float64, copy=True)))

    call.__name__ = f"byzfl:{label}"
    return call


#: adapter name -> factory(callable, **options) -> pre-aggregator under test
PRE_ADAPTERS: dict[str, Callable[..., PreFn]] = {
    "vector": vector_pre,
    "rfrs": rfrs_pre,
    "byzfl": byzfl_pre,
}


# -- attacks -----------------------------------------------------------------------------------
#
# An attack under test is called as ``attack(vectors) -> (D,)``: the (k, D) gradients the
# attack reads (ByzFL's convention: the vectors it is handed, the honest ones for Mimic and
# the optimal attacks) and the one Byzantine vector it returns. rfrs-ref's attacks write a
# round's uploads instead; :func:`rfrs_attack` runs them on a round built from the vectors.

AttackFn = Callable[[np.ndarray], Any]

#: rfrs-ref's attacks that read the round's honest clients (the vectors are honest rows,
#: one Byzantine row is added); the others read the Byzantine clients' own gradients
#: (every vector is a Byzantine row)
_READS_HONEST = ("mimic",)


def rfrs_attack(attack, **options) -> AttackFn:
    """An rfrs-ref attack (instance, class or registry name) as an attack on vectors.

    The round: SGD with η = 1 on θ̄ = 0, so that every honest upload is θᵢ = −gᵢ exactly
    and the server recovers gᵢ = −θᵢ; nᵢ = 5 for every client (float64 gradients: the
    vectors, read as float64). For ``alie`` and ``ipm`` every vector is a Byzantine
    client's own gradient (what they pool); for ``mimic`` the vectors are the round's
    honest clients (in order) and one Byzantine client follows them. The attack vector
    is the gradient the server recovers from the first Byzantine row, or, for an attack
    that breaks the update rule (``inf``), what it wrote there: its θ row, as ByzFL's
    ``Inf`` returns the +inf it aggregates.

    ``options`` are the attack's hyperparameters when a class or name is given.

    Raises:
        AdapterError: ALIE with z = 0 (z_max derives from the round's n and Byzantine
            count, which an attack on vectors does not have: give z), or an attack this
            convention cannot express (one that needs the server's rule or the model).
    """
    from rfrs_ref.attack import ATTACKS, AttackContext
    from rfrs_ref.optim import SGD

    attack = _own(attack, ATTACKS, options, "an attack")
    if attack.name == "alie" and float(attack.z) == 0.0:
        raise AdapterError("rfrs-ref's alie with z=0 derives z_max from the round's n and its "
                           "Byzantine count, which an attack on vectors does not have: give z "
                           "(e.g. z=1.5; ByzFL's ALittleIsEnough(tau) is z = −tau)")
    if attack.needs_model or attack.name in ("opt-ipm", "opt-alie"):
        raise AdapterError(f"rfrs-ref's {attack.name} reads the server's rule or the model, "
                           "which an attack on vectors does not have")
    if attack.optimizers is not None and "sgd" not in attack.optimizers:
        raise AdapterError(f"rfrs-ref's {attack.name} runs with {', '.join(attack.optimizers)} only, "
                           "not on vectors (camouflage: rfrs-ref conformance --optimizer adam)")
    opt = SGD(lr=1.0)

    def call(vectors):
        V = np.asarray(vectors, dtype=np.float64)
        k, D = V.shape
        if attack.name in _READS_HONEST:
            G = np.vstack([V, np.zeros((1, D))])
            byz = np.zeros(k + 1, dtype=bool)
            byz[k] = True
        else:
            G = V.copy()
            byz = np.ones(k, dtype=bool)
        n = G.shape[0]
        state = opt.init(np.zeros(D))
        up = {name: np.empty((n, D)) for name in opt.arrays}
        with np.errstate(all="ignore"):
            opt.client_rule_batch(state, G, 1, up, backend="numpy")
            ctx = AttackContext(t=1, optimizer=opt, state=state, grads=G, uploads=up,
                                byzantine=byz, clients=np.arange(n, dtype=np.int64),
                                n_samples=np.full(n, 5, dtype=np.int64), f=int(byz.sum()),
                                rng=np.random.default_rng(0), backend="numpy")
            attack.apply_inplace(ctx)
            first = int(np.flatnonzero(byz)[0])
            if not attack.obeys_rule:
                return up["theta"][first].copy()
            out = np.empty((n, D))
            opt.recover_batch(state, up, 1, out, backend="numpy", rows=np.array([first]))
        return out[first].copy()

    call.__name__ = f"rfrs:{attack.name}"
    call.attack = attack
    return call


def vector_attack(fn, **options) -> AttackFn:
    """``fn(vectors, **options) -> (D,)`` the Byzantine vector."""

    def call(vectors):
        return _to_numpy(fn(vectors, **options))

    call.__name__ = _name(fn)
    return call


def byzfl_attack(obj, **options) -> AttackFn:
    """A ByzFL attack (``byzfl.attacks``: ``InnerProductManipulation``,
    ``ALittleIsEnough``, ``Mimic``, ``Inf``...; class or instance) in rfrs-ref's
    convention: a class is instantiated for every call with ``options`` (``tau``,
    ``epsilon``; ByzFL checks their types: ``tau=0.1``, not ``tau=1``), then called on
    a float64 copy of the vectors."""
    make, label = _byzfl_factory(obj, options, "attack")

    def call(vectors):
        with np.errstate(all="ignore"):
            return _to_numpy(make(None)(np.array(vectors, dtype=np.float64, copy=True)))

    call.__name__ = f"byzfl:{label}"
    return call


#: adapter name -> factory(callable, **options) -> attack under test
ATTACK_ADAPTERS: dict[str, Callable[..., AttackFn]] = {
    "vector": vector_attack,
    "rfrs": rfrs_attack,
    "byzfl": byzfl_attack,
}


def adapt_family(obj, adapter: str, family: str, **options):
    """``obj`` through adapter ``adapter`` of ``family`` (``pre`` or ``attack``), with a clear
    error for an adapter that family does not have."""
    table = {"pre": PRE_ADAPTERS, "attack": ATTACK_ADAPTERS}[family]
    what = {"pre": "pre-aggregators", "attack": "attacks"}[family]
    try:
        factory = table[adapter]
    except KeyError:
        raise AdapterError(f"adapter {adapter!r} does not apply to {what}; choose one of: "
                           f"{', '.join(table)}") from None
    return factory(obj, **options)

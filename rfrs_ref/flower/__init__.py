"""A-RFRS on a real federation: Flower (``flwr`` 1.41) apps for the paper's clients and server.

The :class:`~flwr.serverapp.ServerApp` of :func:`rfrs_ref.flower.server.server_app`
is the paper's server (Algorithm 2): every round it samples the clients with
the run's seeded stream, sends each the server state (the optimiser's arrays:
θ̄, and m̄, v̄ for Adam) and the round number, receives their uploads, and
hands them to :func:`rfrs_ref.federated.round.server_round`, the same code the
in-process trainer runs (recovery, update-rule verification, detection
features in either space, the registered rule, the new state). Evaluation,
checkpoints and the run directory are the trainer's own
(:class:`rfrs_ref.federated.trainer.Trainer`).

The :class:`~flwr.clientapp.ClientApp` of :func:`rfrs_ref.flower.client.client_app`
is Algorithm 1: a node holds one user's training items (or several users'),
computes the BPR gradient on θ̄ with the project's kernels, applies the
optimiser's client rule, and, when Byzantine, rewrites its upload with an
attack that needs no other client's data (``ascent``, ``noise``,
``camouflage``), drawing its randomness from the same seeded streams as the
in-process trainer. With the same configuration and seed the Flower run ends in
the in-process run's server state, bit for bit (docs/flower.md).

Two ways to run: :func:`rfrs_ref.flower.run.simulate` (Flower's simulation
engine, one virtual SuperNode per user) and :func:`rfrs_ref.flower.run.deploy`
(``flower-superlink`` and ``flower-supernode`` processes on 127.0.0.1, started,
supervised and stopped by one call); ``rfrs-ref flower simulate|deploy`` on the
command line. Flower is the ``flower`` extra: ``pip install "rfrs-ref[flower]"``.
"""

from __future__ import annotations

#: the Flower version these apps are written and tested for (the ``flower`` extra pins it)
FLWR_VERSION = "1.41.0"

def _per_client_attacks() -> tuple[str, ...]:
    from rfrs_ref.attack import ATTACKS

    return tuple(n for n in ATTACKS.names() if getattr(ATTACKS.get(n), "per_client", False))


#: attacks a Byzantine node can run on its own upload alone (``Attack.per_client``); the
#: colluding attacks (``alie``, ``ipm``, their optimal versions, ``mimic``) pool the
#: gradients of other clients, which a node does not hold
PER_CLIENT_ATTACKS = _per_client_attacks()


class FlowerUnavailable(ImportError):
    """Flower (``flwr``) or its simulation engine (Ray) is not installed."""


def require_flwr(simulation: bool = False):
    """Import and return ``flwr``, or raise :class:`FlowerUnavailable` naming the extra.

    ``simulation``: also require Ray, which Flower's simulation engine runs on.
    """
    try:
        import flwr
    except ImportError as exc:
        raise FlowerUnavailable(
            f"Flower is not installed ({exc}); install the flower extra: "
            f"pip install \"rfrs-ref[flower]\" (flwr[simulation]=={FLWR_VERSION})") from None
    if simulation:
        try:
            import ray  # noqa: F401
        except ImportError as exc:
            raise FlowerUnavailable(
                f"Flower's simulation engine needs Ray ({exc}); install the flower extra: "
                f"pip install \"rfrs-ref[flower]\"") from None
    return flwr


__all__ = ["FLWR_VERSION", "FlowerUnavailable", "PER_CLIENT_ATTACKS", "require_flwr"]

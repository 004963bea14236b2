"""The apps a deployed run loads (the Flower App of ``rfrs-ref flower deploy``).

``server`` and ``client`` read the training configuration from the run config
(``config``: JSON text, or ``config-file``: its path) and the run directory from
``run-dir``; the node config of each SuperNode names its users (``users``).
"""

from rfrs_ref.flower.client import client_app
from rfrs_ref.flower.server import server_app

server = server_app()
client = client_app()

"""Dataset manifests (sources, files, sha256, expected counts), installed as
``rfrs_ref.manifests`` and read with ``importlib.resources``."""

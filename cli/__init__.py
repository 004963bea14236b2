"""The ``rfrs-ref`` command line (installed as ``rfrs_ref.cli``)."""

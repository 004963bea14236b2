"""The round loop gives today's server states bit for bit (numba backend, ML100K, 50 rounds).

Every optimiser × rule × detection space × attack the loop accepts (α = 0.4
under attack), replayed and compared with the digest recorded from the round
loop before its verification was screened (see ``round_equivalence.py``): a
change of any verdict, any row order, or any sum's order changes the digest.
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).parent
RECORDED = json.loads((HERE / "data" / "round_digests_ml100k.json").read_text())

sys.path.insert(0, str(HERE))
import round_equivalence as eq  # noqa: E402

sys.path.pop(0)


@pytest.fixture(scope="module")
def ml100k(data_dir):
    from rfrs_ref.data import load_dataset

    try:
        return load_dataset(eq.DATASET, data_dir)
    except Exception as exc:  # the set is not in RFRS_DATA_DIR
        pytest.skip(f"{eq.DATASET} not available: {exc}")


def test_the_recording_covers_every_configuration():
    assert RECORDED["rounds"] == eq.ROUNDS and RECORDED["dim"] == eq.DIM
    assert sorted(RECORDED["digests"]) == sorted("/".join(c) for c in eq.configurations())


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(RECORDED["digests"]))
def test_server_state_after_50_rounds_is_unchanged(config, ml100k):
    assert eq.run(ml100k, *config.split("/")) == RECORDED["digests"][config], config

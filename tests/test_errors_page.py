"""docs/errors.md, the catalogue of users' mistakes: every row has a test and
every such test names a row. The tests themselves sit beside their feature:

- ``meshrun run`` and ``meshrun join``: test_launcher.py (usage, runs
  directory, a failed worker), test_hosts_apart.py (storage, joining hosts),
  test_control_plane.py (control port), test_cli_states.py (a name in use),
  test_ray.py (a Ray address that does not answer, a cluster that holds
  back resources past the start timeout);
- ``status`` and ``logs``: test_cli_states.py; ``profile``: test_profiles.py;
- checkpoints and ``ckpt``: test_checkpoint.py; resuming from a given step:
  test_ckpt_fallback.py; object storage: test_s3.py;
- Python configuration, ``report`` and ``save``: test_trainer.py; Ray
  Train's names, folder checkpoints and the leaves a state may hold:
  test_from_ray.py;
- meshes and sharding rules: test_sharding.py;
- travelling executables: test_executables.py;
- multi-host mistakes (the flight recorder): test_mistakes.py;
- memory limits and out-of-memory: test_memory.py;
- data: test_data.py.

A test registers its rows with ``errors_page.covers`` when its file is
imported, so this test imports every test file first (pytest has already
done so when it collected them)."""

from __future__ import annotations

import importlib
from pathlib import Path

from errors_page import CATALOGUE, TESTED


def test_every_row_has_a_test_and_every_test_a_row():
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        importlib.import_module(path.stem)

    assert len(CATALOGUE) >= 40
    assert sorted(set(CATALOGUE) - TESTED) == [], "rows without a test"
    assert sorted(TESTED - set(CATALOGUE)) == [], "tests of rows the page does not have"

"""The gpu-marked tests use the unit suite's fixtures (one definition of
the small synthetic data set), loaded under another module name so the
two conftest files do not collide."""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "unit_conftest", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit",
                                  "conftest.py"))
_unit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_unit)
small_dataset = _unit.small_dataset

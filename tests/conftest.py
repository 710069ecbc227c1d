"""Shared test settings: hypothesis runs without deadlines (CI machines vary), a bounded budget and
the same examples every run (a gate that passes or fails by chance lands nothing; the profile
"explore", HYPOTHESIS_PROFILE=explore, draws new ones and more of them to hunt for bugs locally);
and the one rule for optional extras: a test that needs one skips, saying why, unless the run
requires it (`make test` sets ZBOPT_REQUIRE_EXTRAS=torch,dask because it installs them), where a
missing extra fails the test instead of hiding it as a skip."""

import importlib
import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("zbopt", deadline=None, max_examples=45, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", settings.get_profile("zbopt"), derandomize=False, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "zbopt"))

REQUIRED_EXTRAS_VARIABLE = "ZBOPT_REQUIRE_EXTRAS"
EXTRA_MODULES = {"torch": "torch", "dask": "distributed"}  # the module each extra of pyproject.toml installs


def required_extras() -> set[str]:
    """The extras this run must have, from ZBOPT_REQUIRE_EXTRAS (comma-separated, e.g. "torch,dask")."""
    return {name.strip() for name in os.environ.get(REQUIRED_EXTRAS_VARIABLE, "").split(",") if name.strip()}


def require_extra(extra: str, reason: str):
    """The module of the optional extra `extra` (a key of EXTRA_MODULES); without it, a skip giving
    `reason`, or a failure naming the extra when ZBOPT_REQUIRE_EXTRAS lists it. Works at module level."""
    module = EXTRA_MODULES[extra]
    try:
        return importlib.import_module(module)
    except ImportError as error:
        missing = f"`import {module}` fails: {error}"
    if extra in required_extras():
        pytest.fail(f"the extra zbopt[{extra}] is required ({REQUIRED_EXTRAS_VARIABLE}="
                    f"{os.environ[REQUIRED_EXTRAS_VARIABLE]}) but {missing}", pytrace=False)
    pytest.skip(f"{reason} ({missing})", allow_module_level=True)

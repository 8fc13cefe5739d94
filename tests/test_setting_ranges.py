"""Every number setting is checked for range at start-up: a nonsense value stops start-up with one line naming
the variable, the value and what is allowed, instead of starting and breaking a feature. The test walks every
row of docs/configuration.md's settings table; gunicorn's own settings are checked by gunicorn.conf.py alike."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields

import pytest

from tests.conftest import ROOT
from tests.test_readme_settings import documented
from webapp.config import LIMITS, ConfigError, Settings

NUMBERS = {f"GLASSBOX_{f.name.upper()}": f.name for f in fields(Settings) if type(f.default) in (int, float)}


def nonsense(limit) -> list[str]:
    """Values each number setting must refuse: out of range on both sides, not finite, not a number."""
    below = "-1" if limit.low > 0 or not limit.zero else str(limit.low / 2 if limit.low > 1 else -1)
    values = [below, str(int(limit.high) * 10 + 1), "nan", "inf", "abc", ""]
    if limit.low > 0 and not limit.zero:
        values.append("0")
    return values


def test_every_number_setting_in_the_readme_table_has_a_range_and_its_default_is_in_it():
    rows = documented() & set(NUMBERS)
    assert rows == set(NUMBERS)  # every number setting is a row of the table (tests/test_readme_settings.py)
    defaults = Settings()
    for variable in sorted(rows):
        limit = LIMITS[NUMBERS[variable]]
        assert limit.allows(getattr(defaults, NUMBERS[variable])), variable


@pytest.mark.parametrize("variable", sorted(NUMBERS))
def test_a_nonsense_value_stops_start_up_with_one_line_naming_the_variable_and_what_is_allowed(variable):
    limit = LIMITS[NUMBERS[variable]]
    for value in nonsense(limit):
        if value == "" and limit.allows(0):
            continue  # an empty value is no number; checked below for the others
        with pytest.raises(ConfigError) as refused:
            Settings.from_env({variable: value})
        message = str(refused.value)
        assert message.startswith(f"{variable}={value!r} ") and "\n" not in message, message
        assert f"from {limit.low:g} to {limit.high:g}" in message, message


@pytest.mark.parametrize("variable, value, allowed", [
    ("GLASSBOX_RETENTION_DAYS", "0.0002", "0 (kept for ever)"),  # less than a day deleted a browser in use
    ("GLASSBOX_TORCH_THREADS", "-1", "0 (torch's default)"),
    ("GLASSBOX_MAX_BATCH", "0", "from 1 to 1024"),
    ("GLASSBOX_HEARTBEAT_SECONDS", "0", "from 0.05 to 60"),
    ("GLASSBOX_SESSION_DAYS", "99999999999", "from 1 to 3650"),
    ("GLASSBOX_INSIDE_CACHE_ENTRIES", "-1", "from 0 to 100000"),
    ("GLASSBOX_MAX_STORED_BYTES", "-1", "0 (no limit)"),
])
def test_the_values_that_used_to_start_and_break_a_feature_are_refused(variable, value, allowed):
    with pytest.raises(ConfigError, match=f"^{variable}={value!r} .*{allowed}".replace("(", r"\(").replace(")", r"\)")):
        Settings.from_env({variable: value})


def test_values_in_range_and_the_zeros_that_mean_something_start():
    settings = Settings.from_env({"GLASSBOX_RETENTION_DAYS": "0", "GLASSBOX_MAX_STREAMS_PER_CLIENT": "0",
                                  "GLASSBOX_HEARTBEAT_SECONDS": " 0.2 ", "GLASSBOX_MAX_BATCH": "1"})
    assert (settings.retention_days, settings.max_streams_per_client, settings.heartbeat_seconds) == (0, 0, 0.2)


@pytest.mark.parametrize("variable, value", [("GLASSBOX_THREADS", "abc"), ("GLASSBOX_THREADS", "0"),
                                             ("GLASSBOX_GRACEFUL_TIMEOUT", "abc"), ("GLASSBOX_GRACEFUL_TIMEOUT", "-5"),
                                             ("GLASSBOX_MAX_STREAMS", "many"), ("GLASSBOX_BIND", "127.0.0.1:99999"),
                                             ("GLASSBOX_BIND", " , ")])
def test_gunicorns_own_settings_are_refused_by_name_before_it_starts(variable, value):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")}
    done = subprocess.run([sys.executable, "-c", "import runpy; runpy.run_path('gunicorn.conf.py')"], cwd=ROOT,
                          env={**env, variable: value}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith(f"Glassbox cannot start: {variable}={value!r}") and done.stderr.count("\n") == 1

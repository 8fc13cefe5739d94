"""docs/configuration.md's settings table names every GLASSBOX_* variable the code reads, and nothing it does not
read: "every setting is an environment variable" must stay true as settings come and go."""

from __future__ import annotations

import re
from dataclasses import fields

from tests.conftest import ROOT
from webapp.config import Settings

# Where the served app reads its environment: the package and gunicorn's config file.
SOURCES = [*sorted((ROOT / "webapp").rglob("*.py")), ROOT / "gunicorn.conf.py", ROOT / "wsgi.py"]
# A variable name as a whole string literal ("GLASSBOX_X" or 'GLASSBOX_X'), which is how os.environ.get and
# friends are called; messages that merely mention a variable ("GLASSBOX_X=... is not valid") do not match.
NAME_LITERAL = re.compile(r"""["'](GLASSBOX_[A-Z0-9_]+)["']""")
TABLE_ROW = re.compile(r"^\| `(GLASSBOX_[A-Z0-9_]+)` \|", re.MULTILINE)


def read_by_the_code() -> set[str]:
    names = {f"GLASSBOX_{f.name.upper()}" for f in fields(Settings)}  # Settings.from_env reads these
    for path in SOURCES:
        names.update(NAME_LITERAL.findall(path.read_text()))
    return names


def documented() -> set[str]:
    table = (ROOT / "docs" / "configuration.md").read_text()
    table = table[:table.index("\n## ")]  # the settings table, before PostgreSQL's section
    return set(TABLE_ROW.findall(table))


def test_the_scan_finds_settings_read_outside_the_settings_class():
    found = read_by_the_code()
    # one from each way of reading: gunicorn's config, os.environ.get in a module, a name kept in a constant
    assert {"GLASSBOX_BIND", "GLASSBOX_DECODE_KERNEL", "GLASSBOX_LOOP_EXTRA_MODELS", "GLASSBOX_CHAT_ARCH"} <= found


def test_every_setting_the_code_reads_is_in_the_readme_table():
    missing = read_by_the_code() - documented()
    assert not missing, f"read by the code but not in docs/configuration.md's settings table: {sorted(missing)}"


def test_the_readme_table_names_no_setting_the_code_does_not_read():
    stale = documented() - read_by_the_code()
    assert not stale, f"in docs/configuration.md's settings table but read nowhere: {sorted(stale)}"

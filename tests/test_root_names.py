"""The package root holds what a user types first; the names it gave up still work, warned.

``sa_outbox.__all__`` stays short (70 names at most: httpx has about 70, psycopg 53). A name
that moved to its subpackage resolves from the root for one more release with a
`DeprecationWarning` that says where to import it from.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import sa_outbox
import sa_outbox.queue
from sa_outbox import _MOVED


def test_the_root_namespace_is_short() -> None:
    assert len(sa_outbox.__all__) <= 70
    assert len(set(sa_outbox.__all__)) == len(sa_outbox.__all__)


@pytest.mark.parametrize("name", sorted(_MOVED))
def test_an_old_root_name_resolves_with_a_warning_naming_its_home(name: str) -> None:
    home = importlib.import_module(_MOVED[name])
    assert name in home.__all__ and name not in sa_outbox.__all__
    message = f"sa_outbox.{name} is deprecated: import it from {_MOVED[name]}"
    with pytest.warns(DeprecationWarning, match=f"^{message}$") as caught:
        found = getattr(sa_outbox, name)
    assert found is getattr(home, name)
    assert caught[0].filename == __file__  # the warning points at the caller's line


def test_from_import_of_an_old_name_warns_too() -> None:
    with pytest.warns(DeprecationWarning, match="import it from sa_outbox.queue"):
        from sa_outbox import JobRow

    assert JobRow is sa_outbox.queue.JobRow


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'sa_outbox' has no attribute 'Nope'"):
        sa_outbox.Nope  # noqa: B018
    with pytest.raises(ImportError, match="cannot import name 'Nope'"):
        from sa_outbox import Nope  # noqa: F401


def test_moved_names_are_not_offered_by_dir() -> None:
    assert not set(_MOVED) & set(dir(sa_outbox))


def test_importing_the_package_and_its_subpackages_warns_nothing() -> None:
    """Nothing inside the library reaches for a deprecated root name."""
    code = (
        "import importlib, pkgutil, warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import sa_outbox\n"
        "for info in pkgutil.walk_packages(sa_outbox.__path__, 'sa_outbox.'):\n"
        "    if info.ispkg:\n"
        "        importlib.import_module(info.name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]

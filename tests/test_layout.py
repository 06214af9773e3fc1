"""The architecture is visible by path: the deployables (operator/, runtime/, gateway/, common/)
import each other's modules, and their own, with explicit relative imports
(``from ..core.api import X``, ``from ..common.contract import Y``): the top-level folders sit
side by side as the ``tidal`` package's subpackages, so a relative import names the very file a
tool or a newcomer reading by path would open, and every edge between deployables shows.
The sandbox (e2e/sandbox, ``tidal.sandbox``) does not sit beside them and imports them absolutely,
itself relatively. A new ``from tidal.…`` import inside a deployable fails here, naming the line."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEPLOYABLES = {
    "operator": "operator",
    "runtime": "runtime",
    "gateway": "gateway",
    "common": "common",
    "sandbox": "e2e/sandbox",
}
IMPORT = re.compile(r"^\s*(?:from|import) tidal\.([a-z_]+)\b")


def test_modules_of_a_deployable_import_each_other_relatively() -> None:
    offenders = []
    for name, folder in DEPLOYABLES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                match = IMPORT.match(line)
                if match and (match.group(1) == name or name != "sandbox"):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "use an explicit relative import in a deployable:\n" + "\n".join(
        offenders
    )


def test_the_checker_sees_an_absolute_import_of_its_own_deployable() -> None:
    assert IMPORT.match("    from tidal.runtime.config import S3Spec").group(1) == "runtime"
    assert IMPORT.match("import tidal.gateway.app as app").group(1) == "gateway"
    assert IMPORT.match("from .config import S3Spec") is None

"""`jobctl --help`, which needs no database."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.processes import BIN


def test_help_lists_the_commands(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "jobctl"), "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0
    assert "migrate" in done.stdout

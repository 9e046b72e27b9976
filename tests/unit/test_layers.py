"""The import layers of pyproject's [tool.importlinter] hold, and a planted forbidden import breaks them
(so the contract can fail): the decision core imports no I/O library, no ledger and no service."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([LINT_IMPORTS, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_layers_hold() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_planted_forbidden_import_breaks_them(tmp_path: Path) -> None:
    for package in ("shared", "services"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "shared" / "dra" / "quantity.py").open("a") as module:
        module.write("\nimport sqlalchemy  # planted\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "the decision core is pure: no I/O library, no ledger, no service BROKEN" in result.stdout
    assert "shared.dra.quantity -> sqlalchemy" in result.stdout

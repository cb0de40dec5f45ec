"""scripts/install.sh chooses its environment: the active virtual environment, else the
checkout's `.venv/`, never the system's Python (PEP 668). Checked through `--print-python` and
through copies of the script whose base interpreter is a fake, so nothing is installed."""

import os
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL = REPO_ROOT / "scripts" / "install.sh"


def run_install(*args: str, cwd: Path = REPO_ROOT, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "MDS_BASE_PYTHON")}
    environ.update(env)
    script = cwd / "scripts" / "install.sh"
    return subprocess.run(
        ["bash", str(script), *args], env=environ, capture_output=True, text=True, cwd=cwd
    )


def test_without_active_env_targets_the_checkouts_venv():
    result = run_install("--print-python")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{REPO_ROOT}/.venv/bin/python\n"


def test_active_env_is_used(tmp_path):
    venv = tmp_path / "some-env"
    result = run_install("--print-python", VIRTUAL_ENV=str(venv))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{venv}/bin/python\n"


def test_active_env_without_python_is_an_error(tmp_path):
    result = run_install(VIRTUAL_ENV=str(tmp_path / "gone"))
    assert result.returncode == 1
    assert result.stderr.startswith("install.sh: error: VIRTUAL_ENV=")
    assert "has no bin/python" in result.stderr


def fake_checkout(tmp_path: Path, venv_exit: int) -> Path:
    """A checkout holding only install.sh, and a fake base `python3` whose `-m venv` leaves a
    half-made `.venv` (no pip) and exits with `venv_exit`, as Debian's does without python3-venv."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(INSTALL, checkout / "scripts" / "install.sh")
    fake = tmp_path / "python3"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  --version) echo "Python 3.11.2" ;;\n'
        "  -c) exit 0 ;;\n"
        f'  -m) mkdir -p .venv/bin && echo "$PWD" > "{tmp_path}/made-in"; exit {venv_exit} ;;\n'
        "esac\n"
    )
    fake.chmod(0o755)
    return checkout


def test_missing_venv_module_is_one_clear_line_and_leaves_no_venv(tmp_path):
    checkout = fake_checkout(tmp_path, venv_exit=1)
    result = run_install(cwd=checkout, MDS_BASE_PYTHON=str(tmp_path / "python3"))
    assert result.returncode == 1
    assert result.stdout.startswith(
        f"install: creating .venv with {tmp_path}/python3 (Python 3.11.2)\n"
    )
    assert result.stderr.splitlines()[-1] == (
        f"install.sh: error: '{tmp_path}/python3 -m venv .venv' failed; on Debian/Ubuntu install "
        "the venv module ('sudo apt install python3-venv'), then rerun"
    )
    assert (tmp_path / "made-in").read_text() == f"{checkout}\n"  # in the checkout, nowhere else
    assert not (checkout / ".venv").exists()


def test_half_made_venv_is_recreated_not_reused(tmp_path):
    checkout = fake_checkout(tmp_path, venv_exit=1)
    (checkout / ".venv" / "bin").mkdir(parents=True)  # a failed earlier creation: no python, no pip
    result = run_install(cwd=checkout, MDS_BASE_PYTHON=str(tmp_path / "python3"))
    assert "install: creating .venv" in result.stdout
    assert not (checkout / ".venv").exists()

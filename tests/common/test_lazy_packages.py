"""Every package that defers its imports does it one way, `mds_common.lazy.lazy_attributes`
(issue #24): importing the package loads none of numpy, torch, DeepSpeed or Triton (so each
tool's `--help` starts at once), and each public name resolves on first use and is then kept in the
package, as a plain import would leave it."""

import importlib
import subprocess
import sys

import pytest

LAZY_PACKAGES = ["mds_checkpoint", "mds_generate", "mds_indexed_data", "mds_model", "mds_tokenize"]
HEAVY = ("numpy", "torch", "deepspeed", "triton")

LIST_HEAVY_IMPORTS = """
import importlib, sys
importlib.import_module(sys.argv[1])
print(sorted({name.partition(".")[0] for name in sys.modules} & set(sys.argv[2:])))
"""


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_importing_the_package_loads_nothing_heavy(package):
    result = subprocess.run(
        [sys.executable, "-c", LIST_HEAVY_IMPORTS, package, *HEAVY],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_public_names_resolve_and_are_kept(package):
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        assert vars(module)[name] is value, name  # kept: the next look-up is a plain attribute
        assert name in dir(module)
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018

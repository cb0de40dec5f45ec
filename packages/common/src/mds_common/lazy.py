"""A package's public names imported on first use (PEP 562 module `__getattr__`), so that a tool
needing one light name does not pay, at start-up, for the modules (torch, Triton) behind the rest.

    __getattr__, __dir__ = lazy_attributes(__name__, {"GPT": "gpt", ...})
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module


def lazy_attributes(
    package: str, module_of: dict[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for `package`: each name of module_of is taken from that
    submodule on first access and kept in the package, so later look-ups skip the function."""

    def __getattr__(name: str) -> object:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(module_of))

    return __getattr__, __dir__

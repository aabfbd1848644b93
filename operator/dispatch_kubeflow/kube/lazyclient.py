"""kubernetes_asyncio's generated client, imported name by name as it is used.

``kubernetes_asyncio.client`` imports all 65 API classes and all 768 models when it is first
imported, and ``kubernetes_asyncio.client.api_client`` imports the models package whole: about
30 MiB of code objects in a process that uses three API classes and a handful of models. kopf
imports ``kubernetes_asyncio.client`` too, when it is installed.

:func:`defer_client_imports` replaces those three packages' ``__init__`` with a module that knows,
from the package's own ``__init__.py``, which submodule defines each public name, and imports that
submodule the first time the name is read. Every name the real package exports stays readable, by
attribute, by ``from ... import`` and by ``import *``; :class:`ApiClient` still finds a model by its
name when it deserialises a response. The programs call it first thing; a process that imported
kubernetes_asyncio before is left as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from pathlib import Path

ROOT = "kubernetes_asyncio"

# The packages whose ``__init__`` imports every submodule, relative to the root package.
DEFERRED_PACKAGES = ("client", "client/api", "client/models")

_EXPORT = re.compile(r"^from (kubernetes_asyncio\.client[.\w]*) import (\w+)$", re.MULTILINE)
_VERSION = re.compile(r'^__version__ = "([^"]+)"$', re.MULTILINE)


def exports(init_source: str) -> dict[str, str]:
    """Each public name a generated ``__init__.py`` imports, and the module it imports it from."""
    return {name: module for module, name in _EXPORT.findall(init_source)}


def is_submodule(directory: Path, attribute: str) -> bool:
    """Whether ``attribute`` names a module or package in ``directory``, as ``rest`` or ``api``."""
    if not attribute.isidentifier():
        return False
    return (directory / f"{attribute}.py").is_file() or (
        directory / attribute / "__init__.py"
    ).is_file()


def deferred_package(name: str, directory: Path) -> types.ModuleType:
    """A module standing for the package ``name`` in ``directory`` that imports on first read."""
    init = directory / "__init__.py"
    source = init.read_text(encoding="utf-8")
    where = exports(source)
    package = types.ModuleType(name)
    package.__file__ = str(init)
    package.__path__ = [str(directory)]
    package.__package__ = name
    package.__dict__["__all__"] = list(where)
    version = _VERSION.search(source)
    if version is not None:
        package.__dict__["__version__"] = version.group(1)

    def load(attribute: str) -> object:
        module = where.get(attribute)
        if module is not None:
            value = getattr(importlib.import_module(module), attribute)
        elif is_submodule(directory, attribute):
            value = importlib.import_module(f"{name}.{attribute}")
        else:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        setattr(package, attribute, value)
        return value

    def names() -> list[str]:
        return sorted({*package.__dict__, *where})

    package.__getattr__ = load  # type: ignore[method-assign]
    package.__dir__ = names  # type: ignore[method-assign]
    return package


def defer_client_imports() -> bool:
    """Import kubernetes_asyncio with its client's names imported on first use.

    Returns whether it did: False when kubernetes_asyncio was imported before, or is not there.
    """
    if ROOT in sys.modules:
        return False
    spec = importlib.util.find_spec(ROOT)
    if spec is None or spec.origin is None:
        return False
    root = Path(spec.origin).parent
    for relative in DEFERRED_PACKAGES:
        name = ".".join((ROOT, *relative.split("/")))
        sys.modules[name] = deferred_package(name, root / relative)
    importlib.import_module(ROOT)
    return True

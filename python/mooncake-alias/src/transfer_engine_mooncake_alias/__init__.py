"""``import mooncake.engine`` answers with transfer-engine, on request.

An import hook (a meta-path finder) that serves the modules ``mooncake``
and ``mooncake.engine`` from :mod:`transfer_engine`, so clients written
against Mooncake's Python binding (``from mooncake.engine import
TransferEngine``) run on transfer-engine unchanged. It is installed only
when the environment variable ``TRANSFER_ENGINE_AS_MOONCAKE`` asks:

* unset, empty or ``0``: nothing is installed, nothing changes;
* ``1`` (or any other value): the alias is installed, but a real Mooncake
  (a ``mooncake`` package that provides ``mooncake.engine``) found on
  ``sys.path`` when ``mooncake`` is first imported wins: a warning says so
  once, and Mooncake is imported as usual;
* ``force``: the alias wins over an installed Mooncake.

The package's ``.pth`` file calls :func:`install` at interpreter start-up
(only when the variable is set), and vLLM calls it in every worker through
its ``vllm.general_plugins`` entry point. Nothing is written into
``site-packages`` beyond this package, so uninstalling it restores the
environment exactly.
"""

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import warnings

VARIABLE = "TRANSFER_ENGINE_AS_MOONCAKE"
"""The environment variable that turns the alias on."""

_SERVED = ("mooncake", "mooncake.engine")


def mode():
    """What :data:`VARIABLE` asks for: ``None`` (off), ``"on"`` or ``"force"``."""
    value = os.environ.get(VARIABLE, "").strip()
    if value in ("", "0"):
        return None
    return "force" if value.lower() == "force" else "on"


class MooncakeAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads ``mooncake`` and ``mooncake.engine`` from transfer-engine."""

    def __init__(self, force):
        self.force = force
        self._yielded = False

    def _real_mooncake(self):
        """Where a real Mooncake is on ``sys.path``, or ``None``.

        Real means a ``mooncake`` package that provides ``mooncake.engine``:
        any directory named ``mooncake`` (an empty one in the working
        directory, a folder of configuration) is a namespace package to
        Python's import system, and a ``mooncake`` module or a package
        without ``engine`` cannot be what a client imports.
        """
        spec = importlib.machinery.PathFinder.find_spec("mooncake", sys.path)
        locations = list(spec.submodule_search_locations or []) if spec else []
        if not locations:
            return None
        engine = importlib.machinery.PathFinder.find_spec("mooncake.engine", locations)
        if engine is None:
            return None
        return engine.origin or next(iter(engine.submodule_search_locations or []), "?")

    def find_spec(self, fullname, path=None, target=None):
        """A spec for the two served names; ``None`` for everything else."""
        if fullname not in _SERVED or self._yielded:
            return None
        if fullname == "mooncake" and not self.force:
            real = self._real_mooncake()
            if real is not None:
                self._yielded = True
                warnings.warn(
                    f"{VARIABLE} is set, but Mooncake is installed ({real}): importing "
                    f"Mooncake, not transfer-engine ({VARIABLE}=force uses transfer-engine)",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return None
        return importlib.machinery.ModuleSpec(
            fullname, self, is_package=fullname == "mooncake"
        )

    def create_module(self, spec):
        """The default module object."""
        return None

    def exec_module(self, module):
        """Fills ``mooncake`` (an empty package) or ``mooncake.engine``."""
        if module.__name__ == "mooncake":
            module.__path__ = []
            module.__doc__ = "transfer-engine answering as Mooncake (TRANSFER_ENGINE_AS_MOONCAKE)."
            return
        engine = importlib.import_module("transfer_engine")
        names = engine.__all__
        module.__dict__.update({name: getattr(engine, name) for name in names})
        module.__all__ = list(names)
        module.__doc__ = engine.__doc__
        module.__getattr__ = _forward(engine)


def _forward(engine):
    """``module.__getattr__`` for names transfer-engine has beyond ``__all__``."""

    def __getattr__(name):
        try:
            return getattr(engine, name)
        except AttributeError:
            raise AttributeError(
                f"module 'mooncake.engine' (transfer-engine) has no attribute {name!r}"
            ) from None

    return __getattr__


def install():
    """Installs the alias if :data:`VARIABLE` asks for it; True when installed.

    Safe to call more than once (the ``.pth`` file and vLLM's plugin both
    call it).
    """
    wanted = mode()
    if wanted is None:
        return False
    if not any(isinstance(f, MooncakeAlias) for f in sys.meta_path):
        sys.meta_path.insert(0, MooncakeAlias(force=wanted == "force"))
    return True


__all__ = ["VARIABLE", "MooncakeAlias", "install", "mode"]


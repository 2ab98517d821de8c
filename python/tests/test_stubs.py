"""The type stubs describe the module as it is: every public name and
method of `transfer_engine._native` is in `_native.pyi` with the runtime's
parameter names and order, and every method has a docstring."""

import ast
import inspect
import pathlib

import transfer_engine
from transfer_engine import _native

STUB = pathlib.Path(transfer_engine.__file__).with_name("_native.pyi")


def stub_classes() -> dict:
    tree = ast.parse(STUB.read_text())
    classes = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            methods = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    args = item.args
                    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
                    if args.vararg:
                        names.append("*" + args.vararg.arg)
                    if args.kwarg:
                        names.append("**" + args.kwarg.arg)
                    methods[item.name] = names
            classes[node.name] = methods
    return classes


def test_stub_is_installed_with_the_package():
    assert STUB.is_file()
    assert STUB.with_name("py.typed").is_file()


def test_every_public_name_is_in_the_stub():
    text = STUB.read_text()
    public = [n for n in dir(_native) if not n.startswith("_")] + ["__version__"]
    missing = [n for n in public if n not in text]
    assert not missing, missing


def test_stub_methods_match_the_runtime():
    classes = stub_classes()
    for cls in (_native.TransferEngine, _native.TransferNotify):
        stub = classes[cls.__name__]
        runtime = [n for n in dir(cls) if not n.startswith("_") or n in ("__enter__", "__exit__")]
        runtime = [n for n in runtime if callable(getattr(cls, n)) and n != "TransferOpcode"]
        missing = [n for n in runtime if n not in stub]
        assert not missing, f"{cls.__name__}: not in the stub: {missing}"
        for name in runtime:
            method = getattr(cls, name)
            assert method.__doc__, f"{cls.__name__}.{name} has no docstring"
            params = inspect.signature(method).parameters.values()
            stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
            names = [stars.get(p.kind, "") + p.name for p in params if p.name != "self"]
            want = [n.lstrip("*").lstrip("_") for n in stub[name] if n != "self"]
            got = [n.lstrip("*").lstrip("_") for n in names]
            assert got == want, f"{cls.__name__}.{name}: runtime {names}, stub {stub[name]}"

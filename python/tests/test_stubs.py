"""The type stubs python/tessera/_tessera.pyi against the built module tessera._tessera.

Every public name of the module is declared in the stubs and nothing else is; each class has
the same public members (methods as methods, static methods as static methods, properties and
fields as properties or annotated fields); exceptions have the same bases; every function and
method has the parameters of the binding (names, order, keyword-only, which have defaults, and
the same literal defaults). Run by ctest (label `python`) with PYTHONPATH=build/python; by hand:

    PYTHONPATH=build/python python3 python/tests/test_stubs.py
"""

import ast
import math
import os
import unittest

import tessera._tessera as core

STUBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tessera",
                     "_tessera.pyi")
# Dunder methods whose signatures the stubs declare and this test compares.
CHECKED_DUNDERS = {"__init__", "__enter__", "__exit__"}


def split_top_level(text):
    """`text` split at the commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, c in enumerate(text):
        if quote:
            if c == quote and text[i - 1] != "\\":
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "([{<":
            depth += 1
        elif c in ")]}>" and not (c == ">" and text[i - 1] == "-"):
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def literal(text):
    """The value of a default that is a Python literal, else the marker `...`."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return ...


def runtime_params(func, name):
    """[(name, kind, default)] from pybind11's signature line `name(a: T = d, *, b: T) -> R`;
    kind is 'pos', 'kw' (after `*`) or 'var' (*args); default is None (no default), a literal
    or `...`."""
    line = (func.__doc__ or "").lstrip().splitlines()[0]
    assert line.startswith(name + "("), "%s: no pybind11 signature in %r" % (name, line)
    depth = 0
    for i, c in enumerate(line):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if c == ")" and depth == 0:
            break
    params, kind = [], "pos"
    for p in split_top_level(line[len(name) + 1:i]):
        if p == "*":
            kind = "kw"
            continue
        if p.startswith("*"):
            params.append((p.lstrip("*").split(":")[0], "var", None))
            continue
        head, _, default = p.partition(" = ")
        pname = head.split(":")[0].strip()
        if pname == "self":
            continue
        params.append((pname, kind, literal(default) if default else None))
    return params


def stub_params(fn):
    """The same list for a stub `def`."""
    a = fn.args
    positional = a.posonlyargs + a.args
    pos_defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = []
    for arg, d in zip(positional, pos_defaults):
        if arg.arg != "self":
            out.append((arg.arg, "pos", None if d is None else literal(ast.unparse(d))))
    if a.vararg:
        out.append((a.vararg.arg, "var", None))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, "kw", None if d is None else literal(ast.unparse(d))))
    return out


def same_default(stub, runtime):
    if stub is ... or runtime is ...:
        return (stub is None) == (runtime is None)  # `...` in the stub: any default
    if isinstance(stub, float) or isinstance(runtime, float):
        return isinstance(runtime, (int, float)) and math.isclose(stub, runtime, rel_tol=1e-6)
    return stub == runtime


def decorators(fn):
    return {d.id for d in fn.decorator_list if isinstance(d, ast.Name)}


class Stubs:
    """The parsed stub file: public top-level classes and functions, each class's members."""

    def __init__(self, path):
        with open(path) as f:
            self.tree = ast.parse(f.read(), path)
        self.classes = {n.name: n for n in self.tree.body if isinstance(n, ast.ClassDef)}
        self.functions = {n.name: n for n in self.tree.body if isinstance(n, ast.FunctionDef)}

    def public(self):
        return {n for n in list(self.classes) + list(self.functions) if not n.startswith("_")}

    def members(self, name):
        """{member: node} of class `name`, with those of its bases declared in the stubs."""
        cls = self.classes[name]
        out = {}
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in self.classes:
                out.update(self.members(base.id))
        for n in cls.body:
            if isinstance(n, ast.FunctionDef):
                out[n.name] = n
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                out[n.target.id] = n
        return out

    def base_names(self, name):
        return [ast.unparse(b) for b in self.classes[name].bases]


class StubsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stubs = Stubs(STUBS)

    def runtime_public(self):
        return {n for n in dir(core) if not n.startswith("_")}

    def test_same_public_names(self):
        runtime, declared = self.runtime_public(), self.stubs.public()
        self.assertEqual(sorted(runtime - declared), [], "in the module, not in the stubs")
        self.assertEqual(sorted(declared - runtime), [], "in the stubs, not in the module")

    def test_exceptions_have_the_same_bases(self):
        for name in sorted(self.runtime_public()):
            obj = getattr(core, name)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                want = [b.__name__ for b in obj.__bases__]
                self.assertEqual(self.stubs.base_names(name), want, name)

    def test_classes_have_the_same_members(self):
        for name in sorted(self.runtime_public()):
            obj = getattr(core, name)
            if not isinstance(obj, type) or issubclass(obj, BaseException):
                continue
            with self.subTest(cls=name):
                members = self.stubs.members(name)
                runtime = {n for n in dir(obj) if not n.startswith("_")}
                declared = {n for n in members if not n.startswith("_")}
                self.assertEqual(sorted(runtime - declared), [], "not in the stubs")
                self.assertEqual(sorted(declared - runtime), [], "not in the module")
                for m in sorted(runtime):
                    self.check_member(name, m, obj, members[m])

    def check_member(self, cls_name, m, cls, node):
        raw = next((vars(k)[m] for k in cls.__mro__ if m in vars(k)), None)
        where = "%s.%s" % (cls_name, m)
        if isinstance(raw, property):
            is_data = isinstance(node, ast.AnnAssign) or "property" in decorators(node)
            self.assertTrue(is_data, where + " is a property in the module")
        elif isinstance(raw, staticmethod):
            self.assertIn("staticmethod", decorators(node), where + " is a static method")
        elif callable(raw):
            self.assertIsInstance(node, ast.FunctionDef, where + " is a method in the module")
        # else: a class attribute (an enum value), declared as an annotated ClassVar

    def assert_same_params(self, where, func, name, node):
        got, want = stub_params(node), runtime_params(func, name)
        self.assertEqual([p[:2] for p in got], [p[:2] for p in want], where + ": parameters")
        for (pname, _, d_stub), (_, _, d_run) in zip(got, want):
            self.assertTrue(same_default(d_stub, d_run),
                            "%s(%s=...): stub default %r, module default %r" %
                            (where, pname, d_stub, d_run))

    def test_functions_and_methods_have_the_same_parameters(self):
        for name in sorted(self.runtime_public()):
            obj = getattr(core, name)
            if name in self.stubs.functions:
                self.assert_same_params(name, obj, name, self.stubs.functions[name])
                continue
            if not isinstance(obj, type) or issubclass(obj, BaseException):
                continue
            for m, node in sorted(self.stubs.members(name).items()):
                if not isinstance(node, ast.FunctionDef) or "property" in decorators(node):
                    continue
                if m.startswith("_") and m not in CHECKED_DUNDERS:
                    continue
                if m in CHECKED_DUNDERS and m not in vars(obj):
                    continue  # inherited from pybind11's base (an enum's __init__ is its own)
                with self.subTest(method="%s.%s" % (name, m)):
                    self.assert_same_params("%s.%s" % (name, m), getattr(obj, m), m, node)

    def test_the_checks_see_a_drifted_stub(self):
        # The comparison itself: a parameter renamed, a default changed, a keyword-only
        # marker dropped are each a difference.
        fn = ast.parse("def f(self, a: int, *, b: int = 3) -> None: ...").body[0]
        self.assertEqual(stub_params(fn), [("a", "pos", None), ("b", "kw", 3)])

        class Fake:
            __doc__ = "f(self: X, a: int, b: int = 4) -> None"

        self.assertNotEqual([p[:2] for p in stub_params(fn)],
                            [p[:2] for p in runtime_params(Fake, "f")])
        self.assertFalse(same_default(3, 4))
        self.assertTrue(same_default(0.01, 0.009999999776482582))


if __name__ == "__main__":
    unittest.main()

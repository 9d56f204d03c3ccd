"""No import circles in the Python package: every import of one chorus module by another
(at module level or inside a function: a deferred import hides a circle, it does not break
it) is an edge; a strongly connected set of more than one module fails, named.
    python3 tests/layers/python_imports.py PACKAGE_DIR     (e.g. python/chorus)
    python3 tests/layers/python_imports.py --self-test PACKAGE_DIR  (a planted circle must fail)"""
import ast
import os
import shutil
import sys
import tempfile


def modules(root):
    """{dotted name: path} of every module under root (a package folder)."""
    base = os.path.dirname(os.path.abspath(root))
    out = {}
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, base)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = path
    return out


def edges(mods):
    graph = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(open(path).read(), path)):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # `from a.b import c`: the module a.b.c where it is one, else a.b
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:  # (an attribute of a module: the module)
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def circles(graph):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def check(root):
    mods = modules(root)
    graph = edges(mods)
    # A package's __init__ importing its own submodules is how packages are made, and a
    # submodule's import of a sibling runs the parent's __init__ without naming it: only
    # modules that name each other count.
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    return circles(graph)


def main(argv):
    if argv[0] == "--self-test":
        root = argv[1]
        tmp = tempfile.mkdtemp()
        try:
            copy = os.path.join(tmp, os.path.basename(os.path.abspath(root)))
            shutil.copytree(root, copy)
            pkg = os.path.basename(copy)
            with open(os.path.join(copy, "a_planted.py"), "w") as f:
                f.write(f"def f():\n    from {pkg} import b_planted\n")
            with open(os.path.join(copy, "b_planted.py"), "w") as f:
                f.write(f"from {pkg}.a_planted import f\n")
            found = check(copy)
            assert [f"{pkg}.a_planted", f"{pkg}.b_planted"] in found, f"the planted circle was not found: {found}"
        finally:
            shutil.rmtree(tmp)
        print("planted circle found")
        return 0
    found = check(argv[0])
    for comp in found:
        print("import circle: " + " <-> ".join(comp))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

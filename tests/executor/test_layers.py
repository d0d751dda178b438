"""The executor's layers as docs/design.md lists them ("Modules"): every module is in the map, a
module imports only from its own layer and the layers listed before it, no two modules import
each other, and the executor never imports the step library. Imports under `TYPE_CHECKING` are
annotations, not dependencies, and are left out; imports inside functions count."""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _layers() -> dict[str, int]:
    text = open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8").read()
    section = text[text.index("## Modules"):text.index("\n## ", text.index("## Modules") + 1)]
    layer, out = -1, {}
    for line in section.splitlines():
        if line.startswith("**"):
            layer += 1
        m = re.match(r"^\| `(executor/[\w/]+)\.py` \|", line)
        if m:
            out[m.group(1).replace("/", ".").removesuffix(".__init__")] = layer
    return out


def _modules(top: str) -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, top)):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].replace(os.sep, ".")
                found[rel.removesuffix(".__init__")] = os.path.join(folder, f)
    return found


def _imports(path: str, name: str, known: dict[str, str]) -> set[str]:
    tree = ast.parse(open(path, encoding="utf-8").read())
    skip = set()
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` blocks
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            targets = subs or [base]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def test_every_executor_module_is_in_the_map_and_imports_only_downward():
    layers, known = _layers(), _modules("executor")
    known.update(_modules("steps"))
    executor = {n: p for n, p in known.items() if n.startswith("executor")}
    unmapped = sorted(n for n in executor if n not in layers and n != "executor"
                      and not n.endswith(".__init__") and not os.path.basename(executor[n]) == "__init__.py")
    assert not unmapped, f"modules missing from docs/design.md's map: {unmapped}"
    stale = sorted(n for n in layers if n not in executor)
    assert not stale, f"docs/design.md maps modules that do not exist: {stale}"
    problems = []
    for name, path in sorted(executor.items()):
        for target in _imports(path, name, known):
            if target.startswith("steps"):
                problems.append(f"{name} imports the step library ({target})")
            elif name in layers and target in layers and layers[target] > layers[name]:
                problems.append(f"{name} imports {target}, a layer above it")
    assert not problems, "\n".join(problems)


def test_no_two_modules_import_each_other():
    known = {**_modules("executor"), **_modules("steps")}
    edges = {n: _imports(p, n, known) for n, p in known.items()}
    pairs = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a]
                    if a in edges.get(b, ()) and "." in a and "." in b
                    and not (a.startswith(b + ".") or b.startswith(a + "."))})  # a package and its own modules
    assert not pairs, f"import circles: {pairs}"

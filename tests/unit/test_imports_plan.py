"""Imports point down in the planner's part of the tree: no module of the
plan, the spec, the stages, the OCI config readers or the OCI runtime is in
an import cycle (every import counted, those inside functions too)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCOPE = ("gpusandbox.plan", "gpusandbox.plandev", "gpusandbox.spec", "gpusandbox.edits",
         "gpusandbox.environ", "gpusandbox.oci.config", "gpusandbox.oci.hook",
         "gpusandbox.oci.runtime", "gpusandbox.stages", "gpusandbox.linux.mounts")


def _modules():
    mods = {}
    for p in (ROOT / "gpusandbox").rglob("*.py"):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    return mods


def _imports(name, path, mods):
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                up = pkg
                for _ in range(n.level - 1):
                    up = up.rpartition(".")[0]
                base = up + ("." + n.module if n.module else "")
            out.add(base)
            out.update(f"{base}.{a.name}" for a in n.names)
    return {m for m in out if m in mods and m != name}


def _cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
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
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_through_the_planner_stages_or_oci_runtime():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    bad = [c for c in _cycles(graph) if any(m.startswith(SCOPE) for m in c)]
    assert bad == []

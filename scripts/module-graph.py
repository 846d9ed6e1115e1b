#!/usr/bin/env python3
"""The product's module graph: for each top-level module of src/, the modules it uses (`crate::…`
in code, not in comments or unit tests), and any cycle among them.

    scripts/module-graph.py           print the graph and the cycles
    scripts/module-graph.py --check   the same; exit 1 when there is a cycle (CI runs this)
"""
import glob
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(path):
    rel = os.path.relpath(path, SRC)
    return rel.split(os.sep)[0].removesuffix(".rs")


def uses(text):
    text = re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0]
    code = "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))
    found = set(re.findall(r"crate::([a-z_]+)", code))
    for group in re.findall(r"use crate::\{([^}]*)\}", code):
        found |= {x.strip().split("::")[0] for x in group.split(",") if x.strip()}
    return found


def graph():
    edges = {}
    for path in glob.glob(os.path.join(SRC, "**", "*.rs"), recursive=True):
        module = module_of(path)
        if module in ("main", "lib"):
            continue
        known = lambda m: os.path.exists(os.path.join(SRC, m + ".rs"))
        deps = {d for d in uses(open(path).read()) if d != module and known(d)}
        edges.setdefault(module, set()).update(deps)
    return edges


def cycles(edges):
    found = []

    def visit(node, path):
        for dep in sorted(edges.get(node, ())):
            if dep in path:
                cycle = path[path.index(dep):] + [dep]
                if sorted(cycle[:-1]) not in [sorted(c[:-1]) for c in found]:
                    found.append(cycle)
            else:
                visit(dep, path + [dep])

    for node in sorted(edges):
        visit(node, [node])
    return found


def main():
    edges = graph()
    for module in sorted(edges):
        print(f"{module:16} -> {', '.join(sorted(edges[module])) or '(nothing)'}")
    found = cycles(edges)
    print("cycles: " + ("; ".join(" -> ".join(c) for c in found) if found else "none"))
    if "--check" in sys.argv and found:
        sys.exit(1)


main()

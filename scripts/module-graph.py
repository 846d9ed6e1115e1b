#!/usr/bin/env python3
"""The product's module graph: for each top-level module of src/, the modules it uses (`crate::…`
in code, not in comments or unit tests), and any cycle among them.

    scripts/module-graph.py           print the graph and the cycles
    scripts/module-graph.py --check   the same; exit 1 when there is a cycle or a back edge to the
                                      root (CI runs this)

A back edge to the root is a module naming an item through the crate root (`crate::Handler`,
`use crate::{Stats, …}`) instead of through the module that defines it: the root re-exports for
users only, and an import through it hides the real dependency.
"""
import glob
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(path):
    rel = os.path.relpath(path, SRC)
    return rel.split(os.sep)[0].removesuffix(".rs")


def code_of(text):
    text = re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0]
    return "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))


def names(code):
    """Every first segment after `crate::`, including those inside `use crate::{…}` groups."""
    found = set(re.findall(r"crate::([A-Za-z_][A-Za-z0-9_]*)", code))
    for group in re.findall(r"use crate::\{([^}]*)\}", code, re.S):
        found |= {x.strip().split("::")[0] for x in group.split(",") if x.strip()}
    return found


def uses(text):
    return {n for n in names(code_of(text)) if n[0].islower()}


def module_exists(name):
    return os.path.exists(os.path.join(SRC, name + ".rs")) or os.path.isdir(os.path.join(SRC, name))


def back_edges():
    """(file, name) for every item a module takes from the crate root instead of its module."""
    found = []
    for path in sorted(glob.glob(os.path.join(SRC, "**", "*.rs"), recursive=True)):
        if module_of(path) in ("main", "lib"):
            continue
        for name in sorted(names(code_of(open(path).read()))):
            if name not in ("self", "super") and not module_exists(name):
                found.append((os.path.relpath(path, SRC), name))
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
    back = back_edges()
    print("back edges to the root: " + (", ".join(f"{f} uses crate::{n}" for f, n in back) if back else "none"))
    if "--check" in sys.argv and (found or back):
        sys.exit(1)


main()

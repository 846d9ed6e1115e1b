#!/usr/bin/env python3
"""The product's module graph at every level: for each folder of src/ (the crate root included),
which of its modules use which of their siblings (`crate::…`, `super::…` and `self::…` paths in
code and in `use` trees, not in comments or unit tests), and any cycle among them.

    scripts/module-graph.py           print each level's graph and its cycles
    scripts/module-graph.py --check   the same; exit 1 when a level has a cycle or a module has a
                                      back edge to the root (CI runs this)

A module's own children and its ancestors are not its siblings: a folder's face (`worker.rs`)
declares and uses its files, and they use what it defines; a cycle is between siblings, e.g.
`worker/breaker.rs` -> `worker/poison.rs` -> `worker/breaker.rs`, or `consumer` -> `stats` ->
`consumer` at the root. A dependency of a file is counted for each level it crosses: a use of
`crate::inbox::poison` from `worker/breaker.rs` is the edge `worker -> inbox` at the root.

A back edge to the root is a module naming an item through the crate root (`crate::Handler`,
`use crate::{Stats, …}`) instead of through the module that defines it: the root re-exports for
users only, and an import through it hides the real dependency.
"""
import glob
import os
import re
import sys

SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_path(path):
    """src/worker/positions.rs -> ("worker", "positions"); src/worker.rs and src/worker/mod.rs
    -> ("worker",); src/lib.rs, src/main.rs and unit-test files (`tests.rs`) -> None."""
    rel = os.path.relpath(path, SRC)
    parts = rel.removesuffix(".rs").split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    if parts in (["lib"], ["main"]) or parts[-1] == "tests":
        return None
    return tuple(parts)


def code_of(text):
    text = re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0]
    return "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))


def use_paths(tree, prefix=()):
    """The leaf paths of a `use` tree: `crate::{a::{b, c}, d}` -> crate::a::b, crate::a::c,
    crate::d."""
    tree = tree.strip()
    out = []
    depth, start, head = 0, 0, None
    # Split the top level on `::{`: a path prefix, then a braced group.
    brace = None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                brace = i
            depth += 1
        elif ch == "}":
            depth -= 1
    if brace is None:
        path = re.sub(r"\s+as\s+" + IDENT + r"$", "", tree)
        return [prefix + tuple(p for p in path.split("::") if p)]
    head = tuple(p for p in tree[:brace].rstrip(":").split("::") if p)
    inner = tree[brace + 1 : tree.rindex("}")]
    depth, start = 0, 0
    for i, ch in enumerate(inner + ","):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            part = inner[start:i].strip()
            start = i + 1
            if part:
                out += use_paths(part, prefix + head)
    return out


def paths_of(code):
    """Every path that starts at `crate`, `super` or `self`, as tuples of segments."""
    found = []
    for tree in re.findall(r"\buse\s+([^;]+);", code):
        found += [p for p in use_paths(tree) if p and p[0] in ("crate", "super", "self")]
    for m in re.finditer(r"\b((?:crate|self|super)(?:::" + IDENT + r")+)", code):
        found.append(tuple(m.group(1).split("::")))
    return found


def exists(mod):
    base = os.path.join(SRC, *mod)
    return os.path.exists(base + ".rs") or os.path.isdir(base)


def resolve(path, here):
    """The deepest module a path names, from the module `here` (a file's module path)."""
    parent = here[:-1]
    segs = list(path)
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] == "self":
        base, segs = here, segs[1:]
    else:
        base = here
        while segs and segs[0] == "super":
            base, segs = base[:-1], segs[1:]
    mod = base
    for s in segs:
        if exists(mod + (s,)):
            mod = mod + (s,)
        else:
            break
    return mod


def files():
    for path in sorted(glob.glob(os.path.join(SRC, "**", "*.rs"), recursive=True)):
        mod = module_path(path)
        if mod is not None:
            yield path, mod


def levels():
    """{parent: {child: {sibling, …}}} for every folder (the root is ())."""
    edges = {}
    for path, here in files():
        parent = here[:-1]
        edges.setdefault(parent, {}).setdefault(here[-1], set())
        for p in paths_of(code_of(open(path).read())):
            dep = resolve(p, here)
            common = 0
            while common < min(len(here), len(dep)) and here[common] == dep[common]:
                common += 1
            if common < len(here) and common < len(dep):
                level = here[:common]
                edges.setdefault(level, {}).setdefault(here[common], set()).add(dep[common])
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


def back_edges():
    """(file, name) for every item a module takes from the crate root instead of its module."""
    found = []
    for path, here in files():
        for p in paths_of(code_of(open(path).read())):
            if p[0] == "crate" and len(p) > 1 and not exists((p[1],)):
                found.append((os.path.relpath(path, SRC), p[1]))
    return sorted(set(found))


def main():
    all_cycles = []
    for level, edges in sorted(levels().items()):
        name = "/".join(level) + "/" if level else "src/ (the root)"
        print(f"## {name}")
        for module in sorted(edges):
            print(f"  {module:16} -> {', '.join(sorted(edges[module])) or '(nothing)'}")
        found = cycles(edges)
        all_cycles += [(name, c) for c in found]
        print("  cycles: " + ("; ".join(" -> ".join(c) for c in found) if found else "none"))
    back = back_edges()
    print("back edges to the root: " + (", ".join(f"{f} uses crate::{n}" for f, n in back) if back else "none"))
    if all_cycles:
        print("CYCLES: " + "; ".join(f"in {n}: {' -> '.join(c)}" for n, c in all_cycles))
    if "--check" in sys.argv and (all_cycles or back):
        sys.exit(1)


main()

#!/usr/bin/env python3
"""Checks the crate's layout: no import cycles between modules (files) or
between folders (wings), and at most ten `.rs` files directly in `src/`.

    scripts/check-layout.py            # prints the module graph's cycles, exits 1 if any
    scripts/check-layout.py --graph    # also prints each module's dependencies

A module is a file under `src/` (the binary under `src/bin/` is a crate of
its own and is checked separately). An edge `a -> b` is any `crate::b…` path
in `a`'s code, doc comments and `#[cfg(test)]` modules excluded (tests may
reach anywhere). Each file is named by its module path (`net::fetch`); a
`mod.rs` or a folder's `<name>.rs` is the folder's own module. `use super::…`
and the `crate::` paths of the binary (`crate::progress`) are read the same
way. A folder's own file may use its parts (`store` -> `store::partial`):
those edges are left out, as its relative paths (`partial::…`) are. Folder
cycles are cycles between the top-level folders of `src/`
(`manifest`, `net`, `transfer`, `store`, `service`, `platform`, …).
"""

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(crate_root: str, path: str) -> str:
    rel = os.path.relpath(path, crate_root)[:-3]  # strip .rs
    parts = rel.split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts)


def strip_tests_and_comments(text: str) -> str:
    # Drop `#[cfg(test)] mod … { … }` blocks by brace matching.
    out = []
    i = 0
    pattern = re.compile(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{")
    while True:
        m = pattern.search(text, i)
        if not m:
            out.append(text[i:])
            break
        out.append(text[i : m.start()])
        depth = 1
        j = m.end()
        while j < len(text) and depth:
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
            j += 1
        i = j
    text = "".join(out)
    # Comments (line and doc comments) never create a dependency.
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return text


def edges(crate_root: str, files: list[str]) -> dict[str, set[str]]:
    modules = {module_of(crate_root, f): f for f in files}
    names = set(modules)
    graph: dict[str, set[str]] = {m: set() for m in names}
    for module, path in modules.items():
        with open(path, encoding="utf-8") as fh:
            text = strip_tests_and_comments(fh.read())
        targets = set()
        for m in re.finditer(r"\bcrate((?:::\w+)+)", text):
            targets.add(m.group(1)[2:])
        # `use crate::{a, b::c}` groups.
        for m in re.finditer(r"\bcrate::\{([^;]*?)\}\s*;", text, flags=re.S):
            for item in re.split(r",", m.group(1)):
                item = item.strip().lstrip("{").strip()
                if item and item[0].isalpha():
                    targets.add(item.split("{")[0].rstrip(":"))
        parent = module.rsplit("::", 1)[0] if "::" in module else ""
        # `super` is the module's parent, for a file (`net/tls.rs`: `net`)
        # as for a folder's own file (`net/x/mod.rs`, module `net::x`: `net`).
        for m in re.finditer(r"\bsuper((?:::\w+)+)", text):
            targets.add((parent + m.group(1)).lstrip(":"))
        for t in targets:
            dep = longest_module(t, names)
            # A folder's own file (`mod.rs`) may use the parts it is made of;
            # a cycle needs a part that uses its folder and a sibling, or
            # folders that use each other.
            if dep and dep != module and not dep.startswith(module + "::"):
                graph[module].add(dep)
    return graph


def longest_module(path: str, names: set[str]) -> str | None:
    parts = path.split("::")
    for n in range(len(parts), 0, -1):
        candidate = "::".join(parts[:n])
        if candidate in names:
            return candidate
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    top = lambda m: m.split("::")[0] if m else "lib"
    folders: dict[str, set[str]] = {}
    for a, deps in graph.items():
        folders.setdefault(top(a), set())
        for b in deps:
            if top(a) != top(b) and top(b) != "lib":
                folders[top(a)].add(top(b))
    return folders


def rs_files(root: str, skip: str | None = None) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        if skip and os.path.abspath(dirpath).startswith(os.path.abspath(skip)):
            continue
        found += [os.path.join(dirpath, f) for f in filenames if f.endswith(".rs")]
    return sorted(found)


def check(name: str, crate_root: str, files: list[str], show: bool) -> int:
    graph = edges(crate_root, files)
    problems = 0
    if show:
        for m in sorted(graph):
            print(f"{name}: {m or '(root)'} -> {', '.join(sorted(graph[m])) or '-'}")
    module_cycles = cycles(graph)
    for c in module_cycles:
        print(f"{name}: import cycle between modules: {' <-> '.join(c)}")
        problems += 1
    for c in cycles(folder_graph(graph)):
        if c in module_cycles:
            continue  # files directly in src/: the same cycle, said once
        print(f"{name}: import cycle between folders: {' <-> '.join(c)}")
        problems += 1
    return problems


def main() -> int:
    show = "--graph" in sys.argv
    root = os.path.abspath(ROOT)
    bin_root = os.path.join(root, "bin")
    problems = check("lib", root, rs_files(root, skip=bin_root), show)
    for entry in sorted(os.listdir(bin_root)) if os.path.isdir(bin_root) else []:
        crate = os.path.join(bin_root, entry)
        if os.path.isdir(crate):
            problems += check(f"bin/{entry}", crate, rs_files(crate), show)
    top_files = [f for f in os.listdir(root) if f.endswith(".rs")]
    if len(top_files) > 10:
        print(f"lib: {len(top_files)} .rs files directly in src/ (at most 10): {', '.join(sorted(top_files))}")
        problems += 1
    print(f"{problems} layout problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

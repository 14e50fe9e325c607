#!/usr/bin/env python3
"""The layers depend one way, checked on the source tree (includes) and on CMake (target links).

  core/         -> (nothing of ours but the generated protocol dfa/v1/)
  kernels/      -> core
  coordinator/  -> core
  worker/       -> core, kernels
  client/       -> core, kernels (the CPU backend computes the reference `--verify` compares
                   against; no coordinator/ or worker/ code)

Every `#include "dir/..."` of a source file and every dfa_* target a CMakeLists.txt links must
stay inside what its folder may use. Prints each violation; exits 1 if there is any.
Usage: dependency_test.py [REPO_ROOT]
"""
import os
import re
import sys

ALLOWED = {
    "core": {"core"},
    "kernels": {"core", "kernels"},
    "coordinator": {"core", "coordinator"},
    "worker": {"core", "kernels", "worker"},
    "client": {"core", "kernels", "client"},
}
OURS = set(ALLOWED) | {"tests", "deploy"}
SOURCE_EXT = (".h", ".cc", ".cu", ".cuh", ".cpp")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/')
ADD_TARGET = re.compile(r"add_(?:library|executable)\(\s*([A-Za-z0-9_\-]+)")
ALIAS = re.compile(r"add_library\(\s*([A-Za-z0-9_\-]+)\s+ALIAS\s+([A-Za-z0-9_\-]+)")
LINK = re.compile(r"target_link_libraries\(\s*([A-Za-z0-9_\-]+)([^)]*)\)", re.S)


def layer_of(rel):
    top = rel.split(os.sep, 1)[0]
    return top if top in ALLOWED else None


def walk(root, want):
    for layer in ALLOWED:
        for dirpath, dirs, files in os.walk(os.path.join(root, layer)):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            for f in files:
                if want(f):
                    path = os.path.join(dirpath, f)
                    yield os.path.relpath(path, root), path


def include_violations(root):
    out = []
    for rel, path in walk(root, lambda f: f.endswith(SOURCE_EXT)):
        layer = layer_of(rel)
        with open(path, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if m and m.group(1) in OURS and m.group(1) not in ALLOWED[layer]:
                    out.append(f"{rel}:{n}: {layer}/ includes {m.group(1)}/ ({line.strip()})")
    return out


def cmake_files(root):
    yield from walk(root, lambda f: f == "CMakeLists.txt" or f.endswith(".cmake"))


def link_violations(root):
    owner = {}  # dfa target -> layer that defines it
    for rel, path in cmake_files(root):
        text = open(path, encoding="utf-8").read()
        for name in ADD_TARGET.findall(text):
            owner[name] = layer_of(rel)
        for alias, real in ALIAS.findall(text):
            owner[alias] = layer_of(rel)
    out = []
    for rel, path in cmake_files(root):
        layer = layer_of(rel)
        text = re.sub(r"#[^\n]*", "", open(path, encoding="utf-8").read())
        for target, args in LINK.findall(text):
            for lib in args.split():
                dep = owner.get(lib)
                if dep is not None and dep not in ALLOWED[layer]:
                    out.append(f"{rel}: {target} ({layer}/) links {lib} ({dep}/)")
    return out, owner


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    bad = include_violations(root)
    links, owner = link_violations(root)
    bad += links
    # The check must see the tree: an empty scan would pass vacuously.
    if len(owner) < 10 or not any(True for _ in walk(root, lambda f: f.endswith(".h"))):
        print(f"dependency_test: found only {len(owner)} targets under {root}; wrong root?")
        return 1
    for line in bad:
        print(line)
    print(f"dependency_test: {len(owner)} targets, {len(bad)} wrong-way dependencies")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Trees as nested dicts: {"name": str, "children": [subtree, ...]} ("children" may be missing)."""

from __future__ import annotations


def depth(tree: dict) -> int:
    """Number of nodes on the longest root-to-leaf path (a lone root has depth 1)."""
    children = tree.get("children", [])
    if not children:
        return 0
    return 1 + max(depth(child) for child in children)


def leaves(tree: dict) -> list[str]:
    """Names of the leaves, left to right."""
    children = tree.get("children", [])
    if not children:
        return [tree["name"]]
    return [name for child in children for name in leaves(child)]


def find_path(tree: dict, name: str) -> list[str] | None:
    """Names from the root to the first node called `name` (depth first), or None."""
    if tree["name"] == name:
        return [name]
    for child in tree.get("children", []):
        path = find_path(child, name)
        return [tree["name"], *path] if path else None
    return None

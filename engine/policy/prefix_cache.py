"""The prefix cache's index: content key -> the physical blocks that carry it.

Invariants:
- A block carries at most one key, and is listed under exactly that key here.
- Usually one block carries a key; two can, when two requests computed the same content before
  either registered it (vLLM v1 allows this too). ``lookup`` returns the block that got the key
  first, as vLLM does.
- ``children[k]`` counts the distinct cached keys whose parent is ``k`` (a radix tree's fan-out),
  so a structure-aware eviction policy can tell leaves from inner nodes in O(1).
- Only full blocks get keys; that rule lives with the caller (``KVCacheManager``), which is the
  only one that knows how many tokens a block holds.
"""

from __future__ import annotations

from engine.policy.block_key import BlockKey


class PrefixCacheIndex:
    __slots__ = ("_blocks", "_children")

    def __init__(self) -> None:
        self._blocks: dict[BlockKey, list[int]] = {}
        self._children: dict[BlockKey, int] = {}

    def __len__(self) -> int:
        """Number of distinct cached keys."""
        return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        return key in self._blocks

    def lookup(self, key: BlockKey) -> int | None:
        """The earliest block carrying ``key``, or ``None``. Verified by key equality (whole chain)."""
        blocks = self._blocks.get(key)
        return None if blocks is None else blocks[0]

    def insert(self, key: BlockKey, block_id: int) -> None:
        blocks = self._blocks.get(key)
        if blocks is None:
            self._blocks[key] = [block_id]
            parent = key.parent
            if parent is not None:
                self._children[parent] = self._children.get(parent, 0) + 1
        else:
            blocks.append(block_id)

    def remove(self, key: BlockKey, block_id: int) -> BlockKey | None:
        """Forget that ``block_id`` carries ``key``. Returns the parent key if it thereby became a
        leaf (the last block carrying ``key`` went and ``key`` was its parent's last child)."""
        blocks = self._blocks[key]
        blocks.remove(block_id)
        if blocks:
            return None
        del self._blocks[key]
        parent = key.parent
        if parent is None:
            return None
        remaining = self._children[parent] - 1
        if remaining:
            self._children[parent] = remaining
            return None
        del self._children[parent]
        return parent

    def has_children(self, key: BlockKey) -> bool:
        return key in self._children

    def blocks_with(self, key: BlockKey) -> list[int]:
        return list(self._blocks.get(key, ()))

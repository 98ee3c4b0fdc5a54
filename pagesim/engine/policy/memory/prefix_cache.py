"""The prefix cache's index: content key -> the physical blocks that carry it.

Invariants:
- A block carries at most one key, and is listed under exactly that key here.
- Usually one block carries a key; two can, when two requests computed the same content before
  either registered it (vLLM v1 allows this too). ``lookup`` returns the block that got the key
  first, as vLLM does.
- ``children[k]`` counts the distinct cached keys whose parent is ``k`` (a radix tree's fan-out),
  so a structure-aware eviction policy can tell leaves from inner nodes in O(1).
- ``children`` is kept only when asked for (``track_children``, the default): the block pool
  turns it off for eviction policies that never look at the tree, which saves two hashes of a
  parent key per insert and per remove.
- Only full blocks get keys; that rule lives with the caller (``KVCacheManager``), which is the
  only one that knows how many tokens a block holds.
"""

from __future__ import annotations

from pagesim.engine.policy.memory.block_key import CacheKey


class PrefixCacheIndex:
    __slots__ = ("_blocks", "_children", "track_children")

    def __init__(self, *, track_children: bool = True) -> None:
        self._blocks: dict[CacheKey, list[int]] = {}
        self._children: dict[CacheKey, int] = {}
        self.track_children = track_children

    def __len__(self) -> int:
        """Number of distinct cached keys."""
        return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        return key in self._blocks

    def lookup(self, key: CacheKey) -> int | None:
        """The earliest block carrying ``key``, or ``None``. Verified by key equality (whole chain)."""
        blocks = self._blocks.get(key)
        return None if blocks is None else blocks[0]

    def insert(self, key: CacheKey, block_id: int) -> None:
        # NOTE: one hash of ``key`` per call (``BlockKey.__hash__`` is Python code): the lists
        # held here are never empty, so a list of length 1 after the append means a new key.
        blocks = self._blocks.setdefault(key, [])
        blocks.append(block_id)
        if len(blocks) == 1 and self.track_children:
            parent = key.parent
            if parent is not None:
                children = self._children
                children[parent] = children.get(parent, 0) + 1

    def insert_many(self, pairs: list[tuple[int, CacheKey]]) -> None:
        """``insert(key, block_id)`` for each ``(block_id, key)``, in order."""
        if self.track_children:
            for block_id, key in pairs:
                self.insert(key, block_id)
            return
        setdefault = self._blocks.setdefault
        for block_id, key in pairs:
            setdefault(key, []).append(block_id)

    def remove(self, key: CacheKey, block_id: int) -> CacheKey | None:
        """Forget that ``block_id`` carries ``key``. Returns the parent key if it thereby became a
        leaf (the last block carrying ``key`` went and ``key`` was its parent's last child);
        always ``None`` without ``track_children``."""
        blocks_by_key = self._blocks
        blocks = blocks_by_key.pop(key)
        if len(blocks) > 1:  # rare: another block still carries the key (no one reads the dict's order)
            blocks.remove(block_id)
            blocks_by_key[key] = blocks
            return None
        if blocks[0] != block_id:
            blocks_by_key[key] = blocks
            raise ValueError(f"block {block_id} does not carry this key")
        parent = key.parent
        if parent is None or not self.track_children:
            return None
        children = self._children
        remaining = children[parent] - 1
        if remaining:
            children[parent] = remaining
            return None
        del children[parent]
        return parent

    def remove_many(self, pairs: list[tuple[int, CacheKey]]) -> None:
        """``remove(key, block_id)`` for each ``(block_id, key)``, in order, for a caller that
        does not ask which parents became leaves."""
        if self.track_children:
            for block_id, key in pairs:
                self.remove(key, block_id)
            return
        blocks_by_key = self._blocks
        pop = blocks_by_key.pop
        for block_id, key in pairs:
            blocks = pop(key)
            if len(blocks) > 1 or blocks[0] != block_id:  # (remove's rare cases, and its error)
                blocks_by_key[key] = blocks
                self.remove(key, block_id)

    def has_children(self, key: CacheKey) -> bool:
        assert self.track_children, "this index does not track children (track_children=False)"
        return key in self._children

    def blocks_with(self, key: CacheKey) -> list[int]:
        return list(self._blocks.get(key, ()))

"""Content keys of full KV blocks: the chained hash that prefix caching looks blocks up by.

The key of a sequence's block ``i`` stands for the sequence's whole token prefix through the end of
that block: it is built from the key of block ``i - 1`` (its *parent*) and the block's own content
(``block_size`` token ids). Two requests whose prompts agree on their first ``k`` full blocks get
equal keys for those blocks, and only for those.

Invariants:
- A key's hash is computed once, from the parent's hash and the content, and cached (``__hash__``
  is O(1) however long the chain).
- Equality is *verified*, not trusted: two keys are equal only if their whole chains have equal
  contents, compared link by link until both chains meet at the same object (``is``). A hash
  collision therefore costs a comparison, never a false cache hit. Chains are compared
  iteratively, so a 100k-token prompt does not hit Python's recursion limit.
- Keys are immutable.

The hash function is a parameter so tests can force collisions (``hash_fn=lambda parent, c: 0``)
and check that no false hit results. The default uses Python's tuple hash, which for int tuples
does not depend on ``PYTHONHASHSEED``: decision logs are reproducible across processes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Protocol

HashFn = Callable[[int, Hashable], int]


class CacheKey(Protocol):
    """What the pool and its index know a cached block by (hashed, compared, and asked for its
    parent): a ``BlockKey``, or, in a hybrid cache's layer groups 1.., a ``GroupKey``
    (pagesim/engine/policy/memory/hybrid_kv.py)."""

    @property
    def parent(self) -> CacheKey | None: ...

    def __hash__(self) -> int: ...


#: Hash standing in for "no parent" at the root of every chain.
ROOT_HASH = 0x9E3779B97F4A7C15


def default_hash(parent_hash: int, content: Hashable) -> int:
    return hash((parent_hash, content))


class BlockKey:
    """The identity of a full block's content *and* of everything before it."""

    __slots__ = ("parent", "content", "_hash")
    parent: BlockKey | None
    content: Hashable
    _hash: int

    def __init__(self, parent: BlockKey | None, content: Hashable, hash_fn: HashFn = default_hash):
        self.parent = parent
        self.content = content
        parent_hash = ROOT_HASH if parent is None else parent._hash
        # NOTE: default_hash inlined (one key per full block is a hot path); same value.
        self._hash = hash((parent_hash, content)) if hash_fn is default_hash else hash_fn(parent_hash, content)

    def __hash__(self) -> int:
        return self._hash

    # (Copies and pickles: compiled, an instance is made only through __init__, so a throwaway one
    # takes every attribute of the original; pagesim/engine/compiled.py.)
    def __reduce__(self) -> str | tuple:
        return _blank_key, (), self.__getstate__()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockKey):
            return NotImplemented
        a: BlockKey | None = self
        b: BlockKey | None = other
        while a is not b:
            if a is None or b is None or a._hash != b._hash or a.content != b.content:
                return False
            a, b = a.parent, b.parent
        return True

    def __repr__(self) -> str:
        return f"BlockKey(hash={self._hash & 0xFFFFFFFF:08x})"


def _blank_key() -> BlockKey:
    return BlockKey(None, None)


class _LazyKey(BlockKey):
    """The marker of a block registered with a lazy key (``pagesim/engine/policy/memory/block_pool.py``): a
    ``BlockKey`` in type only, equal to nothing but itself, in no index."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(None, "LAZY_KEY")

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return "LAZY_KEY"

    # One marker, compared by identity: copies and pickles of a pool keep it (free_block_order).
    def __copy__(self) -> _LazyKey:
        return self

    def __deepcopy__(self, memo: object) -> _LazyKey:
        return self

    def __reduce__(self) -> str:
        return "LAZY_KEY"


#: Stands where a block's key would, for a block registered lazily (``BlockPool.cache_lazy``).
LAZY_KEY: BlockKey = _LazyKey()


def chain_keys(
    block_contents: list[Hashable],
    parent: BlockKey | None = None,
    hash_fn: HashFn = default_hash,
) -> list[BlockKey]:
    """Keys of consecutive blocks whose contents are given, continuing the chain after ``parent``."""
    keys = []
    for content in block_contents:
        parent = BlockKey(parent, content, hash_fn)
        keys.append(parent)
    return keys

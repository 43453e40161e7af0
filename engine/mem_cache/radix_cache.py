"""``RadixCache``: the KV of token sequences that finished (or are running) kept in a radix tree,
so a request whose prompt starts with a cached sequence (one system prompt, one document asked
many questions) reuses its K/V instead of recomputing it.

Each edge holds a run of token ids and the KV slots of those tokens. A node with ``lock_ref > 0``
is in use by a running request and, with its ancestors, cannot be evicted; unlocked leaves are
evicted least recently used first when the pool runs short. Slots are owned by exactly one place
at any time: the tree, or a request's own tail beyond its locked prefix. ``evictable_size +
protected_size`` is what the tree holds; with the pool's free count it accounts for every slot.

``disabled=True`` keeps the same interface without sharing: finished requests free their slots.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING

import torch

from .memory_pool import ReqToTokenPool, TokenToKVPool

if TYPE_CHECKING:
    from ..managers.req import Req

_clock = itertools.count()


class TreeNode:
    __slots__ = ("key", "value", "children", "parent", "lock_ref", "last_access")

    def __init__(self, key: list[int], value: torch.Tensor, parent: TreeNode | None) -> None:
        self.key = key
        self.value = value
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = next(_clock)

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access < other.last_access


def _common_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class RadixCache:
    def __init__(self, req_to_token_pool: ReqToTokenPool, token_to_kv_pool: TokenToKVPool, *, disabled: bool = False) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.disabled = disabled
        self.reset()

    def reset(self) -> None:
        self.root = TreeNode([], torch.empty(0, dtype=torch.int64), None)
        self.root.lock_ref = 1  # never evicted
        self._evictable = 0
        self._protected = 0

    # ------------------------------------------------------------------ sizes
    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    # ------------------------------------------------------------------ lookup / insert
    def match_prefix(self, key: list[int]) -> tuple[torch.Tensor, TreeNode]:
        """KV slots of the longest cached prefix of ``key``, and the node where it ends."""
        node, parts = self.root, []
        if self.disabled:
            return torch.empty(0, dtype=torch.int64), node
        while key:
            child = node.children.get(key[0])
            if child is None:
                break
            n = _common_len(child.key, key)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = next(_clock)
            parts.append(child.value)
            node, key = child, key[n:]
        value = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
        return value, node

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Add ``key`` -> ``value``; returns how many leading tokens were already cached (the
        caller still owns those slots of ``value`` and must free them)."""
        node, done = self.root, 0
        while done < len(key):
            child = node.children.get(key[done])
            if child is None:
                new = TreeNode(list(key[done:]), value[done:].clone(), node)
                node.children[key[done]] = new
                self._evictable += len(new.key)
                return done
            n = _common_len(child.key, key[done:])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = next(_clock)
            node, done = child, done + n
        return done

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child``'s edge after ``n`` tokens; returns the new upper node."""
        upper = TreeNode(child.key[:n], child.value[:n], child.parent)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        assert child.parent is not None
        child.parent.children[child.key[0]] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[child.key[0]] = child
        return upper

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            assert node.lock_ref > 0, "radix lock released twice"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node.key)
                self._evictable += len(node.key)
            node = node.parent  # type: ignore[assignment]

    # ------------------------------------------------------------------ requests
    def attach_prefix(self, req: Req) -> None:
        """Point a newly admitted request at its longest cached prefix (at least one token is
        left to compute, so the forward yields its next-token logits)."""
        key = req.fill_ids[:-1]
        slots, node = self.match_prefix(key)
        assert req.req_pool_idx is not None
        if slots.numel():
            self.req_to_token_pool.write(req.req_pool_idx, 0, slots)
        self.inc_lock_ref(node)
        req.last_node, req.kv_len = node, int(slots.numel())

    def cache_unfinished_req(self, req: Req) -> None:
        """Share the request's computed tokens now (e.g. a prompt just prefilled), keep running."""
        if self.disabled:
            return
        self._insert_req(req)

    def cache_finished_req(self, req: Req) -> None:
        """Hand the request's KV to the tree (or free it) and release its request slot."""
        assert req.req_pool_idx is not None
        if self.disabled:
            slots = self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_len]
            self.token_to_kv_pool.free(slots.clone())
        else:
            self._insert_req(req)
            assert req.last_node is not None
            self.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx, req.last_node, req.kv_len = None, None, 0

    def _insert_req(self, req: Req) -> None:
        key = req.fill_ids[: req.kv_len]
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        slots = row[: req.kv_len].clone()
        locked = self._locked_len(req.last_node)
        known = self.insert(key, slots)
        # Tokens between the locked prefix and ``known`` were computed twice: keep the tree's copy.
        if known > locked:
            self.token_to_kv_pool.free(slots[locked:known])
        new_slots, node = self.match_prefix(key)
        row[: new_slots.numel()] = new_slots
        self.inc_lock_ref(node)
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
        req.last_node = node

    def _locked_len(self, node: TreeNode | None) -> int:
        n = 0
        while node is not None and node is not self.root:
            n += len(node.key)
            node = node.parent
        return n

    # ------------------------------------------------------------------ eviction
    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` slots from unlocked leaves, least recently used first;
        returns how many were freed (fewer if not enough are evictable)."""
        if self.disabled or num_tokens <= 0:
            return 0
        leaves = [n for n in self._nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_tokens and leaves:
            leaf = heapq.heappop(leaves)
            self.token_to_kv_pool.free(leaf.value)
            freed += len(leaf.key)
            self._evictable -= len(leaf.key)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(leaves, parent)
        return freed

    def _nodes(self):  # type: ignore[no-untyped-def]
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not self.root:
                yield node

"""The compiled core of lazy determinization: stack graph, closures, configurations, rows.

``automaton.py`` explains the model; this module holds its data in numpy arrays inside one numba
structure (:class:`Core`) and its operations as numba functions, so a trie walk can compute the
rows it reaches without returning to Python (``token_walk.py`` calls :func:`expand_cell` from
inside its kernel), and without the GIL.

Layout (every set of ids is a sorted run of a pool array, interned by a hash of its content):
- NFA, read-only: byte edges, epsilon edges and calls in CSR form; rule starts and finals.
- stack nodes: (NFA state, parent set); parent sets: node ids plus the markers EMPTY_STACK
  (bottom) and HOLE_STACK (a truncated bottom); a node's depth is one more than its deepest parent.
- closures, per node (memoized): the kernel nodes reachable without consuming a byte (nodes
  whose state has byte edges) and flags (ACCEPTING: a pop reached the bottom; EXITS: a truncation
  hole).
- configurations: kernel nodes, at most one per NFA state (nodes with the same top are merged by
  uniting their parent sets) and flags; the transition table, one row of 256 per configuration,
  UNEXPANDED until computed. Cells are computed a segment at a time (the bytes on which no edge
  of the configuration's nodes begins or ends step alike): a trie walk computes only the
  segments its tokens' next bytes fall in (:func:`expand_cell`; deep in the trie a node has one
  or two children, and a whole row would create configurations no token reaches), anything that
  reads a whole row computes it first (:func:`expand_row`, flagged in ``row_done``).

Functions return a status (< 0: a budget was exceeded, see the ERR_* codes) where they can fail.
Callers hold the automaton's lock: nothing here is safe to run twice at once on one Core.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.experimental import structref

UNEXPANDED = -2
DEAD = -1
EMPTY_STACK = -1
HOLE_STACK = -3
NO_NODE = -10  # (a node id no parent set holds)
ACCEPTING, EXITS = 1, 2
# Status codes (negative): which budget was exceeded.
ERR_STATES, ERR_DEPTH, ERR_CLOSURE = -10, -11, -12

_FNV_OFFSET = np.uint64(1469598103934665603)
_FNV_PRIME = np.uint64(1099511628211)
# Every integer a kernel passes to another is an int64 made with I64: numba compiles a callee
# once per argument type, and a literal constant (``Literal[int](0)``) or an int32 read from an
# array is a type of its own; passed as they come, they made 35 extra compiled versions of the
# kernels below (minutes of a cold start). tests/test_compile_cache.py counts them.
I64 = np.int64


@structref.register
class CoreType(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class Core(structref.StructRefProxy):
    """The determinizer's arrays (one per automaton); build with :func:`new_core`."""


_FIELDS = [
    # NFA (read-only)
    "e_ptr", "e_lo", "e_hi", "e_dst", "eps_ptr", "eps_dst", "call_ptr", "call_callee", "call_ret",
    "final_rule", "rule_start", "tail_ret", "has_edges",
    # budgets
    "max_states", "max_depth", "max_closure",
    # stack nodes
    "node_q", "node_ps", "node_depth", "n_nodes", "nmap_keys", "nmap_vals", "nmap_n",
    "nmap_old_keys", "nmap_old_vals", "nmap_moved",
    # parent sets
    "ps_start", "ps_len", "ps_depth", "n_ps", "ps_pool", "ps_pool_n", "psmap_keys", "psmap_vals", "psmap_n",
    "psmap_old_keys", "psmap_old_vals", "psmap_moved",
    # closures, per node
    "clo_start", "clo_len", "clo_flags", "clo_pool", "clo_pool_n",
    # configurations
    "cfg_start", "cfg_len", "n_cfg", "cfg_pool", "cfg_pool_n", "cmap_keys", "cmap_vals", "cmap_n",
    "cmap_old_keys", "cmap_old_vals", "cmap_moved",
    "accepting", "exits", "table", "row_done",
    # scratch: visit marks per node; the closure's search stack and kernel (see GROWN_IN_LOOP)
    "mark", "mark_gen", "dfs_stack", "dfs_kernel",
]
structref.define_proxy(Core, CoreType, _FIELDS)


# ---------------------------------------------------------------------------------- helpers


@njit(cache=True, nogil=True)
def _hash_run(pool, n, salt):  # pragma: no cover - compiled
    h = _FNV_OFFSET ^ np.uint64(salt)
    for i in range(n):
        h = (h ^ np.uint64(pool[i] + 7)) * _FNV_PRIME
    return np.int64(h >> np.uint64(1))


@njit(cache=True, nogil=True)
def _mix(key):  # pragma: no cover
    """A map slot for ``key``: every bit of the key reaches the low bits the maps mask (a plain
    multiply carries only upward: a node's key (NFA state << 32 | parent set) then hashed by its
    parent set alone, and the nodes over one parent set (a key under seventy properties) probed
    through one cluster)."""
    h = np.uint64(key)
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    h = h ^ (h >> np.uint64(31))
    return np.int64(h >> np.uint64(1))


# GROWN_IN_LOOP: no kernel reassigns a local array inside a loop (``buf = _grow(buf, ...)``).
# numba then carries the array through the loop as a variable that may change, and takes and
# drops a reference to it on every iteration, growth or not: two atomic operations, 14 ns an
# iteration on the 2-core VM, where the loop's own work is under 1 ns. Buffers are sized by a
# counting pass before the loop, or live in the Core (growth then stores a field, which costs
# nothing per iteration). Measured with a return-address profile of the reference counts
# (BENCHMARKS.md, issue 25): they were 60% of the time to create a configuration.
#
# Growth allocates without initializing and fills only the new tail where a fill value means
# something: a fill of the whole new array would touch (page-fault) every page of it at once,
# tens of milliseconds inside one mask for an automaton of 100k configurations.
# One compiled version per element type (int8, int32, int64, bool): the fill is always an int64.
# The kernels copy arrays with loops, never with slice assignments (``new[:n] = old``): numba
# checks a slice assignment's shapes and compiles its error message's string formatting into the
# kernel: it made the grammar kernels' cold compile about a quarter longer (BENCHMARKS.md, issue 25).
@njit(cache=True, nogil=True)
def _grow(a, need, fill):  # pragma: no cover
    new = np.empty(max(need, 2 * a.shape[0]), dtype=a.dtype)
    for i in range(a.shape[0]):
        new[i] = a[i]
    new[a.shape[0]:] = fill
    return new


@njit(cache=True, nogil=True)
def _grow_pool(a, need):  # pragma: no cover
    """A pool (runs of ids addressed by start and length) grows without a fill: only written
    cells are ever read."""
    new = np.empty(max(need, 2 * a.shape[0]), dtype=np.int32)
    for i in range(a.shape[0]):
        new[i] = a[i]
    return new


# Past this many rows the table reserves its whole budget at once: the reservation is address
# space only (the allocator maps it without touching it, and rows are initialized as
# configurations appear), so no later growth copies a table of tens of megabytes in one mask.
# The move itself copies the rows so far into fresh pages (a page fault per four rows, 3 µs each
# on the 2-core VM): 2048 rows, where 4096 made one MaskBench mask (o35868's key start) 5 ms
# longer.
TABLE_RESERVE_FROM = 2048
TABLE_RESERVE_ROWS = 1 << 18


@njit(cache=True, nogil=True)
def _grow_table(table, n_used, max_states):  # pragma: no cover
    cap = 2 * table.shape[0]
    if cap > TABLE_RESERVE_FROM:
        cap = max(cap, min(max_states, TABLE_RESERVE_ROWS))
    new = np.empty((cap, 256), np.int32)
    for r in range(n_used):
        for j in range(256):
            new[r, j] = table[r, j]
    return new


# Below this length a run is sorted by insertion: most runs here (a configuration's kernel, a
# byte's seeds) are a few ids, and numba's quicksort takes a view and a reference count per
# partition call, which cost more than the sorting.
INSERTION_SORT_MAX = 32


# Inlined (a compiled call takes a reference to each array passed: see intern_node); the long
# runs' sort stays a call.
@njit(cache=True, nogil=True, inline="always")
def _sort_run(buf, n):  # pragma: no cover
    """Sort buf[:n] in place."""
    if n > INSERTION_SORT_MAX:
        _sort_long(buf, n)
        return
    for i in range(1, n):
        x = buf[i]
        j = i - 1
        while j >= 0 and buf[j] > x:
            buf[j + 1] = buf[j]
            j -= 1
        buf[j + 1] = x


@njit(cache=True, nogil=True)
def _sort_long(buf, n):  # pragma: no cover
    buf[:n].sort()


@njit(cache=True, nogil=True)
def _sort_unique(buf, n):  # pragma: no cover
    """Sort buf[:n] in place and drop duplicates; returns the new length."""
    if n <= 1:
        return n
    _sort_run(buf, n)
    k = 1
    for i in range(1, n):
        if buf[i] != buf[k - 1]:
            buf[k] = buf[i]
            k += 1
    return k


# ---------------------------------------------------------------------------------- construction


@njit(cache=True)
def new_core(e_ptr, e_lo, e_hi, e_dst, eps_ptr, eps_dst, call_ptr, call_callee, call_ret, final_rule, rule_start,
             tail_ret, has_edges, max_states, max_depth, max_closure):  # pragma: no cover
    cap = 64
    return Core(
        e_ptr, e_lo, e_hi, e_dst, eps_ptr, eps_dst, call_ptr, call_callee, call_ret, final_rule, rule_start,
        tail_ret, has_edges,
        max_states, max_depth, max_closure,
        np.zeros(cap, np.int32), np.zeros(cap, np.int32), np.zeros(cap, np.int32), 0,
        np.zeros(2 * cap, np.int64), np.full(2 * cap, -1, np.int32), 0, np.zeros(1, np.int64), np.full(1, -1, np.int32), 0,
        np.zeros(cap, np.int64), np.zeros(cap, np.int32), np.zeros(cap, np.int32), 0, np.zeros(4 * cap, np.int32), 0,
        np.zeros(2 * cap, np.int64), np.full(2 * cap, -1, np.int32), 0, np.zeros(1, np.int64), np.full(1, -1, np.int32), 0,
        np.full(cap, -1, np.int64), np.zeros(cap, np.int32), np.zeros(cap, np.int8), np.zeros(4 * cap, np.int32), 0,
        np.zeros(cap, np.int64), np.zeros(cap, np.int32), 0, np.zeros(4 * cap, np.int32), 0,
        np.zeros(2 * cap, np.int64), np.full(2 * cap, -1, np.int32), 0, np.zeros(1, np.int64), np.full(1, -1, np.int32), 0,
        np.zeros(cap, np.bool_), np.zeros(cap, np.bool_), np.full((cap, 256), UNEXPANDED, np.int32),
        np.zeros(cap, np.bool_),
        np.zeros(cap, np.int32), 0, np.zeros(cap, np.int32), np.zeros(cap, np.int32),
    )


@njit(cache=True)
def static_core(table, exits):  # pragma: no cover
    """A Core over a complete transition table (every row computed): walkable, never expanded."""
    empty = np.zeros(1, np.int32)
    no = np.zeros(1, np.bool_)
    c = new_core(empty, empty, empty, empty, empty, empty, empty, empty, empty, empty, empty, no, no, I64(0), I64(0), I64(0))
    c.table = table
    c.row_done = np.ones(table.shape[0], np.bool_)
    c.exits = exits
    c.accepting = np.zeros(table.shape[0], np.bool_)
    c.n_cfg = table.shape[0]
    return c


@njit(cache=True)
def core_table(c):  # pragma: no cover
    return c.table


@njit(cache=True)
def core_row_done(c):  # pragma: no cover
    return c.row_done


@njit(cache=True)
def core_flags(c):  # pragma: no cover
    """(exits, accepting, number of configurations)."""
    return c.exits, c.accepting, c.n_cfg


@njit(cache=True)
def core_arrays(c):  # pragma: no cover
    """Views for Python: (table, exits, accepting, n_cfg, node_q, node_ps, node_depth, n_nodes,
    ps_start, ps_len, ps_pool, cfg_start, cfg_len, cfg_pool)."""
    return (c.table, c.exits, c.accepting, c.n_cfg, c.node_q, c.node_ps, c.node_depth, c.n_nodes,
            c.ps_start, c.ps_len, c.ps_pool, c.cfg_start, c.cfg_len, c.cfg_pool)


# ---------------------------------------------------------------------------------- interning


# The three maps (stack nodes, parent sets, configurations) are open-addressing hash tables kept
# at most half full. Doubling one moves its entries over the next inserts, a few slots each,
# instead of all at once: a map of 300k nodes took 30 ms to rehash, inside one mask. While a
# move is under way a lookup that misses in the new table probes the old one too; when none is,
# the old table is a one-slot placeholder.
_MOVE_PER_INSERT = 8


@njit(cache=True, nogil=True)
def _move_entries(keys, vals, old_keys, old_vals, moved, count):  # pragma: no cover
    """Move old slots [moved, moved + count) into the new table; returns the new ``moved``."""
    mask = keys.shape[0] - 1
    end = min(moved + count, old_vals.shape[0])
    for i in range(moved, end):
        if old_vals[i] != -1:
            h = _mix(old_keys[i]) & mask
            while vals[h] != -1:
                h = (h + 1) & mask
            keys[h] = old_keys[i]
            vals[h] = old_vals[i]
    return end


@njit(cache=True, nogil=True)
def _move_on(keys, vals, old_keys, old_vals, moved):  # pragma: no cover
    """After an insert into (keys, vals) while a move is under way: one step of it; returns (old
    keys, old values, moved), the old table dropped at the end of its move."""
    moved = _move_entries(keys, vals, old_keys, old_vals, moved, I64(_MOVE_PER_INSERT))
    if moved == old_vals.shape[0]:
        return np.zeros(1, np.int64), np.full(1, -1, np.int32), I64(0)
    return old_keys, old_vals, moved


@njit(cache=True, nogil=True)
def _make_room(keys, vals, old_keys, old_vals, moved):  # pragma: no cover
    """Before an insert that would fill half the map (the callers check, so the hot path makes
    no call): (keys, values, old keys, old values, moved), doubled. A move still under way
    (which the rate of _MOVE_PER_INSERT prevents) is finished first."""
    if old_vals.shape[0] > 1:
        _move_entries(keys, vals, old_keys, old_vals, moved, old_vals.shape[0])
    cap = 2 * keys.shape[0]
    return np.zeros(cap, np.int64), np.full(cap, -1, np.int32), keys, vals, I64(0)


@njit(cache=True, nogil=True)
def _probe(keys, vals, key, h):  # pragma: no cover
    """The first slot from ``h`` on that is free or holds ``key`` (every map's probe: a node's
    key is the node itself, a run's key is its hash, so equal keys are candidates there)."""
    mask = keys.shape[0] - 1
    h &= mask
    while vals[h] != -1 and keys[h] != key:
        h = (h + 1) & mask
    return h


@njit(cache=True, nogil=True)
def _find_node(keys, vals, key):  # pragma: no cover
    """(node id or -1, the free slot where the probe ended)."""
    h = _probe(keys, vals, key, _mix(key))
    return vals[h], h


# Inlined into every caller (numba's IR inliner): a compiled call increments the reference count
# of each array or structure it is passed on entry and decrements it on return, two atomic
# operations on ``c`` per call, and the lookups that find their node (most calls) do little else.
@njit(cache=True, nogil=True, inline="always")
def intern_node(c, q, ps):  # pragma: no cover
    """Id of stack node (NFA state q, parent set ps); ERR_DEPTH past the depth budget."""
    found = _find_node(c.nmap_keys, c.nmap_vals, (np.int64(q) << 32) | np.int64(ps))[0]
    if found >= 0:
        return np.int64(found)
    return _new_node(c, q, ps)


@njit(cache=True, nogil=True)
def _new_node(c, q, ps):  # pragma: no cover
    """:func:`intern_node` when the node is not in the map's current table: the table being
    moved is probed too, else the node is created."""
    if 2 * (c.nmap_n + 1) > c.nmap_keys.shape[0]:  # (the call reassigns five arrays: only when due)
        c.nmap_keys, c.nmap_vals, c.nmap_old_keys, c.nmap_old_vals, c.nmap_moved = _make_room(
            c.nmap_keys, c.nmap_vals, c.nmap_old_keys, c.nmap_old_vals, c.nmap_moved)
    key = (np.int64(q) << 32) | np.int64(ps)
    found, h = _find_node(c.nmap_keys, c.nmap_vals, key)
    if found < 0 and c.nmap_old_vals.shape[0] > 1:  # a table still being moved
        found = _find_node(c.nmap_old_keys, c.nmap_old_vals, key)[0]
    if found >= 0:
        return found
    depth = 1 + c.ps_depth[ps]
    if depth > c.max_depth:
        return ERR_DEPTH
    nid = c.n_nodes
    if nid == c.node_q.shape[0]:
        c.node_q = _grow(c.node_q, nid + 1, I64(0))
        c.node_ps = _grow(c.node_ps, nid + 1, I64(0))
        c.node_depth = _grow(c.node_depth, nid + 1, I64(0))
        c.clo_start = _grow(c.clo_start, nid + 1, I64(-1))
        c.clo_len = _grow(c.clo_len, nid + 1, I64(0))
        c.clo_flags = _grow(c.clo_flags, nid + 1, I64(0))
        c.mark = _grow(c.mark, nid + 1, I64(0))
    c.node_q[nid] = q
    c.node_ps[nid] = ps
    c.node_depth[nid] = depth
    c.n_nodes = nid + 1
    c.nmap_keys[h] = key
    c.nmap_vals[h] = nid
    if c.nmap_old_vals.shape[0] > 1:
        c.nmap_old_keys, c.nmap_old_vals, c.nmap_moved = _move_on(
            c.nmap_keys, c.nmap_vals, c.nmap_old_keys, c.nmap_old_vals, c.nmap_moved)
    c.nmap_n += 1
    return nid


@njit(cache=True, nogil=True)
def _same_run(pool, start, buf, n):  # pragma: no cover
    """pool[start:start + n] == buf[:n], element by element."""
    for j in range(n):
        if pool[start + j] != buf[j]:
            return False
    return True


@njit(cache=True, nogil=True)
def _find_run(keys, vals, key, pool, starts, lens, buf, n):  # pragma: no cover
    """(id of the run equal to buf[:n] or -1, the free slot where the probe ended); keys are
    the runs' hashes."""
    h = _probe(keys, vals, key, _mix(key))
    while vals[h] != -1 and not (lens[vals[h]] == n and _same_run(pool, starts[vals[h]], buf, n)):
        h = _probe(keys, vals, key, h + 1)
    return vals[h], h


@njit(cache=True, nogil=True)
def intern_parents(c, buf, n):  # pragma: no cover
    """Id of the parent set buf[:n] (sorted, distinct)."""
    if 2 * (c.psmap_n + 1) > c.psmap_keys.shape[0]:  # (the call reassigns five arrays: only when due)
        c.psmap_keys, c.psmap_vals, c.psmap_old_keys, c.psmap_old_vals, c.psmap_moved = _make_room(
            c.psmap_keys, c.psmap_vals, c.psmap_old_keys, c.psmap_old_vals, c.psmap_moved)
    key = _hash_run(buf, n, I64(0))
    found, h = _find_run(c.psmap_keys, c.psmap_vals, key, c.ps_pool, c.ps_start, c.ps_len, buf, n)
    if found < 0 and c.psmap_old_vals.shape[0] > 1:  # a table still being moved
        found = _find_run(c.psmap_old_keys, c.psmap_old_vals, key, c.ps_pool, c.ps_start, c.ps_len, buf, n)[0]
    if found >= 0:
        return found
    ps = c.n_ps
    if ps == c.ps_start.shape[0]:
        c.ps_start = _grow(c.ps_start, ps + 1, I64(0))
        c.ps_len = _grow(c.ps_len, ps + 1, I64(0))
        c.ps_depth = _grow(c.ps_depth, ps + 1, I64(0))
    if c.ps_pool_n + n > c.ps_pool.shape[0]:
        c.ps_pool = _grow_pool(c.ps_pool, c.ps_pool_n + n)
    depth = 0
    for i in range(n):
        c.ps_pool[c.ps_pool_n + i] = buf[i]
        if buf[i] >= 0 and c.node_depth[buf[i]] > depth:
            depth = c.node_depth[buf[i]]
    c.ps_start[ps] = c.ps_pool_n
    c.ps_len[ps] = n
    c.ps_depth[ps] = depth
    c.ps_pool_n += n
    c.n_ps = ps + 1
    c.psmap_keys[h] = key
    c.psmap_vals[h] = ps
    if c.psmap_old_vals.shape[0] > 1:
        c.psmap_old_keys, c.psmap_old_vals, c.psmap_moved = _move_on(
            c.psmap_keys, c.psmap_vals, c.psmap_old_keys, c.psmap_old_vals, c.psmap_moved)
    c.psmap_n += 1
    return ps


@njit(cache=True, nogil=True)
def intern_config(c, buf, n, flags):  # pragma: no cover
    """Id of the configuration with kernel buf[:n] (sorted) and flags; ERR_STATES past budget."""
    if 2 * (c.cmap_n + 1) > c.cmap_keys.shape[0]:  # (the call reassigns five arrays: only when due)
        c.cmap_keys, c.cmap_vals, c.cmap_old_keys, c.cmap_old_vals, c.cmap_moved = _make_room(
            c.cmap_keys, c.cmap_vals, c.cmap_old_keys, c.cmap_old_vals, c.cmap_moved)
    key = _hash_run(buf, n, flags)
    found, h = _find_config(c, c.cmap_keys, c.cmap_vals, key, buf, n, flags)
    if found < 0 and c.cmap_old_vals.shape[0] > 1:  # a table still being moved
        found = _find_config(c, c.cmap_old_keys, c.cmap_old_vals, key, buf, n, flags)[0]
    if found >= 0:
        return found
    cid = c.n_cfg
    if cid >= c.max_states:
        return ERR_STATES
    if cid == c.cfg_start.shape[0]:
        c.cfg_start = _grow(c.cfg_start, cid + 1, I64(0))
        c.cfg_len = _grow(c.cfg_len, cid + 1, I64(0))
        c.accepting = _grow(c.accepting, cid + 1, I64(0))
        c.exits = _grow(c.exits, cid + 1, I64(0))
        c.row_done = _grow(c.row_done, cid + 1, I64(0))
    if cid == c.table.shape[0]:
        c.table = _grow_table(c.table, cid, c.max_states)
    c.table[cid, :] = UNEXPANDED  # rows are initialized one by one, as configurations appear
    c.row_done[cid] = False
    if c.cfg_pool_n + n > c.cfg_pool.shape[0]:
        c.cfg_pool = _grow_pool(c.cfg_pool, c.cfg_pool_n + n)
    for i in range(n):
        c.cfg_pool[c.cfg_pool_n + i] = buf[i]
    c.cfg_start[cid] = c.cfg_pool_n
    c.cfg_len[cid] = n
    c.accepting[cid] = (flags & ACCEPTING) != 0
    c.exits[cid] = (flags & EXITS) != 0
    c.cfg_pool_n += n
    c.n_cfg = cid + 1
    c.cmap_keys[h] = key
    c.cmap_vals[h] = cid
    if c.cmap_old_vals.shape[0] > 1:
        c.cmap_old_keys, c.cmap_old_vals, c.cmap_moved = _move_on(
            c.cmap_keys, c.cmap_vals, c.cmap_old_keys, c.cmap_old_vals, c.cmap_moved)
    c.cmap_n += 1
    return cid


@njit(cache=True, nogil=True)
def _find_config(c, keys, vals, key, buf, n, flags):  # pragma: no cover
    """(id of the configuration with kernel buf[:n] and flags, or -1; the free slot where the
    probe ended)."""
    h = _probe(keys, vals, key, _mix(key))
    while vals[h] != -1 and not _is_config(c, vals[h], buf, n, flags):
        h = _probe(keys, vals, key, h + 1)
    return vals[h], h


@njit(cache=True, nogil=True)
def _is_config(c, cid, buf, n, flags):  # pragma: no cover
    """Whether configuration ``cid`` has kernel buf[:n] and ``flags``."""
    if c.cfg_len[cid] != n or ((1 if c.accepting[cid] else 0) | (2 if c.exits[cid] else 0)) != flags:
        return False
    return _same_run(c.cfg_pool, c.cfg_start[cid], buf, n)


# ---------------------------------------------------------------------------------- closures


@njit(cache=True, nogil=True)
def _next_gen(c):  # pragma: no cover
    if c.mark_gen >= 2_000_000_000:
        c.mark[:] = 0
        c.mark_gen = 0
    c.mark_gen += 1
    return np.int32(c.mark_gen)


@njit(cache=True, nogil=True, inline="always")
def closure(c, nid):  # pragma: no cover
    """Compute (once) the closure of node ``nid``. Returns 0 or a status. Inlined: most calls
    find it computed (see intern_node)."""
    if c.clo_start[nid] >= 0:
        return np.int64(0)
    return _compute_closure(c, nid)


@njit(cache=True, nogil=True)
def _compute_closure(c, nid):  # pragma: no cover
    """The closure of node ``nid``: a depth-first search over epsilon edges, calls (a call in
    tail position pushes no frame) and pops into the parents. Returns 0 or a status."""
    gen = _next_gen(c)
    nk = 0
    flags = 0
    visited = 0
    c.dfs_stack[0] = nid
    ns = 1
    c.mark[nid] = gen
    one = np.empty(1, np.int32)
    while ns > 0:
        ns -= 1
        n = c.dfs_stack[ns]
        q = c.node_q[n]
        ps = c.node_ps[n]
        visited += 1
        if visited > c.max_closure:
            return ERR_CLOSURE
        if c.has_edges[q]:
            if nk == c.dfs_kernel.shape[0]:
                c.dfs_kernel = _grow(c.dfs_kernel, nk + 1, I64(0))
            c.dfs_kernel[nk] = n
            nk += 1
        for e in range(c.eps_ptr[q], c.eps_ptr[q + 1]):
            m = intern_node(c, I64(c.eps_dst[e]), I64(ps))
            if m < 0:
                return m
            if c.mark[m] != gen:
                c.mark[m] = gen
                if ns == c.dfs_stack.shape[0]:
                    c.dfs_stack = _grow(c.dfs_stack, ns + 1, I64(0))
                c.dfs_stack[ns] = m
                ns += 1
        for e in range(c.call_ptr[q], c.call_ptr[q + 1]):
            callee, ret = c.call_callee[e], c.call_ret[e]
            if c.tail_ret[ret]:
                # A call in tail position returns straight to the caller's caller: no frame, so
                # right recursion (`list ::= item list?`) keeps the stack flat.
                m = intern_node(c, I64(c.rule_start[callee]), I64(ps))
            else:
                r = intern_node(c, I64(ret), I64(ps))
                if r < 0:
                    return r
                one[0] = r
                m = intern_node(c, I64(c.rule_start[callee]), intern_parents(c, one, I64(1)))
            if m < 0:
                return m
            if c.mark[m] != gen:
                c.mark[m] = gen
                if ns == c.dfs_stack.shape[0]:
                    c.dfs_stack = _grow(c.dfs_stack, ns + 1, I64(0))
                c.dfs_stack[ns] = m
                ns += 1
        if c.final_rule[q] >= 0:  # the frame pops: continue in every parent
            start = c.ps_start[ps]
            for i in range(start, start + c.ps_len[ps]):
                p = c.ps_pool[i]
                if p == EMPTY_STACK:
                    flags |= ACCEPTING
                elif p == HOLE_STACK:
                    flags |= EXITS
                elif c.mark[p] != gen:
                    c.mark[p] = gen
                    if ns == c.dfs_stack.shape[0]:
                        c.dfs_stack = _grow(c.dfs_stack, ns + 1, I64(0))
                    c.dfs_stack[ns] = p
                    ns += 1
    nk = _sort_unique(c.dfs_kernel, I64(nk))
    if c.clo_pool_n + nk > c.clo_pool.shape[0]:
        c.clo_pool = _grow_pool(c.clo_pool, c.clo_pool_n + nk)
    for i in range(nk):
        c.clo_pool[c.clo_pool_n + i] = c.dfs_kernel[i]
    c.clo_start[nid] = c.clo_pool_n
    c.clo_len[nid] = nk
    c.clo_flags[nid] = flags
    c.clo_pool_n += nk
    return 0


@njit(cache=True, nogil=True)
def _config_of_kernel(c, kernel, nk, flags):  # pragma: no cover
    """Merge kernel nodes sharing a top state (uniting their parent sets), then intern."""
    if nk == 0 and flags == 0:
        return DEAD
    tops = np.empty(nk, np.int64)
    for i in range(nk):
        tops[i] = (np.int64(c.node_q[kernel[i]]) << 32) | np.int64(kernel[i])
    _sort_run(tops, I64(nk))
    out = np.empty(nk, np.int32)
    no = 0
    most = 0
    for i in range(nk):
        most += c.ps_len[c.node_ps[kernel[i]]]
    members = np.empty(most, np.int32)  # (sized first: GROWN_IN_LOOP)
    i = 0
    while i < nk:
        q = tops[i] >> 32
        j = i + 1
        while j < nk and (tops[j] >> 32) == q:
            j += 1
        if j == i + 1:
            out[no] = np.int32(tops[i] & 0xFFFFFFFF)
        else:
            nm = 0
            for k in range(i, j):
                ps = c.node_ps[np.int32(tops[k] & 0xFFFFFFFF)]
                for t in range(c.ps_start[ps], c.ps_start[ps] + c.ps_len[ps]):
                    members[nm] = c.ps_pool[t]
                    nm += 1
            nm = _sort_unique(members, I64(nm))
            merged = intern_node(c, I64(q), intern_parents(c, members, I64(nm)))
            if merged < 0:
                return merged
            out[no] = merged
        no += 1
        i = j
    _sort_run(out, I64(no))
    return intern_config(c, out, I64(no), I64(flags))


@njit(cache=True, nogil=True)
def initial_config(c, root_rule):  # pragma: no cover
    bottom = np.full(1, EMPTY_STACK, np.int32)
    root = intern_node(c, I64(c.rule_start[root_rule]), intern_parents(c, bottom, I64(1)))
    if root < 0:
        return root
    status = closure(c, root)
    if status < 0:
        return status
    start, n = c.clo_start[root], c.clo_len[root]
    return _config_of_kernel(c, c.clo_pool[start:start + n].copy(), I64(n), I64(c.clo_flags[root]))


# ---------------------------------------------------------------------------------- rows


@njit(cache=True, nogil=True)
def _step(c, cfg, b):  # pragma: no cover
    """The configuration after byte ``b`` from ``cfg`` (DEAD, or a status < DEAD)."""
    start, n = c.cfg_start[cfg], c.cfg_len[cfg]
    # Seeds: (target, parent set) per matching edge; equal targets merge their parent sets.
    # Each buffer is sized by a counting pass first: see GROWN_IN_LOOP.
    nseeds = 0
    for i in range(start, start + n):
        q = c.node_q[c.cfg_pool[i]]
        for e in range(c.e_ptr[q], c.e_ptr[q + 1]):
            if c.e_lo[e] <= b <= c.e_hi[e]:
                nseeds += 1
    if nseeds == 0:
        return DEAD
    seeds = np.empty(nseeds, np.int64)
    nseeds = 0
    for i in range(start, start + n):
        node = c.cfg_pool[i]
        q = c.node_q[node]
        for e in range(c.e_ptr[q], c.e_ptr[q + 1]):
            if c.e_lo[e] <= b <= c.e_hi[e]:
                seeds[nseeds] = (np.int64(c.e_dst[e]) << 32) | np.int64(c.node_ps[node])
                nseeds += 1
    _sort_run(seeds, I64(nseeds))
    roots = np.empty(nseeds, np.int32)
    nroots = 0
    flags = 0
    most = 0
    for k in range(nseeds):
        most += c.ps_len[np.int32(seeds[k] & 0xFFFFFFFF)]
    members = np.empty(most, np.int32)
    i = 0
    while i < nseeds:
        t = seeds[i] >> 32
        j = i + 1
        while j < nseeds and (seeds[j] >> 32) == t:
            j += 1
        if j == i + 1:
            ps = np.int32(seeds[i] & 0xFFFFFFFF)
        else:
            nm = 0
            for k in range(i, j):
                p = np.int32(seeds[k] & 0xFFFFFFFF)
                for x in range(c.ps_start[p], c.ps_start[p] + c.ps_len[p]):
                    members[nm] = c.ps_pool[x]
                    nm += 1
            nm = _sort_unique(members, I64(nm))
            ps = intern_parents(c, members, I64(nm))
        seed = intern_node(c, I64(t), I64(ps))
        if seed < 0:
            return seed
        status = closure(c, seed)  # (uses the visit marks: collect the kernels afterwards)
        if status < 0:
            return status
        roots[nroots] = seed
        nroots += 1
        i = j
    gen = _next_gen(c)
    most = 0
    for r in range(nroots):
        most += c.clo_len[roots[r]]
    kernel = np.empty(most, np.int32)
    nk = 0
    for r in range(nroots):
        seed = roots[r]
        flags |= c.clo_flags[seed]
        for x in range(c.clo_start[seed], c.clo_start[seed] + c.clo_len[seed]):
            m = c.clo_pool[x]
            if c.mark[m] != gen:
                c.mark[m] = gen
                kernel[nk] = m
                nk += 1
    return _config_of_kernel(c, kernel, I64(nk), I64(flags))


@njit(cache=True, nogil=True)
def _segment(c, cfg, b):  # pragma: no cover
    """[lo, hi): the bytes around ``b`` on which no edge of ``cfg``'s nodes begins or ends
    (they all step alike)."""
    lo, hi = 0, 256
    start, n = c.cfg_start[cfg], c.cfg_len[cfg]
    for i in range(start, start + n):
        q = c.node_q[c.cfg_pool[i]]
        for e in range(c.e_ptr[q], c.e_ptr[q + 1]):
            for edge in (np.int64(c.e_lo[e]), np.int64(c.e_hi[e]) + 1):
                if edge <= b:
                    lo = max(lo, edge)
                else:
                    hi = min(hi, edge)
    return lo, hi


@njit(cache=True, nogil=True)
def expand_cell(c, cfg, b):  # pragma: no cover
    """Compute the segment of ``cfg``'s row that byte ``b`` falls in. Returns 0 or a status."""
    if c.table[cfg, b] != UNEXPANDED:
        return 0
    lo, hi = _segment(c, cfg, b)
    target = _step(c, cfg, b)
    if target < DEAD:
        return target
    c.table[cfg, lo:hi] = target  # after the step: interning may have grown the table
    return 0


@njit(cache=True, nogil=True)
def expand_row(c, cfg):  # pragma: no cover
    """Compute the whole transition row of ``cfg`` (no-op if done), a segment at a time,
    skipping segments a walk already computed. Returns 0 or a status."""
    if c.row_done[cfg]:
        return 0
    b = 0
    while b < 256:
        lo, hi = _segment(c, cfg, I64(b))
        if c.table[cfg, b] == UNEXPANDED:
            target = _step(c, cfg, I64(b))
            if target < DEAD:
                return target
            c.table[cfg, lo:hi] = target
        b = hi
    c.row_done[cfg] = True
    return 0


@njit(cache=True, nogil=True)
def step_bytes(c, cfg, data):  # pragma: no cover
    """The configuration after the bytes ``data`` (uint8), DEAD, or a status."""
    for b in data:
        if cfg < 0:
            return cfg
        if c.table[cfg, b] == UNEXPANDED:
            status = expand_cell(c, I64(cfg), I64(b))
            if status < 0:
                return status
        cfg = c.table[cfg, b]
    return cfg


@njit(cache=True, nogil=True)
def row_shape(c, cfg):  # pragma: no cover
    """(status, bytes looping back to ``cfg``, lowest live byte, highest live byte) of its row,
    computing the row first: what region detection asks of every state it sees."""
    status = expand_row(c, I64(cfg))
    if status < 0:
        return status, 0, -1, -1
    loops, lo, hi = 0, -1, -1
    for b in range(256):
        t = c.table[cfg, b]
        if t == cfg:
            loops += 1
        if t >= 0:
            if lo < 0:
                lo = b
            hi = b
    return 0, loops, lo, hi


# ---------------------------------------------------------------------------------- truncation


@njit(cache=True, nogil=True)
def _truncated_node(c, nid, keep):  # pragma: no cover
    if c.node_depth[nid] <= keep:
        return nid
    ps = c.node_ps[nid]
    members = np.empty(c.ps_len[ps] + 1, np.int32)
    nm = 0
    if keep == 1:
        members[0] = HOLE_STACK
        nm = 1
    else:
        for i in range(c.ps_start[ps], c.ps_start[ps] + c.ps_len[ps]):
            p = c.ps_pool[i]
            if p >= 0:
                p = _truncated_node(c, I64(p), keep - 1)
                if p < 0:
                    return p
            members[nm] = p
            nm += 1
        nm = _sort_unique(members, I64(nm))
    return intern_node(c, I64(c.node_q[nid]), intern_parents(c, members, I64(nm)))


@njit(cache=True, nogil=True)
def truncate(c, cfg, keep):  # pragma: no cover
    """``cfg`` with every stack cut to its top ``keep`` frames over a HOLE (flags cleared)."""
    return _truncate(c, cfg, keep, I64(NO_NODE), keep)


@njit(cache=True, nogil=True)
def truncate_over(c, cfg, parent):  # pragma: no cover
    """``cfg`` with the stacks of its nodes whose one parent is node ``parent`` cut to two frames
    and every other stack to one, over a HOLE (flags cleared): the top frames of a counted
    chain's state with its place in the chain kept, the same under every caller."""
    return _truncate(c, cfg, I64(1), parent, I64(2))


@njit(cache=True, nogil=True)
def _truncate(c, cfg, keep, parent, keep_over):  # pragma: no cover
    """``cfg``'s stacks cut to ``keep`` frames, those of nodes whose one parent is ``parent`` to
    ``keep_over``."""
    start, n = c.cfg_start[cfg], c.cfg_len[cfg]
    kernel = np.empty(max(n, 1), np.int32)
    for i in range(n):
        nid = c.cfg_pool[start + i]
        ps = c.node_ps[nid]
        k = keep_over if c.ps_len[ps] == 1 and c.ps_pool[c.ps_start[ps]] == parent else keep
        m = _truncated_node(c, I64(nid), I64(k))
        if m < 0:
            return m
        kernel[i] = m
    nk = _sort_unique(kernel, I64(n))
    if nk == 0:
        return intern_config(c, kernel, I64(0), I64(0))
    return _config_of_kernel(c, kernel, I64(nk), I64(0))


@njit(cache=True, nogil=True)
def split_config(c, cfg):  # pragma: no cover
    """One configuration per kernel node of ``cfg`` (flags cleared): the parts whose languages
    unite into ``cfg``'s, each shareable with every configuration that holds the same node."""
    start, n = c.cfg_start[cfg], c.cfg_len[cfg]
    out = np.empty(n, np.int32)
    one = np.empty(1, np.int32)
    for i in range(n):
        one[0] = c.cfg_pool[start + i]
        part = intern_config(c, one, I64(1), I64(0))
        if part < 0:
            return out[:0], part
        out[i] = part
    return out, 0


# ---------------------------------------------------------------------------------- siblings


@njit(cache=True, nogil=True)
def _agree(c, x, y, depth, budget):  # pragma: no cover
    """1 when every byte string leads ``x`` and ``y`` to one state (or both to dead ones) within
    ``depth`` bytes, through states with equal exit flags; 0 when not shown; < 0 a status.
    ``budget[0]``: state pairs left to examine (exhausted: 0)."""
    stack = np.empty((64, 3), np.int64)
    stack[0, 0], stack[0, 1], stack[0, 2] = x, y, depth
    n = 1
    while n > 0:
        n -= 1
        a, b, d = stack[n, 0], stack[n, 1], stack[n, 2]
        if a == b:
            continue
        budget[0] -= 1
        if d == 0 or a < 0 or b < 0 or budget[0] < 0 or c.exits[a] != c.exits[b]:
            return 0
        status = expand_row(c, I64(a))
        if status < 0:
            return status
        status = expand_row(c, I64(b))
        if status < 0:
            return status
        if n + 256 > stack.shape[0]:  # room for the row's pairs before its loop (GROWN_IN_LOOP)
            grown = np.empty((2 * n + 256, 3), np.int64)
            for r in range(n):
                grown[r, 0], grown[r, 1], grown[r, 2] = stack[r, 0], stack[r, 1], stack[r, 2]
            stack = grown
        last_a, last_b = -5, -5
        for byte in range(256):
            ta, tb = c.table[a, byte], c.table[b, byte]
            if (ta < 0) != (tb < 0):
                return 0
            if ta != tb and (ta != last_a or tb != last_b):
                stack[n, 0], stack[n, 1], stack[n, 2] = ta, tb, d - 1
                n += 1
                last_a, last_b = ta, tb
    return 1


@njit(cache=True, nogil=True)
def live_bytes(c, cfg):  # pragma: no cover
    """(status, how many bytes lead somewhere from ``cfg``), its row computed first."""
    status = expand_row(c, I64(cfg))
    if status < 0:
        return status, 0
    n = 0
    for byte in range(256):
        if c.table[cfg, byte] >= 0:
            n += 1
    return 0, n


@njit(cache=True, nogil=True)
def config_depth(c, cfg):  # pragma: no cover
    """The depth of the deepest stack node of configuration ``cfg`` (0 when it has none)."""
    depth = 0
    start = c.cfg_start[cfg]
    for k in range(start, start + c.cfg_len[cfg]):
        d = c.node_depth[c.cfg_pool[k]]
        if d > depth:
            depth = d
    return depth


@njit(cache=True, nogil=True)
def config_size(c, cfg):  # pragma: no cover
    return c.cfg_len[cfg]


@njit(cache=True, nogil=True)
def _edge_bytes(c, cfg):  # pragma: no cover
    """How many bytes begin an edge of some node of ``cfg``: at least its live bytes."""
    covered = np.zeros(256, np.bool_)
    start, n = c.cfg_start[cfg], c.cfg_len[cfg]
    for i in range(start, start + n):
        q = c.node_q[c.cfg_pool[i]]
        for e in range(c.e_ptr[q], c.e_ptr[q + 1]):
            for b in range(c.e_lo[e], c.e_hi[e] + 1):
                covered[b] = True
    count = 0
    for b in range(256):
        if covered[b]:
            count += 1
    return count


@njit(cache=True, nogil=True)
def sibling_of(c, s, min_live, depth, max_pairs):  # pragma: no cover
    """(sibling, bytes on which the two differ (see :func:`differing_bytes`), status) of ``s``:
    the state most of its live bytes lead to (the lowest such id on a tie), when ``s`` has at
    least ``min_live`` live bytes, the sibling is another state with the same exit flag, and
    their rows agree on at least half as many bytes as ``s`` has live ones; else sibling -1."""
    none = np.empty(0, np.int64)
    if not c.row_done[s] and _edge_bytes(c, s) < min_live:
        return -1, none, 0  # (most states: decided without computing their row)
    status = expand_row(c, I64(s))
    if status < 0:
        return -1, none, status
    targets = np.empty(256, np.int64)
    counts = np.zeros(256, np.int64)
    k = 0
    live = 0
    for byte in range(256):
        t = c.table[s, byte]
        if t < 0:
            continue
        live += 1
        j = 0
        while j < k and targets[j] != t:
            j += 1
        if j == k:
            targets[k] = t
            k += 1
        counts[j] += 1
    if live < min_live:
        return -1, none, 0
    best = 0
    for j in range(1, k):
        if counts[j] > counts[best] or (counts[j] == counts[best] and targets[j] < targets[best]):
            best = j
    f = targets[best]
    if f == s or c.exits[f] != c.exits[s]:
        return -1, none, 0
    status = expand_row(c, I64(f))
    if status < 0:
        return -1, none, status
    same = 0
    for byte in range(256):
        if c.table[f, byte] == c.table[s, byte]:
            same += 1
    if 2 * same < live:
        return -1, none, 0  # most bytes lead elsewhere from the two (a counted repeat)
    differ, status = differing_bytes(c, s, f, depth, max_pairs)
    if status < 0:
        return -1, none, status
    return f, differ, 0


@njit(cache=True, nogil=True)
def differing_bytes(c, s, f, depth, max_pairs):  # pragma: no cover
    """(bytes on which ``s`` and ``f`` lead to states that do not agree within ``depth`` bytes,
    status): only tokens starting with one of them can walk differently from the two."""
    out = np.empty(256, np.int64)
    no = 0
    status = expand_row(c, I64(s))
    if status < 0:
        return out[:0], status
    status = expand_row(c, I64(f))
    if status < 0:
        return out[:0], status
    budget = np.full(1, max_pairs, np.int64)
    last_a, last_b, last_ok = -5, -5, 1
    for byte in range(256):
        ta, tb = c.table[s, byte], c.table[f, byte]
        if ta == tb:
            continue
        if ta != last_a or tb != last_b:
            last_ok = _agree(c, ta, tb, depth, budget)
            if last_ok < 0:
                return out[:0], last_ok
            last_a, last_b = ta, tb
        if last_ok == 0:
            out[no] = byte
            no += 1
    return out[:no], 0

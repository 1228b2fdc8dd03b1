"""Who gets a row of the engine's batch: admission into the batch, preemption and turn-taking.

The batch is shared fairly between API requests (a ``group``: the n choices and prompts of one request),
not handed out in arrival order, so one request with many long sequences cannot starve the others:

- a free row goes to the waiting group with the fewest rows in the batch (ties: the one served longest ago);
- when the batch is full, a row of a group holding at least two rows more than a waiting group is
  preempted for it at once, and a waiting group holding no row at all preempts a row that has run
  ``SERVE_PREEMPT_MIN_STEPS`` steps since it joined (time slices when there are more groups than rows);
- a preempted row keeps its tokens, text and sampler and goes back to the front of its group; when it
  returns, its prompt and the tokens it already generated are prefilled again (its KV cache was dropped),
  and it continues exactly where it stopped.

This module decides; the engine (:mod:`kubetune.serve.engine`) carries it out: it drops the preempted rows
from the KV cache, puts them back in their groups and prefills the admitted ones.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import TYPE_CHECKING, Any

from .. import constants as C

if TYPE_CHECKING:
    from .engine import _Row


class _Group:
    """The rows of one API request waiting for a place in the batch, and when it last got or lost one."""

    _counter = 0

    def __init__(self, key: Any, *, served: int) -> None:
        self.key = key
        self.waiting: deque[_Row] = deque()
        self.served = served  # the step at which it last got or lost a row (round-robin order)
        _Group._counter += 1
        self.order = _Group._counter  # arrival order breaks the remaining ties


def _take_turns(groups: dict[Any, _Group], rows: list[_Row], *, max_batch_size: int, step: int) -> tuple[list[int], list[_Row]]:
    """This step's turn: which waiting rows join the batch and which batch rows are preempted for them.

    Admitted rows are taken out of their groups (a group left with no waiting row leaves ``groups``) and
    their groups marked served at ``step``. Rows are admitted until their tokens to prefill reach
    ``SERVE_PREFILL_TOKENS_PER_STEP`` (at least one row joins), so long joins spread over several steps.

    Args:
        groups: the groups with rows waiting, by key (changed in place).
        rows: the rows in the batch now.
        max_batch_size: most rows in the batch.
        step: the engine's decode step now.

    Returns:
        The indices in ``rows`` to preempt, and the rows to prefill into the batch.
    """
    held = Counter(r.group for r in rows)
    room = max_batch_size - len(rows)
    evict: list[int] = []
    admit: list[_Row] = []
    prefill = 0
    lost: set[_Group] = set()  # groups that lost a row in this round wait for the next one
    while prefill < C.SERVE_PREFILL_TOKENS_PER_STEP or not admit:
        group = _next_group(groups, held, lost)
        if group is None:
            break
        if room == 0:
            victim = _victim(rows, held, group, evict)
            if victim is None:
                break
            evict.append(victim)
            held[rows[victim].group] -= 1
            lost.add(rows[victim].group)
            room += 1
        row = group.waiting.popleft()
        if not group.waiting:
            del groups[group.key]
        group.served = step
        held[group] += 1
        room -= 1
        prefill += row.length
        admit.append(row)
    return evict, admit


def _next_group(groups: dict[Any, _Group], held: Counter, lost: set) -> _Group | None:
    """The waiting group to serve next: fewest rows in the batch, then served longest ago, then oldest."""
    best = None
    for g in groups.values():
        if g in lost:
            continue
        rank = (held[g], g.served, g.order)
        if best is None or rank < best[0]:
            best = (rank, g)
    return best[1] if best else None


def _victim(rows: list[_Row], held: Counter, group: _Group, evicted: list[int]) -> int | None:
    """The batch row to preempt for ``group`` (None: it waits): from the group holding most rows, the row that
    has run longest since it joined; only if that group holds two rows more, or ``group`` holds none and the
    row has had its time slice."""
    best = None
    mine = held[group]
    for i, r in enumerate(rows):
        if r.group is group or i in evicted:
            continue
        theirs = held[r.group]
        if not (theirs >= mine + 2 or (mine == 0 and r.ran >= C.SERVE_PREEMPT_MIN_STEPS)):
            continue
        rank = (theirs, r.ran)
        if best is None or rank > best[0]:
            best = (rank, i)
    return best[1] if best else None

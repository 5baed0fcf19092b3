"""Which jobs a claim takes: the ready jobs, locked, in the article's order (``priority
DESC, run_at, id``), walking a partial ready index and never sorting the backlog; the
serial keys' turn, and the claim under concurrency and rate limits (`ClaimLimits`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    true,
    tuple_,
    union_all,
)

from ..schema import JobStatus
from ._common import in_names
from ._job_limits import ClaimLimits, allowance, limit_key, running_by_key
from ._queue_pause import not_paused

#: Above this many names, a claim filters with ``IN`` on the order index instead of one
#: branch per name (each branch locks up to ``batch`` rows; see docs/performance.md).
MAX_CLAIM_BRANCHES = 64


def ready_jobs(
    t: Any,
    now: Any,
    size: int,
    queue_names: tuple[str, ...] | None,
    kind_names: tuple[str, ...] | None,
    paused: object | None = None,
    carried: tuple[Any, ...] = (),
    excluded_kinds: tuple[str, ...] = (),
) -> Select[Any]:
    """The ids of the next ``size`` ready jobs, locked, walking a ready index in order.

    ``carried`` columns of the job come out after the id (the limited claim ranks them);
    ``excluded_kinds`` are skipped as the walk meets them (the limited claim takes those
    kinds in branches of their own).

    Every shape walks one of the three partial ready indexes in the article's order
    (``priority DESC, run_at, id``) and stops after ``size`` rows; none sorts the backlog:

    - nothing named: ``{t}_ready_order_idx`` (``priority DESC, run_at, id``);
    - one queue, or one kind: ``{t}_ready_idx`` / ``{t}_ready_kind_idx``, led by that name;
    - several queues, or (no queue named) several kinds — the worker's default: the kinds
      it handles: one ``LATERAL`` branch per name, each the first ``size`` jobs of its name
      in order, merged by a sort of at most ``names * size`` rows.
    - queues and kinds: the branches are the queues', each filtering the kinds as it walks
      its queue (the workers of one app share its handlers, so a queue rarely holds many
      jobs of kinds its worker does not handle; a kind's jobs often sit in other queues).

    A single ``IN`` walk of the order index would be cheaper when the named kinds fill the
    head of the backlog, and walks the whole backlog when they sit behind other kinds'
    jobs (measured: 380 ms per claim behind 1,000,000 jobs); the branches cost the same at
    any backlog.
    """
    # 'pending' inline, not a bound parameter: a prepared claim (psycopg prepares a statement
    # on its 5th run) may get a generic plan, which can use the partial ready indexes only if
    # their predicate is in the SQL text.
    pending = literal_column(f"'{JobStatus.PENDING.value}'", t.c.status.type)
    order = (t.c.priority.desc(), t.c.run_at, t.c.id)
    # The limit inline too: for a generic plan, a bound LIMIT is a guess of a tenth of the
    # table, for which the planner then joins the claimed ids by a sequential scan.
    limit = literal_column(str(size), Integer())
    ready = select(t.c.id, *carried).where(t.c.status == pending, t.c.run_at <= now)
    turn = serial_turn(t)
    if turn is not None:
        ready = ready.where(turn)
    if excluded_kinds:
        ready = ready.where(t.c.kind.not_in(excluded_kinds))
    if queue_names is not None:
        branch_column, names, other = t.c.queue, queue_names, (t.c.kind, kind_names)
    elif kind_names is not None:
        branch_column, names, other = t.c.kind, kind_names, (t.c.queue, None)
    else:
        if paused is not None:
            ready = ready.where(not_paused(paused, t.c.queue))
        return ready.order_by(*order).limit(limit).with_for_update(skip_locked=True)
    by_queue = branch_column is t.c.queue
    if other[1] is not None:
        ready = ready.where(in_names(other[0], other[1]))
    if len(names) == 1 or len(names) > MAX_CLAIM_BRANCHES:
        ready = ready.where(in_names(branch_column, names))
        if paused is not None:
            # One queue named: whether it is paused does not depend on the row, so the check
            # is a one-time filter and the walk stays an index scan.
            single = by_queue and len(names) == 1
            queue = literal(names[0], Text()) if single else t.c.queue
            ready = ready.where(not_paused(paused, queue))
        return ready.order_by(*order).limit(limit).with_for_update(skip_locked=True)
    each = (
        func.unnest(bindparam("claim_names", list(names), type_=ARRAY(Text())))
        .table_valued("name")
        .render_derived(name="claim_names")
    )
    if paused is not None:
        # A branch per queue: a paused queue's branch is skipped whole, not walked.
        ready = ready.where(not_paused(paused, each.c.name if by_queue else t.c.queue))
    extra = [c for c in (t.c.priority, t.c.run_at) if not any(c is k for k in carried)]
    branch = (
        ready.add_columns(*extra)
        .where(branch_column == each.c.name)
        .order_by(*order)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .lateral("branch")
    )
    return (
        select(branch.c.id, *(branch.c[c.name] for c in carried))
        .select_from(each)
        .join(branch, true())
        .order_by(branch.c.priority.desc(), branch.c.run_at, branch.c.id)
        .limit(limit)
    )


def serial_turn(t: Any) -> ColumnElement[bool] | None:
    """The claim's test for serial keys: a job with a ``lock_key`` is ready only when no
    job of its key is running and none before it in ``(lock_seq, id)`` order is pending
    (``None`` for a table without the column: made before serial keys, not migrated yet).

    Race-free in one statement: ``lock_seq`` follows commit order within a key (the table's
    serial trigger), so a job before this one was visible to the claim, and stays pending or
    running in its snapshot until its end commits; a concurrent claim of it holds its row
    lock, which ``SKIP LOCKED`` leaves to that claim. It walks ``{t}_serial_idx``.
    """
    if "lock_key" not in t.c:
        return None
    unfinished = [
        literal_column(f"'{status.value}'", t.c.status.type)
        for status in (JobStatus.PENDING, JobStatus.RUNNING)
    ]
    other = t.alias("same_key")
    ahead = exists().where(
        other.c.lock_key == t.c.lock_key,
        or_(other.c.status == unfinished[0], other.c.status == unfinished[1]),
        or_(
            other.c.status == unfinished[1],
            tuple_(other.c.lock_seq, other.c.id) < tuple_(t.c.lock_seq, t.c.id),
        ),
    )
    return or_(t.c.lock_key.is_(None), ~ahead)


def limited_ready_jobs(
    t: Any,
    now: Any,
    size: int,
    queue_names: tuple[str, ...] | None,
    kind_names: tuple[str, ...] | None,
    paused: object | None,
    limits: ClaimLimits,
) -> Select[Any]:
    """The ids (and kinds) of the next ``size`` ready jobs that ``limits`` allow, locked.

    Candidates come from branches that each walk a ready index in order: the kinds without
    a limit as `ready_jobs` takes them; each limited kind its own walk of
    ``{t}_ready_kind_idx``, of at most what it could be allowed (``running``, ``size``, or
    ``lookahead`` jobs when limited per key). The candidates are ranked in claim order per
    kind, per key and then per queue, and a job is kept only while its rank is within what
    its limits allow now: the limit, less the jobs running (and, for a rate, the claims in
    the window). The first ``size`` kept, in claim order, are claimed; the candidates not
    kept were locked only until the claim's transaction ends.
    """
    pending = literal_column(f"'{JobStatus.PENDING.value}'", t.c.status.type)
    order = (t.c.priority.desc(), t.c.run_at, t.c.id)
    kinds = limits.kinds
    carried = (t.c.kind, t.c.queue, t.c.priority, t.c.run_at)
    parts: list[Select[Any]] = []
    free_kinds = None if kind_names is None else tuple(k for k in kind_names if k not in kinds)
    if kind_names is None or free_kinds:
        free = ready_jobs(
            t,
            now,
            size,
            queue_names,
            free_kinds,
            paused,
            carried=carried,
            excluded_kinds=tuple(kinds) if kind_names is None else (),
        ).subquery("free")
        parts.append(select(*free.c, literal(None, Text()).label("limit_key")))
    for n, (kind, lim) in enumerate(kinds.items()):
        branch = select(*carried, limit_key(t, lim).label("limit_key")).where(
            t.c.status == pending, t.c.run_at <= now, t.c.kind == kind
        )
        turn = serial_turn(t)
        if turn is not None:
            branch = branch.where(turn)
        if queue_names is not None:
            branch = branch.where(in_names(t.c.queue, queue_names))
        if paused is not None:
            branch = branch.where(not_paused(paused, t.c.queue))
        if lim.by is not None:
            most = max(size, limits.lookahead)
        else:
            most = min(size, lim.running) if lim.running is not None else size
        walked = (
            branch.add_columns(t.c.id)
            .order_by(*order)
            .limit(literal_column(str(most), Integer()))
            .with_for_update(skip_locked=True)
            .subquery(f"limited_{n}")
        )
        parts.append(select(walked.c.id, *(walked.c[c.name] for c in carried), walked.c.limit_key))
    candidates = (parts[0] if len(parts) == 1 else union_all(*parts)).subquery("candidates")
    c = candidates.c
    in_order = (c.priority.desc(), c.run_at, c.id)
    ranked = select(
        *c,
        func.row_number().over(partition_by=c.kind, order_by=in_order).label("rank_in_kind"),
        func.row_number()
        .over(partition_by=(c.kind, c.limit_key), order_by=in_order)
        .label("rank_in_key"),
    ).subquery("ranked")
    r = ranked.c
    kept = select(r.id, r.kind, r.queue, r.priority, r.run_at)
    conditions = []
    for n, (kind, lim) in enumerate(kinds.items()):
        allowed = []
        room = allowance(t, lim, limits.log, now)
        if room is not None:
            allowed.append(r.rank_in_kind <= room)
        if lim.by is not None and lim.running is not None:
            running = running_by_key(t, lim, f"running_by_key_{n}")
            kept = kept.join_from(
                ranked,
                running,
                and_(r.kind == kind, r.limit_key.is_not_distinct_from(running.c.limit_key)),
                isouter=True,
            )
            allowed.append(r.rank_in_key <= lim.running - func.coalesce(running.c.running, 0))
        conditions.append(or_(r.kind != kind, and_(*allowed)))
    kept = kept.where(*conditions)
    if limits.queues:
        by_queue = kept.subquery("kept")
        k = by_queue.c
        queue_ranked = select(
            *k,
            func.row_number()
            .over(partition_by=k.queue, order_by=(k.priority.desc(), k.run_at, k.id))
            .label("rank_in_queue"),
        ).subquery("queue_ranked")
        q = queue_ranked.c
        kept = select(q.id, q.kind, q.queue, q.priority, q.run_at).where(
            *(
                or_(q.queue != queue, q.rank_in_queue <= room)
                for queue, lim in limits.queues.items()
                if (room := allowance(t, lim, limits.log, now)) is not None
            )
        )
    final = kept.subquery("allowed")
    f = final.c
    return (
        select(f.id, f.kind)
        .order_by(f.priority.desc(), f.run_at, f.id)
        .limit(literal_column(str(size), Integer()))
    )

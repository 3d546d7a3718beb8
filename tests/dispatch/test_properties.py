"""Property-based dispatch invariants: random callbacks, delays, failures and barriers.

A hand-written producer drives an :class:`~trainbus.Engine` directly (the training
loop's role) through a short run, stamping a shared counter right before each publish
and right after it returns. Every handler stamps the same counter when it starts and
ends, so the order of everything that happened on any thread can be compared:

- each callback's calls are a prefix of its expected sequence (in order, none twice),
  and the whole sequence when nothing failed (nothing dropped);
- a callback never runs two handlers at once; for a logger destination that includes
  its record handler (``log_metrics``) against its event handlers, whatever mix of sync,
  async and ``@blocking`` (issue 11, defect 1);
- every record logged reaches every destination exactly once, and a record logged
  before another (its ``log_metrics`` call returned before the other's began) reaches
  every destination first;
- when a barrier event's publish returned, every handler of every event it had to wait
  for (all earlier ones, or those at least ``max_lag`` batches back) had finished, and
  a ``@blocking`` handler had finished along with its callback's backlog (for a
  destination, the records logged before the event was published);
- ``close`` runs exactly once per callback, after every handler of every callback (it
  is a barrier) and every record, every ``post_close`` after every ``close``; an
  injected failure is raised as itself, with a note naming the callback (and the event).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import anyio
import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.dispatch._random_probes import (
    BARRIER_CHOICES,
    BATCH,
    Boom,
    DestProbe,
    Probe,
    Spec,
    dest_specs,
    probe_class,
    specs,
)
from trainbus import Engine, Event, Logger, State

E = Event


def required_upto(seq: int, events: list[Event], max_lag: int) -> int:
    """The last seq whose handlers must have finished when the barrier at ``seq`` returns."""
    if max_lag == 0:
        return seq
    batch_ends = [s for s, e in enumerate(events[: seq + 1]) if e is E.BATCH_END]
    if len(batch_ends) <= max_lag:
        return -1
    return batch_ends[len(batch_ends) - max_lag - 1]


def run_scenario(
    backend: str,
    cb_specs: list[Spec],
    n_batches: int,
    barriers: frozenset[Event],
    max_lag: int,
    queue_size: int,
    failure: tuple[int, int] | tuple[int, int, bool] | None,
    d_specs: Sequence[Spec] = (),
) -> None:
    """Run one random scenario and check every invariant of the module docstring.

    ``failure`` is ``(probe, call[, on_record])``: that probe raises at that call of its
    event handlers, or (a destination, ``on_record``) at that record it receives.
    """
    all_specs = [*cb_specs, *d_specs]  # destinations last, as the Trainer orders them
    events = [E.FIT_START, *(BATCH * n_batches), E.EPOCH_END, E.FIT_END]
    expected = [[s for s, e in enumerate(events) if e in spec.events] for spec in all_specs]
    n_records = sum(
        1
        for spec, seqs in zip(all_specs, expected, strict=True)
        for s in seqs
        if events[s] in spec.logs
    )
    fail_cb = fail_at = fail_record = None
    if failure is not None:
        target = failure[0] % len(all_specs)
        on_record = len(failure) > 2 and failure[2] and all_specs[target].destination
        if on_record and n_records:
            fail_cb, fail_record = target, failure[1] % n_records
        elif not on_record and expected[target]:
            fail_cb, fail_at = target, failure[1] % len(expected[target])

    stamp = itertools.count()
    probes = [
        probe_class(i, spec)(i, spec, stamp, fail_at if i == fail_cb else None)
        for i, spec in enumerate(all_specs)
    ]
    dests = [p for p in probes if isinstance(p, DestProbe)]
    if fail_record is not None:
        failing = probes[fail_cb]  # type: ignore[index]
        assert isinstance(failing, DestProbe)
        failing.fail_record_at = fail_record
    state = State(model=torch.nn.Linear(1, 1), max_duration="1ep")
    engine = Engine(
        state,
        Logger(state),
        probes,
        barriers=barriers,
        max_lag=max_lag,
        queue_size=queue_size,
    )
    pre: dict[int, int] = {}
    post: dict[int, int] = {}

    def produce() -> None:  # the training thread's role
        for seq, event in enumerate(events):
            state.batch = seq  # each handler reads its own event's seq from its snapshot
            if event is E.BATCH_END:
                state.timer.on_batch_complete(1)  # type: ignore[union-attr]
            pre[seq] = next(stamp)
            engine.run_event(event)
            post[seq] = next(stamp)

    raised: list[BaseException] = []

    async def main() -> None:
        with anyio.fail_after(30):
            try:
                await engine.run_cycle(produce)
            except Boom as exc:
                raised.append(exc)

    anyio.run(main, backend=backend)

    # An injected failure is raised as itself, with a note naming callback and event.
    if fail_cb is None:
        assert raised == []
    else:
        assert len(raised) == 1, raised
        notes = "\n".join(getattr(raised[0], "__notes__", []))
        assert f"{type(probes[fail_cb]).__name__}." in notes, notes
        if fail_at is not None:
            failing_event = events[expected[fail_cb][fail_at]]
            assert f"Event.{failing_event.name}" in notes, notes

    for i, probe in enumerate(probes):
        got = [seq for seq, _, _ in probe.calls]
        # In order, none twice, nothing skipped before the end; all of it if no failure.
        assert got == expected[i][: len(got)], i
        if fail_cb is None:
            assert got == expected[i], i
        elif i == fail_cb and fail_at is not None:
            # Nothing after its own failure (see test_d10_a_failed_callback_gets_no_
            # further_handler_calls in test_d10_errors.py).
            assert len(got) == fail_at + 1
        # One handler at a time, records included: (start, end, what) of every call.
        spans = [(start, end, f"{events[seq].name} (seq {seq})") for seq, start, end in probe.calls]
        if isinstance(probe, DestProbe):
            spans += [(start, end, f"record {src}.{k}") for src, k, start, end in probe.records]
        spans.sort()
        name = type(probe).__name__
        for before, after in itertools.pairwise(spans):
            assert before[1] < after[0], f"{name} ran two handlers at once: {before}, {after}"
        if i == fail_cb:  # nothing at all after its own failure, records included
            if fail_at is not None:
                failed = probe.calls[fail_at][1]
            else:
                assert isinstance(probe, DestProbe)
                failed = probe.records[fail_record][2]  # type: ignore[index]
            assert spans[-1][0] == failed, f"{name} ran {spans[-1]} after its failure"
        # close exactly once, after the callback's last handler (and record).
        assert len(probe.closes) == 1 and len(probe.post_closes) == 1, i
        assert all(end < probe.closes[0][0] for _, end, _ in spans), i
    first_close = min(p.closes[0][0] for p in probes)
    assert all(end < first_close for p in probes for _, _, end in p.calls)
    last_close = max(p.closes[0][1] for p in probes)
    assert all(p.post_closes[0] > last_close for p in probes)

    check_records(probes, dests, fail_cb)
    if fail_cb is not None and fail_record is not None:
        assert len(probes[fail_cb].records) == fail_record + 1  # type: ignore[attr-defined]

    ends = [{seq: end for seq, _, end in p.calls} for p in probes]
    for seq, returned_at in post.items():
        event = events[seq]
        if event in barriers:  # every handler it waits for had finished
            upto = required_upto(seq, events, max_lag)
            for i, probe_ends in enumerate(ends):
                for s in expected[i]:
                    if s <= upto:
                        assert probe_ends.get(s, returned_at) < returned_at, (seq, i, s)
        for i, spec in enumerate(all_specs):  # @blocking: it and its backlog had finished
            if event in spec.events and event in spec.blocking:
                for s in expected[i]:
                    if s <= seq:
                        assert ends[i].get(s, returned_at) < returned_at, (seq, i, s)
                probe = probes[i]
                if isinstance(probe, DestProbe):  # records logged before the publish
                    check_record_backlog(probe, probes, pre[seq], returned_at, seq)

    if fail_at is not None and events[expected[fail_cb][fail_at]] in all_specs[fail_cb].blocking:  # type: ignore[index]
        # The training thread was waiting for the failing handler: it published no more.
        assert max(post, default=-1) < expected[fail_cb][fail_at]  # type: ignore[index]


def logged_records(probes: list[Probe]) -> dict[tuple[int, int], tuple[int, int]]:
    """Every record logged: ``(src, k)`` to the stamps before and after the call."""
    return {(p.index, k): (before, after) for p in probes for k, before, after in p.logged}


def check_records(probes: list[Probe], dests: list[DestProbe], fail_cb: int | None) -> None:
    """Each record reaches each destination once; happens-before order is kept."""
    logged = logged_records(probes)
    for dest in dests:
        got = [(src, k) for src, k, _, _ in dest.records]
        counts = Counter(got)
        assert all(n == 1 for n in counts.values()), (dest.index, "a record twice", counts)
        assert set(got) <= set(logged), (dest.index, "a record nobody logged")
        if dest.index != fail_cb:  # a failed destination gets nothing after its failure
            assert set(got) == set(logged), (dest.index, "records lost", set(logged) - set(got))
        for a, b in itertools.combinations(got, 2):  # a delivered before b
            assert not logged[b][1] < logged[a][0], (dest.index, "out of order", a, b)


def check_record_backlog(
    dest: DestProbe, probes: list[Probe], published_at: int, returned_at: int, seq: int
) -> None:
    """A ``@blocking`` handler of ``dest`` ran after the records logged before its event."""
    logged = logged_records(probes)
    starts = {s: start for s, start, _ in dest.calls}
    if seq not in starts:  # it failed earlier: nothing more ran
        return
    received = {(src, k): end for src, k, _, end in dest.records}
    for rid, (_, after) in logged.items():
        if after < published_at and rid in received:
            assert received[rid] < starts[seq] < returned_at, (
                f"{type(dest).__name__}'s @blocking handler of seq {seq} started before record "
                f"{rid[0]}.{rid[1]}, logged before that event was published, was handled"
            )


# Timing decides which interleavings a run shows: shrinking such a failure reruns it
# hundreds of times (minutes) and may lose it; the unshrunk example is printed instead.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
SETTINGS = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# On a failure hypothesis imports libcst to suggest a patch; libcst's import warns, which
# filterwarnings=error would turn into an INTERNALERROR hiding the falsifying example.
@pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning")
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@SETTINGS
@given(
    cb_specs=st.lists(specs(), min_size=1, max_size=5),
    n_batches=st.integers(1, 3),
    barriers=st.frozensets(st.sampled_from(BARRIER_CHOICES)),
    max_lag=st.integers(0, 2),
    queue_size=st.integers(1, 8),
    failure=st.none() | st.tuples(st.integers(0, 4), st.integers(0, 40)),
)
def test_dispatch_invariants_hold_for_random_callbacks(
    backend: str,
    cb_specs: list[Spec],
    n_batches: int,
    barriers: frozenset[Event],
    max_lag: int,
    queue_size: int,
    failure: tuple[int, int] | None,
) -> None:
    run_scenario(backend, cb_specs, n_batches, barriers, max_lag, queue_size, failure)


@pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning")
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(SETTINGS, phases=NO_SHRINK, report_multiple_bugs=False)
@given(
    cb_specs=st.lists(specs(logging=True), min_size=1, max_size=4),
    d_specs=st.lists(dest_specs(), min_size=1, max_size=3),
    n_batches=st.integers(1, 3),
    barriers=st.frozensets(st.sampled_from(BARRIER_CHOICES)),
    max_lag=st.integers(0, 2),
    queue_size=st.integers(1, 8),
    failure=st.none() | st.tuples(st.integers(0, 6), st.integers(0, 80), st.booleans()),
)
@example(  # issue 11, defect 1: a @blocking plain handler beside an in-flight async record
    cb_specs=[
        Spec(
            is_async=False,
            override=False,
            events=frozenset({E.AFTER_FORWARD}),
            blocking=frozenset({E.AFTER_FORWARD}),
            delay_ms=None,
            every=1,
            logs=frozenset({E.AFTER_FORWARD}),
        )
    ],
    d_specs=[
        Spec(
            is_async=False,
            override=False,
            events=frozenset({E.AFTER_BACKWARD}),
            blocking=frozenset({E.AFTER_BACKWARD}),
            delay_ms=None,
            every=1,
            destination=True,
            async_events=frozenset(),
            record_async=True,
            record_delay_ms=2,
        )
    ],
    n_batches=3,
    barriers=frozenset({E.BATCH_END}),
    max_lag=0,
    queue_size=8,
    failure=None,
)
def test_dispatch_invariants_hold_for_random_callbacks_logging_to_destinations(
    backend: str,
    cb_specs: list[Spec],
    d_specs: list[Spec],
    n_batches: int,
    barriers: frozenset[Event],
    max_lag: int,
    queue_size: int,
    failure: tuple[int, int, bool] | None,
) -> None:
    run_scenario(backend, cb_specs, n_batches, barriers, max_lag, queue_size, failure, d_specs)


def test_the_random_destinations_cover_the_mix_that_hid_defect_1() -> None:
    """The generator reaches a ``@blocking`` plain handler beside an async ``log_metrics``."""
    found: list[Spec] = []

    @settings(max_examples=50, derandomize=True, database=None)
    @given(dest_specs())
    def collect(spec: Spec) -> None:
        found.append(spec)

    collect()
    assert any(s.record_async and any(not s.handler_is_async(e) for e in s.blocking) for s in found)
    assert any(not s.record_async and any(s.handler_is_async(e) for e in s.events) for s in found)

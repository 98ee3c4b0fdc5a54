"""The fast path (skip-ahead): many steady decode steps at once, with the same pool calls in the
same order as step by step. It depends on the scheduler; the scheduler depends on it only through
what it owns (``scheduling.scheduler.Scheduler``'s lagging-run hook), never by import."""

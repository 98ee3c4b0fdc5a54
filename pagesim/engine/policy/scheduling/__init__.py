"""Scheduling: requests and sequences, the scheduler and its step orders (pagesim's, vLLM v1's and
v0's), the planning and admission rules, preemption modes and victims, sampling's bookkeeping, the
waiting queue under priority scheduling, presets, and the one seam with an executor
(``output.SchedulerOutput`` out of ``Scheduler.schedule()``, ``Scheduler.update()`` back in)."""

"""The policy's exceptions, in a module of their own: the modules an opt-in compiled
build (``pagesim/engine/compiled.py``) compiles with mypyc cannot define a subclass of a built-in
exception, so they import theirs from here (and re-export it where it was always found)."""


class VllmV0Abort(RuntimeError):
    """Where vLLM 0.6.3 itself stops (an assertion); the scheduler is left consistent."""


class NoFreeBlocksError(RuntimeError):
    """The scheduler asked for more blocks than are free: a policy bug, never a normal outcome."""

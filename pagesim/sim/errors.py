"""The simulator's exceptions, in a module of their own: the modules an opt-in compiled
build (``pagesim/engine/compiled.py``) compiles with mypyc cannot define a subclass of a built-in
exception, so they import theirs from here (and re-export it where it was always found)."""


class SimulationStalled(RuntimeError):
    """The scheduler stopped making progress with requests unfinished."""

"""Validation: the calibrated simulator against the real engine on one workload (``pagesim validate``).

``runs`` executes the simulator, the engine in lockstep with it and the engine on the wall clock;
``compare`` measures how far apart they are; ``validate`` assembles the report; ``plots`` draws
its figures; ``cli`` is the command."""

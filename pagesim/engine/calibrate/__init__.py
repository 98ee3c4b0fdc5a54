"""Calibration: timing the engine's kernels, layers, sampler and policy on this device at the
shapes of the model being simulated, into a profile the simulator's calibrated cost model reads
(``pagesim.sim.cost.profile``). ``pagesim calibrate`` is the command (``pagesim.engine.calibrate.cli``)."""

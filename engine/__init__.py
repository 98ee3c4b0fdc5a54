"""pagesim's serving policy (``engine.policy``, pure Python) and, later, its real engine (torch).

Importing ``engine`` or ``engine.policy`` must not import torch or simpy: the simulator runs the
policy at scale without either, and a test checks ``sys.modules``.
"""

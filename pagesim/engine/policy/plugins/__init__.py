"""Plug-ins: looking policy pieces up by name, loading a user's ``FILE.py:CLASS``, and the guard
that turns a plug-in's wrong return, exception or exit into one error line."""

"""Bringing back what died: the resurrector's passes over the expiry index and the
leader-elected scanner that runs them.

Imports ``dlq`` (past its limit a task is dead-lettered), ``store``, ``broker`` and
``model``.
"""

"""The dead-letter queue: the write that files a failure (``dead_letter``), the shape
of an entry read back (``entries``), paging, counting and deleting (``store``), and
release (``release``).

Imports ``store``, ``broker`` and ``model``.
"""

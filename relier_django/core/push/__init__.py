"""The producer side: ``push``/``apush`` (``producer``), delivery deferred to a
transaction's commit (``aftercommit``), the push-time claim and its undo
(``idempotency``) and admission control (``admission``).

Imports ``store``, ``broker`` and ``model``; the worker side never imports it.
"""

"""Tools built on the same store, for users' own code: the heartbeat lock with fencing
tokens (``lock``) and the sliding-window rate limiter behind ``@rate_limit``
(``ratelimit``).

Imports ``store`` and ``model``.
"""

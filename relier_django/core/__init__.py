"""The Lua-fenced Celery worker core. Imports redis-py and Celery, never Django."""

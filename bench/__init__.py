"""Benchmarks measured against vanilla Celery in the same run."""

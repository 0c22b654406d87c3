"""The composition test (G15): features run together against a real Redis and real
workers, over an explicit matrix (docs/chaos.md, "The composition matrix").

The matrix itself (its axes, each a list of named values, and the combinations left
out, each with its reason) is written out in ``tests/chaos/test_composition.py``; a
new feature joins it there, in the commit that adds the feature. Here:

- ``matrix.py``: what a value, a cell and an exclusion are; the cells of a matrix.
- ``sampling.py``: which cells a run takes (a covering sample, or all), and its seed.
- ``triggers.py``, ``fates.py``: what each trigger and each fate does.
- ``case.py``: one cell's run, its evidence and the invariant it must hold.
- ``lab.py``: what the cells share: servers, workers, the lost-reply proxy.
- ``coordinators.py``: the whole-worker kills, the cancel queue's worker, periodic ticks.
- ``campaign.py``: the chosen cells, all in flight together.

The tasks the cells call: ``testproject/demo/composition_tasks.py``.
"""

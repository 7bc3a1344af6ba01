"""The ``dynask`` command: ``run``, ``serve``, ``keys``, and their flag groups, ``in=text`` and
``in=batch``. The composition root: the one place allowed to import ``web``.
"""

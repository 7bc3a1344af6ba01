"""The ``dynask`` command: ``run``, ``serve``, ``keys``, and their flag groups; ``in=text`` and
``in=batch``, which drive the serving pipeline from the terminal (``local_pipeline``). The
composition root: the one place allowed to import ``web``.
"""

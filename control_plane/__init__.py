"""The serving system, one package per concern: ``api`` (HTTP), ``serving`` (the request
pipeline), ``routing``, ``disagg``, ``reliability``, ``cluster`` (the reconciler),
``planner``, ``graphs``, ``state`` (the database) and ``cli`` (the composition root).
``server`` wires them into one running control plane.

Imports ``actors.api`` and ``actors.runtime``, never the built-in engine's insides.
"""

"""The request pipeline: served models and request types, prompts and tokenization,
placing a request on an actor, the one owner of an admitted request's resources
(``AdmittedRequest``), actor handles (the typed actor boundary) and their load, submit
batching, admission, metrics, and the domain errors it raises (the HTTP layer maps them).
It imports no HTTP layer (``api``), cluster, CLI or planner.
"""

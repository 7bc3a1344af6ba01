"""dynask.actors.engine."""

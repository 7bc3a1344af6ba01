"""dynask.actors."""

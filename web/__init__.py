"""dynask.web."""

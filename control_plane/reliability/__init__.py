"""Surviving lost workers and overload: request migration, noticing lost actors, and the
options that tune both.
"""

"""Autoscaling: the planner's pure decision and the loop that observes and scales."""

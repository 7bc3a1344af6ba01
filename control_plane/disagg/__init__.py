"""Disaggregated prefill and decode: when a prompt is prefilled on another actor, and how."""

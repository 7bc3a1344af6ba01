"""The serving path end to end: streaming load on the control plane, the soak under
failures, the planner, and the whole stack on a GPU."""

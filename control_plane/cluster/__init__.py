"""The Dask cluster as the control plane runs it: the deployment plan, the reconciler that
makes the cluster match it, adopting running actors, the lease that picks which of
several control planes reconciles, admin actions, keeping the database in step, and
``deploy.yaml``.
"""

"""The admin UI: Starlette routes, Jinja2 templates (htmx) and vendored static assets.

``mount.admin_extension`` plugs it into a ``ControlPlane`` at ``/admin``; the CLI (the
composition root) passes it in, so the control plane never imports this package.
"""

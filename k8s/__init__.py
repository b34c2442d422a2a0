"""Kubernetes job manifests for the kit: typed values, Jinja templates, validation, kubectl, local runner.

Imports only jinja2, pyyaml, kubernetes-validate and rich (never torch or CDK); see docs/k8s.md.
"""

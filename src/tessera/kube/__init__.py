"""The Kubernetes adapter: the only code that talks to the API server.

It reads and writes Tessera's custom resources as the typed models of :mod:`tessera.api`, and
posts Events; the agent and the controller build on it and never see raw HTTP.
"""

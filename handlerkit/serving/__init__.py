"""Serving engines for TorchServe-contract handlers: :mod:`handlerkit.serving.ray` (Ray Serve).

Engines are optional extras; importing this package imports none of them.
"""

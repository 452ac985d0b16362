"""Builders for the committed fixtures (private; see fixtures/README.md).

``shapes`` draws the synthetic shapes dataset (images with masks and boxes); ``build`` trains
the fixture models on it and writes ``fixtures/`` and ``handlerkit/assets/demo/``. Run it with
``python -m handlerkit._fixtures``. Importing this package imports neither torch nor PIL.
"""

"""What the tests of handlerkit.serving.frontend share: TorchServe's frontend without any engine (pure Python, a real
Service, asyncio for the serving loop).

The handlers here are a shop's price tagger (rows of ``{"sku", "cents"}`` in, a tag out), not
the fixtures': it records the size of every batch it is handed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

import handlerkit as hk
from handlerkit.service import Service
from handlerkit.serving.frontend import Frontend, settings
from handlerkit.worker.context import MockContext


class PriceTagger:
    """Tags each row ``{"sku", "cents"}`` with a price; a row with negative cents is a bug."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.release = threading.Event()
        self.release.set()

    def handle(self, data: list[Any], context: Any) -> list[Any]:
        self.sizes.append(len(data))
        self.release.wait()
        tags = []
        for row in data:
            item = row.get("body") if isinstance(row, dict) and "body" in row else row
            if context.get_request_header(0, "explain") == "True":
                tags.append({"why": item["sku"]})
                continue
            if item["cents"] < 0:
                raise ValueError(f"negative price for {item['sku']}")
            tags.append(f"{item['sku']}: ${item['cents'] / 100:.2f}")
        return tags


def make_frontend(
    config: dict[str, Any] | None = None, *, handler: Any = None, envelopes: tuple[str, ...] = (), **kwargs: Any
) -> tuple[Frontend, Any]:
    handler = handler if handler is not None else PriceTagger()
    config = {"batchSize": 4, "maxBatchDelay": 20000, **(config or {})}
    service = Service(handler, MockContext(model_name="prices", model_yaml_config=config), working_dir=None)
    service.initialize()
    return Frontend(service, name="prices", settings=settings(config), envelopes=envelopes, **kwargs), handler


def priced(sku: str, cents: int, **headers: str) -> hk.Request:
    return hk.Request.json({"sku": sku, "cents": cents}).with_headers(headers)


def run_async(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coroutine)

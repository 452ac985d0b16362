"""Routing on the ``url_path`` header, shaped like the handler in pytorch/serve
test/pytest/test_url_path.py.

The frontend (InferenceRequestHandler.handlePredictions) adds ``url_path`` (the URL segments
after ``/predictions/{model}/{version}/``) and ``explain`` to every request's headers.
"""

from handlerkit.handlers.base import BaseHandler as Base


class UrlRoutes(Base):
    """``v1/sum`` sums the JSON list, ``v1/max`` takes its max; the headers are echoed back."""

    def initialize(self, context):
        self.context = context
        self.initialized = True

    def preprocess(self, data):
        jobs = []
        for idx, row in enumerate(data):
            path = self.context.get_request_header(idx, "url_path")
            explain = self.context.get_request_header(idx, "explain")
            jobs.append((path, explain, row.get("body")))
        return jobs

    def inference(self, data, *args, **kwargs):
        routes = {"v1/sum": sum, "v1/max": max}
        out = []
        for path, explain, numbers in data:
            route = routes.get(path)
            out.append({"url_path": path, "explain": explain, "result": route(numbers) if route else None})
        return out

    def postprocess(self, data):
        return data

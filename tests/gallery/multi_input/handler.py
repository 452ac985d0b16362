"""Several named inputs: ``age``, ``income`` (thousands) and ``city``, sent as one JSON body
or as form fields, ``{"decision", "score"}`` out, on handlerkit's BaseHandler. The model
takes a dict: the numbers as one tensor, the city as an index."""

import json

import torch

from handlerkit import BaseHandler

FIELDS = ("age", "income", "city")
CITIES = ["other", "paris", "lyon", "nice"]  # "other": any city not listed


class LoanHandler(BaseHandler):
    def fields(self, row):
        body = row.get("data") or row.get("body")
        if isinstance(body, (bytes, bytearray)):  # JSON sent without its content type
            body = json.loads(body)
        if isinstance(body, dict):
            return body
        # a form: each field under its own name, its value as bytes
        return {name: row[name].decode("utf-8") for name in FIELDS}

    def preprocess(self, data):
        rows = [self.fields(row) for row in data]
        numbers = [[float(row["age"]) / 100, float(row["income"]) / 100] for row in rows]
        cities = [CITIES.index(row["city"]) if row["city"] in CITIES else 0 for row in rows]
        return {"numbers": torch.tensor(numbers), "city": torch.tensor(cities)}

    def postprocess(self, data):
        top, index = torch.softmax(data, dim=1).max(dim=1)
        return [{"decision": self.mapping[str(i)], "score": round(p, 4)} for i, p in zip(index.tolist(), top.tolist())]

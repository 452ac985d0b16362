"""{{name}}: an image classifier. A request is an image (PNG, JPEG...); its answer is
{"label": ..., "probability": ...}, the likeliest of the classes index_to_name.json names.

TorchServe loads this file as it is, with handlerkit installed on the server (list it in a
requirements.txt); without handlerkit, import BaseHandler from ts.torch_handler.base_handler
instead (the stages and the attributes self.model, self.mapping, self.device are the same) and
raise ValueError where this raises RequestError. A RequestError names the request at fault and
what to send; TorchServe answers the client 400 with its message instead of 503.
BaseHandler.initialize loads model.py's class with model.pt and index_to_name.json; its
inference runs the model on self.device.
"""

import base64
import io

import torch
from PIL import Image
from torchvision import transforms

from handlerkit.errors import RequestError
from handlerkit.handlers import BaseHandler


class ColorClassifier(BaseHandler):
    """preprocess: images to one normalised batch; postprocess: each request's top class."""

    transform = transforms.Compose(
        [transforms.Resize((64, 64)), transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)]
    )

    def preprocess(self, data):
        images = []
        for index, row in enumerate(data):
            body = row.get("data") or row.get("body")  # a form field "data", or the raw POST body
            if isinstance(body, str):  # JSON clients send images base64-encoded
                body = base64.b64decode(body)
            try:
                image = Image.open(io.BytesIO(body)).convert("RGB")  # grayscale, RGBA... -> RGB
            except Exception as exc:
                raise RequestError(
                    f"request {index}: expected an image (PNG, JPEG...) as the body or the form field "
                    f"'data', got {type(body).__name__} that PIL cannot read ({exc})",
                    index,
                    fix="send a PNG or JPEG file as the body, or base64 of it in JSON",
                ) from exc
            images.append(self.transform(image))
        return torch.stack(images).to(self.device)

    def postprocess(self, data):
        probabilities = torch.softmax(data, dim=1)
        best, classes = probabilities.max(dim=1)
        return [
            {"label": self.mapping[str(c)], "probability": round(p, 4)}
            for c, p in zip(classes.tolist(), best.tolist())
        ]

"""{{name}}: an image classifier. A request is an image (PNG, JPEG...); its answer is
{"label": ..., "probability": ...}, the likeliest of the classes index_to_name.json names.

A request that is no image is refused alone: self.refuse(index, message, fix=...) gives that
client 400 and {"code": 400, "error": message, "fix": fix}, and the other requests of the
batch are answered as usual. (Raising handlerkit's RequestError instead would fail every
request of the server's batch with that 400, as any exception does in TorchServe.)

TorchServe loads this file as it is, with handlerkit installed on the server (list it in a
requirements.txt). On TorchServe's own BaseHandler (ts.torch_handler.base_handler) the stages
and self.model, self.mapping, self.device are the same; keep refuse there by mixing it in
first: class ColorClassifier(PerRequestErrors, BaseHandler), with PerRequestErrors from
handlerkit.handlers. BaseHandler.initialize loads model.py's class with model.pt and
index_to_name.json; its inference runs the model on self.device.
"""

import base64
import io

import torch
from PIL import Image, UnidentifiedImageError
from torchvision import transforms

from handlerkit.handlers import BaseHandler


class ColorClassifier(BaseHandler):
    """preprocess: images to one normalised batch (a request that is no image refused);
    postprocess: the top class of each request that reached the model."""

    transform = transforms.Compose(
        [transforms.Resize((64, 64)), transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)]
    )

    def preprocess(self, data):
        images = []
        for index, row in enumerate(data):
            body = row.get("data") or row.get("body")  # a form field "data", or the raw POST body
            try:
                if isinstance(body, str):  # JSON clients send images base64-encoded
                    body = base64.b64decode(body)
                image = Image.open(io.BytesIO(body)).convert("RGB")  # grayscale, RGBA... -> RGB
            except Exception as exc:
                # PIL's own message names a temporary object when the format is unknown
                why = "no image format PIL knows" if isinstance(exc, UnidentifiedImageError) else str(exc)
                self.refuse(
                    index,
                    f"expected an image (PNG, JPEG...) as the body or the form field 'data', "
                    f"got {type(body).__name__} that PIL cannot read ({why})",
                    fix="send a PNG or JPEG file as the body, or base64 of it in JSON",
                )
                continue  # left out of the batch: its answer is the error item
            images.append(self.transform(image))
        if not images:  # every request was refused: inference and postprocess do not run
            return None
        return torch.stack(images).to(self.device)

    def postprocess(self, data):
        probabilities = torch.softmax(data, dim=1)
        best, classes = probabilities.max(dim=1)
        return [
            {"label": self.mapping[str(c)], "probability": round(p, 4)}
            for c, p in zip(classes.tolist(), best.tolist())
        ]

"""Image to image: a PNG or JPEG in, a PNG out (``image/png``), on handlerkit's BaseHandler.
Every image is resized to 32 x 32; the model maps pixels in [0, 1] to pixels in [0, 1]."""

import io

import torch
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

from handlerkit import BaseHandler

SIDE = 32


class ImageFilterHandler(BaseHandler):
    def preprocess(self, data):
        images = []
        for row in data:
            image = Image.open(io.BytesIO(row.get("data") or row.get("body"))).convert("RGB")
            images.append(pil_to_tensor(image.resize((SIDE, SIDE))))
        return torch.stack(images).float() / 255

    def postprocess(self, data):
        answers = []
        for i, image in enumerate(data.clamp(0, 1)):
            pixels = (image * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="PNG")
            self.context.set_response_content_type(i, "image/png")
            answers.append(buffer.getvalue())
        return answers

"""A stand-in for the parts of a pytorch/serve checkout that TorchServe 0.12's handler unit tests read.

The suite installed with torchserve (``ts/torch_handler/unit_tests``) reads example files and
images from the repository it was written in (``examples/...``) and downloads torchvision's
weights. Neither exists here, and nothing may download, so :func:`build` writes, under one
folder laid out as that checkout:

- each example's files the tests copy, written here as small models of our own (the layout
  torchvision gives ResNet-18; torchvision's FCN and Faster R-CNN classes on small backbones;
  a small MNIST net and its handler), and the label maps they copy;
- the images they open, drawn here (the "persons" photo is the repository's
  ``fixtures/images/grace_hopper.jpg``);
- for each weights URL the tests ask for, a state_dict built from a fixed seed and set so the
  tests' assertions test something: the ResNet-18's last layer is fitted to tell the kitten
  from the dog (``tiger_cat`` / ``golden_retriever``), the detector's box classifier answers
  ``bench``, the MNIST net ``0``.

:func:`weights_for` maps a URL to its stand-in file: the suite's ``download_model`` is replaced
by a copy of it (``_ts_unit_plugin.py``).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GRACE_HOPPER = ROOT / "fixtures" / "images" / "grace_hopper.jpg"

RESNET18_URL = "https://download.pytorch.org/models/resnet18-f37072fd.pth"  # ResNet18_Weights.DEFAULT.url
FCN_URL = "https://download.pytorch.org/models/fcn_resnet101_coco-7ecb50ca.pth"
FASTER_RCNN_URL = "https://download.pytorch.org/models/fasterrcnn_resnet50_fpn_coco-258fb6c6.pth"

CLASSIFIER_DIR = "examples/image_classifier/resnet_18"
BATCH_IMAGES = "examples/image_classifier/resnet_152_batch/images"
SEGMENTER_DIR = "examples/image_segmenter/fcn"
DETECTOR_DIR = "examples/object_detector/fast-rcnn"
MNIST_DIR = "examples/image_classifier/mnist"

TIGER_CAT, GOLDEN_RETRIEVER = 282, 207  # ImageNet class indices
BENCH = 15  # a COCO category index, as torchvision numbers them

# -- the examples' model files, as small models of our own -------------------------------------

RESNET18_MODEL_PY = '''\
"""Stand-in for examples/image_classifier/resnet_18/model.py: torchvision's ResNet-18 layout."""
from torchvision.models.resnet import BasicBlock, ResNet


class ImageClassifier(ResNet):
    def __init__(self):
        super().__init__(BasicBlock, [2, 2, 2, 2])
'''

FCN_HEAD_PY = '''\
"""Stand-in for examples/image_segmenter/fcn/fcn.py: the head, torchvision's."""
from torchvision.models.segmentation.fcn import FCNHead  # noqa: F401
'''

FCN_BACKBONE_PY = '''\
"""Stand-in for examples/image_segmenter/fcn/intermediate_layer_getter.py: a small backbone
that hands the head its last feature map under "out", as an IntermediateLayerGetter does."""
import torch


class SmallBackbone(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=4, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
            torch.nn.ReLU(),
        )

    def forward(self, x):
        return {"out": self.features(x)}
'''

FCN_MODEL_PY = '''\
"""Stand-in for examples/image_segmenter/fcn/model.py: torchvision's FCN on a small backbone."""
from torchvision.models.segmentation.fcn import FCN

from fcn import FCNHead
from intermediate_layer_getter import SmallBackbone


class FCNImageSegmenter(FCN):
    def __init__(self, num_classes=21):
        super().__init__(SmallBackbone(), FCNHead(32, num_classes))
'''

FASTER_RCNN_MODEL_PY = '''\
"""Stand-in for examples/object_detector/fast-rcnn/model.py: torchvision's Faster R-CNN on a
small single-level backbone, smaller images."""
import torch
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FasterRCNN
from torchvision.ops import MultiScaleRoIAlign


class FRCNNObjectDetector(FasterRCNN):
    def __init__(self, num_classes=91):
        backbone = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=4, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=4, padding=1),
            torch.nn.ReLU(),
        )
        backbone.out_channels = 32
        super().__init__(
            backbone,
            num_classes,
            min_size=320,
            max_size=480,
            rpn_anchor_generator=AnchorGenerator(sizes=((32, 64, 128),), aspect_ratios=((0.5, 1.0, 2.0),)),
            box_roi_pool=MultiScaleRoIAlign(featmap_names=["0"], output_size=7, sampling_ratio=2),
        )
'''

MNIST_MODEL_PY = '''\
"""Stand-in for examples/image_classifier/mnist/mnist.py: a small net, 1 x 28 x 28 -> 10 digits."""
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, stride=2)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc(x.mean(dim=(2, 3)))
'''

MNIST_HANDLER_PY = '''\
"""Stand-in for examples/image_classifier/mnist/mnist_handler.py (TorchServe 0.12): TorchServe's
ImageClassifier with MNIST's normalisation, answering each image's digit."""
from torchvision import transforms

from ts.torch_handler.image_classifier import ImageClassifier


class MNISTDigitClassifier(ImageClassifier):
    image_processing = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])

    def postprocess(self, data):
        return data.argmax(1).tolist()
'''


# -- images ------------------------------------------------------------------------------------


def _kitten() -> Any:
    """An orange field with dark tiger stripes."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (320, 240), (214, 130, 48))
    draw = ImageDraw.Draw(image)
    for x in range(-240, 320, 28):
        draw.line([(x, 0), (x + 240, 240)], fill=(40, 28, 20), width=9)
    return image


def _dog() -> Any:
    """A golden blob with a dark nose on green grass."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (300, 260), (70, 140, 60))
    draw = ImageDraw.Draw(image)
    draw.ellipse([50, 40, 250, 230], fill=(222, 180, 96))
    draw.ellipse([135, 120, 165, 145], fill=(30, 20, 15))
    return image


def _zero_digit() -> Any:
    """A handwritten-looking 0: a white ring on black, 28 x 28, grayscale."""
    from PIL import Image, ImageDraw

    image = Image.new("L", (28, 28), 0)
    ImageDraw.Draw(image).ellipse([7, 4, 21, 24], outline=255, width=3)
    return image


def _save(image: Any, path: Path, **options: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **options)
    return path


# -- weights -----------------------------------------------------------------------------------


def _model_class(model_py: Path) -> type:
    """The one class a stand-in model file defines, imported in its folder's own imports (its
    ``from fcn import FCNHead`` finds the folder's ``fcn.py``, and leaves with the block)."""
    from handlerkit.worker.isolation import model_dir_imports

    with model_dir_imports(model_py.parent):
        spec = importlib.util.spec_from_file_location(f"_standin_{model_py.parent.name}_{model_py.stem}", model_py)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    [cls] = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__]
    return cls


def _resnet18_weights(model_py: Path, kitten: Path, dog: Path) -> dict:
    """Seeded ResNet-18 weights whose last layer tells the kitten (tiger_cat) from the dog
    (golden_retriever) by a wide margin, through TorchServe's own ImageClassifier preprocessing;
    each one's other label stays out of its top 5."""
    import torch
    from PIL import Image
    from ts.torch_handler.image_classifier import ImageClassifier as TsImageClassifier

    torch.manual_seed(0)
    model = _model_class(model_py)().eval()
    fc, model.fc = model.fc, torch.nn.Identity()
    with torch.no_grad():
        batch = torch.stack([TsImageClassifier.image_processing(Image.open(p)) for p in (kitten, dog)])
        feature_kitten, feature_dog = model(batch)
        direction = feature_kitten - feature_dog
        weight = 20 * direction / direction.dot(direction)  # logit +10 for the kitten, -10 for the dog
        bias = -weight.dot((feature_kitten + feature_dog) / 2)
        fc.weight.zero_()
        fc.bias.zero_()
        fc.weight[TIGER_CAT], fc.bias[TIGER_CAT] = weight, bias
        fc.weight[GOLDEN_RETRIEVER], fc.bias[GOLDEN_RETRIEVER] = -weight, -bias
    model.fc = fc
    return model.state_dict()


def _detector_weights(model_py: Path) -> dict:
    """Seeded Faster R-CNN weights whose box classifier calls every proposal a bench (p > 0.99)."""
    import torch

    torch.manual_seed(0)
    model = _model_class(model_py)()
    predictor = model.roi_heads.box_predictor
    with torch.no_grad():
        for layer in (predictor.cls_score, predictor.bbox_pred):
            layer.weight.zero_()
            layer.bias.zero_()
        predictor.cls_score.bias[BENCH] = 10.0
    return model.state_dict()


def _mnist_weights(model_py: Path) -> dict:
    """Seeded weights for the small MNIST net whose answer is 0."""
    import torch

    torch.manual_seed(0)
    model = _model_class(model_py)()
    with torch.no_grad():
        model.fc.weight.zero_()
        model.fc.bias.zero_()
        model.fc.bias[0] = 5.0
    return model.state_dict()


def _seeded_weights(model_py: Path) -> dict:
    import torch

    torch.manual_seed(0)
    return _model_class(model_py)().state_dict()


# -- the checkout ------------------------------------------------------------------------------


def _write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def build_classifier(root: Path) -> Path:
    """Only the image classifier's part of the checkout: resnet_18's files, the kitten and the
    dog, the ResNet-18 weights. Returns ``root``."""
    import torch
    from torchvision.models import ResNet18_Weights

    imagenet = ResNet18_Weights.DEFAULT.meta["categories"]  # names only: nothing downloads
    labels = {str(i): name.replace(" ", "_") for i, name in enumerate(imagenet)}
    _write(root, f"{CLASSIFIER_DIR}/index_to_name.json", json.dumps(labels))
    kitten = _save(_kitten(), root / BATCH_IMAGES / "kitten.jpg", quality=92)
    dog = _save(_dog(), root / BATCH_IMAGES / "dog.jpg", quality=92)
    resnet = _write(root, f"{CLASSIFIER_DIR}/model.py", RESNET18_MODEL_PY)
    (root / "weights").mkdir(exist_ok=True)
    torch.save(_resnet18_weights(resnet, kitten, dog), root / "weights" / Path(RESNET18_URL).name)
    return root


def build(root: Path) -> Path:
    """Write the whole stand-in checkout under ``root`` (files, images, ``weights/``); returns ``root``."""
    import torch
    from torchvision.models.detection import FasterRCNN_ResNet50_FPN_Weights

    build_classifier(root)
    coco = FasterRCNN_ResNet50_FPN_Weights.DEFAULT.meta["categories"]
    _write(root, f"{DETECTOR_DIR}/index_to_name.json", json.dumps({str(i): n for i, n in enumerate(coco)}))
    _save(_zero_digit(), root / MNIST_DIR / "test_data" / "0.png")

    _write(root, f"{SEGMENTER_DIR}/fcn.py", FCN_HEAD_PY)
    _write(root, f"{SEGMENTER_DIR}/intermediate_layer_getter.py", FCN_BACKBONE_PY)
    fcn = _write(root, f"{SEGMENTER_DIR}/model.py", FCN_MODEL_PY)
    shutil.copyfile(GRACE_HOPPER, root / "examples/image_segmenter/persons.jpg")  # its folder is made above
    detector = _write(root, f"{DETECTOR_DIR}/model.py", FASTER_RCNN_MODEL_PY)
    mnist = _write(root, f"{MNIST_DIR}/mnist.py", MNIST_MODEL_PY)
    _write(root, f"{MNIST_DIR}/mnist_handler.py", MNIST_HANDLER_PY)

    torch.save(_seeded_weights(fcn), root / "weights" / Path(FCN_URL).name)
    torch.save(_detector_weights(detector), root / "weights" / Path(FASTER_RCNN_URL).name)
    torch.save(_mnist_weights(mnist), root / MNIST_DIR / "mnist_cnn.pt")
    return root


def weights_for(root: Path, url: str) -> Path:
    """The stand-in weights file for ``url``; a URL with none is an error, never a download."""
    path = root / "weights" / Path(url).name
    if not path.is_file():
        known = sorted(p.name for p in (root / "weights").iterdir())
        raise FileNotFoundError(
            f"no stand-in weights for {url}: nothing may download here; stand-ins exist for {known} "
            "(add a builder to tests/_ts_standins.py)"
        )
    return path

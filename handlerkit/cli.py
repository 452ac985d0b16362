"""The ``handlerkit`` command.

``handlerkit demo`` runs the built-in image classifier on the bundled shapes model, stage by
stage, and prints what each stage took and gave. ``handlerkit run MODEL_DIR FILE...`` does the
same for any model dir. Heavy imports happen inside the commands so ``--help`` stays fast.

Exit codes: 0 success, 1 a contract problem or a handler error, 2 a usage or input error
(one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import resources
from typing import Any

__all__ = ["main"]

_DEMO_HELP = (
    "Run handlerkit's built-in image_classifier on the bundled 'shapes' model (a small CNN that "
    "knows circle, square, triangle, star, cross...) with three bundled images, stage by stage: "
    "what each stage took and gave, then the top predictions. grace_hopper.jpg is a real photo "
    "outside what the shapes model knows, so its prediction is a guess among shapes."
)


def demo_paths() -> tuple[str, list[str]]:
    """The bundled demo model dir and images (they ship inside the package)."""
    root = resources.files("handlerkit") / "assets" / "demo"
    model_dir = str(root / "image_classifier")
    images_dir = root / "images"
    images = sorted(str(images_dir / name) for name in os.listdir(str(images_dir)))
    return model_dir, images


class _InputError(Exception):
    """A usage or input problem: one line on stderr, exit code 2."""


def _predictions(paths: Sequence[str], output: object) -> str:
    from handlerkit._text import render_text

    if not isinstance(output, list):  # the contract table above says what is wrong with it
        return render_text(["request", "handle returned"], [["(all)", repr(output)[:80]]])
    rows = []
    for path, item in zip(paths, output):
        if isinstance(item, dict) and item:
            ranked = sorted(item.items(), key=lambda kv: -float(kv[1]))  # type: ignore[arg-type]
            top = ", ".join(f"{label} {float(p):.3f}" for label, p in ranked[:3])  # type: ignore[arg-type]
        else:
            top = repr(item)[:80]
        rows.append([os.path.basename(path), top])
    return render_text(["request", "top predictions"], rows)


def run_model(model_dir: str, files: Sequence[str], handler: str | None, out: Any = None) -> int:
    """Run ``handler`` (default: the manifest's) of ``model_dir`` on ``files``, one request each."""
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise _InputError(f"no such file: {', '.join(missing)}")
    if not os.path.isdir(model_dir):
        raise _InputError(f"no such model dir: {model_dir}")
    from handlerkit.context import MockContext
    from handlerkit.harness import Harness
    from handlerkit.batches import batch
    from handlerkit.requests import Request

    stream = out or sys.stdout
    ctx = MockContext.from_model_dir(model_dir)
    spec = handler or (ctx.manifest.get("model", {}).get("handler") or "image_classifier")
    harness = Harness(spec, ctx)
    requests = batch(*(Request.from_file(f) for f in files))
    run = harness.run(requests)
    device = harness.handler.device if harness.handler is not None else "n/a"
    print(f"handler {harness.name} on {device}, model {os.path.basename(os.path.normpath(model_dir))}", file=stream)
    print(run, file=stream)
    print(file=stream)
    print(_predictions(files, run.output), file=stream)
    return 1 if any(p.severity == "error" for p in run.problems) else 0


def _demo(args: argparse.Namespace) -> int:
    model_dir, images = demo_paths()
    code = run_model(model_dir, images, "image_classifier")
    print(
        "\nnote: the shapes model knows only drawn shapes; grace_hopper.jpg is a photo outside "
        "what it knows, so its top class is a guess."
    )
    return code


def _run(args: argparse.Namespace) -> int:
    return run_model(args.model_dir, args.files, args.handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="handlerkit", description="Develop and debug TorchServe-style model handlers, one stage at a time."
    )
    parser.add_argument("--version", action="version", version=f"handlerkit {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="run the built-in image classifier on the bundled shapes model", description=_DEMO_HELP
    )
    demo.set_defaults(func=_demo)
    run = commands.add_parser(
        "run",
        help="run a model dir's handler on files, stage by stage",
        description="Run the handler of MODEL_DIR (an unpacked .mar) on FILES, one request per file, "
        "through TorchServe's handle(); print each stage and the predictions.",
    )
    run.add_argument("model_dir", help="an unpacked .mar: model files, MAR-INF/MANIFEST.json, model-config.yaml")
    run.add_argument("files", nargs="+", help="request bodies, one request per file")
    run.add_argument("--handler", help="handler spec (default: the manifest's handler)")
    run.set_defaults(func=_run)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from handlerkit.errors import HandlerkitError

    try:
        return int(args.func(args))
    except _InputError as exc:
        print(f"handlerkit: error: {exc}", file=sys.stderr)
        return 2
    except HandlerkitError as exc:
        print(f"handlerkit: error: {exc}", file=sys.stderr)
        return 1


def _version() -> str:
    from handlerkit import __version__

    return __version__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

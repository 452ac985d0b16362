"""``handlerkit serve MODEL [--engine ray|kserve]``: serve a model's handler over HTTP: on Ray Serve
with TorchServe's URLs, or on KServe's model server with the KServe v1 and v2 URLs."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from handlerkit.cli._common import OK, InputError, Outcome, non_negative, positive

HELP = "serve a model's handler over HTTP on a maintained engine (Ray Serve or KServe)"
DESCRIPTION = (
    "Serve the handler of MODEL (a model dir or a .mar) on Ray Serve with TorchServe's URLs: "
    "POST /predictions/<model>, POST /explanations/<model>, GET /models/<model>, GET /ping. "
    "model-config.yaml sets the batching (batchSize, maxBatchDelay), the replicas (minWorkers, "
    "maxWorkers) and GPUs (deviceType). Without --address a local Ray instance is started; HTTP "
    "listens on --host (127.0.0.1). With --address the model is deployed to that cluster as an "
    "application named after the model, on the cluster's Serve HTTP address if Serve already "
    "runs there, and only that application is deleted on exit. Blocks until Ctrl-C (or --for "
    "SECONDS). A port already in use is refused (exit code 2); a handler that fails to load stops "
    "the command with its error (exit code 1); a failed request is logged with its stage, line "
    "and fix. Needs: pip install 'handlerkit[ray]'. With --engine kserve the model is served by KServe's "
    "model server (kserve.ModelServer) on 127.0.0.1 only, with KServe's v1 (/v1/models/<model>:predict, "
    ":explain) and v2 (/v2/models/<model>/infer, /v2/health/..., model metadata) URLs, the bodies going "
    "through TorchServe's kserve and kservev2 envelopes; no gRPC, one request per batch. Needs: pip "
    "install 'handlerkit[kserve]'."
)


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("serve", help=HELP, description=DESCRIPTION, parents=parents)
    parser.add_argument("model", metavar="MODEL", help="a model dir (an unpacked .mar) or a .mar file")
    parser.add_argument("--engine", choices=["ray", "kserve"], default="ray", help="the serving engine (default: ray)")
    parser.add_argument("--handler", metavar="SPEC", help="handler spec (default: the manifest's handler)")
    parser.add_argument(
        "--envelope",
        choices=["json", "kserve", "kservev2"],
        help="a TorchServe service envelope around the handler (TorchServe's service_envelope)",
    )
    parser.add_argument(
        "--address",
        metavar="ADDR",
        help="an existing Ray cluster (e.g. ray://head:10001 or auto); default: a new local instance",
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP host (default: 127.0.0.1, loopback only)")
    parser.add_argument("--port", type=non_negative, default=8080, help="HTTP port (default: 8080, TorchServe's)")
    parser.add_argument("--num-cpus", type=positive, metavar="N", help="CPUs of a new local Ray instance")
    parser.add_argument(
        "--for", dest="duration", type=float, metavar="SECONDS", help="stop after SECONDS (default: serve until Ctrl-C)"
    )
    parser.set_defaults(command=command)


def command(args: argparse.Namespace) -> Outcome:
    import os

    if not os.path.exists(args.model):
        raise InputError(f"no such model dir or archive: {args.model!r}")
    if args.engine == "kserve":
        return _serve_on_kserve(args)
    if not args.address:  # a cluster's Serve keeps its own port
        _refuse_a_busy_port(args.host, args.port)
    from handlerkit._optional import require

    ray = require("ray", feature="handlerkit serve --engine ray", extra="ray")
    serve = require("ray.serve", feature="handlerkit serve --engine ray", extra="ray")
    from handlerkit.serving.ray import app, run

    application = app(args.model, handler=args.handler, envelope=args.envelope)
    name = _model_name(args.model)
    if args.address:
        try:
            ray.init(address=args.address)
        except ConnectionError as exc:
            auth = (
                ""
                if os.environ.get("RAY_AUTH_MODE")
                else (
                    "; a cluster with token authentication (Ray's default) also needs RAY_AUTH_MODE=token "
                    "and its token in ~/.ray/auth_token or RAY_AUTH_TOKEN"
                )
            )
            raise InputError(
                f"cannot connect to the Ray cluster at {args.address!r} ({exc}): check the address "
                f"(the head's GCS address, host:6379 by default, or ray://host:10001){auth}"
            ) from exc
    else:
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})  # kept as is where Serve runs
        run(application, name=name, route_prefix="/")  # a handler that fails to load raises its StageError
        url = _http_url(serve, args.host, args.port)
        print(f"handlerkit: serving {name} at {url}/predictions/{name} (Ctrl-C to stop)", flush=True)
        stopped = _wait(args.duration)
    finally:
        try:
            # The application's replicas drain and stop. With --address the cluster's Serve and
            # its other applications stay; a local instance goes with ray.shutdown(). Not
            # serve.shutdown(): it waits on ServeController.graceful_shutdown, a call that only
            # ends when the controller kills itself, and Ray prints that as a failed task
            # ("graceful_shutdown failed ... killed by `ray.kill`") at every stop.
            serve.delete(name)
        finally:
            ray.shutdown()
    print(f"handlerkit: {stopped}", file=sys.stderr)
    return Outcome(OK, f"served {name} at {url}", {"model": name, "url": url, "engine": args.engine})


def _serve_on_kserve(args: argparse.Namespace) -> Outcome:
    """KServe's model server in a child process on 127.0.0.1, until Ctrl-C or --for SECONDS."""
    if args.host != "127.0.0.1":
        raise InputError(f"--engine kserve listens on 127.0.0.1 only: got --host {args.host}; drop --host")
    for option in ("address", "envelope", "num_cpus"):
        if getattr(args, option) is not None:
            raise InputError(
                f"--{option.replace('_', '-')} is for --engine ray: KServe's server runs on this machine and "
                "sends v1 bodies through the kserve envelope, v2 bodies through kservev2"
            )
    from handlerkit._optional import require

    try:
        require("kserve", feature="handlerkit serve --engine kserve", extra="kserve")
    except ImportError as exc:
        raise InputError(str(exc)) from exc
    _refuse_a_busy_port(args.host, args.port)
    from handlerkit.serving.kserve import start

    with start(args.model, handler=args.handler, port=args.port) as server:
        print(f"handlerkit: serving {server.name} on KServe (Ctrl-C to stop)", flush=True)
        print(f"  v1: {server.v1_url}  (POST {server.v1_url}:predict, :explain)", flush=True)
        print(f"  v2: {server.v2_url}  (POST {server.v2_url}/infer; GET {server.url}/v2/health/ready)", flush=True)
        stopped = _wait(args.duration, server.process)
    print(f"handlerkit: {stopped}", file=sys.stderr)
    urls = {"v1": server.v1_url, "v2": server.v2_url}
    return Outcome(
        OK,
        f"served {server.name} at {server.url}",
        {"model": server.name, "url": server.url, "engine": "kserve", **urls},
    )


def _wait(duration: float | None, process: Any = None) -> str:
    """Block until Ctrl-C, SIGTERM, ``duration`` seconds, or the server ``process`` exiting."""
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as Ctrl-C does
    try:
        deadline = None if duration is None else time.monotonic() + duration
        while deadline is None or time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                return f"the server exited with {process.returncode}"
            time.sleep(0.2 if deadline is None else min(0.2, max(0.0, deadline - time.monotonic())))
    except KeyboardInterrupt:
        return "interrupted"
    finally:
        signal.signal(signal.SIGTERM, previous)
    return "stopped"


def _http_url(serve: Any, host: str, port: int) -> str:
    """Where Serve's HTTP really listens: a cluster whose Serve was already running keeps its own."""
    try:
        config = serve.context._get_global_client().http_config  # private: guarded
        host, port = config.host or host, config.port or port
    except Exception:
        pass
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"


def _refuse_a_busy_port(host: str, port: int) -> None:
    """A port something already listens on is refused: Ray's proxy would share it (SO_REUSEPORT)
    and the two servers would split the requests between them."""
    from handlerkit.serving._ports import port_holder

    holder = port_holder(host, port)
    if holder is not None:
        raise InputError(f"port {port} on {host} is already in use by {holder}: stop it, or serve on another --port")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _model_name(model: str) -> str:
    """The manifest's ``modelName``, read without unpacking an archive (its servers unpack it)."""
    from pathlib import Path

    from handlerkit.archive.read import is_archive, read_manifest, stem

    if is_archive(model):
        return (read_manifest(model).get("model") or {}).get("modelName") or stem(Path(model))
    from handlerkit.worker.context import MockContext

    return MockContext.from_model_dir(model).model_name

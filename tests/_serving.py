"""Handler sources the serving tests deploy, and a Ray instance serving them (test helpers, not a test module)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

#: A handler whose initialize fails at its line 6 (``for label in self.labels`` on None), after
#: noting each try in tries.txt (the replica runs in the model dir): one line means no restart.
BROKEN_CLASS = '''class Broken:
    def initialize(self, context):
        with open("tries.txt", "a") as f:  # the replica runs in the model dir
            f.write("try\\n")
        self.labels = None
        for label in self.labels:
            pass

    def handle(self, data, context):
        return data
'''


@contextlib.contextmanager
def ray_apps(sources: Mapping[str, Path], num_cpus: float = 0.25) -> Iterator[int]:
    """A local Ray instance serving each model dir of ``sources`` with handlerkit's adapter, one
    application per model at ``/<name>``, on a free loopback port (yielded); all shut down after."""
    import ray
    from _ts_server import HOST, free_ports
    from ray import serve

    from handlerkit.serving.ray import app

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    # the port is picked after Ray's own processes have bound theirs, so none of them takes it
    (port,) = free_ports(1)
    try:
        serve.start(http_options={"host": HOST, "port": port})
        for name, directory in sources.items():
            serve.run(app(directory, num_cpus=num_cpus), name=name, route_prefix=f"/{name}")
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()

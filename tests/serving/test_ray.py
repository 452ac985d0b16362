"""handlerkit.serving.ray: the application a model's config asks for (no Ray instance starts
here; tests/serving/test_replica.py serves it on a real one)."""

from __future__ import annotations

from pathlib import Path

import pytest

import handlerkit as hk
from handlerkit.serving.ray import app, deployment_options

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "fixtures" / "models" / "image_classifier"


def test_deployment_options_follow_the_model_config() -> None:
    opts = deployment_options({"batchSize": 8, "maxBatchDelay": 20, "minWorkers": 1, "maxWorkers": 3,
                               "deviceType": "gpu", "responseTimeout": 7})
    assert opts["batch_size"] == 8 and opts["batch_wait_timeout_s"] == pytest.approx(0.02)
    assert opts["response_timeout_s"] == 7
    dep = opts["deployment"]
    assert dep["autoscaling_config"]["min_replicas"] == 1 and dep["autoscaling_config"]["max_replicas"] == 3
    assert dep["ray_actor_options"]["num_gpus"] == 1 and dep["max_ongoing_requests"] >= 16
    # A handler that fails to load is not constructed again and again; a stuck replica is
    # found unhealthy within seconds (tests/serving/frontend/test_failure_answers.py shows both).
    assert dep["max_constructor_retry_count"] == 1 and dep["health_check_period_s"] == 1.0
    assert deployment_options({"minWorkers": 2, "maxWorkers": 2})["deployment"]["num_replicas"] == 2


def test_app_refuses_what_no_replica_could_serve_before_deploying():
    with pytest.raises(hk.HandlerkitError, match="unknown service envelope 'jsn'.*did you mean 'json'"):
        app(MODEL, envelope="jsn")
    with pytest.raises(ValueError, match="batching must be one of 'torchserve', 'serve.batch'"):
        app(MODEL, batching="eager")


def test_app_binds_the_replica_with_the_models_settings():
    application = app(MODEL, envelope="json", batch_size=4, max_batch_delay_ms=5, num_replicas=2)
    deployment = application._bound_deployment  # Ray's Application keeps its bound deployment
    assert deployment.name == "handlerkit-image_classifier" and deployment.num_replicas == 2
    model, handler, name, version, settings = deployment.init_args
    assert model == str(MODEL) and handler is None and name == "image_classifier"
    assert settings["batch_size"] == 4 and settings["batch_wait_timeout_s"] == pytest.approx(0.005)
    assert settings["envelope"] == "json" and settings["batching"] == "torchserve"
    assert settings["describe"]["modelName"] == "image_classifier"

"""`sam local invoke <Fn> -e events/<x>.json --env-vars env.json`: every function of the template has its sample
event (the API's are driven in test_api_handler.py) and its values in env.json; each non-API sample runs through its
handler against the real servers (the writer's in test_writer.py::test_sample_msk_event_file, which owns account 1's
sample charge)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from infra.localrt import events, template

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
import cfn  # noqa: E402

SAMPLES = {
    "WriterFunction": "writer_msk",
    "ReconcilerFunction": "reconciler_schedule",
    "StreamDrainerFunction": "stream_drainer_schedule",
    "DelayDrainerFunction": "delay_drainer_schedule",
    "WebhookSenderFunction": "webhook_sender_schedule",
    "WebhookPosterFunction": "webhook_poster_attempt",  # a host that does not resolve: an answered failure
}


def test_env_json_has_a_local_value_for_every_variable_of_every_function():
    env_json = json.loads((REPO / "env.json").read_text())
    stack = cfn.Stack(cfn.expand(), {"EventTransport": "redis-stream"})
    writer = cfn.Stack(cfn.expand())  # the writer exists with the kafka transport only
    names = {
        **{n: stack.environment(n) for n in stack.functions()},
        "WriterFunction": writer.environment("WriterFunction"),
    }
    for function, variables in names.items():
        local = {**env_json["Parameters"], **env_json.get(function, {})}
        assert set(variables) - {
            "LUA_DIR",
            "POWERTOOLS_METRICS_NAMESPACE",
            "POWERTOOLS_TRACER_CAPTURE_RESPONSE",
            "RECONCILE_AGE_S",
        } <= set(local), (function, set(variables) - set(local))


def test_each_scheduled_and_msk_sample_runs_through_its_handler(settings):
    functions = {fn.name: fn for fn in template.load(REPO / "template.yaml")}
    assert set(SAMPLES) | {"ApiFunction", "SetupFunction", "AuthorizerFunction"} == set(functions)
    assert (REPO / "events" / f"{SAMPLES['WriterFunction']}.json").exists()
    for name, sample in SAMPLES.items():
        if name == "WriterFunction":
            continue
        fn = functions[name]
        handler = getattr(importlib.import_module(fn.handler.rsplit(".", 1)[0]), fn.handler.rsplit(".", 1)[1])
        event = json.loads((REPO / "events" / f"{sample}.json").read_text())
        # a short timeout: the drainers work until shortly before it
        result = handler(event, events.LambdaContext(name, 5))
        assert isinstance(result, dict), (name, result)


def test_the_authorizer_sample_runs_through_its_handler_with_a_fresh_token(monkeypatch):
    """events/authorizer_token.json takes a token from `make -s token` (a token in a file would expire); its other
    settings are env.json's, but for the JWKS URL: the local dev issuer's, on whatever port it listens here."""
    from authorizer import app

    from infra import dev_issuer

    issuer = dev_issuer.JwksServer().serve_in_thread()
    try:
        settings = json.loads((REPO / "env.json").read_text())["AuthorizerFunction"]
        for name, value in {**settings, "AUTH_JWKS_URL": issuer.authorizer_env()["AUTH_JWKS_URL"]}.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(app, "_verifier", None)
        event = json.loads((REPO / "events" / "authorizer_token.json").read_text())
        event["authorizationToken"] = "Bearer " + dev_issuer.token(scopes=("service",))
        answer = app.handler(event, events.LambdaContext("AuthorizerFunction", 5))
        assert answer["policyDocument"]["Statement"][0]["Effect"] == "Allow"
        assert answer["context"]["scopes"] == "service", answer
    finally:
        issuer.shutdown()
        issuer.server_close()

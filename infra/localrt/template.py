"""Read what the local runtime needs from template.yaml: functions, their events and the Lua layer, the front door
(FrontDoor: which API Gateway, the function it invokes and its public routes), and the REST API's authorizer with
its gateway responses."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml


class _CfnLoader(yaml.SafeLoader):
    """Accepts CloudFormation short-form tags (!Ref, !Sub, !GetAtt, ...) as plain {tag: value} maps."""


def _intrinsic(loader, tag_suffix, node):
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {tag_suffix: value}


_CfnLoader.add_multi_constructor("!", _intrinsic)


@dataclass
class Function:
    name: str
    handler: str
    code_dir: Path
    timeout_s: int
    layer_dirs: list[Path]
    api: bool = False  # the front door's integration invokes it
    public_routes: set[tuple[str, str]] = field(default_factory=set)  # (METHOD, path) the front door does not authorize
    msk: dict | None = None
    schedules: list[float] = field(default_factory=list)


_RATE = re.compile(r"rate\((\d+) (minute|minutes|hour|hours|second|seconds|day|days)\)")
_UNIT_S = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def rate_seconds(expression: str) -> float:
    match = _RATE.fullmatch(expression.strip())
    if not match:
        raise ValueError(f"only rate(...) schedules run locally, got {expression!r}")
    return int(match.group(1)) * _UNIT_S[match.group(2).rstrip("s")]


# what `sam deploy` would give the pseudo parameters locally (samconfig.toml's default stack name)
PSEUDO = {
    "AWS::StackName": os.environ.get("HOTLEDGER_STACK_NAME", "hotledger"),
    "AWS::Region": "us-east-1",
    "AWS::AccountId": "000000000000",
    "AWS::Partition": "aws",
}
_SUB = re.compile(r"\$\{([^}]+)\}")


def _value(template: dict, node, default=None):
    """Literal, a !Ref to a parameter with a Default or a pseudo parameter, or a !Sub of those."""
    if isinstance(node, dict) and "Ref" in node:
        if node["Ref"] in PSEUDO:
            return PSEUDO[node["Ref"]]
        return template.get("Parameters", {}).get(node["Ref"], {}).get("Default", default)
    if isinstance(node, dict) and "Sub" in node and isinstance(node["Sub"], str):
        return _SUB.sub(lambda m: str(_value(template, {"Ref": m.group(1)})), node["Sub"])
    return default if node is None else node


def _int(template: dict, node, default: int) -> int:
    return int(_value(template, node, default))


def _dead_letter_topic(destination: str | None) -> str | None:
    """kafka://<topic> is the one on-failure destination emulated here (it keeps whole records, as S3 does; SQS and
    SNS keep only metadata, so they are refused rather than emulated as a loss)."""
    if destination is None:
        return None
    if not destination.startswith("kafka://"):
        raise ValueError(f"only a kafka:// on-failure destination runs locally, got {destination!r}")
    return destination.removeprefix("kafka://")


def _read(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=_CfnLoader)


@dataclass
class ApiAuthorizer:
    """The API's default Lambda authorizer (TOKEN payload) and the gateway responses API Gateway answers with."""

    function: str  # the authorizer function's resource name
    header: str
    validation: re.Pattern | None
    gateway_responses: dict[str, tuple[int, str]]  # response type -> (status, application/json body)


def api_authorizer(path: Path) -> ApiAuthorizer | None:
    for resource in _read(path)["Resources"].values():
        if resource.get("Type") != "AWS::Serverless::Api":
            continue
        props = resource.get("Properties", {})
        auth = props.get("Auth") or {}
        default = auth.get("DefaultAuthorizer")
        if not default:
            return None
        spec = auth["Authorizers"][default]
        if spec.get("FunctionPayloadType", "TOKEN") != "TOKEN":
            raise ValueError(f"only TOKEN authorizers run locally, {default} is not one")
        identity = spec.get("Identity") or {}
        expression = identity.get("ValidationExpression")
        responses = {
            kind: (int(r.get("StatusCode", 0)), (r.get("ResponseTemplates") or {}).get("application/json", ""))
            for kind, r in (props.get("GatewayResponses") or {}).items()
        }
        return ApiAuthorizer(
            function=spec["FunctionArn"]["GetAtt"].split(".")[0],
            header=identity.get("Header", "Authorization"),
            validation=re.compile(expression) if expression else None,
            gateway_responses=responses,
        )
    return None


FRONT_DOORS = ("http", "rest")


def front_door(path: Path) -> str:
    """HOTLEDGER_FRONT_DOOR (as `--parameter-overrides FrontDoor=...` would choose), else the template's default."""
    door = os.environ.get("HOTLEDGER_FRONT_DOOR") or _read(path)["Parameters"]["FrontDoor"]["Default"]
    if door not in FRONT_DOORS:
        raise ValueError(f"HOTLEDGER_FRONT_DOOR is one of {FRONT_DOORS}, got {door!r}")
    return door


_FUNCTION_ARN = re.compile(r"\$\{(\w+)\.Arn\}")
_SUB_NAME = re.compile(r"\$\{(\w+)\}")


def api_routes(path: Path, door: str) -> dict[str, set[tuple[str, str]]]:
    """The function each of the front door's routes invokes -> its public routes (METHOD, path): the HTTP API's routes
    (AuthorizationType NONE) through their integrations, or the REST API's body (security NONE: SAM's marker)."""
    resources = _read(path)["Resources"]
    routes: dict[str, set[tuple[str, str]]] = {}
    if door == "http":
        targets = {
            name: r["Properties"]["IntegrationUri"]["GetAtt"].split(".")[0]
            for name, r in resources.items()
            if r.get("Type") == "AWS::ApiGatewayV2::Integration"
        }
        for r in resources.values():
            if r.get("Type") != "AWS::ApiGatewayV2::Route":
                continue
            props = r["Properties"]
            function = targets[_SUB_NAME.search(props["Target"]["Sub"]).group(1)]
            public = routes.setdefault(function, set())
            if props.get("AuthorizationType", "NONE") == "NONE":
                method, route = props["RouteKey"].split(" ", 1)
                public.add((method, route))
        return routes
    for r in resources.values():
        if r.get("Type") != "AWS::Serverless::Api":
            continue
        for route, operations in r["Properties"]["DefinitionBody"]["paths"].items():
            for method, operation in operations.items():
                uri = operation["x-amazon-apigateway-integration"]["uri"]["Sub"]
                public = routes.setdefault(_FUNCTION_ARN.search(uri).group(1), set())
                if any("NONE" in requirement for requirement in operation.get("security", [])):
                    public.add((method.upper(), route))
    return routes


def load(path: Path) -> list[Function]:
    template = _read(path)
    api = api_routes(path, front_door(path))
    root = path.parent
    resources = template["Resources"]
    globals_fn = template.get("Globals", {}).get("Function", {})

    def layer_dir(ref) -> Path | None:
        name = ref.get("Ref") if isinstance(ref, dict) else None
        layer = resources.get(name, {})
        # a layer of files to mount (the Lua scripts); a built one (the dependencies) is the venv's business here
        if layer.get("Type") == "AWS::Serverless::LayerVersion" and "BuildMethod" not in layer.get("Metadata", {}):
            return root / layer["Properties"]["ContentUri"]
        return None

    functions = []
    for name, resource in resources.items():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        props = {**globals_fn, **resource.get("Properties", {})}
        props["Layers"] = globals_fn.get("Layers", []) + resource.get("Properties", {}).get("Layers", [])  # SAM appends
        layers = [d for d in (layer_dir(ref) for ref in props.get("Layers", [])) if d is not None]
        fn = Function(name, props["Handler"], root / props["CodeUri"], int(props.get("Timeout", 30)), layers)
        fn.api, fn.public_routes = name in api, api.get(name, set())
        for event in props.get("Events", {}).values():
            kind, ev = event["Type"], event.get("Properties", {})
            if kind == "MSK":
                topics = ev["Topics"]
                on_failure = ((ev.get("DestinationConfig") or {}).get("OnFailure") or {}).get("Destination")
                fn.msk = {
                    "topic": _value(template, topics[0] if isinstance(topics, list) else topics),
                    "batch_size": _int(template, ev.get("BatchSize"), 100),
                    "window_s": float(_value(template, ev.get("MaximumBatchingWindowInSeconds"), 0) or 0),
                    "group_id": _value(template, ev.get("ConsumerGroupId"), name),
                    # the error contract (-1: infinite, Lambda's default)
                    "max_retries": _int(template, ev.get("MaximumRetryAttempts"), -1),
                    "max_record_age_s": _int(template, ev.get("MaximumRecordAgeInSeconds"), -1),
                    "bisect": bool(_value(template, ev.get("BisectBatchOnFunctionError"), False)),
                    "partial_batch": "ReportBatchItemFailures" in (ev.get("FunctionResponseTypes") or []),
                    "dead_letter_topic": _dead_letter_topic(_value(template, on_failure)),
                }
            elif kind in ("Schedule", "ScheduleV2"):
                fn.schedules.append(rate_seconds(_value(template, ev.get("Schedule") or ev.get("ScheduleExpression"))))
        functions.append(fn)
    return functions

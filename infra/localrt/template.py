"""Read what the local runtime needs from template.yaml: functions, their events and the Lua layer."""
from __future__ import annotations

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
    api: bool = False
    msk: dict | None = None
    schedules: list[float] = field(default_factory=list)


_RATE = re.compile(r"rate\((\d+) (minute|minutes|hour|hours|second|seconds|day|days)\)")
_UNIT_S = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def rate_seconds(expression: str) -> float:
    match = _RATE.fullmatch(expression.strip())
    if not match:
        raise ValueError(f"only rate(...) schedules run locally, got {expression!r}")
    return int(match.group(1)) * _UNIT_S[match.group(2).rstrip("s")]


def _value(template: dict, node, default=None):
    """Literal, or a !Ref to a parameter with a Default."""
    if isinstance(node, dict) and "Ref" in node:
        return template.get("Parameters", {}).get(node["Ref"], {}).get("Default", default)
    return default if node is None else node


def load(path: Path) -> list[Function]:
    template = yaml.load(path.read_text(), Loader=_CfnLoader)
    root = path.parent
    resources = template["Resources"]
    globals_fn = template.get("Globals", {}).get("Function", {})

    def layer_dir(ref) -> Path | None:
        name = ref.get("Ref") if isinstance(ref, dict) else None
        layer = resources.get(name, {})
        if layer.get("Type") == "AWS::Serverless::LayerVersion":
            return root / layer["Properties"]["ContentUri"]
        return None

    functions = []
    for name, resource in resources.items():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        props = {**globals_fn, **resource.get("Properties", {})}
        layers = [d for d in (layer_dir(ref) for ref in props.get("Layers", [])) if d is not None]
        fn = Function(name, props["Handler"], root / props["CodeUri"], int(props.get("Timeout", 30)), layers)
        for event in props.get("Events", {}).values():
            kind, ev = event["Type"], event.get("Properties", {})
            if kind == "Api":
                fn.api = True
            elif kind == "MSK":
                topics = ev["Topics"]
                fn.msk = {
                    "topic": _value(template, topics[0] if isinstance(topics, list) else topics),
                    "batch_size": int(_value(template, ev.get("BatchSize"), 100)),
                    "window_s": float(_value(template, ev.get("MaximumBatchingWindowInSeconds"), 0) or 0),
                    "group_id": _value(template, ev.get("ConsumerGroupId"), name),
                }
            elif kind in ("Schedule", "ScheduleV2"):
                fn.schedules.append(rate_seconds(_value(template, ev.get("Schedule") or ev.get("ScheduleExpression"))))
        functions.append(fn)
    return functions

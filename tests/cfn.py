"""Reading the expanded (SAM-transformed) template as AWS would with given parameters: intrinsic functions resolved
to strings, conditions evaluated, and IAM's matching of actions and resources (wildcards * and ?)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REGION, ACCOUNT, STACK = "us-east-1", "123456789012", "hotledger-dev"
PSEUDO = {
    "AWS::Region": REGION,
    "AWS::AccountId": ACCOUNT,
    "AWS::Partition": "aws",
    "AWS::StackName": STACK,
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK}/1",
    "AWS::NoValue": None,
}

_TRANSFORM = """
import json, sys
from samcli.yamlhelper import yaml_parse
from samtranslator.translator.transform import transform
class NoManagedPolicies:
    def load(self):
        return {}
template = yaml_parse(open(sys.argv[1]).read())
# local code paths stand for what `sam package` uploads (as `sam validate` does)
for section in [template.get("Globals", {}).get("Function", {})] + [r.get("Properties", {}) for r in template["Resources"].values()]:
    for key in ("CodeUri", "ContentUri"):
        if isinstance(section.get(key), str):
            section[key] = "s3://bucket/" + section[key].strip("/")
print(json.dumps(transform(template, {"AWS::Region": "us-east-1"}, NoManagedPolicies())))
"""


def expand(template_path: Path = REPO / "template.yaml") -> dict:
    """SAM's own transform (samtranslator, in the SAM CLI's venv .tools), offline."""
    out = subprocess.run(
        [str(REPO / ".tools" / "bin" / "python"), "-c", _TRANSFORM, str(template_path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "SAM_CLI_TELEMETRY": "0", "AWS_DEFAULT_REGION": REGION},
    )
    return json.loads(out.stdout)


class Stack:
    """The expanded template with parameter values: resolve(node) turns intrinsics into plain values."""

    def __init__(self, template: dict, parameters: dict | None = None):
        self.template, self.resources = template, template["Resources"]
        self.params = {name: spec.get("Default") for name, spec in template.get("Parameters", {}).items()}
        self.params.update(parameters or {})
        for name, spec in template.get("Parameters", {}).items():
            if spec.get("Type", "").startswith(("CommaDelimitedList", "List<")) and isinstance(self.params[name], str):
                self.params[name] = self.params[name].split(",")
        self._conditions: dict = {}

    def condition(self, name: str) -> bool:
        if name not in self._conditions:
            self._conditions[name] = bool(self.resolve(self.template["Conditions"][name]))
        return self._conditions[name]

    def exists(self, logical_id: str) -> bool:
        cond = self.resources[logical_id].get("Condition")
        return cond is None or self.condition(cond)

    def _ref(self, name: str):
        if name in PSEUDO:
            return PSEUDO[name]
        if name in self.params:
            return self.params[name]
        kind = self.resources[name]["Type"]
        if kind == "AWS::SecretsManager::Secret":
            return f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{name}-AbCdEf"
        if kind == "AWS::IAM::ManagedPolicy":
            return f"arn:aws:iam::{ACCOUNT}:policy/{name}"
        return f"{name}-physical-id"

    def _getatt(self, name: str, attribute: str):
        kind = self.resources[name]["Type"]
        if kind.startswith("AWS::MSK::") and attribute == "Arn":
            return f"arn:aws:kafka:{REGION}:{ACCOUNT}:cluster/{name.lower()}/0f1e2d3c-aaaa-bbbb-cccc-0123456789ab-s1"
        if attribute == "Arn":
            service = kind.split("::")[1].lower()
            return f"arn:aws:{service}:{REGION}:{ACCOUNT}:{name}"
        return f"{name}.{attribute}"

    def resolve(self, node):
        if isinstance(node, list):
            return [v for v in (self.resolve(item) for item in node) if v is not None]
        if not isinstance(node, dict):
            return node
        if len(node) != 1:
            return {k: self.resolve(v) for k, v in node.items()}
        ((key, arg),) = node.items()
        if key == "Ref":
            return self._ref(arg)
        if key == "Fn::GetAtt":
            name, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
            return self._getatt(name, attribute)
        if key == "Fn::If":
            return self.resolve(arg[1] if self.condition(arg[0]) else arg[2])
        if key == "Condition":
            return self.condition(arg)
        if key == "Fn::Equals":
            a, b = (self.resolve(v) for v in arg)
            return a == b or (a in ([""], "") and b in ([""], ""))
        if key == "Fn::EachMemberEquals":
            members, value = (self.resolve(v) for v in arg)
            return all(m == value for m in members)
        if key == "Fn::Not":
            return not self.resolve(arg[0])
        if key == "Fn::And":
            return all(self.resolve(v) for v in arg)
        if key == "Fn::Or":
            return any(self.resolve(v) for v in arg)
        if key == "Fn::Join":
            return arg[0].join(str(v) for v in self.resolve(arg[1]))
        if key == "Fn::Split":
            return str(self.resolve(arg[1])).split(arg[0])
        if key == "Fn::Select":
            return self.resolve(arg[1])[int(self.resolve(arg[0]))]
        if key == "Fn::GetAZs":
            return [f"{REGION}a", f"{REGION}b"]
        if key == "Fn::Sub":
            text, names = (
                (arg, {}) if isinstance(arg, str) else (arg[0], {k: self.resolve(v) for k, v in arg[1].items()})
            )

            def value(match):
                ref = match.group(1)
                if ref in names:
                    return str(names[ref])
                if "." in ref:
                    return str(self._getatt(*ref.split(".", 1)))
                return str(self._ref(ref))

            return re.sub(r"\$\{([^}!]+)\}", value, text)
        return {key: self.resolve(arg)}

    def broken_rules(self) -> list[str]:
        """The AssertDescription of every assertion CloudFormation would refuse these parameters by (Rules)."""
        return [
            check["AssertDescription"]
            for rule in self.template.get("Rules", {}).values()
            if "RuleCondition" not in rule or self.resolve(rule["RuleCondition"])
            for check in rule["Assertions"]
            if not self.resolve(check["Assert"])
        ]

    def output(self, name: str):
        """The output's value, or None when its condition leaves it out."""
        spec = self.template["Outputs"][name]
        return self.resolve(spec["Value"]) if "Condition" not in spec or self.condition(spec["Condition"]) else None

    def functions(self) -> dict[str, dict]:
        return {
            name: r for name, r in self.resources.items() if r["Type"] == "AWS::Lambda::Function" and self.exists(name)
        }

    def statements_of(self, function: str) -> list[dict]:
        """Every policy statement of the function's execution role: inline policies and the stack's managed ones."""
        role_ref = self.resources[function]["Properties"]["Role"]["Fn::GetAtt"]
        role = self.resources[role_ref[0] if isinstance(role_ref, list) else role_ref.split(".")[0]]["Properties"]
        documents = [p["PolicyDocument"] for p in self.resolve(role.get("Policies", []))]
        for arn in role.get("ManagedPolicyArns", []):
            if isinstance(arn, dict) and "Ref" in arn and arn["Ref"] in self.resources:
                documents.append(self.resolve(self.resources[arn["Ref"]]["Properties"]["PolicyDocument"]))
            elif isinstance(arn, dict) and "Fn::If" in arn:
                chosen = self.resolve(arn)
                for name, res in self.resources.items():
                    if res["Type"] == "AWS::IAM::ManagedPolicy" and chosen == self._ref(name):
                        documents.append(self.resolve(res["Properties"]["PolicyDocument"]))
        return [s for doc in documents for s in _as_list(doc["Statement"])]

    def environment(self, function: str) -> dict[str, str]:
        variables = self.resources[function]["Properties"].get("Environment", {}).get("Variables", {})
        return {k: str(v) for k, v in self.resolve(variables).items()}


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _iam_match(pattern: str, value: str, case_sensitive: bool) -> bool:
    """IAM wildcards: * any run of characters (also across ':' and '/'), ? one character; nothing else is special."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case_sensitive else re.IGNORECASE) is not None


def allowed(statements: list[dict], action: str, resource: str) -> bool:
    """An Allow statement (no Deny anywhere matches) whose Action and Resource cover the call; no conditions used here."""

    def covers(st):
        return any(_iam_match(a, action, case_sensitive=False) for a in _as_list(st.get("Action", []))) and any(
            _iam_match(r, resource, case_sensitive=True) for r in _as_list(st.get("Resource", []))
        )

    if any(st["Effect"] == "Deny" and covers(st) for st in statements):
        return False
    return any(st["Effect"] == "Allow" and covers(st) for st in statements)


__all__ = ["expand", "Stack", "allowed"]

"""The SAM template: linted by cfn-lint (informational checks too) and `sam validate --lint`, built by `sam build`,
expanded by SAM's own transform and checked as AWS would read it (IAM, the trigger's error contract, alarms), and
read by the local runtime the same way."""

import ast
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infra.localrt import template

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
import cfn  # noqa: E402

from hotledger.aws_calls import CALLS  # noqa: E402

SAM = REPO / ".tools" / "bin" / "sam"
OFFLINE_AWS = {
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "offline",
    "AWS_SECRET_ACCESS_KEY": "offline",
    "SAM_CLI_TELEMETRY": "0",
    "PATH": f"{REPO / '.tools' / 'bin'}:{os.environ['PATH']}",
}
# a stack that brings its own VPC, MSK cluster and DB (the Rules' other legal combination)
EXISTING = {
    "VpcId": "vpc-0123456789abcdef0",
    "SubnetIds": "subnet-0a,subnet-0b",
    "PrivateRouteTableIds": "rtb-0a",
    "MskClusterArn": "arn:aws:kafka:us-east-1:123456789012:cluster/shared/11111111-2222-3333-4444-555555555555-1",
    "MskSecurityGroupId": "sg-0123456789abcdef0",
    "ExistingDbSecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:shared-db-AbCdEf",
    "ExistingDbClusterIdentifier": "shared-db",
    "ExistingDbSecurityGroupId": "sg-0fedcba9876543210",
    "Stage": "prod",
}


def _run(*cmd: str, timeout: int = 600) -> str:
    result = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**os.environ, **OFFLINE_AWS}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


@functools.cache
def expanded() -> dict:
    return cfn.expand(REPO / "template.yaml")


def test_cfn_lint_passes_with_informational_checks():
    _run(str(REPO / ".venv" / "bin" / "cfn-lint"), "--include-checks", "I", "--", "template.yaml")


def test_sam_validate_lint_passes():
    assert "is a valid SAM Template" in _run(str(SAM), "validate", "--lint")


def test_sam_build_puts_the_code_in_the_functions_and_the_dependencies_in_one_arm64_layer(tmp_path):
    _run(str(SAM), "build", "--build-dir", str(tmp_path / "build"))
    for function in ("ApiFunction", "WriterFunction", "ReconcilerFunction", "SetupFunction", "AuthorizerFunction"):
        built = tmp_path / "build" / function
        assert (built / "hotledger" / "ledger" / "service.py").exists() and not (built / "pymysql").exists()
    deps = tmp_path / "build" / "DependenciesLayer" / "python"
    assert (deps / "pymysql").is_dir() and (deps / "aws_xray_sdk").is_dir() and (deps / "jwt").is_dir()
    assert (
        [p.name for p in deps.glob("confluent_kafka-*.dist-info")]
        and all("aarch64" in p.name and "cp313" in p.name for p in deps.glob("confluent_kafka/*.so"))
        or list(deps.glob("confluent_kafka/cimpl.cpython-313-aarch64-linux-gnu.so"))
    )


# --- IAM: every AWS call the code makes is allowed by the policy of every function that makes it -----------------
_POWERTOOLS_PARAMETERS = {
    "get_secret": "secretsmanager:GetSecretValue",
    "get_parameter": "ssm:GetParameter",
    "get_parameters": "ssm:GetParametersByPath",
    "get_parameters_by_name": "ssm:GetParameters",
}


def _calls_in_code() -> dict[str, set[str]]:
    """IAM actions of the calls on boto3 clients (bound to a name, or chained) and of Powertools parameters, per file."""
    import botocore.session
    from botocore import xform_name

    session = botocore.session.get_session()

    def client_service(node) -> str | None:
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "client"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            return node.args[0].value
        return None

    found: dict[str, set[str]] = {}
    for path in sorted((REPO / "functions").rglob("*.py")):
        tree = ast.parse(path.read_text())
        clients = {
            t.id: client_service(n.value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign) and client_service(n.value)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        actions = set()
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            receiver, name = node.func.value, node.func.attr
            service = clients.get(receiver.id) if isinstance(receiver, ast.Name) else client_service(receiver)
            if service:
                if name == "get_paginator":
                    name = node.args[0].value
                model = session.get_service_model(service)
                operations = {xform_name(op): op for op in model.operation_names}
                assert name in operations, f"{path}: {service}.{name} is no operation"
                action = f"{model.signing_name}:{operations[name]}"
                actions.add(_IAM_ACTIONS.get(action, action))
            elif name in _POWERTOOLS_PARAMETERS and "parameters" in ast.unparse(receiver):
                actions.add(_POWERTOOLS_PARAMETERS[name])
        if actions:
            found[str(path.relative_to(REPO))] = actions
    return found


# where IAM's action is not the API operation's name
_IAM_ACTIONS = {"lambda:Invoke": "lambda:InvokeFunction"}


def test_the_list_of_aws_calls_covers_every_call_in_the_code():
    found = _calls_in_code()
    assert found, "the scan found no AWS call at all: it is broken"
    listed = {call.action for call in CALLS}
    unlisted = {path: actions - listed for path, actions in found.items() if actions - listed}
    assert not unlisted, f"add these calls to functions/hotledger/aws_calls.py: {unlisted}"


@pytest.mark.parametrize("parameters", [{}, EXISTING], ids=["default-stack", "existing-resources"])
def test_every_function_may_make_every_aws_call_it_makes(parameters):
    stack = cfn.Stack(expanded(), parameters)
    checked, denied = 0, []
    for function in stack.functions():
        env = {**stack.environment(function), "region": cfn.REGION, "account": cfn.ACCOUNT, "partition": "aws"}
        statements = stack.statements_of(function)
        for call in CALLS:
            if call.functions is not None and function not in call.functions:
                continue
            names = re.findall(r"\{(\w+)\}", call.resource)
            if any(not env.get(name) for name in names):
                continue  # the variable is empty here: the code skips the call
            resource = call.resource.format(**env)
            checked += 1
            if not cfn.allowed(statements, call.action, resource):
                denied.append(f"{function}: {call.action} on {resource}")
    assert checked >= 5 * 3
    assert not denied, "AccessDenied in AWS:\n" + "\n".join(denied)


def test_every_function_that_publishes_may_read_where_the_log_ends():
    """A rebuilt voucher's or red packet's log hold reads the topic's last records (publisher.end_offsets: ListOffsets
    alone under-reports on some brokers), in whichever function publishes and so may rebuild: on MSK a fetch without
    kafka-cluster:ReadData is refused, and the hold would never lift."""
    stack = cfn.Stack(expanded(), EXISTING)
    cluster = EXISTING["MskClusterArn"].split(":cluster/", 1)[1]
    publishers = []
    for function in stack.functions():
        topic = (
            f"arn:aws:kafka:{cfn.REGION}:{cfn.ACCOUNT}:topic/{cluster}/{stack.environment(function).get('KAFKA_TOPIC')}"
        )
        statements = stack.statements_of(function)
        if cfn.allowed(statements, "kafka-cluster:WriteData", topic):
            publishers.append(function)
            assert cfn.allowed(statements, "kafka-cluster:ReadData", topic), function
            # the hold also waits while the dead-letter topic holds unresolved records, read the same way (denied,
            # it counts as unresolved for good), and the operators' console reads them to replay them
            for action in ("kafka-cluster:DescribeTopic", "kafka-cluster:ReadData"):
                assert cfn.allowed(statements, action, f"{topic}.dead-letter"), (function, action)
    assert {"ApiFunction", "ReconcilerFunction"} <= set(publishers)


def test_iam_matching_follows_the_wildcard_rules():
    grant = [
        {"Effect": "Allow", "Action": "ssm:GetParameter*", "Resource": "arn:aws:ssm:*:1:parameter/dev/hotledger/*"}
    ]
    assert cfn.allowed(grant, "ssm:getparametersbypath", "arn:aws:ssm:us-east-1:1:parameter/dev/hotledger/x")
    assert not cfn.allowed(grant, "ssm:GetParametersByPath", "arn:aws:ssm:us-east-1:1:parameter/dev/hotledger")
    assert cfn.allowed([{"Effect": "Allow", "Action": "s?s:*", "Resource": "*"}], "sqs:SendMessage", "arn:x")
    assert not cfn.allowed(
        grant + [{"Effect": "Deny", "Action": "*", "Resource": "*"}],
        "ssm:GetParameter",
        "arn:aws:ssm:us-east-1:1:parameter/dev/hotledger/x",
    )


# --- the writer's trigger, scheduled functions, stateful resources, alarms ---------------------------------------
def test_the_writer_trigger_gives_up_on_a_poison_batch_into_a_topic_that_keeps_whole_records():
    stack = cfn.Stack(expanded())
    [esm] = [r["Properties"] for r in stack.resources.values() if r["Type"] == "AWS::Lambda::EventSourceMapping"]
    esm = stack.resolve(esm)
    assert esm["MaximumRetryAttempts"] >= 0 and esm["MaximumRecordAgeInSeconds"] > 0  # never blocks forever
    assert esm["BisectBatchOnFunctionError"] and esm["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert esm["ProvisionedPollerConfig"]["MinimumPollers"] >= 1  # these controls need provisioned pollers
    assert esm["DestinationConfig"]["OnFailure"]["Destination"] == "kafka://hotledger.ledger.dead-letter"
    assert esm["AmazonManagedKafkaEventSourceConfig"]["ConsumerGroupId"] == "hotledger-dev-writer"


def test_scheduled_functions_never_overlap_their_own_retries():
    stack = cfn.Stack(expanded(), {"EventTransport": "redis-stream"})
    scheduled = {"ReconcilerFunction", "StreamDrainerFunction", "DelayDrainerFunction", "WebhookSenderFunction"}
    assert scheduled <= set(stack.functions())
    for name in scheduled:
        assert stack.resources[name]["Properties"]["ReservedConcurrentExecutions"] == 1
        [config] = [
            r["Properties"]
            for r in stack.resources.values()
            if r["Type"] == "AWS::Lambda::EventInvokeConfig" and r["Properties"]["FunctionName"] == {"Ref": name}
        ]
        assert config["MaximumRetryAttempts"] == 0
    rules = [r["Properties"] for r in stack.resources.values() if r["Type"] == "AWS::Events::Rule"]
    assert rules and all(t["RetryPolicy"]["MaximumRetryAttempts"] == 0 for r in rules for t in r["Targets"])


def test_redis_the_db_and_the_secrets_outlive_a_delete_or_a_replacement():
    resources = expanded()["Resources"]
    for name, policy in {
        "Redis": "Snapshot",
        "DbCluster": "Snapshot",
        "RedisAuthSecret": "Retain",
        "DbSecret": "Retain",
    }.items():
        assert (resources[name]["DeletionPolicy"], resources[name]["UpdateReplacePolicy"]) == (policy, policy), name


def test_alarms_cover_what_the_issue_names_and_the_dashboard_every_metric_the_code_emits():
    resources = expanded()["Resources"]
    alarms = {n: r["Properties"] for n, r in resources.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    text = str(alarms)
    for metric in (
        "OffsetLag",
        "5XXError",
        "Latency",
        "OldestPendingAge",
        "WriterDeadLettered",
        "ReconcilerFailedParts",
        "CreditFailures",
        "DelayDeadLetters",
        "OnFailureDestinationDeliveredEventCount",
    ):
        assert metric in text, metric
    functions = [n for n, r in resources.items() if r["Type"] == "AWS::Lambda::Function" and n != "SetupFunction"]
    for fn in functions:
        for metric in ("Errors", "Throttles"):
            assert any(
                a.get("MetricName") == metric and a["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": fn}}]
                for a in alarms.values()
            ), (fn, metric)
    emitted = {
        m for p in (REPO / "functions").rglob("*.py") for m in re.findall(r'name="([A-Z]\w+)", unit=', p.read_text())
    } | {"Rejections"}
    dashboard = str(resources["Dashboard"]["Properties"]["DashboardBody"])
    assert emitted - {m for m in emitted if m in dashboard} == set()
    assert len(emitted) > 25
    groups = [r for r in resources.values() if r["Type"] == "AWS::Logs::LogGroup"]
    assert len(groups) >= 7 and all(g["Properties"]["RetentionInDays"] for g in groups)


def test_functions_run_python313_on_arm64_with_one_dependencies_layer():
    stack = cfn.Stack(expanded())
    for name, fn in stack.functions().items():
        props = fn["Properties"]
        assert (props["Runtime"], props["Architectures"]) == ("python3.13", ["arm64"]), name
        assert {"Ref": next(n for n in stack.resources if n.startswith("DependenciesLayer"))} in props["Layers"]


def test_local_runtime_reads_the_functions_and_triggers():
    functions = {fn.name: fn for fn in template.load(REPO / "template.yaml")}
    assert functions["ApiFunction"].api and functions["ApiFunction"].handler == "api.app.handler"
    assert functions["WriterFunction"].msk == {
        "topic": "hotledger.ledger",
        "batch_size": 1000,
        "window_s": 0.0,
        "group_id": "hotledger-writer",
        "max_retries": 10,
        "max_record_age_s": 21600,
        "bisect": True,
        "partial_batch": True,
        "dead_letter_topic": "hotledger.ledger.dead-letter",
    }
    assert functions["ReconcilerFunction"].schedules == [60]
    assert all(fn.layer_dirs[0] == REPO / "layers" / "lua" for fn in functions.values())
    assert {p.stem for p in functions["ApiFunction"].layer_dirs[0].glob("*.lua")} >= {
        "ledger_apply",
        "ledger_rollback",
        "outbox_claim",
    }
    assert functions["ApiFunction"].public_routes == PUBLIC
    assert [fn.name for fn in functions.values() if fn.api] == ["ApiFunction"]
    authorizer = template.api_authorizer(REPO / "template.yaml")
    assert authorizer.function == "AuthorizerFunction" and authorizer.header == "Authorization"
    assert authorizer.validation.search("Bearer a.b.c") and not authorizer.validation.search("Bearer abc")
    assert {kind: status for kind, (status, _) in authorizer.gateway_responses.items()} == {
        "UNAUTHORIZED": 401,
        "ACCESS_DENIED": 403,
        "AUTHORIZER_FAILURE": 503,
    }


# --- the front door (FrontDoor): an HTTP API by default, or the REST API -------------------------------------------
PUBLIC = {("GET", "/openapi.json"), ("GET", "/swagger")}
ANY = "x-amazon-apigateway-any-method"
ISSUER = f"https://cognito-idp.{cfn.REGION}.amazonaws.com/UserPool-physical-id"
APP_CLIENTS = ["ServiceClient-physical-id", "OperatorClient-physical-id", "UserClient-physical-id"]


def _document_routes() -> set[tuple[str, str]]:
    """(METHOD, path) of every operation of the API's OpenAPI document (the route table), in API Gateway's path syntax."""
    from api.app import openapi_json

    paths = json.loads(openapi_json())["paths"]
    return {(method.upper(), path) for path, operations in paths.items() for method in operations}


def _routed(routes: dict, method: str, path: str):
    """The gateway route a request takes: its exact route, else ANY on that path, else the greedy ANY /{proxy+}."""
    for key in ((method, path), ("ANY", path), ("ANY", "/{proxy+}" if path != "/" else "/")):
        if key in routes:
            return routes[key]
    raise AssertionError(f"no route of the front door takes {method} {path}")


def _front_door(stack: cfn.Stack) -> dict:
    """What the chosen front door deploys, resolved: route -> the authorizer that checks it (None: public), the
    throttle (burst, rate), where access logs go, the integration, the API's physical id and its stage."""
    live = {n: stack.resolve(r["Properties"]) for n, r in stack.resources.items() if stack.exists(n)}
    kinds = {n: stack.resources[n]["Type"] for n in live}
    of = lambda kind: [n for n in live if kinds[n] == kind]  # noqa: E731
    if stack.params["FrontDoor"] == "http":
        [api], [stage], [integration] = (
            of(k) for k in ("AWS::ApiGatewayV2::Api", "AWS::ApiGatewayV2::Stage", "AWS::ApiGatewayV2::Integration")
        )
        authorizers = {stack.resolve({"Ref": n}): live[n] for n in of("AWS::ApiGatewayV2::Authorizer")}
        routes = {}
        for name in of("AWS::ApiGatewayV2::Route"):
            route = live[name]
            assert route["Target"] == f"integrations/{stack.resolve({'Ref': integration})}", name
            method, path = route["RouteKey"].split(" ", 1)
            routes[(method, path)] = authorizers[route["AuthorizerId"]] if route["AuthorizationType"] == "JWT" else None
        settings = live[stage]["DefaultRouteSettings"]
        return {
            "api": api,
            "routes": routes,
            "throttle": (settings["ThrottlingBurstLimit"], settings["ThrottlingRateLimit"]),
            "access_logs": live[stage]["AccessLogSettings"],
            "integration": {
                k: live[integration][k] for k in ("IntegrationType", "IntegrationUri", "PayloadFormatVersion")
            },
        }
    [api], [stage], [plan] = (
        of(k) for k in ("AWS::ApiGateway::RestApi", "AWS::ApiGateway::Stage", "AWS::ApiGateway::UsagePlan")
    )
    body = live[api]["Body"]
    routes, integrations = {}, set()
    for path, operations in body["paths"].items():
        for method, operation in operations.items():
            names = {name for requirement in operation["security"] for name in requirement}
            assert "api_key" in names, (method, path)  # the usage plan meters every route, the description too
            authorizer = names - {"api_key"}
            routes[("ANY" if method == ANY else method.upper(), path)] = (
                body["securityDefinitions"][authorizer.pop()] if authorizer else None
            )
            integration = operation["x-amazon-apigateway-integration"]
            integrations.add((integration["type"], integration["uri"]))
    [(kind, uri)] = integrations
    throttle = live[plan]["Throttle"]
    return {
        "api": api,
        "routes": routes,
        "throttle": (throttle["BurstLimit"], throttle["RateLimit"]),
        "access_logs": live[stage]["AccessLogSetting"],
        "integration": {"IntegrationType": kind, "IntegrationUri": uri},
    }


@pytest.mark.parametrize("door", ["http", "rest"])
def test_the_front_door_routes_every_operation_of_the_route_table_and_authorizes_all_but_the_description(door):
    """Issue 33 goal 4. Failing first: the template had no FrontDoor parameter and deployed the REST API alone."""
    stack = cfn.Stack(expanded(), {"FrontDoor": door})
    front = _front_door(stack)
    routes = front["routes"]
    for method, path in _document_routes() | PUBLIC:
        assert (_routed(routes, method, path) is None) is ((method, path) in PUBLIC), (method, path)
    authorizers = {json.dumps(a, sort_keys=True): a for a in routes.values() if a is not None}
    [authorizer] = authorizers.values()  # one authorizer on every route that is not public
    if door == "http":
        assert authorizer["AuthorizerType"] == "JWT"
        assert authorizer["IdentitySource"] == ["$request.header.Authorization"]
        assert authorizer["JwtConfiguration"] == {"Issuer": ISSUER, "Audience": APP_CLIENTS}
        assert front["integration"] == {
            "IntegrationType": "AWS_PROXY",
            "IntegrationUri": f"arn:aws:lambda:{cfn.REGION}:{cfn.ACCOUNT}:ApiFunction",
            "PayloadFormatVersion": "2.0",  # the payload the handler reads as the HTTP API's (api/app.py)
        }
        assert not any(
            r["Type"].startswith("AWS::ApiGateway::") and stack.exists(n) for n, r in stack.resources.items()
        )
    else:
        assert authorizer["name"] == "Authorization" and authorizer["x-amazon-apigateway-authorizer"]["type"] == "token"
        assert ":AuthorizerFunction/invocations" in authorizer["x-amazon-apigateway-authorizer"]["authorizerUri"]
        assert front["integration"]["IntegrationType"] == "aws_proxy"
        assert ":ApiFunction/invocations" in front["integration"]["IntegrationUri"]
        permission = stack.resources["ApiJwtAuthorizerAuthorizerPermission"]
        assert stack.exists("ApiJwtAuthorizerAuthorizerPermission")
        assert permission["Properties"]["Principal"] == "apigateway.amazonaws.com"
        responses = stack.resolve(stack.resources["Api"]["Properties"]["Body"])["x-amazon-apigateway-gateway-responses"]
        for kind, status, code in [("UNAUTHORIZED", "401", "UNAUTHENTICATED"), ("ACCESS_DENIED", "403", "FORBIDDEN")]:
            assert responses[kind]["statusCode"] == status
            assert json.loads(responses[kind]["responseTemplates"]["application/json"])["error"]["code"] == code
        assert not any(
            r["Type"].startswith("AWS::ApiGatewayV2::") and stack.exists(n) for n, r in stack.resources.items()
        )
    assert stack.exists("AuthorizerFunction") is (door == "rest")
    # API Gateway may invoke the function from this API only
    [permission] = [
        stack.resolve(r["Properties"])
        for n, r in stack.resources.items()
        if r["Type"] == "AWS::Lambda::Permission"
        and stack.exists(n)
        and r["Properties"]["FunctionName"] in ({"Ref": "ApiFunction"}, {"Fn::GetAtt": ["ApiFunction", "Arn"]})
    ]
    api_id = stack.resolve({"Ref": front["api"]})
    assert (permission["Principal"], permission["Action"]) == ("apigateway.amazonaws.com", "lambda:InvokeFunction")
    assert permission["SourceArn"] == f"arn:aws:execute-api:{cfn.REGION}:{cfn.ACCOUNT}:{api_id}/*"


@pytest.mark.parametrize("door", ["http", "rest"])
def test_the_front_door_throttles_logs_each_request_and_gives_its_url(door):
    stack = cfn.Stack(expanded(), {"FrontDoor": door})
    front = _front_door(stack)
    assert front["throttle"] == _front_door(cfn.Stack(expanded(), {"FrontDoor": "rest"}))["throttle"]
    assert min(front["throttle"]) > 0
    logs = front["access_logs"]
    assert logs["DestinationArn"] == f"arn:aws:logs:{cfn.REGION}:{cfn.ACCOUNT}:ApiAccessLogs"
    fields = json.loads(logs["Format"])
    assert {"requestId", "status", "latencyMs", "path"} <= set(fields) and fields["requestId"] == "$context.requestId"
    api_id = stack.resolve({"Ref": front["api"]})
    host = f"https://{api_id}.execute-api.{cfn.REGION}.amazonaws.com/"
    assert stack.output("ApiUrl") == (host if door == "http" else f"{host}v1/")
    assert (stack.output("ApiKeyId") is not None) is (door == "rest")  # API keys and usage plans: REST only
    # the 5XX alarm and the latency alarm watch this API by its own metric names and dimensions
    five = stack.resolve(stack.resources["Api5xxAlarm"]["Properties"])["Metrics"][0]["MetricStat"]["Metric"]
    latency = stack.resolve(stack.resources["ApiLatencyP99Alarm"]["Properties"])
    dimensions = (
        [{"Name": "ApiId", "Value": api_id}, {"Name": "Stage", "Value": "$default"}]
        if door == "http"
        else [{"Name": "ApiName", "Value": "dev-hotledger"}, {"Name": "Stage", "Value": "v1"}]
    )
    assert five["MetricName"] == ("5xx" if door == "http" else "5XXError") and five["Dimensions"] == dimensions
    assert latency["MetricName"] == "Latency" and latency["Dimensions"] == dimensions
    widgets = json.loads(stack.resolve(stack.resources["Dashboard"]["Properties"]["DashboardBody"]))["widgets"]
    [gateway] = [w["properties"]["metrics"] for w in widgets if w["properties"]["title"] == "API Gateway"]
    assert gateway[0][:6] == ["AWS/ApiGateway", "Latency"] + [v for d in dimensions for v in (d["Name"], d["Value"])]
    assert gateway[2][1] == five["MetricName"]


WEB_ACL = f"arn:aws:wafv2:{cfn.REGION}:{cfn.ACCOUNT}:regional/webacl/edge/0f1e2d3c-aaaa-bbbb-cccc-0123456789ab"


def test_a_web_acl_attaches_to_the_rest_api_only():
    """WAF cannot attach to an HTTP API: with FrontDoor http the Rules refuse WebAclArn (CloudFront with the web ACL
    goes in front instead, docs/operations.md); with rest the web ACL is put on the API's stage."""
    rest = cfn.Stack(expanded(), {"FrontDoor": "rest", "WebAclArn": WEB_ACL})
    assert rest.broken_rules() == [] and rest.exists("ApiWebAclAssociation")
    association = rest.resolve(rest.resources["ApiWebAclAssociation"]["Properties"])
    assert association == {
        "ResourceArn": f"arn:aws:apigateway:{cfn.REGION}::/restapis/Api-physical-id/stages/Apiv1Stage-physical-id",
        "WebACLArn": WEB_ACL,
    }
    assert cfn.Stack(expanded(), {"FrontDoor": "http", "WebAclArn": WEB_ACL}).broken_rules() == [
        "WAF attaches to the REST API only; with FrontDoor=http put CloudFront with the web ACL in front"
    ]
    for door in ("http", "rest"):
        stack = cfn.Stack(expanded(), {"FrontDoor": door})
        assert stack.broken_rules() == [] and not stack.exists("ApiWebAclAssociation")


def test_the_local_runtime_serves_the_templates_default_front_door_unless_told(monkeypatch):
    """HOTLEDGER_FRONT_DOOR defaults to the template's FrontDoor default; both doors route the same function and
    leave the same routes public."""
    path = REPO / "template.yaml"
    monkeypatch.delenv("HOTLEDGER_FRONT_DOOR", raising=False)
    assert template.front_door(path) == expanded()["Parameters"]["FrontDoor"]["Default"] == "http"
    monkeypatch.setenv("HOTLEDGER_FRONT_DOOR", "rest")
    assert template.front_door(path) == "rest"
    monkeypatch.setenv("HOTLEDGER_FRONT_DOOR", "websocket")
    with pytest.raises(ValueError, match="HOTLEDGER_FRONT_DOOR"):
        template.front_door(path)
    for door in ("http", "rest"):
        assert template.api_routes(path, door) == {"ApiFunction": PUBLIC}, door


def test_the_authorizer_trusts_only_the_stacks_user_pool_and_its_app_clients():
    resources = expanded()["Resources"]
    function = resources["AuthorizerFunction"]["Properties"]
    assert function["Handler"] == "authorizer.app.handler"
    assert function.get("VpcConfig") in (None, {"Ref": "AWS::NoValue"})  # it reads the pool's public JWKS
    variables = function["Environment"]["Variables"]
    assert variables["AUTH_ISSUER"] == {"Fn::Sub": "https://cognito-idp.${AWS::Region}.amazonaws.com/${UserPool}"}
    assert variables["AUTH_JWKS_URL"]["Fn::Sub"].endswith("${UserPool}/.well-known/jwks.json")
    assert variables["AUTH_CLIENT_IDS"] == {
        "Fn::Join": [",", [{"Ref": "ServiceClient"}, {"Ref": "OperatorClient"}, {"Ref": "UserClient"}]]
    }
    server = resources["UserPoolResourceServer"]["Properties"]
    assert server["Identifier"] == "hotledger" and {s["ScopeName"] for s in server["Scopes"]} == {"service", "admin"}
    for client, scope in [("ServiceClient", "hotledger/service"), ("OperatorClient", "hotledger/admin")]:
        props = resources[client]["Properties"]
        assert props["AllowedOAuthFlows"] == ["client_credentials"] and props["AllowedOAuthScopes"] == [scope]
        assert props["GenerateSecret"] is True
    assert "AllowedOAuthScopes" not in resources["UserClient"]["Properties"]  # end users get no backend scope
    assert resources["UserPool"]["Properties"].get("UsernameAttributes") is None  # the username is the account id


def test_redis_is_a_cluster_mode_replication_group_the_functions_reach_through_its_configuration_endpoint():
    """Cluster mode with shards and replicas by parameter (1 shard stays valid), Multi-AZ, TLS and AUTH; every
    function that names Redis reaches it as a cluster (REDIS_CLUSTER=1) through the configuration endpoint."""
    template = expanded()
    redis = template["Resources"]["Redis"]["Properties"]
    assert (redis["ClusterMode"], redis["NumNodeGroups"], redis["ReplicasPerNodeGroup"]) == (
        "Enabled",
        {"Ref": "RedisShards"},
        {"Ref": "RedisReplicasPerShard"},
    )
    assert "NumCacheClusters" not in redis
    assert (
        redis["AutomaticFailoverEnabled"]
        and redis["MultiAZEnabled"]
        and redis["TransitEncryptionEnabled"]
        and redis["AuthToken"]
    )
    assert template["Parameters"]["RedisShards"]["MinValue"] == 1
    parameters = template["Resources"][redis["CacheParameterGroupName"]["Ref"]]["Properties"]["Properties"]
    assert parameters["cluster-enabled"] == "yes"
    functions = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    with_redis = [
        f["Environment"]["Variables"] for f in functions if "REDIS_URL" in f.get("Environment", {}).get("Variables", {})
    ]
    assert with_redis and all(
        v["REDIS_CLUSTER"] == "1" and "ConfigurationEndPoint" in str(v["REDIS_URL"]) for v in with_redis
    )


@pytest.mark.parametrize(
    "parameters",
    [{}, {"EventTransport": "redis-stream"}, EXISTING],
    ids=["default-stack", "redis-stream", "existing-resources"],
)
def test_webhook_posts_leave_the_stack_whatever_its_vpc(parameters):
    """Issue 32 item 14. Failing first: the webhook sender posted from inside the VPC, and the VPC the stack creates has
    no NAT: on a fresh deploy no delivery ever left. Now the HTTP POST runs in WebhookPosterFunction, outside any VPC
    (Lambda's own internet access), holding no secret and no DB access; the in-VPC sender signs, hands it each attempt
    through Lambda's API (an interface endpoint where the stack makes them) and records the answer."""
    stack = cfn.Stack(expanded(), parameters)
    functions = stack.functions()
    poster = functions["WebhookPosterFunction"]["Properties"]
    assert poster["Handler"] == "webhook_poster.app.handler"
    assert "VpcConfig" not in poster  # outside the VPC: the internet without a NAT
    assert not {"DB_SECRET_ARN", "REDIS_AUTH_SECRET_ARN", "EVENT_KEYS_SECRET_ARN"} & set(
        stack.environment("WebhookPosterFunction")
    )
    sender = stack.environment("WebhookSenderFunction")
    assert sender["WEBHOOK_POSTER_FUNCTION"] == stack.resolve({"Ref": "WebhookPosterFunction"})
    arn = f"arn:aws:lambda:{cfn.REGION}:{cfn.ACCOUNT}:function:{sender['WEBHOOK_POSTER_FUNCTION']}"
    assert cfn.allowed(stack.statements_of("WebhookSenderFunction"), "lambda:InvokeFunction", arn)
    if stack.condition("UseEndpoints"):  # no NAT: Lambda's API through an interface endpoint
        assert stack.exists("LambdaEndpoint")


@pytest.mark.parametrize("parameters", [{}, EXISTING], ids=["default-stack", "existing-resources"])
def test_webhook_secrets_are_sealed_under_a_kms_key_the_api_seals_with_and_the_sender_alone_opens(parameters):
    """Issue 32 item 7: the stack's key seals signing secrets (envelope); the API may only make data keys
    (kms:GenerateDataKey), the sender alone may decrypt them; the key outlives a stack delete (the secrets with it) and
    KMS is reachable from the VPC (an interface endpoint where the stack makes them)."""
    stack = cfn.Stack(expanded(), parameters)
    key = stack.resources["WebhookSecretsKey"]
    assert key["Type"] == "AWS::KMS::Key" and key["Properties"]["EnableKeyRotation"] is True
    assert (key["DeletionPolicy"], key["UpdateReplacePolicy"]) == ("Retain", "Retain")
    key_id = stack.resolve({"Ref": "WebhookSecretsKey"})
    arn = f"arn:aws:kms:{cfn.REGION}:{cfn.ACCOUNT}:key/{key_id}"
    for function in stack.functions():
        env, statements = stack.environment(function), stack.statements_of(function)
        may_seal = cfn.allowed(statements, "kms:GenerateDataKey", arn)
        may_open = cfn.allowed(statements, "kms:Decrypt", arn)
        assert (may_seal, may_open) == (function == "ApiFunction", function == "WebhookSenderFunction"), function
        if function in ("ApiFunction", "WebhookSenderFunction"):
            assert env["WEBHOOK_SECRETS_KEY_ID"] == key_id
    if stack.condition("UseEndpoints"):
        assert stack.exists("KmsEndpoint")

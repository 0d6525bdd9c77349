"""Issue 21: `hotledger ops --stack <name>` finds a deployed stack's API, API key and operator token from the stack's
outputs (CloudFormation, API Gateway and Cognito control planes in moto) and Cognito's token endpoint (a local HTTP
server checking the client credentials as Cognito does), then calls the admin routes with them."""

import base64
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer

import boto3
import pytest

from helpers import moto_secrets
from infra import ops


class TokenEndpoint:
    """Cognito's /oauth2/token for one app client: client credentials in Basic auth, scope hotledger/admin."""

    def __init__(self, client_id: str, client_secret: str):
        expected = "Basic " + base64.b64encode(f"{client_id}:{client_secret}".encode()).decode()
        self.asked = []
        asked = self.asked

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["content-length"])).decode())
                asked.append(form)
                ok = self.headers.get("authorization") == expected and form.get("grant_type") == ["client_credentials"]
                self.send_response(200 if ok else 401)
                self.end_headers()
                self.wfile.write(
                    json.dumps({"access_token": "operator-token"} if ok else {"error": "invalid_client"}).encode()
                )

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/oauth2/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


URLS = {
    "rest": "https://abc.execute-api.us-east-1.amazonaws.com/v1/",
    "http": "https://abc.execute-api.us-east-1.amazonaws.com/",
}


@pytest.fixture(params=["rest", "http"])
def deployed(request, monkeypatch):
    """A stack of each front door: FrontDoor http has no API key (its output ApiKeyId is left out)."""
    with moto_secrets(monkeypatch):
        cognito = boto3.client("cognito-idp")
        pool = cognito.create_user_pool(PoolName="hotledger")["UserPool"]["Id"]
        client = cognito.create_user_pool_client(UserPoolId=pool, ClientName="operator", GenerateSecret=True)[
            "UserPoolClient"
        ]
        key = boto3.client("apigateway").create_api_key(name="hotledger", enabled=True, value="k" * 30)
        token_endpoint = TokenEndpoint(client["ClientId"], client["ClientSecret"])
        outputs = {
            "ApiUrl": URLS[request.param],
            **({"ApiKeyId": key["id"]} if request.param == "rest" else {}),
            "UserPoolId": pool,
            "OperatorClientId": client["ClientId"],
            "TokenUrl": token_endpoint.url,
        }
        token_endpoint.door = request.param
        boto3.client("cloudformation").create_stack(
            StackName="hotledger-dev",
            TemplateBody=json.dumps(
                {
                    "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
                    "Outputs": {name: {"Value": value} for name, value in outputs.items()},
                }
            ),
        )
        yield token_endpoint
        token_endpoint.server.shutdown()


def test_a_deployed_stack_is_reached_with_its_outputs_api_key_and_an_operator_token(deployed):
    target = ops.stack_target("hotledger-dev")
    api_key = "k" * 30 if deployed.door == "rest" else None
    assert target == ops.Target(URLS[deployed.door], "operator-token", api_key, "arn:aws:sts::123456789012:user/moto")
    assert deployed.asked == [{"grant_type": ["client_credentials"], "scope": ["hotledger/admin"]}]


def test_wrong_client_credentials_are_refused_by_the_token_endpoint(deployed):
    with pytest.raises(Exception, match="401"):
        ops.client_credentials_token(deployed.url, "someone", "else")


class ApiOverHttp:
    """The API function's handler behind a local HTTP server, as the caller `api` names (the authorizer's part): what
    the console sends, headers included, reaches the handler as API Gateway would pass it."""

    def __init__(self, api):
        class Handler(BaseHTTPRequestHandler):
            def _any(self):
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                status, answer = api(self.command, self.path, body, headers=dict(self.headers.items()))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(json.dumps(answer).encode())

            do_GET = do_POST = _any

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_an_operators_action_is_logged_as_the_person_sts_names_not_the_shared_client(deployed, monkeypatch):
    """Issue 32: `make ops --stack` acts with the stack's one operator app client, so the log named that client (the
    token's subject) for everyone. Failing first: the actor was the client id alone. Now the console names the person
    from STS GetCallerIdentity (an SSO session's ARN ends with the person's name, not only the shared role's) and the
    API logs '<that ARN> via <the token's subject>'; a caller without the admin scope cannot name anyone."""
    from helpers import Api
    from hotledger.webhooks.feature import webhooks

    monkeypatch.setattr(webhooks(), "allow_local", True)  # the service's logged action below: a local endpoint
    iam, sts = boto3.client("iam"), boto3.client("sts")
    role = iam.create_role(
        RoleName="AWSReservedSSO_Operators_0123456789abcdef", AssumeRolePolicyDocument=json.dumps({"Statement": []})
    )["Role"]["Arn"]
    session = sts.assume_role(RoleArn=role, RoleSessionName="alice@example.com")["Credentials"]
    for name, field in (
        ("AWS_ACCESS_KEY_ID", "AccessKeyId"),
        ("AWS_SECRET_ACCESS_KEY", "SecretAccessKey"),
        ("AWS_SESSION_TOKEN", "SessionToken"),
    ):
        monkeypatch.setenv(name, session[field])
    boto3.setup_default_session()  # acting as alice from here on (the default session keeps the credentials it read)
    target = ops.stack_target("hotledger-dev")
    assert target.operator.endswith(":assumed-role/AWSReservedSSO_Operators_0123456789abcdef/alice@example.com")

    operator, service = ApiOverHttp(Api(scopes=("admin",))), ApiOverHttp(Api(scopes=("service",)))
    try:
        ops.Target(operator.url, "t", operator=target.operator).ok(
            "POST", "/ops/dead-letters/replay", {"source": "writer", "ids": ["999999999"]}
        )
        ((line, *_),) = [ops.Target(operator.url, "t").ok("GET", "/ops/log?limit=1")]
        assert line["action"] == "replay.writer"
        assert line["actor"].startswith(f"{target.operator} via ")  # the person, then the client acting for them
        status, _ = ops.Target(service.url, "t", operator=target.operator).call(
            "POST", "/webhook-endpoints", {"url": "http://127.0.0.1:9/x", "event_types": ["charge.persisted"]}
        )
        ((line, *_),) = [ops.Target(operator.url, "t").ok("GET", "/ops/log?limit=1")]
        assert status == 201 and line["action"] == "create.webhook-endpoint"
        assert "alice" not in line["actor"]  # a service caller names no person
        Api()("DELETE", f"/webhook-endpoints/{line['detail']['endpoint_id']}")
    finally:
        operator.server.shutdown()
        service.server.shutdown()

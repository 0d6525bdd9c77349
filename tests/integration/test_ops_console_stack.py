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
    assert target == ops.Target(URLS[deployed.door], "operator-token", api_key)
    assert deployed.asked == [{"grant_type": ["client_credentials"], "scope": ["hotledger/admin"]}]


def test_wrong_client_credentials_are_refused_by_the_token_endpoint(deployed):
    with pytest.raises(Exception, match="401"):
        ops.client_credentials_token(deployed.url, "someone", "else")

"""Every AWS API call the functions make, with the resource it acts on. tests/integration/test_template.py holds
the code to this list (every boto3 or Powertools-parameters call found in functions/ is here) and the template to it
(each call is allowed by the policies of every function that can make it, under IAM's wildcard rules).

resource: an ARN pattern over the function's environment variables ({NAME}) and {region}, {account}, {partition}.
functions: the functions that make the call; None = all of them. The authorizer inherits the stack's environment
(SAM Globals) but never loads the settings: it verifies tokens against the pool's public JWKS and nothing else."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AwsCall:
    action: str  # IAM action, service:Operation
    resource: str
    functions: tuple[str, ...] | None = None
    why: str = ""


# every function but the authorizer loads the settings (secrets, tunables) at its cold start
SETTINGS_LOADERS = (
    "ApiFunction",
    "WriterFunction",
    "ReconcilerFunction",
    "StreamDrainerFunction",
    "DelayDrainerFunction",
    "SetupFunction",
)

CALLS = (
    AwsCall(
        "secretsmanager:GetSecretValue", "{DB_SECRET_ARN}", SETTINGS_LOADERS, why="hotledger.config: DB credentials"
    ),
    AwsCall(
        "secretsmanager:GetSecretValue",
        "{REDIS_AUTH_SECRET_ARN}",
        SETTINGS_LOADERS,
        why="hotledger.config: Redis AUTH token",
    ),
    AwsCall(
        "secretsmanager:GetSecretValue",
        "{EVENT_KEYS_SECRET_ARN}",
        SETTINGS_LOADERS,
        why="hotledger.dal.event_keys: the keyring that signs and verifies Kafka events",
    ),
    # the path itself: GetParametersByPath is authorized against parameter/<path>, not parameter/<path>/*
    AwsCall(
        "ssm:GetParametersByPath",
        "arn:{partition}:ssm:{region}:{account}:parameter{SSM_PARAMETER_PATH}",
        SETTINGS_LOADERS,
        why="hotledger.config: tunables",
    ),
    AwsCall(
        "lambda:InvokeFunction",
        "arn:{partition}:lambda:{region}:{account}:function:{WEBHOOK_POSTER_FUNCTION}",
        functions=("WebhookSenderFunction",),
        why="hotledger.webhooks.service: each attempt posted by the poster function, outside the VPC",
    ),
    AwsCall(
        "kms:GenerateDataKey",
        "arn:{partition}:kms:{region}:{account}:key/{WEBHOOK_SECRETS_KEY_ID}",
        functions=("ApiFunction",),
        why="hotledger.webhooks.secrets: a data key seals each new signing secret",
    ),
    AwsCall(
        "kms:Decrypt",
        "arn:{partition}:kms:{region}:{account}:key/{WEBHOOK_SECRETS_KEY_ID}",
        functions=("WebhookSenderFunction",),
        why="hotledger.webhooks.secrets: the sender opens a signing secret to sign",
    ),
    AwsCall(
        "kafka:GetBootstrapBrokers",
        "{MSK_CLUSTER_ARN}",
        functions=("SetupFunction",),
        why="hotledger.dal.topics: the brokers of the MSK cluster",
    ),
)

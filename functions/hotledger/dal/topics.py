"""The Kafka side of a deploy: where the brokers are (MSK has no bootstrap attribute in CloudFormation) and the topics
the service needs, created when missing."""

from __future__ import annotations

from hotledger.config import Settings
from hotledger.dal.publisher import confluent_connection


def bootstrap_brokers(cluster_arn: str) -> str:
    """The IAM-authenticated bootstrap brokers of an MSK cluster (provisioned or serverless), host:9098,..."""
    import boto3

    return str(boto3.client("kafka").get_bootstrap_brokers(ClusterArn=cluster_arn)["BootstrapBrokerStringSaslIam"])


def dead_letter_topic(topic: str) -> str:
    """Where the writer's trigger puts the records it gave up on (template.yaml: DestinationConfig kafka://...)."""
    return f"{topic}.dead-letter"


def ensure_topics(cfg: Settings, names: list[str], partitions: int, timeout_s: float = 30) -> list[str]:
    """Create the topics that do not exist yet (the others are left as they are); returns the ones created."""
    # confluent-kafka documents NewTopic under confluent_kafka.admin, whose stub re-imports it without exporting it
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient(confluent_connection(cfg))
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    missing = [name for name in names if name not in existing]
    if missing:
        # MSK keeps three replicas on its own; Tansu and single brokers take what they have (-1: broker default)
        futures = admin.create_topics([NewTopic(name, partitions, -1) for name in missing], request_timeout=timeout_s)
        for future in futures.values():
            future.result()
    return missing

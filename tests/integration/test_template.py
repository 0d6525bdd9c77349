"""The SAM template: linted by cfn-lint and `sam validate --lint`, built by `sam build`, and read by
the local runtime the same way."""
import os
import subprocess
from pathlib import Path

from infra.localrt import template

REPO = Path(__file__).resolve().parents[2]
SAM = REPO / ".tools" / "bin" / "sam"
OFFLINE_AWS = {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "offline", "AWS_SECRET_ACCESS_KEY": "offline",
               "SAM_CLI_TELEMETRY": "0"}


def _run(*cmd: str, timeout: int = 600) -> str:
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**os.environ, **OFFLINE_AWS})
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_cfn_lint_passes():
    _run(str(REPO / ".venv" / "bin" / "cfn-lint"), "template.yaml")


def test_sam_validate_lint_passes():
    assert "is a valid SAM Template" in _run(str(SAM), "validate", "--lint")


def test_sam_build_packages_every_function(tmp_path):
    _run(str(SAM), "build", "--build-dir", str(tmp_path / "build"))
    for function in ("ApiFunction", "WriterFunction", "ReconcilerFunction"):
        built = tmp_path / "build" / function
        assert (built / "hotledger" / "ledger" / "service.py").exists() and (built / "pymysql").is_dir()


def test_local_runtime_reads_the_functions_and_triggers():
    functions = {fn.name: fn for fn in template.load(REPO / "template.yaml")}
    assert functions["ApiFunction"].api and functions["ApiFunction"].handler == "api.app.handler"
    assert functions["WriterFunction"].msk == {"topic": "hotledger.ledger", "batch_size": 1000, "window_s": 0.0,
                                              "group_id": "hotledger-writer"}
    assert functions["ReconcilerFunction"].schedules == [60]
    assert all(fn.layer_dirs == [REPO / "layers" / "lua"] for fn in functions.values())
    assert {p.stem for p in functions["ApiFunction"].layer_dirs[0].glob("*.lua")} >= {"ledger_apply", "ledger_rollback", "outbox_claim"}

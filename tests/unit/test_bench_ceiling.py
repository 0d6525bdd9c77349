"""bench/ceiling.py (issue 33 goal 2): the C tools' output read as they print it, the private MariaDB started with an
RDS/Aurora instance's durability, and the AWS model's arithmetic."""

from __future__ import annotations

import pytest

from bench import ceiling

MYSQLSLAP = """Benchmark
\tAverage number of seconds to run all queries: 4.004 seconds
\tMinimum number of seconds to run all queries: 4.004 seconds
\tMaximum number of seconds to run all queries: 4.004 seconds
\tNumber of clients running queries: 16
\tAverage number of queries per client: 125
"""


def test_mysqlslap_seconds_are_read_from_its_report():
    assert ceiling.mysqlslap_seconds(MYSQLSLAP) == 4.004


def test_mysqlslap_without_a_timing_is_an_error_not_a_zero():
    with pytest.raises(RuntimeError, match="no timing"):
        ceiling.mysqlslap_seconds("mysqlslap: Error when connecting to server: 2002")


def test_redis_benchmark_rate_is_its_last_figure():
    out = "EVALSHA ...: rps=12000.0 (overall: 11000.0) avg_msec=1.0\rEVALSHA ...: 22471.91 requests per second\n"
    assert ceiling.redis_benchmark_rate(out) == 22471.91


def test_the_private_mariadb_runs_with_rds_durability():
    command = ceiling.DurableMariaDB(3306, ceiling.REPO / ".state" / "unused").command()
    for flag in ("--log-bin=binlog", "--sync-binlog=1", "--innodb-flush-log-at-trx-commit=1"):
        assert flag in command


def test_the_statement_path_is_the_procedure_s_transaction():
    assert ceiling.STATEMENTS[0] == "START TRANSACTION" and ceiling.STATEMENTS[-1] == "COMMIT"
    assert "FOR UPDATE" in ceiling.STATEMENTS[1]
    assert all(";" not in s for s in ceiling.STATEMENTS)  # mysqlslap splits the query on ;
    for step in ("FOR UPDATE", "UPDATE t_account", "INSERT INTO t_order", "COMMIT"):
        assert step in ceiling.PROCEDURE


def test_aws_model_adds_the_round_trips_under_the_lock_to_the_database_only():
    model = ceiling.aws_model(usec_per_call=20.0, db_per_s=1000.0, rtt_ms=0.25)
    assert model["db_us_per_deduct"] == 1000.0
    assert model["redis_per_s"] == 50_000.0
    assert model["db_per_s"] == pytest.approx(1e6 / (1000 + ceiling.DB_RTTS_UNDER_LOCK * 250), abs=0.1)
    assert model["ratio"] == pytest.approx(50_000 / model["db_per_s"], abs=0.1)

"""A cluster's REDIS_URL names one seed or several (issue 31, hole 9): every one is kept, credentials and options too."""

import pytest

from hotledger.dal.redis_store import cluster_seeds


def test_several_seeds_are_every_one_kept_with_the_credentials_and_options_on_the_first():
    url, seeds = cluster_seeds("rediss+cluster://app:s3cret@10.0.0.1:7000,10.0.0.2,[::1]:7002/0?ssl_cert_reqs=required")
    assert seeds == (("10.0.0.1", 7000), ("10.0.0.2", 6379), ("::1", 7002))
    assert url == "rediss://app:s3cret@10.0.0.1:7000/0?ssl_cert_reqs=required"


def test_one_seed_is_the_url_as_it_was():
    assert cluster_seeds("redis+cluster://127.0.0.1:7000") == ("redis://127.0.0.1:7000", (("127.0.0.1", 7000),))


def test_an_empty_seed_is_refused():
    with pytest.raises(ValueError, match="host:port"):
        cluster_seeds("redis+cluster://127.0.0.1:7000,,127.0.0.1:7001")

"""The rendezvous' inputs: --rdzv-conf, the handler's parameters and the endpoint grammar."""

from __future__ import annotations

import re

import pytest

from xrun.errors import UsageError
from xrun.runtime.rendezvous import (
    Endpoint,
    RendezvousParams,
    config_from_conf,
    create_handler,
    parse_rdzv_conf,
)
from xrun.runtime.rendezvous.endpoint import unbracket

# -- --rdzv-conf and endpoints -----------------------------------------------------------------


def test_parse_rdzv_conf_accepts_the_documented_keys() -> None:
    conf = parse_rdzv_conf("join_timeout=60, last_call_timeout=5,heartbeat_timeout=20,is_host=0")
    assert conf == {
        "join_timeout": "60",
        "last_call_timeout": "5",
        "heartbeat_timeout": "20",
        "is_host": "0",
    }
    cfg = config_from_conf(conf)
    assert (cfg.join_timeout, cfg.last_call_timeout, cfg.heartbeat_timeout, cfg.is_host) == (
        60.0,
        5.0,
        20.0,
        False,
    )
    assert config_from_conf({}).heartbeat_timeout == 15.0
    assert config_from_conf({"timeout": "7"}).join_timeout == 7.0  # torchrun's static spelling
    # the exit barrier has its own, long default (torchrun's 300 s), not close_timeout's 30 s
    assert config_from_conf({}).exit_barrier_timeout == 300.0
    assert config_from_conf({"exit_barrier_timeout": "2"}).exit_barrier_timeout == 2.0
    assert parse_rdzv_conf("") == {}


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("join_timeout=", "join_timeout"),
        ("join_timeout=abc", "join_timeout='abc'"),
        ("last_call_timeout=-1", "last_call_timeout"),
        ("read_timeout=inf", "read_timeout"),
        ("join_timeout", "KEY=VALUE"),
        ("heartbeat_interval=30", "smaller than heartbeat_timeout"),
        ("is_host=maybe", "is_host"),
        ("token=abc", "command line"),
        ("token_file=", "token_file"),
    ],
)
def test_bad_rdzv_conf_is_a_one_line_usage_error(raw: str, needle: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_rdzv_conf(raw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_torchrun_keys_are_accepted_and_unknown_keys_warn(capsys) -> None:
    # every key torchrun's backends read is accepted; keep-alive sets xrun's heartbeat
    cfg = config_from_conf({"keep_alive_interval": "2", "keep_alive_max_attempt": "4"})
    assert (cfg.heartbeat_interval, cfg.heartbeat_timeout) == (2.0, 8.0)
    assert parse_rdzv_conf("store_type=tcp,use_libuv=1,protocol=https,etcd_prefix=/x") == {
        "store_type": "tcp",
        "use_libuv": "1",
        "protocol": "https",
        "etcd_prefix": "/x",
    }
    assert capsys.readouterr().err == ""
    # a key no backend knows: one warning line, then ignored (torchrun ignores it silently)
    assert config_from_conf({"joint_timeout": "5"}).join_timeout == 600.0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'joint_timeout' is not known" in err
    # shell quotes passed through literally, as PyTorch's own test does
    quoted = "'join_timeout=5,last_call_timeout=1,timeout=5'"
    assert config_from_conf(parse_rdzv_conf(quoted)).join_timeout == 5.0


def test_create_handler_validates_params() -> None:
    def params(**kw: object) -> RendezvousParams:
        base: dict = dict(
            backend="c10d",
            endpoint=Endpoint("localhost", 0),
            run_id="j",
            min_nodes=1,
            max_nodes=1,
            local_world_size=1,
            conf={},
        )
        base.update(kw)
        return RendezvousParams(**base)

    for bad, needle in [
        (params(backend="zookeeper"), "zookeeper"),
        (params(min_nodes=3, max_nodes=2), "3:2"),
        (params(run_id=""), "run id"),
        (params(backend="static", max_nodes=2, min_nodes=2, node_rank=2), "--node-rank 2"),
        (params(conf={"join_timeout": "x"}), "join_timeout"),
    ]:
        with pytest.raises(UsageError, match=needle):
            create_handler(bad)


def test_parse_endpoint_forms() -> None:
    assert Endpoint.parse("node0:1234") == Endpoint("node0", 1234)
    assert Endpoint.parse("node0") == Endpoint("node0", 29400)
    assert Endpoint.parse("[::1]:5") == Endpoint("::1", 5)
    assert Endpoint.parse("::1") == Endpoint("::1", 29400)
    for bad in ("[::1", ":80", "h:port", "h:99999", "h:\u00b2", "h:\uff11", "h:-1"):
        with pytest.raises(UsageError, match="rendezvous endpoint"):
            Endpoint.parse(bad)


def test_an_ipv6_address_with_a_port_needs_brackets() -> None:
    assert Endpoint.parse("fe80::1:2") == Endpoint("fe80::1:2", 29400)  # whole address: no port
    with pytest.raises(UsageError, match=re.escape("[IPV6]:PORT, e.g. [::1]:29400")):
        Endpoint.parse("::1:29400")  # not an address: the port would be ambiguous
    assert Endpoint.parse("[::1]") == Endpoint("::1", 29400)


def test_an_endpoint_prints_with_ipv6_in_brackets_and_reads_back() -> None:
    for host, port in (("node0", 5), ("::1", 29400), ("10.0.0.1", 0)):
        assert Endpoint.parse(str(Endpoint(host, port))) == Endpoint(host, port)
    assert str(Endpoint("::1", 5)) == "[::1]:5"
    with pytest.raises(AttributeError):
        Endpoint("h", 1).port = 2  # type: ignore[misc]  # a value: frozen
    assert unbracket("[::1]") == "::1" and unbracket("node0") == "node0"

"""The job spec: dataclasses, macros, mounts, handles, YAML round trip."""

from __future__ import annotations

import pytest

from xrun.errors import UsageError
from xrun.specs import (
    AppDef,
    AppHandle,
    AppState,
    AppStatus,
    BindMount,
    DeviceMount,
    ReplicaStatus,
    Resource,
    RetryPolicy,
    Role,
    RoleStatus,
    VolumeMount,
    appdef_from_yaml,
    appdef_to_yaml,
    is_terminal,
    macros,
    parse_mounts,
)


def _role(**kw: object) -> Role:
    base: dict[str, object] = dict(name="trainer", image="/img", entrypoint="sh")
    base.update(kw)
    return Role(**base)  # type: ignore[arg-type]


VALUES = macros.Values(img_root="/root", app_id="app-1", replica_id="3", rank0_env="R0_HOST")


def test_macros_substituted_in_args_and_env() -> None:
    role = _role(
        args=["-c", "run ${app_id} ${replica_id} ${img_root}/x ${${rank0_env}}:29500"],
        env={"ID": "${app_id}-${replica_id}", "PLAIN": "v"},
    )
    out = VALUES.apply(role)
    assert out.args == ["-c", "run app-1 3 /root/x ${R0_HOST}:29500"]
    assert out.env == {"ID": "app-1-3", "PLAIN": "v"}


def test_macros_leave_unknown_alone_and_unescape_dollars() -> None:
    out = VALUES.apply(_role(args=["${unknown} $HOME $$ $${app_id}"]))
    # `$$` is a literal `$`, so `$${app_id}` is the literal text `${app_id}`
    assert out.args == ["${unknown} $HOME $ ${app_id}"]


def test_macros_do_not_mutate_the_original_role() -> None:
    role = _role(args=["${app_id}"], env={"A": "${replica_id}"})
    VALUES.apply(role)
    assert role.args == ["${app_id}"]
    assert role.env == {"A": "${replica_id}"}


def test_resource_copy_merges_capabilities() -> None:
    r = Resource(cpu=2, gpu=1, memMB=1024, capabilities={"a": 1})
    c = Resource.copy(r, b=2)
    assert c.capabilities == {"a": 1, "b": 2}
    assert r.capabilities == {"a": 1}
    assert (c.cpu, c.gpu, c.memMB) == (2, 1, 1024)


@pytest.mark.parametrize(
    "text,expected",
    [
        (["type=bind,src=/a,dst=/b"], [BindMount("/a", "/b", False)]),
        (["type=bind,src=/a,dst=/b,readonly"], [BindMount("/a", "/b", True)]),
        (["type=volume,src=vol,dst=/data"], [VolumeMount("vol", "/data", False)]),
        (["type=device,src=/dev/fuse"], [DeviceMount("/dev/fuse", "/dev/fuse", "rwm")]),
        (["type=device,src=/dev/a,dst=/dev/b,perm=r"], [DeviceMount("/dev/a", "/dev/b", "r")]),
        (
            ["type=bind", "src=/a", "dst=/b", "type=volume", "src=v", "dst=/c"],
            [BindMount("/a", "/b"), VolumeMount("v", "/c")],
        ),
    ],
)
def test_parse_mounts(text: list[str], expected: list[object]) -> None:
    assert parse_mounts(text) == expected


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("src=/a,dst=/b", "no type="),
        ("type=bind,src=/a", "needs src= and dst="),
        ("type=nfs,src=/a,dst=/b", "unknown type 'nfs'"),
        ("type=device,dst=/x", "needs src="),
        ("type=device,src=/dev/a,perm=rwx", "perm='rwx'"),
        ("type=bind,src=/a,dst=/b,bogus", "unknown flag 'bogus'"),
    ],
)
def test_parse_mounts_errors_name_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_mounts([text])
    assert fragment in str(e.value)
    assert "type=bind" in str(e.value) or fragment.startswith("perm")
    assert "\n" not in str(e.value)


def test_app_handle_round_trip() -> None:
    h = AppHandle.parse("local_cwd://default/ddp-abc123")
    assert (h.scheduler, h.session, h.app_id) == ("local_cwd", "default", "ddp-abc123")
    assert str(h) == "local_cwd://default/ddp-abc123"
    assert AppHandle.parse("slurm:///1234").session == ""


@pytest.mark.parametrize(
    "bad", ["", "ddp-abc", "local_cwd:/default/x", "local_cwd://default/", "://s/x", "a://s/x/y"]
)
def test_malformed_handle_errors_with_expected_form(bad: str) -> None:
    with pytest.raises(UsageError) as e:
        AppHandle.parse(bad)
    assert "SCHEDULER://SESSION/APP_ID" in str(e.value)


def test_appdef_yaml_round_trip() -> None:
    app = AppDef(
        name="job",
        roles=[
            _role(
                args=["-c", "echo ${app_id} 'a b'"],
                env={"K": "v"},
                num_replicas=3,
                min_replicas=1,
                max_retries=2,
                retry_policy=RetryPolicy.REPLICA,
                resource=Resource(cpu=4, gpu=0, memMB=2048, capabilities={"x": "y"}),
                port_map={"tb": 6006},
                mounts=[
                    BindMount("/a", "/b", True),
                    VolumeMount("v", "/c"),
                    DeviceMount("/d", "/d"),
                ],
                metadata={"m": 1},
            ),
            _role(name="ps"),
        ],
        metadata={"team": "ml"},
    )
    text = appdef_to_yaml(app)
    assert "retry_policy: REPLICA" in text
    back = appdef_from_yaml(text)
    assert back == app


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("name: x\nroles: [", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping with 'name' and 'roles'"),
        (
            "name: x\nroles:\n- name: r\n  image: i\n  entrypoint: e\n  colour: red\n",
            "unknown field 'colour'",
        ),
        (
            "name: x\nroles:\n- name: r\n  image: i\n  entrypoint: e\n  retry_policy: SOMETIMES\n",
            "retry_policy",
        ),
        (
            "name: x\nroles:\n- name: r\n  image: i\n  entrypoint: e\n  num_replicas: 0\n",
            "num_replicas=0",
        ),
        (
            "name: x\nroles:\n- name: r\n  image: i\n  entrypoint: e\n  mounts:\n  - {type: nfs}\n",
            "unknown mount type",
        ),
        ("name: x\nroles: []\n", "has no roles"),
    ],
)
def test_bad_yaml_spec_errors(text: str, fragment: str) -> None:
    with pytest.raises(UsageError) as e:
        appdef_from_yaml(text, source="spec.yaml")
    assert fragment in str(e.value)
    assert str(e.value).startswith("spec.yaml")


def test_validate_rejects_duplicate_roles_and_bad_names() -> None:
    with pytest.raises(UsageError, match="two roles are named"):
        AppDef("a", [_role(), _role()]).validate()
    with pytest.raises(UsageError, match="role name"):
        AppDef("a", [_role(name="has space")]).validate()
    with pytest.raises(UsageError, match="min_replicas=5"):
        AppDef("a", [_role(num_replicas=2, min_replicas=5)]).validate()


def test_states_and_status_format() -> None:
    assert [s for s in AppState if is_terminal(s)] == [
        AppState.SUCCEEDED,
        AppState.FAILED,
        AppState.CANCELLED,
    ]
    status = AppStatus(
        state=AppState.FAILED,
        msg="replica trainer/1 exited 3",
        roles=[
            RoleStatus(
                "trainer",
                [
                    ReplicaStatus(0, AppState.CANCELLED, "trainer", "h0"),
                    ReplicaStatus(1, AppState.FAILED, "trainer", "h1", 3, "ValueError: bad"),
                ],
            )
        ],
    )
    text = status.format()
    assert "State: FAILED" in text
    assert "trainer/1: FAILED host=h1 exit_code=3" in text
    assert "error: ValueError: bad" in text
    assert status.is_terminal()

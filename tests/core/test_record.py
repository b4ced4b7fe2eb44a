"""xrun.record: value classes that behave like (frozen) dataclasses without the cost of making
one, and the agent's start-up making only the dataclasses torch's API has (benchmark 1)."""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys

import pytest

from xrun.record import Record, Value
from xrun.runtime.config import WorkerGroup
from xrun.runtime.events import JobClosed, RendezvousChanged, Signalled
from xrun.runtime.rendezvous.conf import RdzvConfig
from xrun.runtime.rendezvous.endpoint import Endpoint
from xrun.runtime.rendezvous.keys import Seat


class Point(Value):
    x: int
    y: int = 0


class Box(Record):
    __slots__ = _fields = ("items",)

    def __init__(self, items: list[int]) -> None:
        self.items = items


def test_value_compares_hashes_and_prints_by_its_fields():
    assert Point(1, 2) == Point(1, 2)
    assert Point(1, 2) != Point(2, 1)
    assert hash(Point(1, 2)) == hash(Point(1, 2))
    assert len({Point(1, 2), Point(1, 2), Point(1)}) == 2
    assert repr(Point(1, 2)) == "Point(x=1, y=2)"


def test_value_of_another_class_is_never_equal():
    class Other(Point):
        __slots__ = ()

    assert Point(1, 2) != Other(1, 2)
    assert Point(1, 2) != (1, 2)


def test_value_cannot_change_and_replace_makes_a_copy():
    p = Point(1, 2)
    with pytest.raises(AttributeError, match="is a value: x cannot change"):
        p.x = 5
    with pytest.raises(AttributeError):
        p.z = 5  # type: ignore[attr-defined]  # slots: no new attributes either
    q = p._replace(y=7)
    assert (p, q) == (Point(1, 2), Point(1, 7))
    with pytest.raises(TypeError, match="Point has no field 'z'"):
        p._replace(z=1)


@pytest.mark.parametrize(
    "copier", [copy.copy, copy.deepcopy, lambda v: pickle.loads(pickle.dumps(v))]
)
def test_values_pickle_and_copy_as_frozen_dataclasses_do(copier):
    # pickle and copy set slots with setattr, which a Value refuses: __reduce__ rebuilds it
    for v in (
        Point(1, 2),
        Endpoint("::1", 29400),
        RdzvConfig(token_file="/t"),
        WorkerGroup("r", "j", 2, 0, 4, 0, 2, "h", 1, 0, 3, rdzv_round=5),
    ):
        c = copier(v)
        assert c == v and type(c) is type(v)


def test_value_needs_every_field():
    class Pair(Value):
        a: int
        b: int

    with pytest.raises(TypeError, match="Pair is missing the field 'b'"):
        Pair(1)
    with pytest.raises(TypeError, match="Pair has no field 'c'"):
        Pair(1, 2, c=3)
    with pytest.raises(TypeError, match="Pair got 'a' twice"):
        Pair(1, a=2)
    with pytest.raises(TypeError, match="Pair takes 2 fields"):
        Pair(1, 2, 3)


def test_value_fields_come_from_annotations_once():
    class Base(Value):
        a: int
        b: str = "x"

    class Derived(Base):
        c: tuple[int, ...] = ()
        note: str
        __slots__ = ("note",)  # a slot, not a field: neither compared nor printed

    assert Derived._fields == Derived.__match_args__ == ("a", "b", "c")
    assert Derived(1) == Derived(a=1, b="x", c=()) != Derived(1, c=(2,))
    assert repr(Derived(1, "y")) == "Derived(a=1, b='y', c=())"
    assert Base.__slots__ == ("a", "b") and Derived.__slots__ == ("c", "note")
    d = Derived(2)
    object.__setattr__(d, "note", "n")
    assert d == Derived(2) and copy.copy(d).note == "n"
    match d:
        case Derived(a, b, c):
            assert (a, b, c) == (2, "x", ())


def test_record_is_mutable_and_still_compares_by_value():
    b = Box([1])
    b.items.append(2)
    assert b == Box([1, 2])
    assert repr(b) == "Box(items=[1, 2])"


def test_the_agents_values_behave_as_their_dataclasses_did():
    group = WorkerGroup("trainer", "job", 2, 0, 4, 0, 2, "h", 29500, 0, 3)
    assert group.rdzv_round == 0
    assert group._replace(rdzv_round=2).rdzv_round == 2
    assert group == WorkerGroup("trainer", "job", 2, 0, 4, 0, 2, "h", 29500, 0, 3)
    assert RdzvConfig() == RdzvConfig(join_timeout=600.0)
    assert RdzvConfig(heartbeat_interval=1).heartbeat_timeout == 15.0
    assert Seat.parse(Seat(1, 8, 2, 16).encode()) == Seat(1, 8, 2, 16)
    seen = []
    for event in (Signalled(15), JobClosed("done", False), RendezvousChanged("joined")):
        match event:
            case Signalled(signum):
                seen.append(signum)
            case JobClosed(reason, failed):
                seen.append((reason, failed))
            case RendezvousChanged(reason):
                seen.append(reason)
    assert seen == [15, ("done", False), "joined"]


def test_agent_start_up_makes_only_the_dataclasses_of_torchs_api():
    # Making a dataclass class costs ~0.5-2 ms (its methods are compiled from source), on
    # every agent's start: only the classes torch's launcher API exposes as dataclasses
    # (users call dataclasses.replace/asdict on them) are still made.
    code = """
import dataclasses, json, sys
made = []
orig = dataclasses._process_class
def count(cls, *a, **k):
    made.append(cls.__module__ + "." + cls.__qualname__)
    return orig(cls, *a, **k)
dataclasses._process_class = count
import xrun.runtime.__main__, xrun.runtime.agent, xrun.runtime.args
print(json.dumps(made))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    made = set(json.loads(out.stdout))
    assert made <= {
        "xrun.runtime.config.LaunchConfig",
        "xrun.runtime.errors.failure.ProcessFailure",
        "xrun.runtime.workers.api.RunProcsResult",
    }, made

"""Audit of a worker's extension while a job's row claim decides.

``process()`` puts a job among the running ones before its database claim, and the
worker's extension kept every running id whoever held its lease. Worker process W1 held
job J claimed ahead in its batch; Redis lost its data, the sweep added J again, and W2
claimed and started it. While W1's claim of J's row was deciding (to defer it: W2 had
just started it), an extension of W1's took J's lease from W2, so W1's deferral then
moved J to pending as its own (its nack moves only its own leases), where a third claim
took it over beside W2. An id is now kept whoever holds it only once its row is claimed.
"""

from __future__ import annotations

from django_delayjobs.engine import Engine
from django_delayjobs.execution import Execution
from django_delayjobs.models import Job
from django_delayjobs.worker import Options, WorkerProcess
from tests.test_audit_lse import another

Q = "default"
HOUR = 3_600_000


def lease_of(engine: Engine, id_: str) -> float | None:
    return engine.client.zscore(engine.keys(Q).unack, id_)


def test_a_running_id_whose_row_is_not_claimed_yet_is_kept_only_under_its_own_lease(engine):
    process = WorkerProcess(engine, Options(queues=[Q]))
    engine.add(Q, {"j": 0})
    process.hold(Q, engine.claim(Q, 1, lease_ms=HOUR))  # W1's batch
    engine.client.flushdb()  # a restart without persistence
    engine.add(Q, {"j": 0})  # the reconcile sweep's add
    other = another(engine)
    assert other.claim(Q, 1, lease_ms=HOUR) == ["j"]  # W2
    theirs = lease_of(engine, "j")
    execution = Execution(Q, "j", process.id)
    execution.job = Job()  # as a claim that matched nothing sets it, deciding what to do
    with process.held_lock:
        process.running[1] = execution  # W1 reached J: its row claim has not returned
    process.extend_leases()
    assert lease_of(engine, "j") == theirs  # left to W2, and lost here
    assert "j" in process.lost
    execution.row_claimed = True  # had the claim returned the row, J's action would run here
    process.extend_leases()
    assert lease_of(engine, "j") not in (None, theirs)  # kept whoever held it


def test_a_hand_back_of_an_id_another_worker_holds_now_says_so(engine, caplog):
    """The nack leaves it under that worker's lease: it is not counted as handed back
    (``hand_back_waiting`` logged every id it was given as handed back)."""
    process = WorkerProcess(engine, Options(queues=[Q]))
    engine.add(Q, {"j": 0, "k": 0})
    process.hold(Q, engine.claim(Q, 2, lease_ms=HOUR))
    engine.client.flushdb()
    engine.add(Q, {"j": 0})
    assert another(engine).claim(Q, 1, lease_ms=HOUR) == ["j"]
    theirs = lease_of(engine, "j")
    assert process.give_back(Q, ["j", "k"]) == 0
    assert lease_of(engine, "j") == theirs
    assert "2 of 2 job(s) handed back were not in flight under this worker's lease" in caplog.text

"""Cancelling jobs and giving up on interpreters, as the pool's user sees it."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from aserve.engine import BatchCancelled, InterpreterLost, ModelSpec, Pool
from aserve.errors import EngineError, ModelError
from aserve.tensor import Tensor

from ..conftest import until

ENGINES = ["private", "main"] + (["subinterp"] if sys.version_info >= (3, 12) else [])

# Opens the FIFO its input names and reads a byte: open(2) blocks in the kernel until a writer
# comes, where no exception raised into the interpreter can reach it.
# (A bare descriptor: the Cancelled pending when open returns leaves no file object to finalize.)
BLOCKER = """
import os
from array import array
from aserve.runtime import Model, TensorSpec

class Blocker(Model):
    inputs = [TensorSpec("PATH", "UINT8", (-1,))]
    outputs = [TensorSpec("OUT", "INT32", (1,))]

    def __call__(self, inputs):
        path = bytes(inputs["PATH"]).decode()
        if path:
            fd = os.open(path, os.O_RDONLY)
            os.read(fd, 1)
            os.close(fd)
        return {"OUT": array("i", [len(path)])}
"""


def path_input(path: str) -> list[Tensor]:
    data = path.encode()
    return [Tensor("UINT8", (len(data),), data)]


@pytest.mark.parametrize("engine", ENGINES)
async def test_blocked_job_is_given_up_and_its_interpreter_comes_back(engine, model_dir, tmp_path,
                                                                      monkeypatch) -> None:
    monkeypatch.setattr(Pool, "cancel_grace_s", 0.2)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    loop = asyncio.get_running_loop()
    async with Pool(engine=engine, interpreters=1) as pool:
        await pool.load(ModelSpec(name="b", version="3", key="b/3", path=str(model_dir(BLOCKER))))
        blocked: asyncio.Future = loop.create_future()
        job = pool.run("b/3", path_input(str(fifo)), lambda outputs, error: blocked.set_result(error))
        await until(lambda: pool.running_jobs() != [], what="the job to start")
        # a job queued behind it is cancelled before it runs
        queued: asyncio.Future = loop.create_future()
        behind = pool.run("b/3", path_input(""), lambda outputs, error: queued.set_result(error))
        assert pool.cancel(behind)
        assert isinstance(await queued, BatchCancelled)
        # the running one cannot be interrupted in open(2): given up after the grace period
        assert pool.cancel(job)
        assert isinstance(await blocked, InterpreterLost)
        assert pool.lost == [0] and pool.stats()["lost"] == 1 and pool.stats()["active"] == 0
        assert not pool.serves("b/3")
        assert pool.interpreters_of("b/3") == ([0], [0])
        assert [(i, key) for i, key, _ in pool.stuck()] == [(0, "b/3")]
        with pytest.raises(EngineError, match="interpreter 0 is lost"):
            await pool.execute(0, "result = 1")
        assert not pool.cancel(job)  # nothing left to cancel: its token completed

        # the writer comes: open(2) returns, the pending Cancelled ends the job, the interpreter is back
        fd = os.open(fifo, os.O_WRONLY)
        os.write(fd, b"x")
        os.close(fd)
        await until(lambda: not pool.lost, what="the interpreter to come back")
        assert pool.serves("b/3") and pool.stats()["lost"] == 0
        assert (await pool.infer("b/3", {"PATH": path_input("")[0]}))["OUT"].view().cast("i")[0] == 0


@pytest.mark.parametrize("engine", ENGINES)
async def test_model_code_cannot_end_the_process(engine) -> None:
    async with Pool(engine=engine, interpreters=1) as pool:
        for code, called in (("os._exit(4)", "os._exit(4)"), ("os.abort()", "os.abort()"),
                             ("sys.exit('bye')", "sys.exit('bye')"), ("posix._exit(0)", "os._exit(0)")):
            with pytest.raises(ModelError) as failed:
                await pool.execute(0, f"import os, posix, sys\n{code}")
            assert str(failed.value) == f"code run by Pool.execute called {called}"
            assert failed.value.error_type == "ModelExit"
        assert await pool.execute(0, "result = 6 * 7") == "42"


async def test_cancelling_a_completed_job_does_nothing(model_dir) -> None:
    async with Pool(engine="main", interpreters=1) as pool:
        await pool.load(ModelSpec(name="b", path=str(model_dir(BLOCKER))))
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        job = pool.run("b", path_input(""), lambda outputs, error: done.set_result((outputs, error)))
        outputs, error = await done
        assert error is None and outputs["OUT"].view().cast("i")[0] == 0
        assert not pool.cancel(job)
        assert (await pool.execute(0, "result = 1")) == "1"  # no stray Cancelled is pending in the interpreter

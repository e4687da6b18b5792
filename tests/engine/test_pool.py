"""The interpreter pool, exercised as a user drives it: real interpreters, real models."""

from __future__ import annotations

import array
import asyncio
import os
import pathlib
import sys

import pytest

from aserve.engine import ModelSpec, Pool
from aserve.errors import EngineError, ModelError, ModelLoadError, ModelNotFound
from aserve.tensor import Tensor

from ..conftest import needs_torch

ENGINES = ["private", "main"] + (["subinterp"] if sys.version_info >= (3, 12) else [])
PARALLEL_ENGINES = [e for e in ENGINES if e != "main"]

ECHO = """
from aserve.runtime import Model
class Echo(Model):
    def __call__(self, inputs):
        return dict(inputs)  # outputs over the inputs' memory keep that memory alive
"""


async def test_interpreters_are_isolated() -> None:
    for engine in PARALLEL_ENGINES:
        async with Pool(engine=engine, interpreters=2) as pool:
            await pool.execute(0, "import sys; sys.modules['__main__'].marker = 'zero'; result = 1")
            seen0 = await pool.execute(0, "import sys; result = getattr(sys.modules['__main__'], 'marker', None)")
            seen1 = await pool.execute(1, "import sys; result = getattr(sys.modules['__main__'], 'marker', None)")
            assert (seen0, seen1) == ("'zero'", "None"), engine
            ids = {await pool.execute(i, "import sys; result = id(sys.modules)") for i in range(2)}
            assert len(ids) == 2, engine


async def test_main_engine_shares_one_interpreter() -> None:
    async with Pool(engine="main", interpreters=2) as pool:
        ids = {await pool.execute(i, "import sys; result = id(sys.modules)") for i in range(2)}
        assert len(ids) == 1


@needs_torch
async def test_torch_runs_in_every_interpreter_of_four() -> None:
    async with Pool(engine="private", interpreters=4) as pool:
        code = "import torch; result = (float(torch.ones(3).sum()), torch.get_num_threads(), id(torch))"
        results = [eval(await pool.execute(i, code)) for i in range(4)]
        assert [r[0] for r in results] == [3.0] * 4
        assert len({r[2] for r in results}) == 4  # four distinct torch modules


def _thread_names() -> list[str]:
    return sorted(pathlib.Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task"))


@pytest.mark.parametrize("engine", ENGINES)
async def test_interpreter_threads_are_named_for_top_and_perf(engine: str) -> None:
    """Each interpreter's thread says whose it is (top -H, perf, /proc), as do the threads
    model code starts from it; a pool can name its threads (front loops do)."""
    async with Pool(engine=engine, interpreters=2) as pool:
        short = {"private": "priv", "subinterp": "subi", "main": "main"}[engine]
        assert {f"aserve-{short}0", f"aserve-{short}1"} <= set(_thread_names())
        # a thread as a native library starts one (threading.Thread would add a dummy Thread for
        # the worker, which 3.13 finalizes noisily in a subinterpreter)
        started = await pool.execute(1, "import _thread, pathlib\n"
                                        "names, done = [], _thread.allocate_lock()\n"
                                        "done.acquire()\n"
                                        "def read():\n"
                                        "    names.append(pathlib.Path('/proc/thread-self/comm').read_text().strip())\n"
                                        "    done.release()\n"
                                        "_thread.start_new_thread(read, ())\n"
                                        "done.acquire()\n"
                                        "result = names[0]")
        assert started == f"'aserve-{short}1'"
    async with Pool(engine=engine, interpreters=1, threads="aserve-loop"):
        assert "aserve-loop0" in _thread_names()
    with pytest.raises(EngineError, match="threads: expected a thread name of 1 to 11 printable ASCII characters"):
        Pool(engine=engine, threads="aserve-far-too-long")


RENDEZVOUS = """
import mmap, time
from aserve.runtime import Model
class Meet(Model):
    def __call__(self, inputs):
        with open(bytes(inputs["path"]).decode(), "r+b") as f:  # a file both callers map: a byte each
            flags = mmap.mmap(f.fileno(), 2)
        me = inputs["me"][0]
        flags[me] = 1
        limit = time.monotonic() + 60
        while flags[1 - me] == 0:        # wait until the other caller is inside its call too
            if time.monotonic() > limit:
                raise TimeoutError("the other interpreter never arrived")
        flags.close()
        import sys
        return {"interp": [id(sys.modules)]}
"""


@pytest.mark.parametrize("engine", PARALLEL_ENGINES)
async def test_two_interpreters_run_model_code_simultaneously(engine: str, model_dir, tmp_path) -> None:
    async with Pool(engine=engine, interpreters=2) as pool:
        await pool.load(ModelSpec(name="meet", path=str(model_dir(RENDEZVOUS))))
        shared = tmp_path / "flags"
        shared.write_bytes(bytes(2))
        path = str(shared).encode()

        def call(me: int):
            return pool.infer(
                "meet",
                {"path": Tensor("UINT8", (len(path),), path), "me": Tensor("INT32", (1,), array.array("i", [me]))},
            )

        a, b = await asyncio.wait_for(asyncio.gather(call(0), call(1)), 120)
        assert shared.read_bytes() == b"\x01\x01"  # both callers were inside their calls at once
        ids = {memoryview(r["interp"].data).cast("q")[0] for r in (a, b)}
        assert len(ids) == 2  # and they were two different interpreters


INPUTS_READ_ONLY = """
from aserve.runtime import Model
class Writer(Model):
    def __call__(self, inputs):
        try:
            inputs["x"][0] = 1
        except TypeError as e:
            return {"error": [str(e)]}
        return {"error": ["the write went through"]}
"""


@pytest.mark.parametrize("engine", ENGINES)
async def test_models_get_read_only_views_of_inputs(engine: str, model_dir) -> None:
    async with Pool(engine=engine, interpreters=1) as pool:
        await pool.load(ModelSpec(name="writer", path=str(model_dir(INPUTS_READ_ONLY))))
        x = bytearray(4)  # writable on the host, read-only in the model
        out = await pool.infer("writer", {"x": Tensor("UINT8", (4,), x)})
        assert bytes(out["error"].data)[4:].decode() == "cannot modify read-only memory"
        assert x == bytearray(4)


STATEFUL = """
from aserve.runtime import Model
class State(Model):
    def load(self):
        self.state = bytearray(8)
    def __call__(self, inputs):
        if inputs["op"][0] == 0:
            return {"out": memoryview(self.state)}       # share the model's own memory
        return {"out": bytes(self.state)}                # a copy of what it holds now
"""


@pytest.mark.parametrize("engine", ENGINES)
async def test_writes_through_an_output_buffer_reach_the_interpreter(engine: str, model_dir) -> None:
    async with Pool(engine=engine, interpreters=1) as pool:
        await pool.load(ModelSpec(name="state", path=str(model_dir(STATEFUL))))
        op = {"op": Tensor("INT32", (1,), array.array("i", [0]))}
        shared = (await pool.infer("state", op))["out"]
        memoryview(shared.data)[:4] = b"abcd"
        copy = (await pool.infer("state", {"op": Tensor("INT32", (1,), array.array("i", [1]))}))["out"]
        assert bytes(copy.data) == b"abcd\0\0\0\0"


@needs_torch
async def test_inputs_and_outputs_cross_without_copy(model_dir) -> None:
    source = """
import torch
from aserve.runtime import Model
class Addr(Model):
    tensor_format = "torch"
    def load(self):
        self.out = torch.arange(4, dtype=torch.float32)
    def __call__(self, inputs):
        addr = torch.tensor([inputs["x"].data_ptr(), self.out.data_ptr()], dtype=torch.int64)
        return {"addr": addr, "out": self.out}
"""
    async with Pool(engine="private", interpreters=1) as pool:
        await pool.load(ModelSpec(name="addr", path=str(model_dir(source))))
        import numpy as np

        x = np.ones((2, 3), dtype=np.float32)
        out = await pool.infer("addr", {"x": Tensor("FP32", (2, 3), x)})
        seen_in, model_out = memoryview(out["addr"].data).cast("q")
        assert seen_in == x.__array_interface__["data"][0]
        assert out["out"].data.address == model_out
        assert list(memoryview(out["out"].data).cast("f")) == [0.0, 1.0, 2.0, 3.0]


RAISER = """
from aserve.runtime import Model
class Raiser(Model):
    def __call__(self, inputs):
        value = inputs["x"][0]
        if value == 13:
            raise ValueError(f"unlucky {value}")
        return {"y": [value * 2]}
"""


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_raising_model_fails_only_its_own_job(engine: str, model_dir) -> None:
    async with Pool(engine=engine, interpreters=2) as pool:
        await pool.load(ModelSpec(name="raiser", path=str(model_dir(RAISER))))
        calls = [pool.infer("raiser", {"x": Tensor("INT64", (1,), array.array("q", [v]))}) for v in range(10, 17)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        for v, r in zip(range(10, 17), results):
            if v == 13:
                assert isinstance(r, ModelError)
                assert str(r) == "ValueError: unlucky 13"
                assert "model.py" in r.traceback and "raise ValueError" in r.traceback
            else:
                assert memoryview(r["y"].data).cast("q")[0] == 2 * v
        again = await pool.infer("raiser", {"x": Tensor("INT64", (1,), array.array("q", [1]))})
        assert memoryview(again["y"].data).cast("q")[0] == 2


SLOW = """
import time
from aserve.runtime import Model
class Slow(Model):
    def __call__(self, inputs):
        time.sleep(0.005)
        return {"y": bytes(inputs["x"])}
"""


@pytest.mark.parametrize("engine", ENGINES)
async def test_close_with_jobs_in_flight_loses_none(engine: str, model_dir) -> None:
    pool = Pool(engine=engine, interpreters=2)
    await pool.start()
    await pool.load(ModelSpec(name="slow", path=str(model_dir(SLOW))))
    tasks = [
        asyncio.ensure_future(pool.infer("slow", {"x": Tensor("UINT8", (4,), i.to_bytes(4, "little"))}))
        for i in range(60)
    ]
    await asyncio.sleep(0)  # every job is submitted
    await pool.close()
    results = await asyncio.gather(*tasks)
    assert [int.from_bytes(bytes(r["y"].data), "little") for r in results] == list(range(60))
    with pytest.raises(EngineError, match="closed"):
        await pool.infer("slow", {"x": Tensor("UINT8", (4,), bytes(4))})


@pytest.mark.parametrize("engine", ENGINES)
async def test_every_datatype_round_trips(engine: str, model_dir) -> None:
    from aserve.runtime.datatypes import DATATYPES, encode_bytes

    inputs = {}
    for name, dt in DATATYPES.items():
        if name == "BYTES":
            data = encode_bytes([b"a", b"", "é".encode()])
            inputs[name] = Tensor(name, (3,), data)
        else:
            inputs[name] = Tensor(name, (2, 3), bytes(range(dt.itemsize * 6)))
    from aserve.runtime import TensorSpec

    specs = [TensorSpec(name, name, (-1,) * len(t.shape)) for name, t in inputs.items()]
    async with Pool(engine=engine, interpreters=1) as pool:
        await pool.load(ModelSpec(name="echo", path=str(model_dir(ECHO)), inputs=specs, outputs=specs))
        out = await pool.infer("echo", inputs)
    for name, t in inputs.items():
        assert out[name].datatype == name
        if name not in ("BF16", "FP16"):  # memoryviews cannot be shaped as half floats: they come back flat
            assert out[name].shape == t.shape, name
        assert bytes(out[name].data) == bytes(t.data), name


KEEPER = """
from aserve.runtime import Model
class Keeper(Model):
    kept = None
    def __call__(self, inputs):
        op = inputs["op"][0]
        if op == 0:
            self.kept = inputs["x"]          # keeps a view of an input past the call
        elif op == 2:
            self.kept = None
        return {"seen": bytes(self.kept) if self.kept is not None else b""}
"""


@pytest.mark.parametrize("engine", ENGINES)
async def test_an_input_a_model_keeps_stays_alive_until_it_lets_go(engine: str, model_dir) -> None:
    import gc
    import weakref

    def op(n: int) -> Tensor:
        return Tensor("INT32", (1,), array.array("i", [n]))

    async with Pool(engine=engine, interpreters=1) as pool:
        await pool.load(ModelSpec(name="keeper", path=str(model_dir(KEEPER))))
        x = array.array("i", [7, 8, 9, 10])
        alive = weakref.ref(x)
        await pool.infer("keeper", {"op": op(0), "x": Tensor("INT32", (4,), x)})
        del x
        gc.collect()
        assert alive() is not None  # the host keeps the buffer: the model still holds a view of it
        seen = await pool.infer("keeper", {"op": op(1), "x": Tensor("INT32", (4,), array.array("i", [0] * 4))})
        assert list(memoryview(seen["seen"].data).cast("i")) == [7, 8, 9, 10]
        await pool.infer("keeper", {"op": op(2), "x": Tensor("INT32", (4,), array.array("i", [0] * 4))})
        gc.collect()
        assert alive() is None  # the model let go during that call: the host released the buffer


async def test_outputs_are_released_when_the_host_drops_them(model_dir) -> None:
    source = """
import weakref
from aserve.runtime import Model
LIVE = set()
class Buf(bytearray):
    pass
class Tracked(Model):
    def __call__(self, inputs):
        b = Buf(1024)
        LIVE.add(id(b))
        weakref.finalize(b, LIVE.discard, id(b))
        return {"y": b}
"""
    async with Pool(engine="private", interpreters=1) as pool:
        await pool.load(ModelSpec(name="tracked", path=str(model_dir(source))))
        x = {"x": Tensor("UINT8", (1,), b"\0")}
        held = [await pool.infer("tracked", x) for _ in range(5)]
        live = "import sys; result = len(sys.modules['aserve_model_tracked'].LIVE)"
        assert await pool.execute(0, live) == "5"
        del held
        await pool.infer("tracked", x)  # the worker frees released outputs before its next job
        assert await pool.execute(0, live) in ("0", "1")


async def test_load_errors_name_the_file_and_cause(model_dir, tmp_path) -> None:
    async with Pool(engine="private", interpreters=1) as pool:
        missing = tmp_path / "nowhere"
        with pytest.raises(ModelLoadError, match=r"nowhere: model file not found"):
            await pool.load(ModelSpec(name="x", path=str(missing)))
        broken = model_dir("def oops(:\n", name="broken")
        with pytest.raises(ModelLoadError, match=r"broken/model.py: import failed: SyntaxError"):
            await pool.load(ModelSpec(name="x", path=str(broken)))
        failing = model_dir(
            "from aserve.runtime import Model\nclass F(Model):\n    def load(self):\n        raise OSError('no weights')\n",
            name="failing",
        )
        with pytest.raises(ModelLoadError, match=r"failing/model.py: F failed to load: OSError: no weights"):
            await pool.load(ModelSpec(name="x", path=str(failing)))
        none = model_dir("x = 1\n", name="none")
        with pytest.raises(ModelLoadError, match=r"expected exactly one aserve.runtime.Model subclass"):
            await pool.load(ModelSpec(name="x", path=str(none)))
        with pytest.raises(ModelNotFound):
            await pool.infer("x", {})
        # the interpreter is still fine
        assert await pool.execute(0, "result = 2 + 2") == "4"


async def test_model_subset_runs_only_on_its_interpreters(model_dir) -> None:
    source = "import sys\nfrom aserve.runtime import Model\nclass W(Model):\n" \
             "    def __call__(self, inputs):\n        return {'who': [id(sys.modules)]}\n"
    async with Pool(engine="private", interpreters=2) as pool:
        await pool.load(ModelSpec(name="w", path=str(model_dir(source))), interpreters=1)
        first = await pool.execute(0, "import sys; result = id(sys.modules)")
        x = {"x": Tensor("UINT8", (1,), b"\0")}
        seen = {memoryview((await pool.infer("w", x))["who"].data).cast("q")[0] for _ in range(8)}
        assert seen == {int(first)}


def test_too_many_private_interpreters_is_a_clear_error() -> None:
    with pytest.raises(EngineError, match="at most 15"):
        Pool(engine="private", interpreters=16)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="subinterpreters exist on 3.12+")
def test_subinterp_before_312_names_the_python_version() -> None:
    with pytest.raises(EngineError, match=r"Python >= 3.12\); this is Python 3\.11"):
        Pool(engine="subinterp", interpreters=1)


def _blocked_signals(tid: int) -> int:
    status = pathlib.Path(f"/proc/self/task/{tid}/status").read_text()
    for line in status.splitlines():
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigBlk line")


@pytest.mark.parametrize("engine", ENGINES)
async def test_worker_threads_leave_signals_to_the_host(engine: str) -> None:
    import signal
    import threading

    main = threading.main_thread().native_id
    async with Pool(engine=engine, interpreters=2) as pool:
        ids = [int(await pool.execute(i, "import threading; result = threading.get_native_id()")) for i in range(2)]
        for tid in ids:
            assert tid != main
            mask = _blocked_signals(tid)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1):
                assert mask >> (sig - 1) & 1, f"{sig.name} reaches worker thread {tid}"
            for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT):
                assert not mask >> (sig - 1) & 1, f"{sig.name} is blocked in worker thread {tid}"


@pytest.mark.parametrize("engine", ENGINES)
async def test_worker_threads_do_not_preempt_the_loop(engine: str) -> None:
    # batch-scheduled workers: waking one to run a batch never preempts the event loop's
    # thread (which stays a normal one), whatever the model's threads are doing
    import os
    import threading

    async with Pool(engine=engine, interpreters=2) as pool:
        ids = [int(await pool.execute(i, "import threading; result = threading.get_native_id()")) for i in range(2)]
        assert threading.get_native_id() not in ids
        for tid in ids:
            assert os.sched_getscheduler(tid) == os.SCHED_BATCH, tid
        assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_engine_errors_are_aserves_own() -> None:
    from aserve import _native

    assert _native.EngineError is EngineError
    with pytest.raises(EngineError, match="unknown engine"):
        _native.Pool("gpu", executable=sys.executable, path=sys.path, bootstrap="aserve.runtime._worker")


async def test_a_raising_completion_handler_does_not_stop_the_others(model_dir) -> None:
    source = """
from aserve.runtime import Model, TensorSpec
class Double(Model):
    inputs = [TensorSpec("x", "INT64", (1,))]
    def __call__(self, inputs):
        return {"y": [2 * inputs["x"][0]]}
"""
    loop = asyncio.get_running_loop()
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context["exception"]))
    async with Pool(engine="main", interpreters=1) as pool:
        await pool.load(ModelSpec(name="double", path=str(model_dir(source))))
        answers: dict[int, object] = {}
        every = asyncio.Event()

        def done(i: int):
            def call(outputs, error) -> None:
                answers[i] = error if outputs is None else memoryview(outputs["y"].data).cast("q")[0]
                if len(answers) == 8:
                    every.set()
                if i == 3:
                    raise RuntimeError("a handler's own bug")
            return call

        ref_inputs = [[Tensor("INT64", (1,), array.array("q", [i]))] for i in range(8)]
        for i, inputs in enumerate(ref_inputs):  # queued together: one interpreter, drained together
            pool.run("double", inputs, done(i))
        await asyncio.wait_for(every.wait(), 60)
    assert answers == {i: 2 * i for i in range(8)}
    assert [str(e) for e in reported] == ["a handler's own bug"]


async def test_a_private_interpreter_keeps_an_environment_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host growing its environment (its libc reallocates the array) must not leave a
    private namespace's libc reading the freed array, as its setenv did."""
    monkeypatch.setenv("ASERVE_TEST_BEFORE", "1")  # the host's array is a heap array from here on
    async with Pool(engine="private", interpreters=1) as pool:
        for i in range(300):
            monkeypatch.setenv(f"ASERVE_TEST_GROW_{i}", "x" * 64)
        seen = await pool.execute(0, (
            "import os\n"
            "for i in range(100):\n"
            "    os.environ[f'ASERVE_INNER_{i}'] = str(i)\n"
            "result = (os.getenv('ASERVE_INNER_99'), 'ASERVE_TEST_GROW_1' in os.environ)"
        ))
    assert seen == "('99', False)"  # its own copy, taken when it started


COUNT_COLLECTIONS = """
import gc, os, weakref
from aserve.runtime import _worker
_models_seen = [weakref.ref(loaded.model) for loaded in _worker._models.values()]

def _count(phase, info, flag={flag!r}, out={out!r}, seen=_models_seen):
    # one line per full collection: how many of the models loaded above are still alive
    if phase != "stop" or info["generation"] != 2:
        return
    if not os.path.exists(flag):  # the test is over: this interpreter may serve other pools
        gc.callbacks.remove(_count)
        return
    with open(out, "a") as f:
        f.write(f"{{sum(ref() is not None for ref in seen)}}\\n")

gc.callbacks.append(_count)
result = len(_models_seen)
"""


async def test_closing_collects_once_per_interpreter_after_its_last_model(model_dir, tmp_path) -> None:
    # a full collection takes ~100 ms with torch imported: a pool that closes with several
    # models collects once per interpreter, after the last model unloaded from it, and frees
    # every model then. "a" runs on both interpreters, "b" on the first only: interpreter 1's
    # collection comes with a's unload, interpreter 0's with b's.
    flag = tmp_path / "counting"
    flag.touch()
    async with Pool(engine="private", interpreters=2) as pool:
        await pool.load(ModelSpec(name="a", path=str(model_dir(ECHO, name="a"))))
        await pool.load(ModelSpec(name="b", path=str(model_dir(ECHO, name="b"))), interpreters=1)
        for i, models in ((0, 2), (1, 1)):
            source = COUNT_COLLECTIONS.format(flag=str(flag), out=str(tmp_path / f"collections{i}"))
            assert await pool.execute(i, source) == str(models)
    flag.unlink()
    for i in range(2):
        assert (tmp_path / f"collections{i}").read_text().split() == ["0"], i


async def test_closing_the_main_engine_collects_the_servers_heap_once(model_dir) -> None:
    # the main engine's models live in this (the host's) heap, where a full collection is
    # the whole server's: three models closed, one collection, every model freed by it
    import gc
    import weakref

    from aserve.runtime import _worker

    full: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(sum(ref() is not None for ref in seen))

    pool = Pool(engine="main", interpreters=2)
    await pool.start()
    try:
        for name in ("a", "b", "c"):
            await pool.load(ModelSpec(name=name, path=str(model_dir(ECHO, name=name))))
        seen = [weakref.ref(_worker._models[name].model) for name in ("a", "b", "c")]
    except BaseException:
        await pool.close()
        raise
    automatic = gc.isenabled()
    gc.disable()  # count only the collections closing asks for
    gc.callbacks.append(count)
    try:
        await pool.close()
    finally:
        gc.callbacks.remove(count)
        if automatic:
            gc.enable()
    assert full == [0]


EXIT_SCRIPT = '''
import asyncio, sys
from aserve.engine import Pool, ensure_glibc_tunables

async def main(engine):
    pool = Pool(engine=engine, interpreters=2)
    await pool.start()
    try:
        for i in range(2):  # what logging does for every record: the thread's name
            await pool.execute(i, "import threading; result = threading.current_thread().name")
    finally:
        await pool.close()
    print("closed")

ensure_glibc_tunables()
asyncio.run(main(sys.argv[1]))
'''


@pytest.mark.parametrize("engine", ENGINES)
def test_a_process_whose_model_code_asked_its_thread_exits_quietly(engine: str) -> None:
    """Model code that asks `threading` for its thread (logging does, for every record) leaves
    a record of that thread in its interpreter; ending the interpreters at the host's exit
    reports no error for it (3.13 printed "Exception ignored in _DeleteDummyThreadOnDel")."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, engine], check=False, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "closed", done.stderr[-3000:]
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]

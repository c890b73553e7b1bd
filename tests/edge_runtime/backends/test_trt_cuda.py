"""The runner's CUDA layer on pycuda's context model (``fake_pycuda``): every push is popped on its own
thread, so no thread ends (and the interpreter does not exit) with a context on its stack, which pycuda
answers by aborting the process; the batch copies come from page-locked memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fake_pycuda import FakePyCuda, fake_runner

from sac_edge.common.bundle import open_bundle
from sac_edge.edge_runtime.backends.base import BackendOptions
from sac_edge.edge_runtime.backends.trt.cuda import PyCuda


@pytest.fixture
def pycuda(monkeypatch: pytest.MonkeyPatch) -> FakePyCuda:
    fake = FakePyCuda()
    fake.install(monkeypatch)
    return fake


def _on_thread(call: Callable[[], object]) -> None:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            call()
        except BaseException as err:  # re-raised on the test's thread
            errors.append(err)

    thread = threading.Thread(target=body, name="worker")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def test_the_model_aborts_where_pycuda_would(pycuda: FakePyCuda) -> None:
    cuda = PyCuda()
    _on_thread(lambda: cuda._context.push())  # the old once-per-thread push, never popped
    assert pycuda.aborts == ["worker"]


def test_current_pushes_once_and_always_pops(pycuda: FakePyCuda) -> None:
    cuda = PyCuda()
    assert pycuda.stack() == []
    with cuda.current():
        assert len(pycuda.stack()) == 1
        with cuda.current():
            assert len(pycuda.stack()) == 1
    assert pycuda.stack() == []
    with pytest.raises(RuntimeError), cuda.current():
        raise RuntimeError("a failing call")
    assert pycuda.stack() == []
    _on_thread(lambda: cuda.current().__enter__())  # even a block left unfinished pops when it is dropped
    assert not pycuda.aborts
    cuda.close()
    assert pycuda.stack() == [] and not pycuda.device and not pycuda.aborts


def test_the_runner_on_pycuda_leaves_every_thread_clean(
    pendulum_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, _, pycuda = fake_runner("8.5.3.1", monkeypatch)  # JetPack 5, where pycuda is the CUDA layer
    backend = runner.TensorRTBackend(open_bundle(pendulum_bundle), "fp32", BackendOptions(engine_dir=tmp_path))
    assert pycuda.stack() == []
    _on_thread(lambda: backend.act(np.zeros(3, np.float32)))  # the control thread
    _on_thread(lambda: backend.act_batch(np.ones((70, 3), np.float32)))  # a benchmark thread, two chunks
    backend.act(np.zeros(3, np.float32))
    assert not pycuda.aborts and pycuda.stack() == []
    assert pycuda.pageable_copies == []  # act's and act_batch's copies are asynchronous
    backend.close()
    assert pycuda.stack() == [] and not pycuda.device and not pycuda.aborts

"""benchmarks/host_profile.py: the step summaries of a torch.profiler trace.

A CPU trace made here by a tiny torch loop under torch.profiler, written as mds-train's
--profile writes it (tensorboard_trace_handler, gzipped): its steps, its .item() syncs, and its
host ops' self times and calls against torch's own key_averages. The GPU figures (launches,
copies, graph launches, kernel union) on a hand-made trace whose answers are worked out below.
"""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def tiny_loop_trace(folder, *, steps: int = 3):
    """Steps 2..steps+1 of a tiny training loop under the profiler; returns torch's own
    key_averages of the recorded events. Each step reads two scalars (.item() and float())."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)  # (CPU AdamW .item()s its steps)
    # Labels made once: `x % 4` nests aten::remainder in itself, which key_averages counts once.
    labels = torch.arange(8) % 4
    averages = []
    write = tensorboard_trace_handler(str(folder), use_gzip=True)

    def ready(prof):
        write(prof)
        averages.append(prof.key_averages())

    profiler = profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=0, active=steps, repeat=1),
        on_trace_ready=ready,
    )
    for step in range(1, steps + 3):
        if step == 2:
            profiler.start()
        loss = torch.nn.functional.cross_entropy(model(torch.randn(8, 16)), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss.item(), float(loss.detach())
        if 2 <= step <= steps + 1:
            profiler.step()
    return averages[0]


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")  # upstream's schedule
def test_a_cpu_loops_steps_syncs_and_self_times(host_profile, tmp_path):
    averages = tiny_loop_trace(tmp_path, steps=3)
    (path,) = host_profile.trace_files([tmp_path])
    assert path.name.endswith(".pt.trace.json.gz")
    trace = host_profile.load_trace(path)
    steps = host_profile.summarise(trace)
    assert [s.name for s in steps] == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    for step in steps:
        assert step.wall_us > 0 and step.launches == 0 and step.gpu_busy_us == 0
        assert step.syncs == 2  # one .item() and one float(): each an aten::item
        assert step.sync_kinds == {"aten::item": 2, "aten::_local_scalar_dense": 2}
    assert not host_profile.has_gpu(trace)
    # Self time and calls of every host op, summed over the steps, are torch's own figures.
    ours_us = sum((s.self_us for s in steps), host_profile.Counter())
    ours_calls = sum((s.calls for s in steps), host_profile.Counter())
    theirs = {e.key: e for e in averages}
    assert {"ProfilerStep*", "Optimizer.step#SGD.step", "aten::addmm"} <= set(theirs)
    assert set(ours_calls) == set(theirs)
    for name, event in theirs.items():
        assert ours_calls[name] == event.count, name
        # The trace keeps microseconds to 3 decimals: a nanosecond of rounding per call.
        assert ours_us[name] == pytest.approx(event.self_cpu_time_total, abs=0.01 * event.count)
    text = host_profile.report(path, steps, top=15, gpu=False)
    assert f"{path}: 3 profiled steps" in text and "n/a" in text
    assert "synchronising calls per step: aten::item 2, aten::_local_scalar_dense 2" in text
    assert len(text.split("top 15 host ops by self time, per step:")[1].splitlines()) == 17


def X(name, cat, ts, dur, tid=1, correlation=None):  # noqa: N802 - Chrome's complete event
    event = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": tid}
    if correlation is not None:
        event["args"] = {"correlation": correlation}
    return event


GPU_TRACE = {
    "deviceProperties": [{"id": 0, "name": "a GPU"}],
    "traceEvents": [
        X("ProfilerStep#0", "user_annotation", 0, 1000),
        X("ProfilerStep#1", "user_annotation", 1000, 1000),
        # A CUDA trace repeats each step span on the GPU's timeline: not a step of its own.
        X("ProfilerStep#0", "gpu_user_annotation", 100, 950, tid=9),
        X("ProfilerStep#1", "gpu_user_annotation", 1100, 900, tid=9),
        # Step 0: a matmul's launch, a bare launch, an .item() (its pageable DtoH copy and stream
        # sync inside), a device sync, a backward-thread launch and a pinned (async) copy.
        X("aten::mm", "cpu_op", 10, 50),
        X("cudaLaunchKernel", "cuda_runtime", 20, 10, correlation=1),
        X("cudaLaunchKernel", "cuda_runtime", 100, 5, correlation=2),
        X("aten::item", "cpu_op", 200, 300),
        X("aten::_local_scalar_dense", "cpu_op", 205, 290),
        X("cudaMemcpyAsync", "cuda_runtime", 210, 20, correlation=3),
        X("cudaStreamSynchronize", "cuda_runtime", 240, 250),
        X("cudaDeviceSynchronize", "cuda_runtime", 600, 100),
        X("aten::mm", "cpu_op", 700, 40, tid=2),
        X("cudaLaunchKernel", "cuda_runtime", 710, 10, tid=2, correlation=4),
        X("cudaMemcpyAsync", "cuda_runtime", 800, 5, correlation=5),
        # Step 1: a graph launch, a launch (by CUPTI's versioned name), and a .cpu() (aten::to
        # around its copy and sync).
        X("cudaGraphLaunch", "cuda_runtime", 1100, 20, correlation=6),
        X("cudaLaunchKernelExC_v11060", "cuda_runtime", 1130, 5, correlation=7),
        X("aten::to", "cpu_op", 1400, 100),
        X("aten::_to_copy", "cpu_op", 1401, 98),
        X("aten::copy_", "cpu_op", 1402, 96),
        X("cudaMemcpyAsync", "cuda_runtime", 1410, 10, correlation=8),
        X("cudaStreamSynchronize", "cuda_runtime", 1430, 60),
        # The device: step 0's kernels overlap (100-300, 250-400) and its last one runs during
        # step 1 (launched in step 0: counted there); step 1's graph kernels and launch overlap
        # (1200-1250, 1260-1310, 1240-1270: 110 us) and one kernel has no launch on record.
        X("gemm", "kernel", 100, 200, tid=9, correlation=1),
        X("gelu", "kernel", 250, 150, tid=9, correlation=2),
        X("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 400, 10, tid=9, correlation=3),
        X("gemm", "kernel", 1500, 100, tid=9, correlation=4),
        X("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 810, 10, tid=9, correlation=5),
        X("graph kernel 1", "kernel", 1200, 50, tid=9, correlation=6),
        X("graph kernel 2", "kernel", 1260, 50, tid=9, correlation=6),
        X("add", "kernel", 1240, 30, tid=9, correlation=7),
        X("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 1415, 5, tid=9, correlation=8),
        X("orphan", "kernel", 1900, 10, tid=9, correlation=99),
    ],
}


def test_a_gpu_traces_launches_syncs_and_busy_time(host_profile, tmp_path):
    path = tmp_path / "gpu.pt.trace.json"
    path.write_text(json.dumps(GPU_TRACE))
    first, second = host_profile.summarise(host_profile.load_trace(path))
    assert (first.launches, first.graph_launches, second.launches, second.graph_launches) == (
        3, 0, 1, 1,
    )  # fmt: skip
    # Step 0: the .item() is one sync (its copy and stream sync inside it), the device sync one.
    assert first.syncs == 2
    assert first.sync_kinds == {
        "aten::item": 1, "aten::_local_scalar_dense": 1, "cudaMemcpyAsync DtoH": 1,
        "cudaStreamSynchronize": 1, "cudaDeviceSynchronize": 1,
    }  # fmt: skip
    assert first.sync_wait_us == 20 + 250 + 100
    assert first.gpu_busy_us == (400 - 100) + 100
    assert first.gpu_idle_fraction == pytest.approx(1 - 400 / 1000)
    assert first.self_us["aten::mm"] == (50 - 10) + (40 - 10) and first.calls["aten::mm"] == 2
    assert first.self_us["aten::item"] == 10
    assert first.self_us["aten::_local_scalar_dense"] == 290 - 20 - 250
    assert first.self_us["cudaLaunchKernel"] == 10 + 5 + 10
    # Step 1: the .cpu() is one sync; kernels 1200-1310 and the unmatched one.
    assert second.syncs == 1
    assert second.sync_kinds == {"cudaMemcpyAsync DtoH": 1, "cudaStreamSynchronize": 1}
    assert second.sync_wait_us == 10 + 60
    assert second.gpu_busy_us == 110 + 10
    # Kernel tallies: by name, each kernel in the step that launched it (the gemm of step 0's
    # backward thread runs during step 1), graph kernels as any other.
    assert first.kernel_us == {"gemm": 200 + 100, "gelu": 150}
    assert first.kernel_calls == {"gemm": 2, "gelu": 1}
    assert second.kernel_us == {"graph kernel 1": 50, "graph kernel 2": 50, "add": 30, "orphan": 10}
    text = host_profile.report(path, [first, second], top=3, gpu=True, top_kernels=2)
    lines = text.splitlines()
    row = "ProfilerStep#0          1.00         3       0    2.0     0.37         0.40     60.0%"
    assert row in lines
    assert "top 2 kernels by GPU time, per step (all kernels: 0.29 ms):" in lines
    assert "       0.15    50.8%       1  gemm" in lines  # 300 of 590 us, over 2 steps


def test_files_that_are_not_traces_get_one_line(host_profile, tmp_path, capsys):
    truncated = tmp_path / "cut.pt.trace.json.gz"
    truncated.write_bytes(gzip.compress(b'{"traceEvents": [')[:-4])
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}')
    empty = tmp_path / "empty"
    empty.mkdir()
    for path, message in [
        (truncated, f"host_profile.py: error: {truncated}: not a readable trace ("),
        (other, f"host_profile.py: error: {other}: no traceEvents; give a torch.profiler"),
        (empty, f"host_profile.py: error: {empty}: no *.pt.trace.json(.gz) in this folder"),
        (tmp_path / "gone", f"host_profile.py: error: {tmp_path / 'gone'}: no such file"),
    ]:
        assert host_profile.main([str(path)]) == 1
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.splitlines()) == 1, captured.err
        assert captured.err.startswith(message), captured.err

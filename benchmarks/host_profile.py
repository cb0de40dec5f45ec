"""Where a training step's host time goes, from torch.profiler's Chrome traces (issue #25).

Reads the traces `tensorboard_trace_handler` writes (`*.pt.trace.json`, or `.json.gz`), as
`mds-train --profile pt` and `benchmarks/reference_profile.py` do, and prints per profiled step
(its ProfilerStep#N span) and on average:
  wall       host wall time of the step span
  launches   kernel launches (cudaLaunchKernel, cuLaunchKernel, cudaLaunchKernelExC, ...);
             `graphs` counts CUDA graph launches apart
  syncs      host-device synchronisations: cuda*Synchronize calls, blocking device-to-host copies
             and aten::item / aten::_local_scalar_dense, counted once per outermost host op that
             holds them (an .item() is one, not its copy plus its stream sync); `wait` is the host
             time inside the synchronising CUDA calls
  GPU busy   the union of the kernels launched in the step (matched to their launch by
             correlation id), and `idle` = 1 - busy / wall
then the top kernels by GPU time per step (--kernels; a kernel replayed inside a CUDA graph is
counted where CUPTI records it, as any other), to compare where two steps' device time goes,
then the top host ops by self time, per step, with their calls per step: cpu_op events, CUDA
runtime calls, and record_function spans (user annotations: Optimizer.step#AdamW.step, and
ProfilerStep*, the step itself), whose self time is the host time between their ops: Python and
framework code that no aten op covers. Self time is torch's (key_averages' self CPU time): a
span less its child spans on its thread. A trace without CUDA activity has no launches or
waits, and its GPU figures are n/a.

Usage: python benchmarks/host_profile.py TRACE_OR_FOLDER [...] [--top 15] [--kernels 0]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

LAUNCHES = {
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cuLaunchKernel",
    "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
}  # fmt: skip
GRAPH_LAUNCHES = {"cudaGraphLaunch", "cuGraphLaunch"}
SYNC_CALLS = {
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
    "cuCtxSynchronize", "cuEventSynchronize",
}  # fmt: skip
SCALAR_READS = {"aten::item", "aten::_local_scalar_dense"}
HOST_CATEGORIES = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"}
RUNTIME_CATEGORIES = {"cuda_runtime", "cuda_driver"}
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
API_VERSION = re.compile(r"_v\d+$")  # CUPTI names some calls by version: cudaLaunchKernelExC_v11060
EPSILON_US = 1e-3  # timestamps are microseconds with nanosecond digits


class TraceError(ValueError):
    """A file that is not a readable torch.profiler trace: one line, exit 1."""


@dataclass(frozen=True)
class Event:
    name: str
    cat: str
    ts: float
    dur: float
    tid: object
    correlation: int | None
    index: int  # position in the trace: a stable identity

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class StepSummary:
    name: str
    wall_us: float
    launches: int = 0
    graph_launches: int = 0
    syncs: int = 0
    sync_kinds: Counter = field(default_factory=Counter)  # name -> calls
    sync_wait_us: float = 0.0
    gpu_busy_us: float = 0.0
    self_us: Counter = field(default_factory=Counter)  # host op -> self time
    calls: Counter = field(default_factory=Counter)  # host op -> calls
    kernel_us: Counter = field(default_factory=Counter)  # kernel name -> GPU time
    kernel_calls: Counter = field(default_factory=Counter)  # kernel name -> launches

    @property
    def gpu_idle_fraction(self) -> float:
        return max(0.0, 1.0 - self.gpu_busy_us / self.wall_us) if self.wall_us > 0 else 0.0


def trace_files(paths: list[Path]) -> list[Path]:
    """The traces named, a folder standing for the traces in it (sorted by name)."""
    files = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise TraceError(f"{path}: no *.pt.trace.json(.gz) in this folder")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise TraceError(f"{path}: no such file or folder")
    return files


def load_trace(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt") as handle:
            trace = json.load(handle)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TraceError(f"{path}: not a readable trace ({error})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TraceError(f"{path}: no traceEvents; give a torch.profiler Chrome trace")
    return trace


def _events(trace: dict) -> list[Event]:
    events = []
    for index, raw in enumerate(trace["traceEvents"]):
        if raw.get("ph") != "X" or "dur" not in raw:
            continue
        args = raw.get("args") or {}
        events.append(
            Event(
                name=raw.get("name", ""),
                cat=raw.get("cat", ""),
                ts=float(raw["ts"]),
                dur=float(raw["dur"]),
                tid=(raw.get("pid"), raw.get("tid")),
                correlation=args.get("correlation"),
                index=index,
            )
        )
    return events


def _parents(host: list[Event]) -> dict[int, Event]:
    """Each host event's enclosing host event on its thread (by index), from span nesting."""
    parents: dict[int, Event] = {}
    by_thread: dict[object, list[Event]] = {}
    for event in host:
        by_thread.setdefault(event.tid, []).append(event)
    for events in by_thread.values():
        stack: list[Event] = []
        for event in sorted(events, key=lambda e: (e.ts, -e.dur, e.index)):
            while stack and stack[-1].end <= event.ts + EPSILON_US:
                stack.pop()
            if stack and event.end <= stack[-1].end + EPSILON_US:
                parents[event.index] = stack[-1]
            stack.append(event)
    return parents


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def summarise(trace: dict) -> list[StepSummary]:
    """One summary per ProfilerStep#N span, in time order."""
    events = _events(trace)
    # The host's spans: a CUDA trace repeats each on the GPU timeline (gpu_user_annotation).
    spans = sorted(
        (e for e in events if e.name.startswith("ProfilerStep#") and e.cat == "user_annotation"),
        key=lambda e: e.ts,
    )
    steps = [StepSummary(name=span.name, wall_us=span.dur) for span in spans]
    starts = [span.ts for span in spans]

    def step_at(ts: float) -> StepSummary | None:
        i = bisect.bisect_right(starts, ts + EPSILON_US) - 1
        return steps[i] if i >= 0 and ts <= spans[i].end + EPSILON_US else None

    host = [e for e in events if e.cat in HOST_CATEGORIES]
    parents = _parents(host)
    device_copies = {e.correlation: e.name for e in events if e.cat == "gpu_memcpy"}
    launched_in: dict[int, StepSummary | None] = {}
    child_us: Counter = Counter()
    for event in host:
        if event.index in parents:
            child_us[parents[event.index].index] += event.dur
    sites: dict[int, set[int]] = {}  # id(step) -> outermost host ops holding a sync
    for event in host:
        step = step_at(event.ts)
        if event.cat in RUNTIME_CATEGORIES and event.correlation is not None:
            launched_in[event.correlation] = step
        if step is None:
            continue
        name = "ProfilerStep*" if event.name.startswith("ProfilerStep#") else event.name  # as torch
        step.self_us[name] += event.dur - child_us[event.index]
        step.calls[name] += 1
        api = API_VERSION.sub("", event.name) if event.cat in RUNTIME_CATEGORIES else ""
        if api in LAUNCHES:
            step.launches += 1
        elif api in GRAPH_LAUNCHES:
            step.graph_launches += 1
        kind = _sync_kind(event, device_copies)
        if kind is None:
            continue
        step.sync_kinds[kind] += 1
        if event.cat in RUNTIME_CATEGORIES:
            step.sync_wait_us += event.dur
        outermost = event
        while outermost.index in parents and parents[outermost.index].cat == "cpu_op":
            outermost = parents[outermost.index]
        sites.setdefault(id(step), set()).add(outermost.index)
    for step in steps:
        step.syncs = len(sites.get(id(step), ()))
    kernels: dict[int, list[tuple[float, float]]] = {}
    for event in events:
        if event.cat != "kernel":
            continue
        if event.correlation in launched_in:
            step = launched_in[event.correlation]
        else:  # no launch recorded: its start decides
            step = step_at(event.ts)
        if step is not None:
            kernels.setdefault(id(step), []).append((event.ts, event.end))
            step.kernel_us[event.name] += event.dur
            step.kernel_calls[event.name] += 1
    for step in steps:
        step.gpu_busy_us = _union_us(kernels.get(id(step), []))
    return steps


def _sync_kind(event: Event, device_copies: dict) -> str | None:
    """The kind of host-device synchronisation `event` is, if it is one."""
    if event.cat == "cpu_op":
        return event.name if event.name in SCALAR_READS else None
    if API_VERSION.sub("", event.name) in SYNC_CALLS:
        return event.name
    if event.cat in RUNTIME_CATEGORIES and "Memcpy" in event.name:
        copy = device_copies.get(event.correlation, "")
        # cudaMemcpy waits always; cudaMemcpyAsync into pageable host memory waits too.
        if "DtoH" in copy and ("Async" not in event.name or "Pageable" in copy):
            return f"{event.name} DtoH"
    return None


def _ms(us: float) -> str:
    return f"{us / 1000:.2f}"


def has_gpu(trace: dict) -> bool:
    """Whether the trace recorded CUDA activity (else its GPU figures are n/a)."""
    return bool(trace.get("deviceProperties")) or any(
        raw.get("cat") in ("kernel", *RUNTIME_CATEGORIES) for raw in trace["traceEvents"]
    )


def report(
    path: Path, steps: list[StepSummary], *, top: int, gpu: bool, top_kernels: int = 0
) -> str:
    if not steps:
        return f"{path}: no ProfilerStep#N spans (was the profiler stepped?)"
    lines = [f"{path}: {len(steps)} profiled steps"]
    header = (
        f"{'step':<18}{'wall ms':>10}{'launches':>10}{'graphs':>8}{'syncs':>7}{'wait ms':>9}"
        f"{'GPU busy ms':>13}{'GPU idle':>10}"
    )
    lines.append(header)
    rows = [
        (s.name, s.wall_us, s.launches, s.graph_launches, s.syncs, s.sync_wait_us, s.gpu_busy_us)
        for s in steps
    ]
    n = len(steps)
    mean = ["mean", *(sum(row[i] for row in rows) / n for i in range(1, 7))]
    for name, wall, launches, graphs, syncs, wait, busy in [*rows, mean]:
        idle = f"{max(0.0, 1.0 - busy / wall) if wall > 0 else 0.0:.1%}" if gpu else "n/a"
        lines.append(
            f"{name:<18}{_ms(wall):>10}{launches:>10.0f}{graphs:>8.0f}{syncs:>7.1f}"
            f"{_ms(wait):>9}{_ms(busy) if gpu else 'n/a':>13}{idle:>10}"
        )
    kinds = sum((s.sync_kinds for s in steps), Counter())
    if kinds:
        per_step = ", ".join(f"{name} {count / n:g}" for name, count in kinds.most_common())
        lines.append(f"synchronising calls per step: {per_step}")
    wall = sum(s.wall_us for s in steps)
    kernel_us = sum((s.kernel_us for s in steps), Counter())
    if gpu and top_kernels > 0 and kernel_us:
        kernel_calls = sum((s.kernel_calls for s in steps), Counter())
        total = sum(kernel_us.values())
        lines.append(
            f"top {top_kernels} kernels by GPU time, per step (all kernels: {_ms(total / n)} ms):"
        )
        lines.append(f"  {'GPU ms':>9}{'of all':>9}{'calls':>8}  kernel")
        for name, us in kernel_us.most_common(top_kernels):
            share = us / total
            lines.append(
                f"  {_ms(us / n):>9}{share:>9.1%}{kernel_calls[name] / n:>8g}  {name[:150]}"
            )
    self_us = sum((s.self_us for s in steps), Counter())
    calls = sum((s.calls for s in steps), Counter())
    lines.append(f"top {top} host ops by self time, per step:")
    lines.append(f"  {'self ms':>9}{'of wall':>9}{'calls':>8}  op")
    for name, us in self_us.most_common(top):
        lines.append(f"  {_ms(us / n):>9}{us / wall:>9.1%}{calls[name] / n:>8g}  {name}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path, metavar="TRACE", help="trace or folder")
    parser.add_argument("--top", type=int, default=15, help="host ops listed (default 15)")
    parser.add_argument(
        "--kernels",
        type=int,
        default=0,
        metavar="N",
        help="also list the top N kernels by GPU time",
    )
    args = parser.parse_args(argv)
    try:
        for path in trace_files(args.traces):
            trace = load_trace(path)
            steps = summarise(trace)
            text = report(path, steps, top=args.top, gpu=has_gpu(trace), top_kernels=args.kernels)
            print(text, flush=True)
    except TraceError as error:
        print(f"host_profile.py: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

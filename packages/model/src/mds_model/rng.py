"""Model-parallel RNG tracker: dropout inside tensor-parallel regions differs per TP rank.

Follows Megatron's `CudaRNGStatesTracker` and `model_parallel_cuda_manual_seed`: the default
generators are seeded alike on every TP rank (so dropout on replicated activations matches), and a
named extra state seeded `seed + 2718 + tp_rank` is swapped in with `fork()` around dropout on
TP-split activations (attention probabilities). Unlike Megatron it tracks the CPU generator as well
as the CUDA one, so the same code is exercised on CPU, and it is an object passed in, not a global.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.utils.checkpoint

MODEL_PARALLEL_RNG = "model-parallel-rng"
_TP_SEED_OFFSET = 2718  # Megatron's constant, so seeds line up with Megatron runs
_PP_SEED_OFFSET = 100  # Megatron offsets the seed by 100 * pipeline rank


def _cuda_ready() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class RNGStatesTracker:
    """Named generator states (CPU and, once CUDA is initialised, the current CUDA device)."""

    def __init__(self) -> None:
        self._states: dict[str, dict[str, torch.Tensor]] = {}
        self._seeds: dict[str, int] = {}

    def add(self, name: str, seed: int) -> None:
        if name in self._states:
            raise ValueError(f"RNG state {name!r} already exists")
        saved = self._capture()
        torch.manual_seed(seed)  # seeds CPU and every CUDA device
        self._states[name] = self._capture()
        self._seeds[name] = seed
        self._restore(saved)

    def _cuda_state_for(self, name: str) -> None:
        # A model is often built on CPU before CUDA starts: derive the CUDA state from the
        # same seed on first use rather than silently forking only the CPU generator.
        if _cuda_ready() and "cuda" not in self._states[name]:
            saved = torch.cuda.get_rng_state()
            torch.cuda.manual_seed(self._seeds[name])
            self._states[name]["cuda"] = torch.cuda.get_rng_state()
            torch.cuda.set_rng_state(saved)

    def get_states(self) -> dict[str, dict[str, torch.Tensor]]:
        return {name: dict(state) for name, state in self._states.items()}

    def set_states(self, states: dict[str, dict[str, torch.Tensor]]) -> None:
        self._states = {name: dict(state) for name, state in states.items()}

    def megatron_states(self) -> dict[str, torch.Tensor]:
        """The states as Megatron's tracker holds them (`get_cuda_rng_tracker().get_states()`):
        one generator state per name, the CUDA one once CUDA is initialised, else the CPU one
        (what Megatron-DeepSpeed's tracker holds on DeepSpeed's CPU accelerator)."""
        states = {}
        for name in self._states:
            self._cuda_state_for(name)
            states[name] = self._states[name]["cuda" if _cuda_ready() else "cpu"]
        return states

    def set_megatron_states(self, states: dict[str, torch.Tensor]) -> None:
        """`megatron_states`' inverse: each state replaces this device's generator of its name
        (on CUDA the CPU one, which Megatron does not track, stays as it is)."""
        device = "cuda" if _cuda_ready() else "cpu"
        for name, state in states.items():
            if name not in self._states:
                raise ValueError(f"RNG state {name!r} was never added")
            self._states[name] = {**self._states[name], device: state}

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG) -> Iterator[None]:
        """Runs the block on the named state; the default state is untouched by it."""
        if name not in self._states:
            raise ValueError(f"RNG state {name!r} was never added")
        self._cuda_state_for(name)
        saved = self._capture()
        self._restore(self._states[name])
        try:
            yield
        finally:
            self._states[name] = self._capture()
            self._restore(saved)

    @staticmethod
    def _capture() -> dict[str, torch.Tensor]:
        state = {"cpu": torch.get_rng_state()}
        if _cuda_ready():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    @staticmethod
    def _restore(state: dict[str, torch.Tensor]) -> None:
        torch.set_rng_state(state["cpu"])
        if "cuda" in state and _cuda_ready():
            torch.cuda.set_rng_state(state["cuda"])


def model_parallel_seed(seed: int, *, tp_rank: int = 0, pp_rank: int = 0) -> RNGStatesTracker:
    """Seeds the default generators and returns a tracker holding the per-TP-rank state."""
    seed = seed + _PP_SEED_OFFSET * pp_rank
    torch.manual_seed(seed)
    tracker = RNGStatesTracker()
    tracker.add(MODEL_PARALLEL_RNG, seed + _TP_SEED_OFFSET + tp_rank)
    return tracker


@contextlib.contextmanager
def init_rng(seed: int | None) -> Iterator[None]:
    """Draws the parameters built inside from `seed`, leaving the default generator untouched.

    Each layer gets its own init seed, so a layer is the same whichever pipeline stage builds it
    (Megatron's weights depend on the stage layout; ours do not). None: the current generator.
    """
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def checkpoint(function, *args: torch.Tensor, rng_tracker: RNGStatesTracker | None):
    """Activation checkpointing that replays the tracker's named states on recompute.

    torch's checkpoint restores the default generators; Megatron's CheckpointFunction also
    restores the model-parallel state, or recomputed dropout masks inside TP regions would differ
    from the forward's.
    """
    snapshot = rng_tracker.get_states() if rng_tracker is not None else None
    calls = [0]

    def run(*inputs):
        calls[0] += 1
        if calls[0] == 1 or rng_tracker is None:
            return function(*inputs)
        current = rng_tracker.get_states()
        rng_tracker.set_states(snapshot)
        try:
            return function(*inputs)
        finally:
            rng_tracker.set_states(current)

    return torch.utils.checkpoint.checkpoint(
        run, *args, use_reentrant=False, preserve_rng_state=True
    )

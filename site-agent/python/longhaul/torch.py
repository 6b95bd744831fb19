"""DiLoCo for a PyTorch model: wrap the model and its inner optimizer, and
call :meth:`DiLoCo.step` where you would call the inner optimizer's.

    import longhaul, longhaul.torch

    session = longhaul.TrainerClient().join("my-job", rank=0, parameters=longhaul.torch.parameter_count(model))
    optimizer = longhaul.torch.DiLoCo(session, model, torch.optim.AdamW(model.parameters(), lr=3e-4))
    for x, y in data:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()          # the inner step; every H steps also the outer one
    session.leave()

The outer loop is :class:`longhaul.diloco.DiLoCo`'s, on a float32 copy of
the model's trainable parameters (in ``model.parameters()`` order, each
flattened): the outer optimizer (Nesterov SGD, lr 0.7 and momentum 0.9 by
default), the anchor, the planner's fragments and their overlap, and the
rounds this site did not apply (it keeps its anchor and its local
progress, which the next pseudo-gradient carries) and the catch-up of a
site that missed a committed round (which copies the whole model in and
out once) are all kept there. Only the fragments due
at a step are copied between the model and that vector, on the steps they
are submitted or applied, so the model may live on any device and in any
floating dtype (a bf16 model is trained in bf16 and averaged in float32).
Error feedback on the quantised pseudo-gradients is the agent's codec's.

Wrap the model after moving it to its device and before training; the
parameters must keep their shapes. Importing this module needs torch; the
rest of the package does not.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

import numpy as np
import torch

from longhaul.client import Fragment, Session
from longhaul.diloco import DiLoCo as _Loop
from longhaul.diloco import RoundRecord

__all__ = ["DiLoCo", "parameter_count"]


def _trainable(model: torch.nn.Module) -> List[torch.nn.Parameter]:
    # model.parameters() yields a parameter shared by two modules once.
    return [p for p in model.parameters() if p.requires_grad]


def parameter_count(model: torch.nn.Module) -> int:
    """The trainable parameters of ``model``: what the job's ``parameters``
    and :meth:`~longhaul.client.TrainerClient.join` must say."""
    return sum(p.numel() for p in _trainable(model))


class _Layout:
    """Where each parameter sits in the flat vector: parameter ``i`` holds
    ``[starts[i], starts[i] + params[i].numel())``."""

    def __init__(self, params: List[torch.Tensor]):
        self.params = params
        self.starts: List[int] = []
        at = 0
        for p in params:
            self.starts.append(at)
            at += p.numel()
        self.size = at

    def pieces(self, first: int, size: int) -> Iterable[Tuple[torch.Tensor, int, int, int]]:
        """(parameter, its first element, its end, the flat offset of its
        first element) for every parameter that overlaps
        ``[first, first + size)``."""
        end = first + size
        for p, start in zip(self.params, self.starts):
            lo, hi = max(first, start), min(end, start + p.numel())
            if lo < hi:
                yield p, lo - start, hi - start, lo

    def gather(self, flat: np.ndarray, first: int, size: int, source: str = "data") -> None:
        """Copies ``[first, first + size)`` of the parameters (or, with
        ``source="grad"``, of their gradients; a missing one is zero) into
        ``flat``."""
        with torch.no_grad():
            for p, lo, hi, at in self.pieces(first, size):
                t = p if source == "data" else p.grad
                if t is None:
                    flat[at : at + hi - lo] = 0
                    continue
                values = t.detach().reshape(-1)[lo:hi].to(device="cpu", dtype=torch.float32)
                flat[at : at + hi - lo] = values.numpy()

    def scatter(self, flat: np.ndarray, first: int, size: int, target: str = "data") -> None:
        """Writes ``flat[first : first + size)`` back into the parameters
        (or their gradients), converting to each one's device and dtype."""
        with torch.no_grad():
            for p, lo, hi, at in self.pieces(first, size):
                if target == "grad" and p.grad is None:
                    p.grad = torch.zeros_like(p)
                t = p if target == "data" else p.grad
                values = torch.from_numpy(flat[at : at + hi - lo]).to(device=t.device, dtype=t.dtype)
                if t.is_contiguous():
                    t.view(-1)[lo:hi].copy_(values)
                else:
                    whole = t.detach().reshape(-1).clone()
                    whole[lo:hi] = values
                    t.copy_(whole.view_as(t))


class DiLoCo:
    """DiLoCo's outer loop around ``model`` and its ``inner_optimizer``
    (see the module docs).

    ``session`` is a joined :class:`~longhaul.client.Session` whose job has
    :func:`parameter_count` ``(model)`` parameters. The outer optimizer's
    ``outer_lr``, ``momentum`` and ``nesterov``, and ``collect_timeout``,
    ``round_wait`` and ``progress_every``, are
    :class:`longhaul.diloco.DiLoCo`'s. :attr:`history` holds a
    :class:`~longhaul.diloco.RoundRecord` per outer step.
    """

    def __init__(
        self,
        session: Session,
        model: torch.nn.Module,
        inner_optimizer: torch.optim.Optimizer,
        *,
        outer_lr: float = 0.7,
        momentum: float = 0.9,
        nesterov: bool = True,
        collect_timeout: float = 600.0,
        round_wait: float = 30.0,
        progress_every: float = 1.0,
    ):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model: must be a torch.nn.Module (got {type(model).__name__})")
        if not isinstance(inner_optimizer, torch.optim.Optimizer):
            raise TypeError(f"inner_optimizer: must be a torch.optim.Optimizer (got {type(inner_optimizer).__name__})")
        params = _trainable(model)
        for i, p in enumerate(params):
            if not p.is_floating_point():
                raise ValueError(f"model: parameter {i} has dtype {p.dtype}; DiLoCo averages floating-point parameters")
        layout = _Layout(params)
        expected = session.schedule.parameters
        if layout.size != expected:
            raise ValueError(
                f"model: {layout.size} trainable parameters; the job's schedule has {expected}"
                " (join with parameters=longhaul.torch.parameter_count(model))"
            )
        optimized = {id(p) for group in inner_optimizer.param_groups for p in group["params"]}
        missing = [i for i, p in enumerate(params) if id(p) not in optimized]
        if missing:
            raise ValueError(f"inner_optimizer: does not update trainable parameters {missing[:8]} of the model")
        self.model = model
        self.inner_optimizer = inner_optimizer
        self._layout = layout
        self._flat = np.empty(layout.size, dtype=np.float32)
        layout.gather(self._flat, 0, layout.size)
        self._loop = _Loop(
            session,
            self._flat,
            outer_lr=outer_lr,
            momentum=momentum,
            nesterov=nesterov,
            collect_timeout=collect_timeout,
            progress_every=progress_every,
            round_wait=round_wait,
            whole_model=self._whole_model,
        )
        self._grads: Optional[np.ndarray] = None

    def _whole_model(self, direction: str) -> None:
        # A catch-up rewrites every parameter: all of the model is copied
        # into the flat vector before it and back after.
        if direction == "in":
            self._layout.gather(self._flat, 0, self._layout.size)
        else:
            self._layout.scatter(self._flat, 0, self._layout.size)

    @property
    def session(self) -> Session:
        return self._loop.session

    @property
    def history(self) -> List[RoundRecord]:
        return self._loop.history

    @property
    def inner_steps(self) -> int:
        """H, the planner's inner steps per outer step."""
        return self._loop.inner_steps

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The inner optimizer's ``zero_grad``."""
        self.inner_optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> Optional[RoundRecord]:
        """The inner optimizer's step, then the outer loop's: on the steps a
        fragment is due it is submitted for the job's round or its average
        applied. Returns the outer step's record when one ended here."""
        self.inner_optimizer.step()
        due: List[Fragment] = self._loop.due()
        for fragment in due:
            self._layout.gather(self._flat, fragment.first, fragment.size)
        record = self._loop.step()
        for fragment in due:
            self._layout.scatter(self._flat, fragment.first, fragment.size)
        return record

    def allreduce_gradients(self) -> bool:
        """Synchronous data parallelism, for a baseline (the job's H must be
        1): replaces every parameter's gradient by its average over the
        round's live sites. Call after ``backward()`` and before
        :meth:`sync_step`; ``False`` when this site was left out of the
        round (its own gradients stay)."""
        if self._grads is None:
            self._grads = np.empty(self._layout.size, dtype=np.float32)
        grads = self._grads
        self._layout.gather(grads, 0, grads.size, source="grad")
        average = self._loop.allreduce(grads)
        if average is None:
            return False
        self._layout.scatter(average, 0, average.size, target="grad")
        return True

    def sync_step(self) -> None:
        """The inner optimizer's step alone, for synchronous data
        parallelism after :meth:`allreduce_gradients`."""
        self.inner_optimizer.step()

"""Problems that are rows of a task's own tables, split once into train / held out: the
sampling and the host-scorer adapter such JAX-reward tasks share (countdown, reasoning-gym's
character form)."""

from __future__ import annotations

import abc

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.tasks.protocol import Scored


class RowSampling(abc.ABC):
    """`sample_problems` / `heldout_problems` of a task whose problems are table rows
    (`problems_at(rows_b)`, jit-able) split into `row_split()` = (train rows, held-out rows)."""

    @abc.abstractmethod
    def row_split(self) -> tuple[np.ndarray, np.ndarray]:
        """The int row indices of the train and held-out problems."""

    @abc.abstractmethod
    def problems_at(self, rows_b):
        """The problems of table rows `rows_b` `[b]` (jit-able)."""

    def sample_problems(self, table, rng: jax.Array, n: int, split: str = "train"):
        """`n` problems of `split` drawn uniformly with replacement (pure, jit-able)."""
        del table
        train, heldout = self.row_split()
        rows = {"train": train, "heldout": heldout}.get(split)
        if rows is None:
            raise ValueError(f"split {split!r} is not 'train' or 'heldout'")
        return self.problems_at(jnp.asarray(rows)[jax.random.randint(rng, (n,), 0, len(rows))])

    def heldout_problems(self, table, n: int, rng: jax.Array):
        """The first `n` held-out problems (fewer if the split is smaller; the same every time)."""
        del table, rng
        return self.problems_at(self.row_split()[1][:n])


class RowScorer:
    """A row task's reward as a `HostScorer` (the host loop, `log.jit_loop=false`): its
    `score(index_b, tokens_br, mask_br)`, the function its JAX reward calls back."""

    def __init__(self, task):
        self.task = task

    def score(self, problems, tokens_br, mask_br) -> Scored:
        return Scored(self.task.score(problems.index_b, tokens_br, mask_br))

    def take_counts(self) -> dict[str, int]:
        return {}  # it counts nothing

    def close(self) -> None:
        pass

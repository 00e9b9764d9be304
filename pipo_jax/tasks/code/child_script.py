"""`CHILD_SCRIPT`: the path of `child.py`, the judge's and the runner's entry point, which the trainer
(`launch.py`) and the judge (`judge.py`) start as ``python -I CHILD_SCRIPT ...``. Standard library only:
the judge imports it inside the sandbox. Kept apart from `child.py`, which imports the judge."""
import os

CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")

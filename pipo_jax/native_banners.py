"""TensorFlow's load-time banners kept off the console (JetStream's and tensorflow-datasets' imports
load TensorFlow, and a tfds dataset's first load and read start its runtime; this package never places a
TensorFlow op on a device).

TensorFlow's native libraries log while they load, before absl's C++ logging is initialised, so
`TF_CPP_MIN_LOG_LEVEL` does not reach them: each of its two libraries prints absl's "before
InitializeLog" notice, the oneDNN notice and, on a machine without an NVIDIA driver, `Could not find
cuda drivers on your machine, GPU will not be used.` `banners_dropped()` runs an import with the
process's stderr (file descriptor 2) captured and writes back every captured line except those
(`BANNERS`): a warning or error printed during the import, and any traceback, still reaches the console.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

# Substrings of the lines TensorFlow prints on every load; nothing else is dropped.
BANNERS = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on",
    "Could not find cuda drivers on your machine, GPU will not be used.",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "rebuild TensorFlow with the appropriate compiler flags.",
    # What its runtime prints when a dataset is first loaded and read (it initialises its devices then);
    # this package reads data through TensorFlow and never places a TensorFlow op on a device.
    "failed call to cuInit",
    "Unable to register cuDNN factory",
    "Unable to register cuFFT factory",
    "Unable to register cuBLAS factory",
    "computation placer already registered",
    "TF-TRT Warning: Could not find TensorRT",
)


def kept_lines(text: str, banners: tuple[str, ...] = BANNERS) -> str:
    """`text` without its lines that contain one of `banners` (line ends kept)."""
    return "".join(line for line in text.splitlines(keepends=True) if not any(b in line for b in banners))


@contextlib.contextmanager
def banners_dropped(banners: tuple[str, ...] = BANNERS) -> Iterator[None]:
    """Runs the body with file descriptor 2 captured; afterwards writes back what it printed there
    less the lines of `banners`, also when the body raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            rest = kept_lines(captured.read().decode(errors="replace"), banners)
            data = rest.encode()
            while data:
                data = data[os.write(2, data):]

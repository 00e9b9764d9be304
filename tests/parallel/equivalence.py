"""How a sharded run is held equal to the single-device run (shared by the test modules).

Metrics (losses, KL, rewards, PIPO signal): fp32 with rtol 1e-5 (atol 1e-6 for values
that are themselves differences at rounding level). Integers (sampled tokens, counters,
PI-step flags): exactly.

Parameters and Adam moments: AdamW divides each gradient element by its own running
RMS, so an element whose gradient is a cancellation (rounding-level |g|) takes a step of
about +-lr whose *sign* is rounding noise; a different summation order (any sharding)
flips a handful of those (measured: 6-11 of 299,776 elements). So the parameters are
checked (1) as a whole: the total update of the run agrees to 1e-3 relative L2
(measured ~4e-5), and (2) element-wise: no element is off by more than one optimizer
step `lr` (+ 1e-5 relative); Adam moments element-wise to 1e-4 of the leaf's largest
entry. A real sharding error (a missing psum, a wrong shard) changes the update by O(1).
"""

from __future__ import annotations

import numpy as np

UPDATE_RTOL = 1e-3


def assert_run_matches(run: dict, reference: dict, initial_params: dict, lr: float) -> None:
    """`run` and `reference` are `scenario.run_summary` dicts; `initial_params` the flattened start params."""
    missing = sorted(set(reference) - set(run))
    assert not missing, f"run lacks {missing[:5]}"
    for key, ref in reference.items():
        got = run[key]
        if ref.dtype.kind != "f":
            np.testing.assert_array_equal(got, ref, err_msg=key)
        elif key.startswith("metric/"):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=key)
        elif key.startswith("params"):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=lr, err_msg=key)
        elif key.startswith("opt"):  # Adam moments: relative to the leaf's largest entry
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4 * float(np.max(np.abs(ref), initial=0)),
                                       err_msg=key)
        else:  # stored PIPO batch (log-probs, attributions of B_t under theta_t)
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=key)
    num = sum(float(np.sum((run[f"params{k}"] - reference[f"params{k}"]) ** 2)) for k in initial_params)
    den = sum(float(np.sum((reference[f"params{k}"] - p0) ** 2)) for k, p0 in initial_params.items())
    assert den > 0, "the reference run did not change the parameters"
    assert np.sqrt(num / den) < UPDATE_RTOL, f"relative L2 error of the update {np.sqrt(num / den):.3g}"

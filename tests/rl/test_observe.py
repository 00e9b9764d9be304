"""Run logging: metrics.jsonl, TensorBoard event files (read back record by record), the
PNG plots, and what a resume does to each."""

import glob
import json
import struct

import numpy as np
from tensorboardX.proto import event_pb2

from pipo_jax.run import observe

KEYS = ("reward_mean", "heldout_accuracy", "mu_t", "mu_his", "xi", "c", "pi_step_applied", "response_length",
        "kl_ref", "tokens_per_s")


def read_events(workdir):
    """Every Event of every TensorBoard file in workdir/tensorboard (TFRecord framing)."""
    events = []
    for path in sorted(glob.glob(f"{workdir}/tensorboard/events.out.tfevents.*")):
        data = open(path, "rb").read()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            pos += 12  # length + its crc
            events.append(event_pb2.Event.FromString(data[pos:pos + length]))
            pos += length + 4  # payload + its crc
    return events


def scalars(events):
    return {(v.tag, e.step): v.simple_value for e in events for v in e.summary.value}


def row(step):
    return {k: 0.1 * step + i for i, k in enumerate(KEYS)}


def test_logger_writes_jsonl_tensorboard_and_plots(tmp_path):
    log = observe.RunLogger(str(tmp_path), total=3, progress=False)
    log.log(0, {"heldout_accuracy": 0.25})
    log.log_many(0, {k: np.asarray([row(s)[k] for s in (1, 2, 3)]) for k in KEYS if k != "heldout_accuracy"},
                 {"heldout_accuracy": 0.5})
    plots = log.close(plots=True)
    rows = observe.read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[2]["xi"] == row(2)["xi"] and "heldout_accuracy" not in rows[2] and rows[3]["heldout_accuracy"] == 0.5
    got = scalars(read_events(tmp_path))
    for s in (1, 2, 3):
        for k in KEYS:
            if k != "heldout_accuracy":
                assert np.isclose(got[(k, s)], row(s)[k]), (k, s)
    assert got[("heldout_accuracy", 0)] == 0.25 and got[("heldout_accuracy", 3)] == 0.5
    names = sorted(p.rsplit("/", 1)[-1] for p in plots)
    assert names == ["kl.png", "mu_vs_mu_his.png", "response_length.png", "reward.png", "xi_c.png"]
    for p in plots:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_resume_truncates_jsonl_and_purges_tensorboard(tmp_path):
    log = observe.RunLogger(str(tmp_path), total=4, progress=False)
    for s in range(5):
        log.log(s, {"xi": float(s)})
    log.close(plots=False)
    # The checkpoint was at step 2: rows 3 and 4 of the first attempt are dropped / purged.
    log = observe.RunLogger(str(tmp_path), total=4, progress=False, start_step=2)
    log.log(3, {"xi": 30.0})
    log.close(plots=False)
    assert [(r["step"], r["xi"]) for r in observe.read_metrics(str(tmp_path / "metrics.jsonl"))] == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]
    events = read_events(tmp_path)
    # TensorBoard drops earlier events at steps >= a SessionLog START's step when it loads.
    starts = [e.step for e in events if e.HasField("session_log") and e.session_log.status == e.session_log.START]
    assert starts == [0, 3]  # each attempt: a fresh start purges from 0, the resume from 3
    last = {}
    for e in events:
        if e.HasField("session_log") and e.session_log.status == e.session_log.START:
            last = {k: v for k, v in last.items() if k[1] < e.step}
        for v in e.summary.value:
            last[(v.tag, e.step)] = v.simple_value
    assert last == {("xi", 0): 0.0, ("xi", 1): 1.0, ("xi", 2): 2.0, ("xi", 3): 30.0}
    # A fresh start (step 0) drops everything the earlier attempt logged.
    log = observe.RunLogger(str(tmp_path), total=4, progress=False)
    log.log(0, {"xi": 7.0})
    log.close(plots=False)
    assert [(r["step"], r["xi"]) for r in observe.read_metrics(str(tmp_path / "metrics.jsonl"))] == [(0, 7.0)]


def test_every_plot_has_labelled_axes_with_units_a_titled_run_and_legends_off_the_data(tmp_path, monkeypatch):
    """Each PNG the run writes is drawn from a figure whose axes name the quantity and its unit, whose
    title names the run, its algorithm and seed, and whose legends sit outside the panels; xi, c and the
    PI step (different scales) get a panel each. savefig is wrapped to read the figure it writes."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    seen = {}
    save = Figure.savefig

    def recording_savefig(fig, path, *args, **kwargs):
        fig.canvas.draw()
        panels = []
        for ax in fig.axes:
            legend = ax.get_legend()
            outside = legend is None or legend.get_window_extent().x0 >= ax.get_window_extent().x1
            panels.append((ax.get_xlabel(), ax.get_ylabel(), ax.get_title(), [ln.get_label() for ln in ax.lines],
                           outside))
        seen[str(path).rsplit("/", 1)[-1]] = panels
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording_savefig)
    run = tmp_path / "grpo_pipo_s3"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"algorithm": "grpo", "seed": 3, "pipo": {"enabled": True}}))
    rows = [dict(row(s), step=s) for s in (1, 2, 3)]
    written = observe.plot_run(rows, str(run))
    names = sorted(p.rsplit("/", 1)[-1] for p in written)
    assert names == ["kl.png", "mu_vs_mu_his.png", "response_length.png", "reward.png", "xi_c.png"]
    assert sorted(seen) == names
    units = {"reward.png": ["fraction"], "mu_vs_mu_his.png": ["reward"], "xi_c.png": ["std. devs", "scale", "0/1"],
             "response_length.png": ["tokens"], "kl.png": ["nats"]}
    for name, panels in seen.items():
        assert len(panels) == len(units[name]), name
        assert panels[0][2].endswith(": grpo_pipo_s3 (grpo + PIPO, seed 3)"), (name, panels[0][2])
        assert "iteration" in panels[-1][0], name  # the shared x axis, labelled under the last panel
        for (_, ylabel, _, _, outside), unit in zip(panels, units[name]):
            assert "(" in ylabel and unit in ylabel and outside, (name, ylabel)
        assert open(run / name, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert [p[3] for p in seen["xi_c.png"]] == [["xi"], ["c"], ["PI step applied"]]
    assert seen["reward.png"][0][3] == ["batch reward", "held-out accuracy"]
    # a workdir without a config: the run's name alone
    assert observe.run_caption(str(tmp_path)) == tmp_path.name



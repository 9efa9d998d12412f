"""Inputs that used to fail late, silently or with a traceback: each is now handled at the
door (a clamp with a note, a named `ValueError`, a warning). The table of bad inputs through
every entry point is `test_probe.py`."""

from __future__ import annotations

import logging

import chex
import jax
import numpy as np
import optax
import pytest
from helpers import CLASSES, SHAPE, TINY_RUN, make_data

from pfedwn_jax.data.batching import clamp_notes_once, fit_batch_size
from pfedwn_jax.engine import init_client_state, local_train
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.setup import setup
from pfedwn_jax.models import get_model


# --------------------------------------------------------------------------- batch clamp
def test_fit_batch_size_clamps_to_the_largest_client_with_one_note(caplog):
    with caplog.at_level(logging.WARNING, logger="pfedwn_jax"):
        assert fit_batch_size(32, [5, 800, 0]) == 32
        assert fit_batch_size(800, [5, 800, 0]) == 800
        assert not caplog.records
        assert fit_batch_size(1_000_000, np.array([5, 800, 0])) == 800
    assert len(caplog.records) == 1
    assert "1000000" in caplog.text and "800" in caplog.text
    assert fit_batch_size(64, [0, 0]) == 64  # no data at all: left to the engine's checks


def test_a_job_notes_a_clamped_batch_once_not_once_per_run(caplog):
    """Outside a job every clamp is noted; inside one (`setup_runs`), once per batch size."""
    with caplog.at_level(logging.WARNING, logger="pfedwn_jax"):
        for _ in range(2):
            fit_batch_size(64, [5, 30])
        assert len(caplog.records) == 2
        caplog.clear()
        with clamp_notes_once():
            for counts in ([5, 30], [7, 28], [9, 30]):
                assert fit_batch_size(64, counts) == max(counts)
            fit_batch_size(1_000, [5, 30])
        assert [r.getMessage()[:15] for r in caplog.records] == [
            "batch_size=64 i",
            "batch_size=1000",
        ]
        assert "every run whose clients are smaller" in caplog.records[0].getMessage()


@pytest.mark.parametrize("steps", [None, pytest.param(2, marks=pytest.mark.slow)])
def test_a_batch_larger_than_every_client_gives_the_numbers_of_the_largest_client(steps):
    """The padded schedule (the engine without the clamp) against the clamped one."""
    model = get_model("logreg", CLASSES, SHAPE)
    opt = optax.sgd(0.1)
    data = make_data()  # counts 11, 5, 0, 9, 3; M = 16
    dc = np.array([0, 1, 3, 4])
    state = init_client_state(model, opt, jax.random.key(0), len(dc))
    kw = dict(num_steps=steps, strategy="vmap")
    key = jax.random.key(3)
    padded, m_pad = local_train(model, opt, state, data, dc, key, batch_size=64, **kw)
    clamped, m_cl = local_train(
        model, opt, state, data, dc, key, batch_size=fit_batch_size(64, [11, 5, 9, 3]), **kw
    )
    chex.assert_trees_all_close(padded, clamped, rtol=1e-5, atol=1e-8)  # summation order only
    np.testing.assert_allclose(m_pad["loss"], m_cl["loss"], rtol=1e-6)


def test_setup_clamps_the_batch_of_the_round_context():
    exp = setup(ExperimentConfig(**{**TINY_RUN, "batch_size": 1_000_000}))
    largest = int(np.asarray(exp.data.train.count)[exp.federation.data_client].max())
    assert exp.ctx.batch_size == largest
    assert setup(ExperimentConfig(**TINY_RUN)).ctx.batch_size == TINY_RUN["batch_size"]


# --------------------------------------------------------------------------- size guards
def test_error_probability_of_two_million_neighbors_is_refused_before_jax_allocates():
    from pfedwn_jax.wireless import error_probability

    nbrs = np.random.default_rng(0).uniform(0, 50, (2_000_000, 2))
    with pytest.raises(ValueError) as err:
        error_probability(np.zeros(2), nbrs, 5.0)
    text = str(err.value)
    for part in ("2000000 neighbor(s)", "TiB", "free on the device", "sparse_error_probability"):
        assert part in text, (part, text)


@pytest.fixture
def small_device(monkeypatch):
    """Every size guard sees a device with 1 MiB free and checks every estimate."""
    from pfedwn_jax import devices

    monkeypatch.setattr(devices, "_CHECK_FLOOR", 0)
    monkeypatch.setattr(devices, "available_bytes", lambda device=None: 1 << 20)


def test_every_link_level_call_checks_its_size(small_device):
    from pfedwn_jax.wireless import (
        candidate_neighbors,
        error_probability,
        physical_received,
        simulate_links,
        sparse_error_probability,
    )

    xy = np.random.default_rng(1).uniform(0, 50, (600, 2))
    with pytest.raises(ValueError, match=r"600 target\(s\) x 400 neighbor\(s\).*into chunks"):
        error_probability(xy, xy[None, :400], 5.0)
    with pytest.raises(ValueError, match=r"\(1000 draws\).*1 MiB free.*split the draws"):
        simulate_links(jax.random.key(0), xy[0], xy[1:100], 5.0, 1000)
    rx = np.arange(600, dtype=np.int32)
    with pytest.raises(ValueError, match="num_interferers"):
        physical_received(jax.random.key(0), xy, rx, (rx + 1) % 600, np.ones(600, bool), 5.0)
    idx, mask = candidate_neighbors(xy, k=8)
    with pytest.raises(ValueError, match="fewer interferers per receiver"):
        sparse_error_probability(xy, idx, mask, 5.0)
    assert error_probability(xy[0], xy[1:4], 5.0).shape == (3,)  # a small call still runs


@pytest.mark.parametrize(
    ("targets", "n"), [(1, 2000), pytest.param(200, 300, marks=pytest.mark.slow)]
)
def test_the_error_probability_estimate_against_xla(targets, n):
    """`perr_bytes` within [1, 2]x of XLA's own temporaries plus arguments."""
    from pfedwn_jax.wireless import ChannelParams
    from pfedwn_jax.wireless._inputs import link_inputs
    from pfedwn_jax.wireless.perr import _perr_jit, moment_coefficients, perr_bytes

    xy = np.random.default_rng(2).uniform(0, 50, (targets, n, 2))
    links, params = link_inputs(xy[:, 0], xy, 5.0, None, ChannelParams())
    m1, var1 = moment_coefficients(params, moments="paper")
    mem = _perr_jit.lower(links, params, m1, var1, num_nodes=10).compile().memory_analysis()
    xla = mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
    assert 1.0 <= perr_bytes(targets, n, 4) / xla <= 2.0


# --------------------------------------------------------------------------- files and data
def test_npz_dataset_pointing_at_a_npy_file_is_a_named_error(tmp_path):
    from pfedwn_jax.data import load_dataset

    np.save(tmp_path / "x.npy", np.zeros((5, 4, 4), np.uint8))
    with pytest.raises(ValueError, match=r"x\.npy' holds one array \(uint8 \[5, 4, 4\]\)"):
        load_dataset(f"npz:{tmp_path / 'x.npy'}")


def test_a_stray_label_is_named_with_the_label_count(tmp_path, caplog):
    from pfedwn_jax.data import load_dataset

    y = np.arange(100) % 10
    x = np.zeros((100, 4, 4), np.uint8)
    np.savez(tmp_path / "ok.npz", x_train=x, y_train=y)
    y[7] = 1000
    np.savez(tmp_path / "stray.npz", x_train=x, y_train=y)
    with caplog.at_level(logging.WARNING, logger="pfedwn_jax"):
        assert load_dataset(f"npz:{tmp_path / 'ok.npz'}").num_classes == 10
        assert not caplog.records
        assert load_dataset(f"npz:{tmp_path / 'stray.npz'}").num_classes == 1001
    assert len(caplog.records) == 1
    for part in ("largest label is 1000", "1001 classes", "only 11 distinct labels"):
        assert part in caplog.text, caplog.text


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"schema": "pfedwn-res', "is not valid JSON"),  # truncated
        (b"\x89PNG\x00\xff", "is not valid JSON"),  # binary
        (b"[1, 2]", "not a results JSON"),
        (b"{}", "not a results JSON: results schema must be one of"),
        (b'{"schema": "pfedwn-results/1"}', "has no 'config' entry"),
    ],
)
def test_result_load_of_a_damaged_file_names_the_file(tmp_path, content, expected):
    from pfedwn_jax import Result

    path = tmp_path / "results.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=expected) as err:
        Result.load(path)
    assert str(path) in str(err.value)


def test_a_federation_without_any_selected_neighbor_warns(caplog):
    from pfedwn_jax.experiment.federation import build_federation, selected_links

    with caplog.at_level(logging.WARNING, logger="pfedwn_jax"):
        assert selected_links(build_federation(ExperimentConfig())) == 3
        assert not caplog.records
        for mode in ("single", "network"):
            fed = build_federation(ExperimentConfig(mode=mode, num_neighbors=4, gamma_th=1e4))
            assert selected_links(fed) == 0
    assert len(caplog.records) == 2
    assert "no neighbor is selected" in caplog.text and "as Local" in caplog.text


def test_an_empty_out_is_refused_not_read_as_the_current_directory(capsys):
    from pfedwn_jax.cli import main

    for command in ("run", "sweep"):
        assert main([command, "--out", ""]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "must not be empty" in err, err


# --------------------------------------------------------------------------- orbax's lines
def _absl_records(caplog, emit):
    from absl import logging as absl_logging

    with caplog.at_level(logging.INFO):
        caplog.clear()
        emit(absl_logging)
    return [r for r in caplog.records if r.name == "absl"]


def test_benign_orbax_lines_are_dropped_and_real_ones_kept(caplog):
    import pfedwn_jax.state_store  # noqa: F401  (installs the filter)

    tmp = "Attempted to create temporary directory %s which already exists. Removing existing "
    tmp += "directory since it is not finalized."
    assert not _absl_records(caplog, lambda a: a.warning(tmp, "/x/3.orbax-checkpoint-tmp"))
    assert _absl_records(caplog, lambda a: a.warning("Metadata file does not exist: %s", "/x"))
    # a save in progress reading its own step metadata file (orbax's race), and a finished one
    in_progress, done = (
        "/x/s/13.orbax-checkpoint-tmp/_CHECKPOINT_METADATA",
        "/x/s/13/_CHECKPOINT_METADATA",
    )
    missing = "Metadata file does not exist: %s"
    empty = "Failed to json parse Metadata file: %s, file content: %s, error: %s"
    error = "Expecting value: line 1 column 1 (char 0)"
    assert not _absl_records(caplog, lambda a: a.warning(missing, in_progress))
    assert not _absl_records(caplog, lambda a: a.error(empty, in_progress, "", error))
    assert _absl_records(caplog, lambda a: a.warning(missing, done))
    assert _absl_records(caplog, lambda a: a.error(empty, done, "", error))
    assert _absl_records(caplog, lambda a: a.error(empty, in_progress, '{"item', error))

    def failed(exc):
        def emit(a):
            try:
                raise exc
            except BaseException:
                a.exception("Save Finalize thread (save_finalize) failed.")

        return emit

    assert not _absl_records(caplog, failed(KeyboardInterrupt()))
    # a full disk: the caller reports it once (`io.DiskFullError`), orbax's tracebacks go
    assert not _absl_records(caplog, failed(OSError(28, "No space left on device")))
    assert _absl_records(caplog, failed(OSError(5, "Input/output error")))


def test_a_killed_saves_leftover_is_cleaned_up_without_a_warning(tmp_path, caplog):
    from pfedwn_jax import state_store

    state_store.save(tmp_path, 1, {"a": np.zeros(3)}, {"n": 1})
    (tmp_path / "2.orbax-checkpoint-tmp" / "state").mkdir(parents=True)  # a killed save of 2
    with caplog.at_level(logging.WARNING):
        state_store.save(tmp_path, 2, {"a": np.ones(3)}, {"n": 2})
    assert state_store.latest(tmp_path) == 2
    assert not [r for r in caplog.records if r.name == "absl"], caplog.text


# --------------------------------------------------------------------------- eps ceiling
@pytest.mark.parametrize("moments", ["paper", "exact", "physical"])
def test_perr_never_exceeds_the_ceiling_and_far_links_reach_it(moments):
    from pfedwn_jax.wireless import error_probability, perr_ceiling

    ceiling = perr_ceiling(moments=moments)
    assert ceiling == pytest.approx(np.exp(-2.0))  # Table I: beta 2, Gamma 2
    xy = np.random.default_rng(3).uniform(0, 50, (400, 2))
    perr = np.asarray(error_probability(np.array([0.0, 0.0]), xy, 15.0, moments=moments))
    assert ceiling - 1e-3 < perr.max() <= ceiling * (1 + 1e-6)  # float32 rounding


def test_perr_ceiling_follows_the_channel_and_checks_its_inputs():
    from pfedwn_jax.wireless import ChannelParams, perr_ceiling

    assert perr_ceiling(ChannelParams(fading_threshold=1.0)) == pytest.approx(np.exp(-0.5))
    with pytest.raises(ValueError, match="moments must be one of"):
        perr_ceiling(moments="nosuch")


def test_experiment_config_warns_once_about_an_eps_above_the_ceiling(caplog):
    from pfedwn_jax.experiment import config as config_module

    config_module._warn_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger="pfedwn_jax"):
        ExperimentConfig(eps=0.1)
        ExperimentConfig(eps=0.2, selection=False)  # eps does not matter without selection
        ExperimentConfig(eps=0.2, channel={"fading_threshold": 1.0})  # ceiling 0.61
        assert not caplog.records
        ExperimentConfig(eps=0.2).replace(rounds=2)
    assert len(caplog.records) == 1
    assert "eps=0.2 is above 0.1353" in caplog.text and "selection=False" in caplog.text


def test_the_eps_flags_refuse_a_value_above_the_ceiling(capsys, tmp_path):
    from pfedwn_jax.cli import main

    for argv in (
        ["neighbors", "--eps", "0.2"],
        ["run", "--eps", "0.2", "--moments", "exact", "--out", str(tmp_path)],
        ["sweep", "--eps", "0.15", "--out", str(tmp_path)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is above 0.1353" in err, err
    assert not list(tmp_path.iterdir())  # refused before any work
    assert main(["neighbors", "--eps", "0.1"]) == 0
    assert "selected 3 of 10" in capsys.readouterr().out


def test_refuse_eps_flag_uses_each_configs_own_ceiling():
    from pfedwn_jax.cli.common import refuse_eps_flag

    lenient = ExperimentConfig(eps=0.2, channel={"fading_threshold": 1.0})
    assert refuse_eps_flag(0.2, lambda: [lenient]) == [lenient]
    off = ExperimentConfig(eps=0.2, selection=False)
    assert refuse_eps_flag(0.2, lambda: off) is off
    with pytest.raises(ValueError, match=r"--eps=0\.2 is above"):
        refuse_eps_flag(0.2, lambda: [lenient, ExperimentConfig(eps=0.2)])


# --------------------------------------------------------------------------- scripts
def _script(name):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "args",
    [
        ["--only", "nosuch"],
        ["--seeds", "a,b"],
        ["--seeds=-1"],
        ["--methods", "nosuch"],
        ["--cpu-devices", "0"],
        ["--out-is-a-file"],
    ],
)
def test_robustness_script_checks_every_argument_before_any_work(args, tmp_path, capsys):
    script = _script("robustness")
    script.run_robustness = lambda *a, **k: pytest.fail("computed before checking")
    out = tmp_path / "rob"
    if args == ["--out-is-a-file"]:
        out.write_text("")
        args = []
    assert script.main(["--preset", "tiny", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("robustness.py: error: --") and err.count("\n") == 1, err


def test_reproduce_script_checks_out_and_items_before_any_work(tmp_path, capsys):
    from pfedwn_jax.reproduce import learning

    script = _script("reproduce")
    file = tmp_path / "f"
    file.write_text("")
    original = learning.reproduce
    learning.reproduce = lambda *a, **k: pytest.fail("computed before checking")
    try:
        for argv in (["--out", str(file)], ["--out", str(tmp_path), "--only", "fig99"]):
            assert script.main(["--preset", "tiny", *argv]) == 2
            err = capsys.readouterr().err
            assert err.startswith("reproduce.py: error: --") and err.count("\n") == 1, err
        with pytest.raises(SystemExit) as exit_:
            script.main(["--preset", "tiny", "--out", ""])
        assert exit_.value.code == 2 and "must not be empty" in capsys.readouterr().err
    finally:
        learning.reproduce = original


# --------------------------------------------------------------------------- version
def test_pfedwn_version(capsys):
    from importlib.metadata import version

    from pfedwn_jax.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pfedwn {version('pfedwn-jax')}"


# --------------------------------------------------------------------------- plots
def _fig1_like(plt, rounds):
    """Fig. 1's layout (figsize, labels, no tight_layout): the x label used to be cut off."""
    fig, ax = plt.subplots(figsize=(5, 3.4), dpi=120)
    x = np.arange(1, rounds + 1)
    ax.plot(x, 50 + x, label="target client")
    ax.set(ylabel="test accuracy (%)")
    return fig, ax


@pytest.mark.parametrize("rounds", [1, 2])
def test_round_axes_have_whole_ticks_and_saved_figures_keep_their_labels(rounds, tmp_path):
    plt = pytest.importorskip("matplotlib.pyplot")
    from matplotlib.image import imread

    from pfedwn_jax.plotting import rounds_axis, save_figure

    fig, ax = _fig1_like(plt, rounds)
    rounds_axis(ax)
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks == list(range(1, rounds + 1)), ticks
    png = imread(save_figure(fig, tmp_path / "f.png"))
    assert (png[-3:, :, :3] == 1.0).all()  # a white margin below the x label: nothing cut


def test_a_one_round_learning_curve_draws_its_points(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    from pfedwn_jax import run
    from pfedwn_jax.results import report

    drawn = {}
    save = report.save_figure
    monkeypatch.setattr(report, "save_figure", lambda fig, path: drawn.setdefault("f", fig))
    result = run(ExperimentConfig(**{**TINY_RUN, "rounds": 1, "algorithms": ("local",)}))
    report.plot_learning_curves(result, tmp_path / "c.png")
    (line,) = drawn["f"].axes[0].get_lines()
    assert len(line.get_xdata()) == 1 and line.get_marker() == "o"
    save(drawn["f"], tmp_path / "c.png")


# --------------------------------------------------------------------------- docs
def test_the_readmes_exp_toml_is_a_valid_config(tmp_path):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (block,) = re.findall(r"```toml\n(.*?)```", readme, flags=re.S)
    (tmp_path / "exp.toml").write_text(block)
    config = ExperimentConfig.from_toml(tmp_path / "exp.toml")
    assert config.hparams == {"pfedwn": {"a": 0.5}} and config.rounds == 50

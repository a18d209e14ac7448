"""The widgets: frames, sliders, Play buttons, and values that agree with llmnote.hw."""

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from llmnote import viz  # noqa: E402
from llmnote.hw import bandwidth_ladder, get_gpu, measured_ceilings, memory_levels  # noqa: E402
from llmnote.viz.roofline_figures import DEFAULT_BATCHES, moving_workloads  # noqa: E402


def assert_animated(fig, frame_names):
    assert [f.name for f in fig.frames] == list(frame_names)
    (slider,) = fig.layout.sliders
    assert [s.args[0][0] for s in slider.steps] == list(frame_names)
    labels = [b.label for menu in fig.layout.updatemenus for b in menu.buttons]
    assert "Play" in labels and "Pause" in labels


def test_roofline_figure_is_animated_over_batch():
    fig = viz.roofline_figure("H200", "bf16")
    assert_animated(fig, [str(b) for b in DEFAULT_BATCHES])


def test_roofline_roofs_come_from_the_spec_table():
    spec = get_gpu("H200")
    fig = viz.roofline_figure(spec, "bf16")
    roof = fig.data[0]
    assert max(roof.y) == pytest.approx(spec.peak_tflops("bf16"))
    i = int(np.argmin(np.abs(np.log(roof.x) - np.log(1.0))))
    assert roof.y[i] == pytest.approx(roof.x[i] * spec.memory_tbps)
    ridge = next(t for t in fig.data if t.name and t.name.startswith("ridge"))
    assert ridge.x[0] == pytest.approx(spec.ridge_point("bf16"))
    fp8 = viz.roofline_figure(spec, "fp8")
    assert max(fp8.data[0].y) == pytest.approx(spec.peak_tflops("fp8"))


def test_roofline_frames_move_the_points_where_the_model_says():
    spec = get_gpu("H200")
    fig = viz.roofline_figure(spec, "bf16")
    for frame, batch in zip(fig.frames, DEFAULT_BATCHES, strict=True):
        expected = moving_workloads(batch)
        assert len(frame.data) == 3 and len(frame.traces) == 3
        for trace, work in zip(frame.data, expected, strict=True):
            assert trace.x[0] == pytest.approx(work.intensity)
            assert trace.y[0] == pytest.approx(work.attainable_tflops(spec, "bf16"))
    # The decode GEMM point starts memory-bound and ends compute-bound.
    first, last = fig.frames[0].data[0], fig.frames[-1].data[0]
    assert first.x[0] < spec.ridge_point("bf16") < last.x[0]
    # Frames replace exactly the last three traces (the moving markers).
    assert list(fig.frames[0].traces) == [len(fig.data) - 3, len(fig.data) - 2, len(fig.data) - 1]


def test_roofline_shows_measured_points_only_for_the_gpu_they_were_measured_on():
    names = lambda fig: [t.name or "" for t in fig.data]  # noqa: E731
    h200 = names(viz.roofline_figure("H200"))
    assert any(n.startswith("measured:") for n in h200)
    assert any(n.startswith("roof (measured") for n in h200)
    a100 = names(viz.roofline_figure("A100"))
    assert not any("measured" in n for n in a100)
    points = viz.measured_points("H200")
    assert {p["dtype"] for p in viz.measured_points("H200", "bf16")} == {"bf16"}
    fp8_points = [t for t in viz.roofline_figure("H200", "fp8").data if (t.name or "").startswith("measured:")]
    assert fp8_points and all("fp8" in text for t in fp8_points for text in t.text)
    ceilings = measured_ceilings()
    assert max(p["tflops"] for p in points if p["kernel"] == "matmul" and p["dtype"] == "bf16") == pytest.approx(
        ceilings.matmul_tflops["bf16"]
    )


def test_roofline_rejects_bad_input():
    with pytest.raises(ValueError, match="do not support"):
        viz.roofline_figure("V100", "bf16")
    with pytest.raises(ValueError, match="batches"):
        viz.roofline_figure("H200", batches=())


@pytest.mark.parametrize("workload,frames", [("matmul", 6), ("elementwise", 3)])
def test_memory_hierarchy_figure(workload, frames):
    fig = viz.memory_hierarchy_figure("H200", workload)
    assert len(fig.frames) == frames
    assert_animated(fig, [f.name for f in fig.frames])
    assert len(fig.data) == 2 and fig.data[0].type == "bar"
    levels = memory_levels("H200")
    assert f"{levels[3].bandwidth_tbps:.1f} TB/s" in fig.data[0].y[0]  # labels carry the level's bandwidth
    # The time bars are bytes over each level's bandwidth; the red bar is the slowest.
    for frame in fig.frames:
        nbytes, times = frame.data[0].x, frame.data[1].x
        assert times[0] == pytest.approx(nbytes[0] / (levels[3].bandwidth_tbps * 1e12) * 1e6)
        red = [i for i, c in enumerate(frame.data[1].marker.color) if c == "#d62728"]
        assert red == [int(np.argmax(times))]


def test_matmul_traffic_model():
    n, b = 8192, 2
    traffic = [viz.matmul_traffic(n, t) for t in (1, 16, 32, 64, 128, 256)]
    dram = [t.bytes[0] for t in traffic]
    assert dram == sorted(dram, reverse=True)
    assert min(dram) >= 3 * n * n * b
    assert traffic[0].bytes[1] == pytest.approx(2 * n**3 * b + n * n * b)  # naive: every operand from L2
    assert traffic[4].bytes[1] == pytest.approx(2 * n**3 * b / 128 + n * n * b)
    spec = get_gpu("H200")
    naive_dram_s = traffic[0].bytes[0] / (spec.memory_tbps * 1e12)
    math_s = traffic[0].flops / (spec.peak_tflops("bf16") * 1e12)
    assert naive_dram_s > math_s  # naive is bandwidth-bound...
    assert traffic[4].bytes[0] / (spec.memory_tbps * 1e12) < math_s  # ...128x128 tiles are not
    assert traffic[0].bytes[2] == pytest.approx(2 * n**3 * b)
    assert traffic[4].bytes[2] == pytest.approx(n**3 * b * (1 / 64 + 1 / 128))  # a 64x128 accumulator block
    # Under the model, 128x128 tiles leave L2 -> SM traffic as the bound; 256x256 tiles
    # finally make the tensor cores the slowest part.
    frames = viz.memory_hierarchy_figure("H200", "matmul").frames
    assert int(np.argmax(frames[4].data[1].x)) == 1
    assert int(np.argmax(frames[5].data[1].x)) == 3
    with pytest.raises(ValueError):
        viz.matmul_traffic(0, 16)


def test_elementwise_traffic_model():
    unfused, fused = viz.elementwise_traffic(1000, 4), viz.elementwise_traffic(1000, 1)
    assert unfused.bytes[0] == 3 * fused.bytes[0] == 9 * 1000 * 2
    with pytest.raises(ValueError, match="kernels"):
        viz.elementwise_traffic(1000, 3)
    with pytest.raises(ValueError, match="workload"):
        viz.memory_hierarchy_figure("H200", "conv")


def test_bandwidth_ladder_figure_matches_hw():
    fig = viz.bandwidth_ladder_figure("H200")
    assert list(fig.data[0].x) == [lv.bandwidth_tbps for lv in bandwidth_ladder("H200")]
    measured = fig.data[1]
    assert measured.x[0] == pytest.approx(measured_ceilings().copy_tbps)


def test_generations_figure_and_table_match_hw():
    fig = viz.generations_figure()
    bf16 = next(t for t in fig.data if t.name == "bf16")
    assert list(bf16.y) == [get_gpu(n).tensor_tflops["bf16"] for n in viz.figures.GENERATION_GPUS]
    table = viz.specs_table()
    assert table.loc["H200", "TB/s"] == 4.8 and table.loc["B200", "fp4 TFLOP/s"] == 9000
    assert len(table) == len(get_gpu.__globals__["GPUS"])


def test_explorers_build_live_controls():
    box = viz.roofline_explorer()
    controls, _ = box.children
    gpu, dtype, batch = controls.children
    gpu.value = "V100"  # no bf16 on Volta: the format list follows the GPU
    assert "bf16" not in dtype.options and dtype.value == "fp16"
    batch.value = 5
    fig = viz.explorer.roofline_snapshot("H200", "bf16", 32)
    ax = fig.axes[0]
    assert max(ax.lines[0].get_ydata()) == pytest.approx(get_gpu("H200").peak_tflops("bf16"))
    assert len(ax.lines) == 5  # roof, three workloads, ridge
    text = viz.explorer.hierarchy_text("H200", 16, 8192)
    assert text.count("GB") == 3
    assert f"{viz.matmul_traffic(8192, 16).bytes[0] / 1e9:.2f}" in text
    assert len(viz.hierarchy_explorer().children) == 2


def test_si_tick_labels():
    assert viz.common.si_label(1e9, "B") == "1 GB"
    assert viz.common.si_label(2.2e12, "B") == "2.2 TB"
    assert viz.common.si_label(1e-4, "s") == "100 µs"
    assert viz.common.si_label(0.0399, "s") == "39.9 ms"
    ticks = viz.common.log_ticks(3e8, 7e12, "B")
    assert ticks["ticktext"] == ["1 GB", "10 GB", "100 GB", "1 TB"]
    assert viz.common.log_ticks(0.4e9, 3.6e9, "B")["ticktext"] == ["500 MB", "1 GB", "2 GB"]
    assert viz.common.log_ticks(50, 2e5, "s", scale=1e-6)["ticktext"] == ["100 µs", "1 ms", "10 ms", "100 ms"]
    with pytest.raises(ValueError):
        viz.common.log_ticks(0, 1, "B")
    with pytest.raises(ValueError, match="labels"):
        viz.common.animation_controls(["a", "b"], labels=["a"])


@pytest.mark.parametrize("workload", ["matmul", "elementwise"])
def test_memory_hierarchy_bars_stay_on_their_axes(workload):
    """Every bar of every frame starts inside its log axis (none vanishes below it) and
    the axes are labelled in bytes and seconds, not plotly's "1B" for a billion."""
    fig = viz.memory_hierarchy_figure("H200", workload, gpus=("H200", "V100", "B200"))
    for trace_index, axis in ((0, fig.layout.xaxis), (1, fig.layout.xaxis2)):
        low, high = 10 ** axis.range[0], 10 ** axis.range[1]
        for frame in fig.frames:
            for trace in frame.data[trace_index::2]:
                assert all(2 * low < x < high / 2 for x in trace.x), (frame.name, trace.x, low, high)
        assert all(t.split()[-1] in ("B", "kB", "MB", "GB", "TB", "PB", "µs", "ms", "s") for t in axis.ticktext), axis.ticktext


def test_memory_hierarchy_gpu_menu():
    names = ("H200", "V100", "A100")
    fig = viz.memory_hierarchy_figure("A100", "matmul", gpus=names)
    assert len(fig.data) == 2 * len(names)
    assert [t.visible for t in fig.data] == [False, False, False, False, True, True]
    (menu,) = [m for m in fig.layout.updatemenus if m.type == "dropdown"]
    assert [b.label for b in menu.buttons] == list(names) and menu.active == 2
    for g, (name, button) in enumerate(zip(names, menu.buttons)):
        visible, layout = button.args
        assert visible["visible"] == [i // 2 == g for i in range(2 * len(names))]
        assert layout["title.text"].startswith(name)
    # Each GPU's bars in each frame are that GPU's traffic (V100: no bf16, so fp16).
    for frame, tile in zip(fig.frames, viz.hierarchy.MATMUL_TILES):
        assert len(frame.data) == 2 * len(names)
        for g, name in enumerate(names):
            dtype = "bf16" if get_gpu(name).supports("bf16") else "fp16"
            assert list(frame.data[2 * g].x) == pytest.approx(viz.matmul_traffic(8192, tile, name, dtype).bytes)
    # The slider's labels are short; its steps still name the frames.
    assert [s.label for s in fig.layout.sliders[0].steps] == ["naive", "16x16", "32x32", "64x64", "128x128", "256x256"]


def test_roofline_figure_legend_is_grouped():
    fig = viz.roofline_figure("H200", "bf16")
    in_legend = [t for t in fig.data if t.showlegend is not False]
    assert len(in_legend) <= 12, [t.name for t in in_legend]
    kernels = {p["kernel"] for p in viz.measured_points("H200", "bf16")}
    assert {t.name for t in fig.data if (t.name or "").startswith("measured:")} == {f"measured: {k}" for k in kernels}
    assert all(t.mode == "markers" for frame in fig.frames for t in frame.data)  # no batch labels over the markers


def test_roofline_explorer_menus_compose():
    gpus, formats = ("V100", "H200", "B200"), viz.roofline_figures.FORMATS
    fig = viz.roofline_explorer_figure("H200", "bf16", gpus=gpus)
    gpu_menu, format_menu = [m for m in fig.layout.updatemenus if m.type == "dropdown"]
    assert [b.label for b in gpu_menu.buttons] == list(gpus) and gpu_menu.active == 1
    assert [b.label for b in format_menu.buttons] == list(formats) and format_menu.active == formats.index("bf16")

    def shown(gpu_button, format_button):
        """Names of the traces a reader sees after picking the two menu items."""
        visible = gpu_button.args[0]["visible"]
        opacity = format_button.args[0]["opacity"]
        return [(t.name, t.text) for t, v, o in zip(fig.data, visible, opacity) if v and o > 0]

    # Only the menus decide what is shown: the GPU menu sets visible, the format menu the rest.
    assert all(set(b.args[0]) == {"visible"} for b in gpu_menu.buttons)
    assert all(set(b.args[0]) == {"opacity", "showlegend", "hoverinfo"} for b in format_menu.buttons)
    initial = [(t.name, t.text) for t in fig.data if t.visible and t.opacity > 0]
    assert initial == shown(gpu_menu.buttons[1], format_menu.buttons[formats.index("bf16")])
    for g, name in enumerate(gpus):
        spec = get_gpu(name)
        for f, fmt in enumerate(formats):
            traces = shown(gpu_menu.buttons[g], format_menu.buttons[f])
            if spec.supports(fmt):
                roof = next(n for n, _ in traces if n and "roof" in n)
                assert roof.startswith(f"{name} {fmt} roof") and f"{spec.peak_tflops(fmt):,.0f} TFLOP/s" in roof
                assert len(traces) == 5  # roof, ridge, three workloads
            else:
                ((_, text),) = traces
                assert "do not support" in text[0]
    # The frames move only the highlighted batch, on every workload trace of every pair.
    assert_animated(fig, [str(b) for b in DEFAULT_BATCHES])
    moving = [i for i, t in enumerate(fig.data) if t.mode == "lines+markers"]
    assert len(moving) == 3 * sum(get_gpu(n).supports(f) for n in gpus for f in formats)
    for i, frame in enumerate(fig.frames):
        assert list(frame.traces) == moving and all(list(t.selectedpoints) == [i] for t in frame.data)
    # The workload points are those of the model, in the pair's own format.
    roof = next(i for i, t in enumerate(fig.data) if (t.name or "").startswith("B200 fp4 roof"))
    for j, trace in enumerate(fig.data[roof + 2 : roof + 5]):
        works = [moving_workloads(b, dtype="fp4")[j] for b in DEFAULT_BATCHES]
        assert list(trace.x) == pytest.approx([w.intensity for w in works])
        assert list(trace.y) == pytest.approx([w.attainable_tflops("B200", "fp4") for w in works])
    with pytest.raises(ValueError, match="do not support"):
        viz.roofline_explorer_figure("V100", "bf16")
    with pytest.raises(ValueError, match="formats"):
        viz.roofline_explorer_figure("H200", "fp64")

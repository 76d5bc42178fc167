"""bench/linear_vs_softmax.py's report side (markdown, crossover, --report,
the plot's data) on a synthetic json: no GPU, torch, triton or fla needed.
Every number here is made up for the test."""

import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")


def load(name):
    """A bench/ script as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(BENCH, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = load("linear_vs_softmax")
plot_linear = load("plot_linear")


def row(series, pass_name, seqlen, batch, ms, errors=None, skipped=None, **extra):
    """A row as the benchmark writes it: ms {kernel: time or None}."""
    errors, skipped = errors or {}, skipped or {}
    tokens = batch if series == "decode" else batch * seqlen
    return {"series": series, "pass": pass_name, "seqlen": seqlen, "batch": batch, "heads": 16, "head_dim": 128,
            "dtype": "bf16", "causal": series != "decode", "median_ms": dict(ms),
            "tokens_per_s": {k: None if v is None else tokens / (v * 1e-3) for k, v in ms.items()},
            "errors": errors, "skipped": skipped, **extra}


SYNTHETIC_HEADER = {"device": "Synthetic GPU", "date": "2000-01-01T00:00:00", "commit": "synthetic0",
                    "torch": "0.0-synthetic", "triton": "0.0", "fla": "0.0", "heads": 16, "head_dim": 128,
                    "dtype": "bf16", "tokens_per_batch": 16384, "softmax_max_len": 131072,
                    "linear_only_lengths": [1048576], "warmup_ms": 25, "rep_ms": 100,
                    "timer": "synthetic", "complete": True}


def synthetic_doc():
    oom = bench.OOM_PREFIX + "OutOfMemoryError: CUDA out of memory (synthetic)"
    quadratic = {"cuflash_softmax": bench.SKIPPED_QUADRATIC, "cudnn_softmax": bench.SKIPPED_QUADRATIC}
    rows = [
        # cuflash linear beats cuDNN at 1k, loses at 2k, wins from 4k on: crossover 4k, not 1k.
        row("tokens16k", "fwd", 1024, 16, {"cuflash_linear": 1.0, "fla_linear": 2.0, "cuflash_softmax": 3.0,
                                           "cudnn_softmax": 1.5}),
        row("tokens16k", "fwd", 2048, 8, {"cuflash_linear": 2.0, "fla_linear": 2.5, "cuflash_softmax": 3.0,
                                          "cudnn_softmax": 1.8}),
        row("tokens16k", "fwd", 4096, 4, {"cuflash_linear": 2.0, "fla_linear": 2.5, "cuflash_softmax": 3.0,
                                          "cudnn_softmax": 2.2}),
        # cuDNN out of memory here: the comparison skips this length.
        row("tokens16k", "fwd", 8192, 2, {"cuflash_linear": 2.0, "fla_linear": 1.0, "cuflash_softmax": 5.0,
                                          "cudnn_softmax": None}, errors={"cudnn_softmax": oom}),
        row("tokens16k", "fwd", 1048576, 1, {"cuflash_linear": 40.0, "fla_linear": 30.0, "cuflash_softmax": None,
                                             "cudnn_softmax": None}, skipped=quadratic),
        # fla slower than cuDNN at the longest length: no crossover.
        row("tokens16k", "fwdbwd", 1024, 16, {"cuflash_linear": 1.0, "fla_linear": 1.0, "cuflash_softmax": 3.0,
                                              "cudnn_softmax": 2.0}),
        row("tokens16k", "fwdbwd", 2048, 8, {"cuflash_linear": 1.0, "fla_linear": 9.0, "cuflash_softmax": 3.0,
                                             "cudnn_softmax": 2.0}),
        row("b1", "fwd", 2048, 1, {"cuflash_linear": 0.5, "fla_linear": 0.4, "cuflash_softmax": 0.3,
                                   "cudnn_softmax": 0.2}),
        row("b1", "fwd", 131072, 1, {"cuflash_linear": 4.0, "fla_linear": 3.0, "cuflash_softmax": 100.0,
                                     "cudnn_softmax": 50.0}),
        row("b1", "fwd", 1048576, 1, {"cuflash_linear": 40.0, "fla_linear": 30.0, "cuflash_softmax": None,
                                      "cudnn_softmax": None}, skipped=quadratic, same_point_as="tokens16k"),
        row("decode", "decode", 4096, 16, {"cuflash_linear": 0.01, "fla_linear": 0.02, "cuflash_softmax": 0.05,
                                           "cudnn_softmax": 0.06, "flash_softmax": 0.04}),
        row("decode", "decode", 131072, 16, {"cuflash_linear": 0.01, "fla_linear": 0.02, "cuflash_softmax": 0.5,
                                             "cudnn_softmax": None, "flash_softmax": 0.4},
            errors={"cudnn_softmax": "RuntimeError: synthetic refusal"}),
    ]
    return {"header": dict(SYNTHETIC_HEADER), "rows": rows}


def test_crossover_is_where_linear_stays_faster():
    rows = bench.part(synthetic_doc()["rows"], "tokens16k", "fwd")
    assert bench.crossover(rows, "cuflash_linear") == 4096  # won at 1k, lost at 2k
    assert bench.crossover(rows, "fla_linear", "cuflash_softmax") == 1024
    assert bench.crossover_text(rows, "fla_linear", "cuflash_softmax") == "≤ 1k (faster at every measured length)"
    fwdbwd = bench.part(synthetic_doc()["rows"], "tokens16k", "fwdbwd")
    assert bench.crossover(fwdbwd, "fla_linear") is None
    assert bench.crossover_text(fwdbwd, "fla_linear", "cudnn_softmax") == "none (slower at 2k)"
    assert bench.crossover_text([], "fla_linear", "cudnn_softmax") == "not compared"


def test_crossover_ignores_lengths_where_either_failed_or_was_skipped():
    rows = bench.part(synthetic_doc()["rows"], "tokens16k", "fwd")
    # 8k (cuDNN OOM) and 1M (skipped) are no comparison against cuDNN.
    assert [length for length, _ in bench.comparisons(rows, "fla_linear", "cudnn_softmax")] == [1024, 2048, 4096]
    assert bench.crossover(rows, "fla_linear") is None  # fla slower than cuDNN at 4k, the last compared


def test_markdown_cells_crossovers_and_decode():
    doc = synthetic_doc()
    text = bench.markdown(doc["header"], doc["rows"])
    assert "commit synthetic0" in text
    assert bench.CROSSOVER_DEFINITION in text
    lines = text.splitlines()
    one_million = [line for line in lines if line.startswith("| 1M | 1 |")]
    assert len(one_million) == 2 and all(line.count("skipped (quadratic)") == 2 for line in one_million)
    assert any(line.startswith("| 8k | 2 |") and "| OOM |" in line for line in lines)
    assert "| tokens16k | fwd | 4k |" in text
    assert "## Decode: one step per sequence" in text
    decode_row = next(line for line in lines if line.startswith("| 128k | 16 |"))
    assert "| 10.0 |" in decode_row and "| fail |" in decode_row  # 0.01 ms = 10.0 µs; cuDNN refused
    assert "1.6M" in decode_row  # 16 tokens per 10 µs step
    assert "RuntimeError: synthetic refusal" in text and "CUDA out of memory (synthetic)" in text
    assert "Partial run" not in text
    doc["header"]["complete"] = False
    assert "Partial run" in bench.markdown(doc["header"], doc["rows"])


def test_shared_point_is_not_listed_twice_in_failures():
    doc = synthetic_doc()
    doc["rows"][9]["errors"] = {"fla_linear": "synthetic error"}
    assert "b1 fwd 1M" not in "\n".join(bench.failures(doc["rows"]))


def test_report_writes_linear_md_with_spec_beside_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "plot", lambda header, rows, path: "no plot in this test (the next one draws it)")
    source = tmp_path / "run" / "linear_vs_softmax.json"
    source.parent.mkdir()
    source.write_text(json.dumps(synthetic_doc()))
    out = tmp_path / "perf"
    assert bench.main(["--report", str(source), "--out", str(out)]) == 0
    text = (out / "linear.md").read_text()
    assert json.loads((out / "linear.json").read_text()) == synthetic_doc()
    assert "Synthetic GPU, 2000-01-01T00:00:00, commit synthetic0" in text
    assert "triton.testing.do_bench" in text
    assert "![time against sequence length, log-log](linear.png)" in text
    assert "## Decode: one step per sequence" in text
    assert "## Against the specification's estimates" in text
    spec_128k = next(line for line in text.splitlines() if line.startswith("| 128k | 7k | 8.5k | 1.87M |"))
    # Measured at 128k (b1 fwd): cuDNN 131072 tokens / 50 ms, cuDNN / cuflash linear = 50 / 4.
    assert "| 2.62M |" in spec_128k and "| 12.5× |" in spec_128k and "| 16.7× |" in spec_128k
    spec_32k = next(line for line in text.splitlines() if line.startswith("| 32k |"))
    assert spec_32k.endswith("| - | - | - | - | - | - |")  # not measured at 32k
    assert "(22,120× slower than its linear attention); cuflash's softmax (cuda) measured 1.31M tok/s" in text


def test_report_plot_link_and_missing_matplotlib(tmp_path):
    doc = synthetic_doc()
    # One panel is enough to see the file written (drawing all four takes seconds).
    message = bench.plot(doc["header"], doc["rows"][:2], str(tmp_path / "linear.png"))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert message.startswith("no plot") and "plot_linear.py" in message
        assert not (tmp_path / "linear.png").exists()
    else:
        assert message.startswith("wrote") and (tmp_path / "linear.png").stat().st_size > 0


def test_plot_panels_from_rows_alone():
    panels = plot_linear.panels(synthetic_doc()["rows"])
    titles = [title for title, _, _ in panels]
    assert titles == ["forward, 16k tokens per batch", "forward + backward, 16k tokens per batch", "forward, B = 1",
                      "decode step, B = 16"]
    lines = panels[0][2]
    assert list(lines) == ["cuflash_linear", "fla_linear", "cuflash_softmax", "cudnn_softmax"]
    assert lines["cudnn_softmax"] == [(1024, 1.5), (2048, 1.8), (4096, 2.2)]  # no OOM or skipped points
    assert lines["cuflash_linear"][-1] == (1048576, 40.0)


class FakeOutOfMemory(RuntimeError):
    pass


def test_benchmark_driver_with_fake_kernels(tmp_path, monkeypatch):
    """The run's bookkeeping (series, reuse, skips, OOM, incremental files)
    with stand-ins for torch, triton and the kernels: names in, made-up ms out."""
    torch = types.ModuleType("torch")
    torch.__version__, torch.bfloat16 = "0.0-fake", "bf16"
    torch.cuda = types.SimpleNamespace(get_device_name=lambda index: "Fake GPU", empty_cache=lambda: None,
                                       OutOfMemoryError=FakeOutOfMemory)
    triton = types.ModuleType("triton")
    triton.__version__ = "0.0-fake"
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setattr(bench, "load_fla", lambda: ("fla chunk", None))
    monkeypatch.setattr(bench, "load_fla_step", lambda: (None, "ImportError: no recurrent step (fake)"))
    monkeypatch.setattr(bench, "fla_version", lambda: "0.0-fake")
    monkeypatch.setenv("CUFLASH_COMMIT", "fake123")
    built = []

    def fake_callables(torch_, batch, length, heads, dim, dtype, pass_name, fla):
        built.append((pass_name, length, batch))
        return {k: (k, pass_name, length, batch) for k in bench.KERNELS}

    def fake_decode_callables(torch_, batch, context, heads, dim, dtype, fla_step):
        assert fla_step is None
        return {k: (k, "decode", context, batch) for k in bench.DECODE_KERNELS if k != "fla_linear"}

    def fake_time_ms(call, warmup_ms, rep_ms):
        kernel, pass_name, length, batch = call
        if pass_name == "decode":
            # Every prefill point is on disk before decode starts, the run not yet complete.
            on_disk = json.loads((tmp_path / "linear_vs_softmax.json").read_text())
            assert len(on_disk["rows"]) == 12 and not on_disk["header"]["complete"]
        if (kernel, length, batch) == ("cudnn_softmax", 8192, 2):
            raise FakeOutOfMemory("CUDA out of memory (fake)")
        return 1e-6 * length * batch

    monkeypatch.setattr(bench, "callables", fake_callables)
    monkeypatch.setattr(bench, "decode_callables", fake_decode_callables)
    monkeypatch.setattr(bench, "time_ms", fake_time_ms)
    assert bench.main(["--out", str(tmp_path), "--lengths", "8192", "16384", "--linear-only-lengths", "65536",
                       "--decode-contexts", "4096", "--decode-batches", "1"]) == 0
    # 8k B=2, 16k B=1, 64k B=1 (tokens16k), then 8k B=1 (b1): 16k and 64k are not measured again.
    assert built == [(p, n, b) for n, b in ((8192, 2), (16384, 1), (65536, 1), (8192, 1)) for p in bench.PASSES]
    doc = json.loads((tmp_path / "linear_vs_softmax.json").read_text())
    assert doc["header"]["complete"] and doc["header"]["commit"] == "fake123"
    rows = {(r["series"], r["pass"], r["seqlen"]): r for r in doc["rows"]}
    assert len(rows) == 13
    oom = rows[("tokens16k", "fwd", 8192)]
    assert oom["errors"]["cudnn_softmax"].startswith(bench.OOM_PREFIX) and oom["median_ms"]["cudnn_softmax"] is None
    assert oom["tokens_per_s"]["cuflash_linear"] == pytest.approx(2 * 8192 / (1e-6 * 8192 * 2 * 1e-3))
    linear_only = rows[("b1", "fwdbwd", 65536)]
    assert linear_only["same_point_as"] == "tokens16k"
    assert linear_only["skipped"] == {"cuflash_softmax": "quadratic", "cudnn_softmax": "quadratic"}
    decode = rows[("decode", "decode", 4096)]
    assert decode["errors"] == {"fla_linear": "ImportError: no recurrent step (fake)"}
    assert decode["tokens_per_s"]["cuflash_linear"] == pytest.approx(1 / (1e-6 * 4096 * 1e-3))
    text = (tmp_path / "linear_vs_softmax.md").read_text()
    assert "skipped (quadratic)" in text and "| OOM |" in text and "## Decode" in text


@pytest.mark.parametrize("length, label", [(512, "512"), (1024, "1k"), (131072, "128k"), (1048576, "1M")])
def test_length_labels(length, label):
    assert bench.length_label(length) == label


def test_importing_the_bench_needs_no_torch():
    # Checked in a fresh interpreter: other tests of this process may have imported torch.
    path = os.path.join(BENCH, "linear_vs_softmax.py")
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('bench', {path!r})\n"
            "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            "assert not {'torch', 'triton', 'fla', 'cuflash'} & set(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True)

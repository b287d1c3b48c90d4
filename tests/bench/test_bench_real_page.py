"""The real suite's page (scripts/real_models_page.py -> docs/real_models.md) and chart (``--png``), rendered from
a small bench JSON: every model and path with its figures, what auto chose, the date, machine and command."""

import json
import subprocess
import sys

import pytest

import harness
from tfaccel.bench.real import KERAS_MULTI_WORKER
from tfaccel.bench.real_report import (auto_choice, auto_choice_short, merge_reports, plot_real, render_page,
                                       render_readme_table)


def _fig(median: float, low: float, high: float) -> dict:
    return {"median": median, "min": low, "max": high, "values": [low, median, high]}


def _report() -> dict:
    compiled = {"jit_compile": False, "loop": "compiled whole-epoch loop running the model's train_step",
                "xla": "True -> False (auto: XLA off to start (no figures measured for this model yet); the ...)"}
    multi = {"jit_compile": False, "loop": "tfaccel's multi-step loop: 24 steps of the model's train_step per call "
                                           "under 'mirrored'"}
    row = {"time_to_train": {"keras": _fig(8.8, 8.1, 9.9), "tfaccel": _fig(4.4, 4.0, 5.1)},
           "time_to_train_ratio": _fig(2.0, 1.59, 2.2), "steady_ratio": _fig(1.31, 1.2, 1.4),
           "details": {"tfaccel": compiled, "keras": {"loop": "keras model.fit"}}}
    return {"config": {"repeats": 3}, "seconds": 10.0, "versions": {"tensorflow": "2.21.0", "keras": "3.15.1",
                                                                     "tfaccel": "0.1"},
            "machine": {"date": "2026-11-25 17:00 UTC", "cpus": 2, "platform": "Linux-x86_64",
                        "loadavg_before": [3.1, 3.0, 2.9], "loadavg_after": [3.3, 3.0, 2.9]},
            "real": {"size": "bench", "jobs": {"bert_classifier": {"examples": 768, "batch_size": 32, "epochs": 3}},
                     "rows": {"bert_classifier": {
                         "default": row, "mirrored": {**row, "details": {"tfaccel": multi}},
                         "multi_worker": {"time_to_train": {"tfaccel": _fig(9.0, 8.0, 10.0)},
                                          "keras": KERAS_MULTI_WORKER, "details": {"tfaccel": multi}}}}}}


def test_page_has_every_row_with_its_figures_and_what_auto_chose():
    page = render_page(_report(), command="tfaccel bench --suite real --repeats 3")
    assert "2026-11-25 17:00 UTC" in page and "2 CPUs" in page and "`tfaccel bench --suite real --repeats 3`" in page
    assert "[3.1, 3.0, 2.9] / [3.3, 3.0, 2.9]" in page
    assert ("| bert_classifier (768 ex., batch 32, 3 epochs) | default (one CPU device) | 8.8 s (8.1–9.9) | "
            "4.4 s (4.0–5.1) | 2.00 (1.59–2.20) | 1.31 (1.20–1.40) | compiled whole-epoch loop; XLA off: auto: "
            "XLA off to start") in page
    assert "| mirrored (2 virtual CPUs) |" in page and "multi-step loop, 24 steps per call; XLA off |" in page
    assert "| multi_worker (2 processes) | cannot run: Keras 3 model.fit under MultiWorkerMirroredStrategy" in page
    assert "No GPU took part: every figure here is a CPU figure" in page  # the machine recorded no GPU


def test_page_shows_the_limit_where_the_report_has_it():
    report = _report()
    assert "tfaccel / limit" not in render_page(report, command="x")  # reports before the limit contender
    report["real"]["rows"]["bert_classifier"]["default"].update(limit=_fig(3.6, 3.5, 3.9),
                                                                limit_ratio=_fig(0.82, 0.7, 0.9))
    page = render_page(report, command="x")
    assert "**limit** is the faster of two hand-written loops" in page and "| tfaccel / limit |" in page
    assert "| 1.31 (1.20–1.40) | 3.6 s (3.5–3.9) | 0.82 (0.70–0.90) | compiled whole-epoch loop" in page
    assert "| mirrored (2 virtual CPUs) |" in page and "| — | — | multi-step loop" in page


def test_page_with_a_gpu_does_not_say_none_took_part():
    report = _report()
    report["machine"]["gpus"] = ["NVIDIA H100 80GB HBM3"]
    assert "No GPU took part" not in render_page(report, command="x")


def test_auto_choice_without_details_and_with_the_xla_figures():
    assert auto_choice({}) == "?; XLA off"
    auto = {"measured": {"jit_off": {"overhead_s": 1.709, "step_s": 0.006081}}, "expected_steps": 72,
            "events": ["epoch 3: XLA tried (...)"]}
    assert auto_choice({"xla_auto": auto}).endswith(
        "measured without XLA: 1.7 s overhead + 6.08 ms/step; XLA tried only with ≥ 2,530 steps left (this job: "
        "72); epoch 3: XLA tried (...)")


def test_auto_choice_of_a_convolutional_model_names_its_slow_down_prior():
    from tfaccel.train.xla_payback import CONV_CPU_PRIOR

    auto = {"measured": {"jit_off": {"overhead_s": 8.1, "step_s": 0.95}}, "expected_steps": 30,
            "try_from_steps": 1_404, "prior": {"speedup": CONV_CPU_PRIOR.speedup, "source": CONV_CPU_PRIOR.source},
            "events": []}
    assert auto_choice({"xla_auto": auto}).endswith(
        f"XLA tried only with ≥ 1,404 steps left ({CONV_CPU_PRIOR.source}) (this job: 30)")


def test_script_writes_the_page_and_rejects_a_file_without_real(tmp_path):
    source, out = tmp_path / "bench.json", tmp_path / "docs" / "real_models.md"
    source.write_text(json.dumps(_report()))
    script = str(harness.REPO_ROOT / "scripts" / "real_models_page.py")
    proc = subprocess.run([sys.executable, script, "--from", str(source), "--out", str(out)], capture_output=True,
                          text=True, timeout=120, cwd=str(harness.REPO_ROOT))
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().startswith("# Real models") and "tfaccel bench --suite real --real-paths" in out.read_text()
    source.write_text(json.dumps({"config": {}}))
    proc = subprocess.run([sys.executable, script, "--from", str(source), "--out", str(out)], capture_output=True,
                          text=True, timeout=120, cwd=str(harness.REPO_ROOT))
    assert proc.returncode == 2 and "has no 'real' key" in proc.stderr, proc.stderr


def test_chart_is_written(tmp_path):
    path = tmp_path / "img" / "real.png"
    plot_real(_report(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_of_some_models_each_merge_into_one_page():
    from tfaccel.bench.real_report import merge_reports

    first, second = _report(), _report()
    second["real"]["jobs"] = {"recommender": {"examples": 4096, "batch_size": 64, "epochs": 3}}
    second["real"]["rows"] = {"recommender": {"default": first["real"]["rows"]["bert_classifier"]["default"]}}
    second["machine"].update(date="2026-11-25 17:30 UTC", loadavg_before=[5.0, 4.0, 3.0])
    merged = merge_reports([first, second])
    assert list(merged["real"]["rows"]) == ["bert_classifier", "recommender"]
    page = render_page(merged, command="x")
    assert "2026-11-25 17:00 UTC to 2026-11-25 17:30 UTC" in page
    assert "recommender (default) on 2026-11-25 17:30 UTC: [5.0, 4.0, 3.0] / " in page
    assert "| recommender (4096 ex., batch 64, 3 epochs) | default (one CPU device) |" in page


def test_a_later_run_of_one_path_replaces_that_path_only():
    from tfaccel.bench.real_report import merge_reports

    first, second = _report(), _report()
    rows = second["real"]["rows"]["bert_classifier"]
    second["real"]["rows"] = {"bert_classifier": {"multi_worker": {**rows["multi_worker"],
                                                                   "time_to_train": {"tfaccel": _fig(7.0, 6.0, 8.0)}}}}
    merged = merge_reports([first, second])["real"]["rows"]["bert_classifier"]
    assert list(merged) == ["default", "mirrored", "multi_worker"]
    assert merged["multi_worker"]["time_to_train"]["tfaccel"]["median"] == 7.0
    assert merged["default"] == first["real"]["rows"]["bert_classifier"]["default"]


def _page_script():
    """scripts/real_models_page.py, imported."""
    sys.path.insert(0, str(harness.REPO_ROOT / "scripts"))
    try:
        import real_models_page
    finally:
        sys.path.pop(0)
    return real_models_page


def test_readme_table_has_every_row_in_a_few_words():
    table = render_readme_table(_report(), command="tfaccel bench --suite real")
    assert "2026-11-25 17:00 UTC on 2 CPUs (Linux-x86_64, no GPU)" in table and "`tfaccel bench --suite real`" in table
    assert ("| bert_classifier (768 ex. x 3 epochs, batch 32) | default | 8.8 s → 4.4 s | 2.00 | 1.31 | compiled "
            in table)
    assert "| multi_worker | plain Keras cannot run it → 9.0 s | — | — |" in table
    assert "[Real models](docs/real_models.md)" in table
    auto = {"measured": {"jit_off": {"overhead_s": 1.709, "step_s": 0.006081}}, "expected_steps": 72,
            "try_from_steps": 5059, "events": ["epoch 3: XLA tried (remaining_steps ...)"]}
    assert auto_choice_short({"loop": "compiled whole-epoch loop", "xla_auto": auto}) == (
        "compiled whole-epoch loop; XLA off: the job's 72 steps, XLA tried only from ≥ 5,059; epoch 3: XLA tried")
    auto["prior"] = {"speedup": 0.28, "source": "convolutions on CPU: ..."}
    assert "XLA tried only from ≥ 5,059 (convolutions: a slow-down assumed); epoch 3" in auto_choice_short(
        {"xla_auto": auto})
    assert auto_choice_short({"jit_compile": False, "xla": 'True -> False (fails here ("an error message"))'}) == (
        "?; XLA off: fails here")


def test_merging_merged_reports_gives_the_earliest_to_the_latest_date_and_keeps_each_run():
    first, second, third = _report(), _report(), _report()
    second["machine"]["date"], third["machine"]["date"] = "2026-11-26 19:00 UTC", "2026-11-26 22:00 UTC"
    third["real"]["rows"]["bert_classifier"] = {"default": third["real"]["rows"]["bert_classifier"]["default"]}
    earlier = merge_reports([first, second])
    assert earlier["machine"]["date"] == "2026-11-25 17:00 UTC to 2026-11-26 19:00 UTC"
    merged = merge_reports([earlier, third])
    assert merged["machine"]["date"] == "2026-11-25 17:00 UTC to 2026-11-26 22:00 UTC"
    assert len(merged["machine"]["loadavg_per_run"]) == 3, merged["machine"]["loadavg_per_run"]


def test_script_writes_the_readme_table_between_its_markers_and_refuses_a_readme_without_them(tmp_path):
    real_models_page = _page_script()
    source, readme = tmp_path / "bench.json", tmp_path / "README.md"
    source.write_text(json.dumps(_report()))
    readme.write_text(f"# x\n\n{real_models_page.README_BEGIN}\nold\n{real_models_page.README_END}\n\nafter\n")
    args = ["--from", str(source), "--out", str(tmp_path / "page.md"), "--readme", str(readme), "--command", "cmd"]
    assert real_models_page.main(args) == 0
    text = readme.read_text()
    assert "old" not in text and text.endswith(f"{real_models_page.README_END}\n\nafter\n")
    assert render_readme_table(_report(), command="cmd") in text
    readme.write_text("# no markers\n")
    (tmp_path / "page.md").unlink()
    assert real_models_page.main(args) == 2
    assert readme.read_text() == "# no markers\n" and not (tmp_path / "page.md").exists()  # nothing half-written


@pytest.mark.parametrize("target", ["README.md", "docs/real_models.md"])
def test_the_committed_real_models_tables_are_rendered_from_the_committed_json(target):
    """Both tables come from docs/data/real_bench.json (and the command it keeps), so neither is edited by hand."""
    real_models_page = _page_script()
    report = json.loads((harness.REPO_ROOT / "docs" / "data" / "real_bench.json").read_text())
    command = report["page_command"]
    text = (harness.REPO_ROOT / target).read_text()
    if target == "README.md":
        assert real_models_page.replace_readme_table(text, render_readme_table(report, command=command)) == text
    else:
        assert text == render_page(report, command=command)
